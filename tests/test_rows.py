"""capo_train.rows: golden rollout -> rows conversions for both layouts (the multi-turn token/mask
misalignment bug class), and the property that makes the packed layout worth having: a per_action forward
and a packed forward give the same per-action log-probs and boundary values."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from capo_train.algorithms import action_ppo_loss
from capo_train.rows import ActionRecord, Trajectory, build_rows, gather_actions, minibatches, token_logprobs

PAD = 99


def rec(prompt, action, obs, *, valid=True, reward=0.0):
    """An action record whose old log-probs encode the token ids (-id/100), so their placement is visible."""
    return ActionRecord(prompt_ids=prompt, action_ids=action, old_logprobs=[-a / 100 for a in action], reward=reward,
                        action_valid=valid, obs_ids=obs)


def traj(traj_id, task_id, group_id, actions, anchors, *, terminated=True):
    """A trajectory that ended with ``terminated`` (else truncated), with no metrics."""
    return Trajectory(traj_id=traj_id, task_id=task_id, group_id=group_id, actions=actions, terminated=terminated,
                      truncated=not terminated, metrics={}, anchors=anchors)


def golden_trajectories() -> list[Trajectory]:
    """Trajectory 0: three actions; the second is invalid and followed by an EMPTY observation; the last
    has no observation. Trajectory 1: one action, another group. States are concatenated."""
    p0 = [1, 2, 3]
    p1 = p0 + [10, 11] + [20, 21]
    p2 = p1 + [12] + []
    t0 = Trajectory(
        traj_id=7,
        task_id="a",
        group_id=0,
        actions=[
            rec(p0, [10, 11], [20, 21], reward=0.5),
            rec(p1, [12], [], valid=False),
            rec(p2, [13, 14, 15], [], reward=1.0),
        ],
        terminated=True,
        truncated=False,
        metrics={"em": 1.0},
        anchors=["question", "passages", "passages"],
    )
    t1 = traj(8, "b", 1, [rec([5], [30], [])], ["other"], terminated=False)
    return [t0, t1]


def test_per_action_golden():
    b = build_rows(golden_trajectories(), "per_action", pad_id=PAD, max_tokens=None)
    _ = -1
    assert b.input_ids.tolist() == [
        [1, 2, 3, 10, 11, PAD, PAD, PAD, PAD, PAD, PAD],
        [1, 2, 3, 10, 11, 20, 21, 12, PAD, PAD, PAD],
        [1, 2, 3, 10, 11, 20, 21, 12, 13, 14, 15],
        [5, 30, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [[1] * 5 + [0] * 6, [1] * 8 + [0] * 3, [1] * 11, [1] * 2 + [0] * 9]
    assert b.action_index.tolist() == [
        [_, _, _, 0, 0, _, _, _, _, _, _],
        [_, _, _, _, _, _, _, 1, _, _, _],
        [_, _, _, _, _, _, _, _, 2, 2, 2],
        [_, 3, _, _, _, _, _, _, _, _, _],
    ]
    assert b.boundary_row.tolist() == [0, 1, 2, 3]
    assert b.boundary_pos.tolist() == [2, 6, 7, 0]
    _check_per_action_fields(b)


def test_packed_golden():
    b = build_rows(golden_trajectories(), "packed", pad_id=PAD, max_tokens=11)
    _ = -1
    assert b.input_ids.tolist() == [
        [1, 2, 3, 10, 11, 20, 21, 12, 13, 14, 15],
        [5, 30, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [[1] * 11, [1] * 2 + [0] * 9]
    # observation tokens (positions 5, 6) belong to no action; the empty observation leaves a1, a2 adjacent
    assert b.action_index.tolist() == [
        [_, _, _, 0, 0, _, _, 1, 2, 2, 2],
        [_, 3, _, _, _, _, _, _, _, _, _],
    ]
    assert b.boundary_row.tolist() == [0, 0, 0, 1]
    assert b.boundary_pos.tolist() == [2, 6, 7, 0]
    _check_per_action_fields(b)


def _check_per_action_fields(b):
    """The [A] and [A, L] fields do not depend on the layout."""
    expected = [[-0.10, -0.11, 0.0], [-0.12, 0.0, 0.0], [-0.13, -0.14, -0.15], [-0.30, 0.0, 0.0]]
    torch.testing.assert_close(b.old_logp, torch.tensor(expected))
    assert b.action_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert b.reward.tolist() == [0.5, 0.0, 1.0, 0.0]
    assert b.traj_index.tolist() == [0, 0, 0, 1]
    assert b.step_index.tolist() == [0, 1, 2, 0]
    assert b.group_index.tolist() == [0, 0, 0, 1]
    assert b.terminated.tolist() == [True, True, True, False]
    assert b.truncated.tolist() == [False, False, False, True]
    assert b.anchor.tolist() == [0, 1, 1, 2]
    assert b.action_valid.tolist() == [True, False, True, True]
    assert b.action_id.tolist() == [0, 1, 2, 3]
    # gathering the ids themselves returns each action's tokens, left-aligned, 0 on padding
    assert gather_actions(b.input_ids, b).tolist() == [[10, 11, 0], [12, 0, 0], [13, 14, 15], [30, 0, 0]]


def test_packed_needs_concatenated_states():
    window_like = traj(0, "a", 0, [rec([1, 2], [10], [20]), rec([1, 3, 20], [11], [])], ["x", "y"])
    build_rows([window_like], "per_action", pad_id=0)  # fine one row per action
    with pytest.raises(ValueError, match="concatenated states"):
        build_rows([window_like], "packed", pad_id=0)
    wrong_obs = traj(0, "a", 0, [rec([1], [10], [20]), rec([1, 10, 21], [11], [])], ["x", "y"])
    with pytest.raises(ValueError, match="breaks it at action 0"):
        build_rows([wrong_obs], "packed", pad_id=0)


def test_build_rows_rejects_bad_input():
    t = golden_trajectories()
    with pytest.raises(ValueError, match="exceeds max_tokens"):
        build_rows(t, "per_action", pad_id=0, max_tokens=10)
    with pytest.raises(ValueError, match="unknown layout"):
        build_rows(t, "nested", pad_id=0)
    t[1].actions[0].old_logprobs = [0.0, 0.0]
    with pytest.raises(ValueError, match="2 old_logprobs for 1 action tokens"):
        build_rows(t, "per_action", pad_id=0)
    t[1].actions[0] = rec([5], [], [])
    with pytest.raises(ValueError, match="empty"):
        build_rows(t, "per_action", pad_id=0)


def test_trajectory_without_actions_gives_no_rows():
    cut = traj(3, "c", 2, [], [], terminated=False)
    b = build_rows([cut] + golden_trajectories(), "packed", pad_id=PAD)
    assert b.num_rows == 2 and b.num_actions == 4
    assert b.traj_index.tolist() == [1, 1, 1, 2]  # positions in the list given to build_rows


def test_token_logprobs_alignment():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))  # [1, 3, 2]
    ids = torch.tensor([[1, 0, 1]])
    out = token_logprobs(logits, ids)  # token s scored by the logits at s - 1
    torch.testing.assert_close(out, torch.log(torch.tensor([[1.0, 0.5, 0.75]])))


@pytest.mark.parametrize("layout", ["per_action", "packed"])
def test_minibatches_keep_actions_with_their_rows(layout):
    trajs = golden_trajectories() + [
        traj(9, "b", 1, [rec([6, 7], [31, 32], [40]), rec([6, 7, 31, 32, 40], [33], [])], ["p", "q"])
    ]
    full = build_rows(trajs, layout, pad_id=PAD)
    seen = []
    for mb in minibatches(full, 2, torch.Generator().manual_seed(0)):
        assert mb.num_rows <= 2
        # every action's tokens sit where action_index says, in the row boundary_row says
        for a in range(mb.num_actions):
            r, start, n = mb.boundary_row[a], mb.boundary_pos[a] + 1, int(mb.action_mask[a].sum())
            assert (mb.action_index[r, start : start + n] == a).all()
        assert int((mb.action_index >= 0).sum()) == int(mb.action_mask.sum())
        assert mb.input_ids.shape[1] == int(mb.attention_mask.sum(1).max())  # trimmed
        L = mb.action_mask.shape[1]
        assert torch.equal(full.old_logp[mb.action_id, :L], mb.old_logp)  # action_id points into the full batch
        assert torch.equal(full.step_index[mb.action_id], mb.step_index)
        seen += [
            (t, s, tuple(ids[:n]), tuple(lp[:n]))
            for t, s, ids, lp, n in zip(
                mb.traj_index.tolist(),
                mb.step_index.tolist(),
                gather_actions(mb.input_ids, mb).tolist(),
                mb.old_logp.tolist(),
                mb.action_mask.sum(1).int().tolist(),
            )
        ]
    expected = [
        (t, s, tuple(ids[:n]), tuple(lp[:n]))
        for t, s, ids, lp, n in zip(
            full.traj_index.tolist(),
            full.step_index.tolist(),
            gather_actions(full.input_ids, full).tolist(),
            full.old_logp.tolist(),
            full.action_mask.sum(1).int().tolist(),
        )
    ]
    assert sorted(seen) == sorted(expected)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_minibatches_with_a_fixed_count(count):
    """Data-parallel processes take the same number of steps: ``count`` chunks, every row in one of
    them (reused cyclically only when there are fewer rows than chunks)."""
    full = build_rows(golden_trajectories(), "per_action", pad_id=PAD)
    chunks = list(minibatches(full, 2, torch.Generator().manual_seed(0), count=count))
    assert len(chunks) == count and all(mb.num_rows >= 1 for mb in chunks)
    used = sorted(a for mb in chunks for a in mb.action_id.tolist())
    if count <= full.num_rows:
        assert used == list(range(full.num_actions))
    else:
        assert set(used) == set(range(full.num_actions))


def _random_concat_trajectories(vocab: int, gen: torch.Generator) -> list[Trajectory]:
    """Three trajectories of 1-4 actions with random ids, concatenated states, some empty observations."""

    def ids(lo, hi):
        return torch.randint(3, vocab, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen).tolist()

    trajs = []
    for i, steps in enumerate([3, 1, 4]):
        state, actions = ids(2, 9), []
        for t in range(steps):
            a = ids(1, 7)
            obs = ids(0, 5) if t < steps - 1 else []
            actions.append(ActionRecord(prompt_ids=state, action_ids=a, old_logprobs=[0.0] * len(a), reward=0.0,
                                        action_valid=True, obs_ids=obs))
            state = state + a + obs
        trajs.append(traj(i, str(i), i // 2, actions, [""] * steps))
    return trajs


def test_layouts_agree_under_a_model():
    """A per_action forward and a packed forward give the same per-action log-probs (1e-5, float32), the
    same boundary values, and so the same CAPO loss."""
    torch.manual_seed(0)
    vocab = 64
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    ).eval()
    value_head = torch.nn.Linear(32, 1)  # stands in for the critic: one value per position
    trajs = _random_concat_trajectories(vocab, torch.Generator().manual_seed(1))

    logp, values = {}, {}
    for layout in ("per_action", "packed"):
        b = build_rows(trajs, layout, pad_id=0)
        with torch.no_grad():
            out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_hidden_states=True)
        logp[layout] = gather_actions(token_logprobs(out.logits, b.input_ids), b)  # [A, L]
        per_position = value_head(out.hidden_states[-1]).squeeze(-1)  # [R, S]
        values[layout] = per_position[b.boundary_row, b.boundary_pos]  # [A]
        mask = b.action_mask
    assert build_rows(trajs, "packed", 0).num_rows == 3 and build_rows(trajs, "per_action", 0).num_rows == 8
    torch.testing.assert_close(logp["per_action"], logp["packed"], rtol=0, atol=1e-5)
    torch.testing.assert_close(values["per_action"], values["packed"], rtol=0, atol=1e-5)

    old = logp["per_action"] - 0.01 * torch.randn_like(mask) * mask
    adv = torch.randn(mask.shape[0])
    loss = {k: action_ppo_loss(v, old, adv, mask)[0] for k, v in logp.items()}
    torch.testing.assert_close(loss["per_action"], loss["packed"], rtol=0, atol=1e-6)
