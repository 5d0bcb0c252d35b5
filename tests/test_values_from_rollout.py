"""The shared critic's values from the hidden states the HF rollout recorded (``HFBackend(keep_features=True)``)
equal the values of the critic's own pass over the rows, in both row layouts and at every action token, so
the trainer can skip that pass (``update.values_from_features``). A wrong offset (the hidden state after a
token instead of before it) or a prefix-reuse mix-up fails these."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import capo_envs  # noqa: F401  (registers the ids)
from capo_train.backends import HFBackend
from capo_train.models import build_actor_critic
from capo_train.models.logprobs import evaluating
from capo_train.rollout import RolloutSettings, collect
from capo_train.rows import action_features, build_rows, gather_actions
from capo_train.update import final_values, reads_features, shift_right, values_from_features


@pytest.fixture(scope="module")
def actor_critic(tiny_model_dir):
    torch.manual_seed(0)
    model, tokenizer = build_actor_critic(tiny_model_dir, critic="shared")
    # A head whose values vary visibly across positions (the default starts near 0 everywhere).
    torch.nn.init.normal_(model.critic.head.linear.weight, std=1.0)
    return model, tokenizer


def trajectories(model, tokenizer, state: str, reuse_prefixes: bool = True):
    envs = [gym.make("capo/SynthHop-v0", size="tiny", k=1, max_passage_chars=40) for _ in range(3)]
    backend = HFBackend(model.actor, tokenizer, batch_size=3, keep_features=True, reuse_prefixes=reuse_prefixes)
    settings = RolloutSettings(max_action_tokens=12, max_prompt_tokens=4000, state=state, window=1)
    return collect(envs, backend, tokenizer, settings, tasks_per_batch=3, group_size=1, seed=5), backend


@pytest.mark.parametrize("state,layout", [("concat", "packed"), ("concat", "per_action"), ("window", "per_action")])
def test_recorded_features_give_the_critic_pass_values(actor_critic, state, layout):
    model, tokenizer = actor_critic
    trajs, backend = trajectories(model, tokenizer, state)
    assert sum(len(t.actions) for t in trajs) >= 4  # several turns, so prefix reuse is exercised
    batch = build_rows(trajs, layout, backend.pad_id)
    features = action_features(trajs)
    assert features is not None and reads_features(model)
    values, token_values = values_from_features(model, features, batch)  # [A], [A, L]
    with evaluating(model):
        rows = model(batch.input_ids, batch.attention_mask, need_values=True, need_logp=False).values  # [R, S]
    expected = rows[batch.boundary_row, batch.boundary_pos]
    expected_tokens = gather_actions(shift_right(rows), batch)
    assert values.abs().max() > 1e-2  # the head is not flat: a wrong position would show
    torch.testing.assert_close(values, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(token_values, expected_tokens, atol=1e-4, rtol=1e-4)


def test_features_are_one_per_action_token_and_absent_without_the_flag(actor_critic):
    model, tokenizer = actor_critic
    trajs, _ = trajectories(model, tokenizer, "concat", reuse_prefixes=False)
    for action in (a for t in trajs for a in t.actions):
        assert action.state_features.shape == (len(action.action_ids), model.actor.config.hidden_size)
    backend = HFBackend(model.actor, tokenizer)
    generation = backend.generate([[1, 2, 3]], stop=[], max_new_tokens=3)[0]
    assert generation.features is None
    trajs[0].actions[0].state_features = None  # one action without them: the trainer makes its own pass
    assert action_features(trajs) is None


def test_truncated_episodes_bootstrap_values_come_from_the_rollout(actor_critic):
    """An episode the env truncates records its final state's hidden state (``HFBackend.prompt_features``,
    a prefill of the final observation after the cached prefix): the bootstrap value read from it equals
    the critic's pass over the whole final state, and the prefill reused the episode's cached tokens."""
    model, tokenizer = actor_critic
    envs = [gym.make("capo/SynthHop-v0", size="tiny", k=1, max_passage_chars=40, max_steps=2) for _ in range(4)]
    backend = HFBackend(model.actor, tokenizer, batch_size=4, keep_features=True)
    settings = RolloutSettings(max_action_tokens=12, max_prompt_tokens=4000)
    trajs = collect(envs, backend, tokenizer, settings, tasks_per_batch=4, group_size=1, seed=5)
    cut = [t for t in trajs if t.truncated and t.final_prompt_ids]
    assert cut and all(t.final_features is not None for t in cut)
    assert all(t.final_features is None for t in trajs if not t.truncated)
    batch = build_rows(trajs, "packed", backend.pad_id)
    from_rollout = final_values(model, trajs, batch, backend.pad_id)  # [A]
    recorded = cut[0].final_features
    for t in trajs:
        t.final_features = None  # the critic's own pass over each final state
    from_pass = final_values(model, trajs, batch, backend.pad_id)
    assert from_pass.abs().max() > 1e-2  # the head is not flat, and some actions bootstrap
    torch.testing.assert_close(from_rollout, from_pass, atol=1e-4, rtol=1e-4)
    # the truncated episodes all ended on the last turn, whose sequences the backend still caches: their
    # final states prefill only the last action's tail and the final observation
    before, states = backend.prefilled_tokens, [t.final_prompt_ids for t in cut]
    backend.prompt_features(states)
    assert 0 < backend.prefilled_tokens - before < sum(map(len, states)) / 2
    # without a cached prefix (a fresh backend) the same state gives the same features
    fresh = HFBackend(model.actor, tokenizer, keep_features=True)
    torch.testing.assert_close(fresh.prompt_features([cut[0].final_prompt_ids])[0], recorded, atol=1e-4, rtol=1e-4)
    assert fresh.reused_tokens == 0 and backend.reused_tokens > 0
    with pytest.raises(RuntimeError, match="keep_features"):
        HFBackend(model.actor, tokenizer).prompt_features([[1, 2, 3]])
