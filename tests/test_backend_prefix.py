"""KV-prefix reuse in HFBackend: a multi-turn rollout gives the same tokens and log-probs with and
without it, while prefilling only the new tokens of each turn."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import capo_envs  # noqa: F401
from capo_train.backends.hf import HFBackend
from capo_train.models import make_tiny_llama
from capo_train.rollout import RolloutSettings, collect
from capo_train.rows import build_rows, gather_actions, token_logprobs


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    return model.eval(), tokenizer


def rollout(model, tokenizer, reuse: bool, greedy: bool, state: str = "concat", common: bool = False):
    envs = [gym.make("capo/SynthHop-v0", size="tiny", k=1, max_passage_chars=40) for _ in range(3)]
    backend = HFBackend(model, tokenizer, batch_size=3, reuse_prefixes=reuse, common_prefixes=common)
    settings = RolloutSettings(max_action_tokens=6, max_prompt_tokens=4000, greedy=greedy, state=state, window=1)
    trajectories = collect(envs, backend, tokenizer, settings, tasks_per_batch=3, group_size=1, seed=11)
    return trajectories, backend


@pytest.mark.parametrize("greedy", [True, False])
def test_reuse_changes_nothing_but_the_work(tiny, greedy):
    model, tokenizer = tiny
    fresh, fresh_backend = rollout(model, tokenizer, reuse=False, greedy=greedy)
    reused, reuse_backend = rollout(model, tokenizer, reuse=True, greedy=greedy)
    assert fresh_backend.reused_tokens == 0 and reuse_backend.reused_tokens > 0
    assert reuse_backend.prefilled_tokens < fresh_backend.prefilled_tokens / 2
    for a, b in zip(fresh, reused):
        assert [x.action_ids for x in a.actions] == [x.action_ids for x in b.actions]
        for x, y in zip(a.actions, b.actions):
            torch.testing.assert_close(torch.tensor(x.old_logprobs), torch.tensor(y.old_logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("greedy", [True, False])
def test_a_window_state_reuses_its_shared_head_and_changes_nothing_else(tiny, greedy):
    """A window prompt is rebuilt each step, so no earlier sequence is a whole prefix of it: only
    ``common_prefixes`` reuses the system prompt and task it shares with the episode's last sequence."""
    model, tokenizer = tiny
    fresh, fresh_backend = rollout(model, tokenizer, reuse=False, greedy=greedy, state="window")
    whole, whole_backend = rollout(model, tokenizer, reuse=True, greedy=greedy, state="window")
    common, common_backend = rollout(model, tokenizer, reuse=True, greedy=greedy, state="window", common=True)
    assert common_backend.reused_tokens > 4 * whole_backend.reused_tokens
    assert common_backend.prefilled_tokens < 0.75 * fresh_backend.prefilled_tokens
    for a, b in zip(fresh, common):
        assert [x.action_ids for x in a.actions] == [x.action_ids for x in b.actions]
        for x, y in zip(a.actions, b.actions):
            torch.testing.assert_close(torch.tensor(x.old_logprobs), torch.tensor(y.old_logprobs), atol=1e-4, rtol=0)


def test_reused_logprobs_match_a_fresh_forward(tiny):
    model, tokenizer = tiny
    trajectories, backend = rollout(model, tokenizer, reuse=True, greedy=False)
    assert backend.reused_tokens > 0
    batch = build_rows(trajectories, "packed", backend.pad_id)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    fresh = gather_actions(token_logprobs(logits, batch.input_ids), batch)
    torch.testing.assert_close(fresh, batch.old_logp, atol=1e-4, rtol=0)


def test_clear_prefixes_forgets(tiny):
    model, tokenizer = tiny
    _, backend = rollout(model, tokenizer, reuse=True, greedy=True)
    assert backend._prefixes
    backend.clear_prefixes()
    assert backend._prefixes == []
