"""The verl path computes what capo_train computes: advantages, returns, policy and critic losses, on the
same rows, to float precision.

The same trajectories go both ways: natively through ``capo_train.rows.build_rows`` and the estimator
input the trainer builds (``capo_train.update.compute_targets``), and through the verl path (the
``capo_env`` agent loop's per-action outputs, ``AgentLoopOutput.as_dict``, verl's padded response tensors,
TransferQueue-style keys, the critic's values in verl's left-shifted layout) into
``capo_train.integrations.verl.core.action_targets`` and the registered verl losses. Runs in the verl venv.
"""

import random

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402

from capo_train.algorithms import action_ppo_loss, get, value_loss  # noqa: E402
from capo_train.algorithms.estimators import StepBatch  # noqa: E402
from capo_train.integrations.verl.agent_loop import CapoEnvAgentLoop  # noqa: E402
from capo_train.integrations.verl.core import ESTIMATORS, LOSSES, action_targets  # noqa: E402
from capo_train.rows import ActionRecord, Trajectory, build_rows, gather_actions  # noqa: E402
from capo_train.update import shift_right  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)


def make_trajectories(seed: int = 0) -> list[Trajectory]:
    """3 tasks x 2 rollouts, 1-4 actions each, prompts of 3-9 tokens, actions of 1-7 tokens, sparse and
    dense rewards, some trajectories truncated; repeated anchors so GiGPO has step groups."""
    rng = random.Random(seed)
    trajs = []
    for i in range(6):
        n = rng.randint(1, 4)
        actions = []
        for t in range(n):
            length = rng.randint(1, 7)
            actions.append(ActionRecord(
                prompt_ids=[rng.randrange(1, 50) for _ in range(rng.randint(3, 9))],
                action_ids=[rng.randrange(1, 50) for _ in range(length)],
                old_logprobs=[-rng.random() for _ in range(length)],
                reward=rng.choice([0.0, 0.0, 1.0, 0.5]) if t == n - 1 else rng.choice([0.0, 0.25]),
                action_valid=True, obs_ids=[]))
        truncated = i % 3 == 2
        trajs.append(Trajectory(traj_id=i, task_id=str(i // 2), group_id=i // 2, actions=actions,
                                terminated=not truncated, truncated=truncated, metrics={},
                                anchors=[f"obs{t % 2}" for t in range(n)]))
    return trajs


def verl_rows(trajs: list[Trajectory], bootstrap_row: bool = False):
    """What verl's V1 trainer holds for these trajectories: one row per action (and with ``bootstrap_row``
    one after each env-truncated episode), keyed ``{uid}_{session}_{index}``, padded response tensors,
    extra_fields as the agent loop wrote them."""
    keys, prompts, masks, extras = [], [], [], []
    for traj in trajs:
        outputs = CapoEnvAgentLoop.outputs(traj, ["stop"] * len(traj.actions), [], bootstrap_row=bootstrap_row)
        for t, out in enumerate(outputs):
            d = out.as_dict()
            keys.append(f"task{traj.group_id}_{traj.traj_id}_{t}")
            prompts.append(d["prompts"])
            masks.append(d["response_mask"])
            extras.append(d["extra_fields"])
    L = max(len(m) for m in masks)
    response_mask = torch.zeros(len(masks), L, dtype=torch.long)
    for r, m in enumerate(masks):
        response_mask[r, : len(m)] = m
    return keys, prompts, response_mask, extras


def native_step_batch(batch, critic_out):
    """The estimator input exactly as capo_train.update.compute_targets builds it (final_value 0)."""
    return StepBatch(
        reward=batch.reward, traj_index=batch.traj_index, step_index=batch.step_index,
        group_index=batch.group_index, truncated=batch.truncated, final_value=torch.zeros(batch.num_actions),
        response_mask=batch.action_mask, anchor=batch.anchor,
        values=critic_out[batch.boundary_row, batch.boundary_pos],
        token_values=gather_actions(shift_right(critic_out), batch),
    )


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_advantages_and_returns_match_capo_train(estimator):
    trajs = make_trajectories()
    batch = build_rows(trajs, "per_action", pad_id=0)
    torch.manual_seed(0)
    critic_out = torch.randn(batch.input_ids.shape)  # the critic's output at every position of each row [R, S]

    keys, prompts, response_mask, extras = verl_rows(trajs)
    # verl's critic values: values[r, j] = output at the position before response token j
    # (no_padding_2_padding's left shift), so column 0 is the last prompt token's: V(s_t).
    verl_values = torch.zeros(response_mask.shape)
    for r, p in enumerate(prompts):
        n = int(response_mask[r].sum())
        verl_values[r, :n] = critic_out[r, len(p) - 1 : len(p) - 1 + n]

    algo = get(ESTIMATORS[estimator]).bind({"bootstrap_truncated": False})
    step = native_step_batch(batch, critic_out)
    token_kl = None
    if algo.kl_in_reward:  # RLOO, REINFORCE++: k1 = old - ref log-probs per action token, in the reward
        token_kl = torch.where(batch.action_mask.bool(), 0.1 * torch.randn(batch.action_mask.shape), 0)
        step.token_kl = token_kl
    native = algo.estimate(step)
    ours = action_targets(keys, response_mask, extras, estimator=estimator,
                          values=verl_values if algo.needs_critic else None, token_kl=token_kl)

    m = batch.action_mask.bool()
    expect_adv = native.advantages if native.advantages.dim() == 2 else native.advantages[:, None].expand_as(m)
    expect_ret = native.returns if native.returns.dim() == 2 else native.returns[:, None].expand_as(m)
    torch.testing.assert_close(ours.advantages, torch.where(m, expect_adv, 0), **TOL)
    torch.testing.assert_close(ours.returns, torch.where(m, expect_ret, 0), **TOL)


def test_padding_rows_get_zero_and_change_nothing():
    trajs = make_trajectories(1)
    keys, _, response_mask, extras = verl_rows(trajs)
    values = torch.randn(response_mask.shape)
    plain = action_targets(keys, response_mask, extras, estimator="capo_action_gae", values=values)
    # verl's padding rows copy a real row's fields (extra_fields included) with an all-zero response mask
    pad_mask = torch.cat([response_mask, torch.zeros(2, response_mask.shape[1], dtype=torch.long)])
    padded = action_targets(keys + ["padabc_0_0", "padabc_1_0"], pad_mask, extras + [extras[0]] * 2,
                            estimator="capo_action_gae", values=torch.cat([values, torch.randn(2, values.shape[1])]),
                            is_padding=[False] * len(keys) + [True, True])
    torch.testing.assert_close(padded.advantages[: len(keys)], plain.advantages)
    assert padded.advantages[len(keys):].abs().sum() == 0 and padded.returns[len(keys):].abs().sum() == 0


@pytest.mark.parametrize("estimator", ["capo_action_gae", "capo_token_gae"])
def test_truncated_episodes_bootstrap_from_the_bootstrap_row_as_capo_train_does(estimator):
    """An env-truncated episode's extra row (its final state, response mask 0) carries V(s_{T+1}) as
    values[:, 0]; the advantages equal capo_train's with ``final_value`` = that value (capo train's
    ``final_values``), and differ from the authors' no-bootstrap ones."""
    trajs = make_trajectories(2)
    g = torch.Generator().manual_seed(5)
    final_v = {}
    for traj in trajs:
        if traj.truncated:
            traj.final_prompt_ids = [7, 8, 9]
            final_v[traj.traj_id] = float(torch.randn(1, generator=g)) + 2.0
    assert final_v
    batch = build_rows(trajs, "per_action", pad_id=0)
    critic_out = torch.randn(batch.input_ids.shape, generator=g)
    keys, prompts, response_mask, extras = verl_rows(trajs, bootstrap_row=True)
    assert sum(bool(e.get("capo_bootstrap")) for e in extras) == len(final_v)  # one per truncated episode
    values = torch.zeros(response_mask.shape)
    a = 0
    for r, (traj_key, e) in enumerate(zip(keys, extras)):
        if e.get("capo_bootstrap"):
            values[r, 0] = final_v[int(traj_key.split("_")[1])]  # the critic at the final state's last token
        else:
            n = int(response_mask[r].sum())
            values[r, :n] = critic_out[a, len(prompts[r]) - 1 : len(prompts[r]) - 1 + n]
            a += 1
    ours = action_targets(keys, response_mask, extras, estimator=estimator, values=values)

    step = native_step_batch(batch, critic_out)
    step.final_value = torch.tensor([final_v.get(int(t), 0.0) for t in batch.traj_index.tolist()])
    native = get(ESTIMATORS[estimator]).bind({}).estimate(step)  # capo_train's default: bootstrap_truncated=True
    authors = get(ESTIMATORS[estimator]).bind({"bootstrap_truncated": False}).estimate(step)
    action_rows = [r for r, e in enumerate(extras) if not e.get("capo_bootstrap")]
    m = batch.action_mask.bool()
    expect = native.advantages if native.advantages.dim() == 2 else native.advantages[:, None].expand_as(m)
    got = ours.advantages[action_rows][:, : m.shape[1]]
    torch.testing.assert_close(got, torch.where(m, expect, 0), **TOL)
    assert not torch.allclose(native.advantages, authors.advantages)  # bootstrapping changed something
    boot_rows = [r for r, e in enumerate(extras) if e.get("capo_bootstrap")]
    assert ours.advantages[boot_rows].abs().sum() == 0 and ours.returns[boot_rows].abs().sum() == 0


def actor_config(loss_mode: str, clip: float):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4,
                       clip_ratio=clip, clip_ratio_low=clip, clip_ratio_high=clip,
                       policy_loss=PolicyLossConfig(loss_mode=loss_mode), use_dynamic_bsz=False)


def loss_inputs(seed: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    A, L = 7, 9
    lengths = torch.randint(1, L + 1, (A,), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]).long()
    old = -torch.rand(A, L, generator=g)
    logp = (old + scale * torch.randn(A, L, generator=g)).requires_grad_(True)
    adv = torch.randn(A, generator=g)
    return logp, old, adv, mask


@pytest.mark.parametrize("loss_mode", sorted(LOSSES))
@pytest.mark.parametrize("scale", [1e-4, 0.05])  # no action clipped / about 1 in 7 clipped
def test_policy_loss_value_and_gradient_match_capo_train(loss_mode, scale):
    import capo_train.integrations.verl.plugin  # noqa: F401
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    clip = 3e-4 if scale < 1e-3 else 0.02
    logp, old, adv, mask = loss_inputs(0, scale)
    adv_tokens = adv[:, None] * mask  # verl broadcasts the action's advantage over its tokens
    fn = get_policy_loss_fn(loss_mode)
    loss, metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv_tokens, response_mask=mask.bool(),
                       loss_agg_mode="seq-mean-token-mean", config=actor_config(loss_mode, clip),
                       rollout_is_weights=None)
    (grad,) = torch.autograd.grad(loss, logp)

    logp2 = logp.detach().clone().requires_grad_(True)
    ref, diag = action_ppo_loss(logp2, old, adv, mask, ratio_mode=LOSSES[loss_mode], clip_low=clip,
                                clip_high=clip, token_scale="exact")
    (ref_grad,) = torch.autograd.grad(ref, logp2)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(diag["clip_frac"]), abs=1e-6)
    assert (float(diag["clip_frac"]) > 0) == (scale > 1e-3)  # both regimes are exercised


def test_policy_loss_normalises_over_the_global_batch():
    """With verl's global batch info (2 data-parallel ranks, each holding half of the actions), the sum
    of the two ranks' gradients is the gradient of the whole batch's loss (mu per micro-batch aside: the
    geometric-mean ratio has none)."""
    import capo_train.integrations.verl.plugin  # noqa: F401
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    logp, old, adv, mask = loss_inputs(1, 0.01)
    fn = get_policy_loss_fn("capo_action_geomean")
    whole = fn(old_log_prob=old, log_prob=logp, advantages=adv[:, None] * mask, response_mask=mask.bool(),
               config=actor_config("capo_action_geomean", 0.02))[0]
    (g_whole,) = torch.autograd.grad(whole, logp)
    halves = []
    for part in (slice(0, 4), slice(4, 7)):
        cfg = actor_config("capo_action_geomean", 0.02)
        cfg.global_batch_info.update(dp_size=2, global_batch_size=7)
        loss = fn(old_log_prob=old[part], log_prob=logp[part], advantages=(adv[:, None] * mask)[part],
                  response_mask=mask[part].bool(), config=cfg)[0]
        halves.append(torch.autograd.grad(loss, logp)[0] / 2)  # DDP averages the ranks' gradients
    torch.testing.assert_close(halves[0] + halves[1], g_whole, **TOL)


def test_boundary_critic_loss_matches_capo_train_value_loss():
    from capo_train.integrations.verl.losses import boundary_value_loss

    _, _, _, mask = loss_inputs(2, 0.0)
    g = torch.Generator().manual_seed(3)
    vpreds, old_values, returns = (torch.randn(mask.shape, generator=g) for _ in range(3))
    loss, clipfrac = boundary_value_loss(vpreds, old_values, returns, mask.bool(), cliprange_value=0.5)
    ref, diag = value_loss(vpreds[:, 0], old_values[:, 0], returns[:, 0], cliprange=0.5)
    torch.testing.assert_close(loss, ref, **TOL)
    # the other response tokens do not matter
    noisy = vpreds.clone()
    noisy[:, 1:] += 100.0
    torch.testing.assert_close(boundary_value_loss(noisy, old_values, returns, mask.bool(), cliprange_value=0.5)[0],
                               ref, **TOL)
