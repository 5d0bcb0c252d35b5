"""The ``capo_env`` verl agent loop against a real capo env (capo/SynthChain-v0), no model: verl's server is
replaced by a scripted one that answers token ids and log-probs by a fixed rule of the prompt, and
capo_train's own rollout plays the same episode with the same rule, so both must record the same actions.
Runs in the verl venv.
"""

import asyncio
import random

import pytest

pytest.importorskip("verl")

import gymnasium as gym  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import capo_envs  # noqa: E402,F401
from capo_train.backends.base import Generation  # noqa: E402
from capo_train.integrations.verl.agent_loop import CapoEnvAgentLoop  # noqa: E402
from capo_train.integrations.verl.core import end_reason  # noqa: E402
from capo_train.models import make_tiny_tokenizer  # noqa: E402
from capo_train.rollout import RolloutSettings, collect  # noqa: E402

ENV_ID, ENV_KWARGS = "capo/SynthChain-v0", {"k": 4}
MAX_ACTION_TOKENS = 24
TEXTS = ["<go>left</go>", "<go>right</go>", "I am not sure which door " * 4]  # the last one runs past the budget


def scripted(tokenizer, prompt_ids, max_tokens):
    """Token ids and log-probs for a prompt: one of TEXTS picked by the prompt's tokens, cut at max_tokens."""
    ids = tokenizer.encode(TEXTS[sum(prompt_ids) % len(TEXTS)], add_special_tokens=False)[:max_tokens]
    return ids, [-0.01 * (i + 1) for i in range(len(ids))]


class ScriptedServer:
    """Stands in for verl's ``server_manager`` (``generate(request_id, prompt_ids=, sampling_params=)``)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, dict(sampling_params)))
        ids, logprobs = scripted(self.tokenizer, prompt_ids, sampling_params["max_tokens"])
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")  # verl: stop = length


class ScriptedBackend:
    """The same rule as capo_train's GenerationBackend."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, *, stop, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        out = []
        for p in prompts:
            ids, logprobs = scripted(self.tokenizer, p, max_new_tokens)
            out.append(Generation(ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True), "stop"))
        return out


def make_loop(tokenizer, prompt_length=4096, critic=False):
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": prompt_length,
                                                              "response_length": MAX_ACTION_TOKENS}}, "data": {},
                            "critic": {"enable": critic}})
    return CapoEnvAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=ScriptedServer(tokenizer),
                            tokenizer=tokenizer, processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data))


def native_episode(tokenizer, task_id, seed, prompt_length=4096):
    env = gym.make(ENV_ID, **ENV_KWARGS)
    settings = RolloutSettings(max_action_tokens=MAX_ACTION_TOKENS, max_prompt_tokens=prompt_length)
    (traj,) = collect([env], ScriptedBackend(tokenizer), tokenizer, settings, tasks_per_batch=1, group_size=1,
                      task_ids=[task_id], seed=seed)
    env.close()
    return traj


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


@pytest.mark.parametrize("task_index", [0, 1, 2])
@pytest.mark.parametrize("prompt_length", [4096, 400])  # 400: the state outgrows the budget mid-episode
def test_one_output_per_action_matching_capo_train_rollout(tokenizer, task_index, prompt_length):
    env = gym.make(ENV_ID, **ENV_KWARGS)
    task_id = env.unwrapped.task_ids()[task_index]
    env.close()
    seed = 7
    reset_seed = random.Random(seed).randrange(2**31)  # what collect() passes to reset for its first episode
    loop = make_loop(tokenizer, prompt_length)
    spec = {"env_id": ENV_ID, "env_kwargs": ENV_KWARGS, "task_id": task_id, "seed": reset_seed}
    outputs = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, extra_info=spec, uid="u", raw_prompt=[]))
    traj = native_episode(tokenizer, task_id, seed, prompt_length)

    assert len(outputs) == len(traj.actions) >= 1
    for t, (out, action) in enumerate(zip(outputs, traj.actions)):
        assert out.prompt_ids == action.prompt_ids  # the same state tokens as capo_train's rollout
        assert out.response_ids == action.action_ids
        assert out.response_mask == [1] * len(action.action_ids)  # observations are never action tokens
        assert out.response_logprobs == pytest.approx(action.old_logprobs)
        extra = out.extra_fields
        assert extra["capo_reward"] == action.reward and extra["capo_step"] == t
        assert extra["capo_action_valid"] == action.action_valid
        assert extra["capo_anchor"] == traj.anchors[t]
        assert (extra["capo_terminated"], extra["capo_truncated"]) == (traj.terminated, traj.truncated)
        assert out.reward_score == pytest.approx(sum(a.reward for a in traj.actions))  # the episode's return
        d = out.as_dict()  # what verl stores: rollout_log_probs aligned with the response tokens
        assert d["rollout_log_probs"].shape == d["responses"].shape == d["response_mask"].shape
    if prompt_length == 4096:
        assert traj.terminated and not traj.truncated
    # sampling parameters: the env's stop strings, kept in the output; the per-action budget
    params = loop.server_manager.calls[0][1]
    assert params["stop"] == ["</go>"] and params["include_stop_str_in_output"] is True
    assert params["max_tokens"] == MAX_ACTION_TOKENS and params["logprobs"] is True
    assert len({rid for rid, _ in loop.server_manager.calls}) == 1  # one sticky session per episode


def test_truncated_actions_are_detected(tokenizer):
    """verl reports vLLM's "stop" and "length" both as "completed": the loop tells them apart itself."""
    env = gym.make(ENV_ID, **ENV_KWARGS)
    task_ids = env.unwrapped.task_ids()
    env.close()
    reasons = {}
    for task_id in task_ids[:6]:
        outputs = asyncio.run(make_loop(tokenizer).run({}, extra_info={"env_id": ENV_ID, "env_kwargs": ENV_KWARGS,
                                                                       "task_id": task_id, "seed": 0}))
        for out in outputs:
            text = tokenizer.decode(out.response_ids)
            reasons[out.extra_fields["capo_finish_reason"]] = text
            if out.extra_fields["capo_finish_reason"] == "length":
                assert len(out.response_ids) == MAX_ACTION_TOKENS and not out.extra_fields["capo_action_valid"]
    assert reasons.keys() == {"stop", "length"}


@pytest.mark.parametrize("critic", [True, False])
def test_an_env_truncated_episode_gets_a_bootstrap_row_when_a_critic_values_it(tokenizer, critic):
    env = gym.make(ENV_ID, **ENV_KWARGS)
    task_id = env.unwrapped.task_ids()[0]
    env.close()
    spec = {"env_id": ENV_ID, "env_kwargs": {**ENV_KWARGS, "max_episode_steps": 2}, "task_id": task_id, "seed": 0}
    outputs = asyncio.run(make_loop(tokenizer, critic=critic).run({}, extra_info=spec))
    assert all(o.extra_fields["capo_truncated"] for o in outputs)  # Gymnasium's TimeLimit cut it
    actions = [o for o in outputs if not o.extra_fields.get("capo_bootstrap")]
    assert len(actions) == 2
    if not critic:
        assert len(outputs) == 2
        return
    boot = outputs[-1]
    assert len(outputs) == 3 and boot.extra_fields["capo_bootstrap"] and boot.extra_fields["capo_step"] == 2
    assert boot.response_mask == [0] and len(boot.response_ids) == 1  # no loss token
    last = actions[-1]
    assert boot.prompt_ids[: len(last.prompt_ids) + len(last.response_ids)] == last.prompt_ids + last.response_ids
    assert len(boot.prompt_ids) > len(last.prompt_ids) + len(last.response_ids)  # plus the final observation


def test_end_reason():
    assert end_reason([1, 2], "<go>left</go>", ["</go>"], [9], 2) == "stop"  # a stop string wins at the budget
    assert end_reason([1, 9], "left", ["</go>"], [9], 5) == "eos"
    assert end_reason([1, 2, 3], "left r", ["</go>"], [9], 3) == "length"
    assert end_reason([1], "left", ["</go>"], [9], 3) == "stop"  # a stop token id below the budget


def test_dataset_rows_drive_the_loop(tokenizer, tmp_path):
    """Rows written by the dataset helper, read by verl's own RLHFDataset, are what the loop plays."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from capo_train.integrations.verl.dataset import task_rows, write_parquet

    path = write_parquet(task_rows(ENV_ID, split="train", env_kwargs=ENV_KWARGS, count=3), tmp_path / "t.parquet")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": True,
                               "truncation": "error", "return_raw_chat": True})
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config)
    assert len(dataset) == 3
    row = dataset[1]  # the fields verl hands to the agent loop as keyword arguments
    assert row["agent_name"] == "capo_env" and row["extra_info"]["task_id"] == "synthchain-0-train-1"
    outputs = asyncio.run(make_loop(tokenizer).run({}, **row))
    assert outputs and all(o.extra_fields["capo_step"] == t for t, o in enumerate(outputs))
