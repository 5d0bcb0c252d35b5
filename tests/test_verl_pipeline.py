"""verl's V1 data path on CPU with every piece real except the model workers: a local Ray cluster and the real
TransferQueue, verl's ``RLHFDataset`` and dataloader on Parquet rows written by
``capo_train.integrations.verl.dataset``, the trainer's own ``prepare_step`` (uids, prompt tags), verl's
``AgentLoopWorkerTQ`` running the ``capo_env`` agent loop against a real capo env and writing one row per
action, the ``ReplayBuffer`` sampling rows of varying count per prompt, ``upsample_batch_to_divisible_size``
adding verl's padding rows, then ``capo_sync``'s ``_compute_advantage`` reading and writing TransferQueue.

The one stand-in is the LLM server (a sampler of scripted texts, as in test_verl_agent_loop.py) and the
critic's values (random, written as verl's ``_compute_values`` leaves them). Every trajectory is replayed
through ``capo_train.rollout.collect`` with the same tokens, and the advantages must equal capo_train's own
estimator on those trajectories. Runs in the verl venv (about 15 s: Ray's start-up).
"""

import asyncio
import json
import os
import random

import pytest

pytest.importorskip("verl")

import gymnasium as gym  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402
from verl.workers.utils.padding import response_to_nested  # noqa: E402

import capo_envs  # noqa: E402,F401
from capo_train.algorithms import get  # noqa: E402
from capo_train.backends.base import Generation  # noqa: E402
from capo_train.integrations.verl.core import ESTIMATORS  # noqa: E402
from capo_train.rollout import RolloutSettings, collect  # noqa: E402
from capo_train.rows import build_rows  # noqa: E402
from test_verl_agent_loop import ENV_ID, ENV_KWARGS, MAX_ACTION_TOKENS, TEXTS  # noqa: E402
from test_verl_config import example_overrides  # noqa: E402
from test_verl_parity import native_step_batch  # noqa: E402

PROMPTS, SESSIONS, DP_RANKS = 3, 2, 5  # 5 data-parallel ranks: a batch multiple the rows rarely meet -> padding


class SamplingServer:
    """verl's ``server_manager``: each episode (request id) draws its texts from its own seeded generator, so the
    sessions of one prompt differ, as sampled rollouts do."""

    def __init__(self, tokenizer):
        self.tokenizer, self.rngs = tokenizer, {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        rng = self.rngs.setdefault(request_id, random.Random(len(self.rngs)))
        ids = self.tokenizer.encode(rng.choice(TEXTS), add_special_tokens=False)[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-rng.random() for _ in ids], stop_reason="completed")


class ReplayBackend:
    """capo_train's generation interface answering each state with the tokens verl recorded for it."""

    def __init__(self, tokenizer, table: dict[tuple, tuple[list, list]]):
        self.tokenizer, self.table = tokenizer, table

    def generate(self, prompts, *, stop, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        out = []
        for p in prompts:
            ids, logprobs = self.table[tuple(p)]
            out.append(Generation(ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True), "stop"))
        return out


def verl_config(workdir):
    """docs/scaleout.md's example command, with a tiny local model, a small batch and 2 sessions per prompt."""
    import verl
    from hydra import compose, initialize_config_dir

    from capo_train.integrations.verl.dataset import task_rows, write_parquet
    from capo_train.models import make_tiny_llama

    model, tokenizer = make_tiny_llama()
    model.save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "model")
    for split in ("train", "dev"):
        # one task of SynthChain with k = 2, 3, 4 doors, the last cut by Gymnasium's TimeLimit after 3 steps
        # (truncated: a bootstrap row follows): episodes of 2, 3, 3 actions, so rows per prompt vary
        kwargs = [{**ENV_KWARGS, "k": 2}, {**ENV_KWARGS, "k": 3}, {**ENV_KWARGS, "k": 4, "max_episode_steps": 3}]
        rows = [task_rows(ENV_ID, split=split, env_kwargs=kw, count=1)[0] for kw in kwargs]
        for i, row in enumerate(rows):  # the reset seed capo_train's collect(seed=i) uses for its first episode
            row["extra_info"].update(index=i, seed=random.Random(i).randrange(2**31))
        write_parquet(rows, workdir / f"{split}.parquet")
    mine = {"data.train_batch_size": PROMPTS, "data.max_prompt_length": 4096, "data.max_response_length":
            MAX_ACTION_TOKENS, "data.dataloader_num_workers": 0, "data.shuffle": False,
            "actor_rollout_ref.rollout.n": SESSIONS, "actor_rollout_ref.rollout.prompt_length": 4096,
            "actor_rollout_ref.rollout.response_length": MAX_ACTION_TOKENS,
            "actor_rollout_ref.actor.ppo_mini_batch_size": PROMPTS, "critic.ppo_mini_batch_size": PROMPTS,
            "data.train_files": workdir / "train.parquet", "data.val_files": workdir / "dev.parquet"}
    overrides = [o.replace("Qwen/Qwen3-1.7B", str(workdir / "model")) for o in example_overrides()
                 if o.split("=")[0] not in mine]
    overrides += [f"{k}={v}" for k, v in mine.items()]
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides), tokenizer


class InProcessAgentLoops:
    """verl's ``AgentLoopManagerTQ`` with its one ``AgentLoopWorkerTQ`` in this process instead of a Ray actor:
    the worker's own ``generate_sequences`` (per-sample tasks, ``rollout.n`` sessions, status tags) and
    ``_agent_loop_postprocess`` (one TransferQueue row per output) run unchanged."""

    def __init__(self, config, tokenizer):
        from verl.experimental.agent_loop.agent_loop import get_dataset_class
        from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

        cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class
        worker = cls.__new__(cls)  # the attributes AgentLoopWorker.__init__ sets that these paths read
        worker.config, worker.tokenizer, worker.processor, worker.hf_model_type = config, tokenizer, None, None
        worker.llm_client, worker.tools = SamplingServer(tokenizer), []
        worker.dataset_cls = get_dataset_class(config.data)
        worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
        worker.background_tasks = set()
        self.worker = worker

    def generate_sequences(self, batch):
        async def run():
            await self.worker.generate_sequences(batch)
            while self.worker.background_tasks:
                await asyncio.gather(*list(self.worker.background_tasks))

        asyncio.run(run())


@pytest.fixture(scope="module")
def v1_step(tmp_path_factory):
    """One V1 step up to the critic's values: ``(trainer, sampled batch with padding, rows before padding,
    replayed trajectories)``."""
    # TransferQueue's controller and storage units are Ray actors that each hold a CPU: with Ray's default
    # (the 2 cores of a CI machine) tq.init() waits for them forever, so declare more.
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init()
    try:
        from capo_train.integrations.verl.trainer import CapoSyncTrainer

        config, tokenizer = verl_config(tmp_path_factory.mktemp("verl"))
        trainer = CapoSyncTrainer(config)  # verl's constructor: registrations asserted, replay buffer built
        trainer.tokenizer, trainer.processor, trainer.global_steps = tokenizer, None, 1
        trainer._init_dataloader()
        trainer.agent_loop_manager = InProcessAgentLoops(config, tokenizer)
        trainer.prepare_step()  # dataloader batch -> uids -> TransferQueue prompt tags -> agent loops
        batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=PROMPTS)
        real_rows = len(batch)
        batch = upsample_batch_to_divisible_size(batch, trainer._get_required_batch_multiple(DP_RANKS),
                                                 tokenizer.eos_token_id)
        # what verl's _compute_old_log_prob and _compute_values leave, jagged, one per response token: the
        # actor's log-probs of the sampled tokens (the engine's, a little off) and the critic's values
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["response_mask", "rollout_log_probs"])
        padded = data.to_padded_tensor()
        torch.manual_seed(0)
        values = torch.randn(padded["response_mask"].shape)
        old_log_probs = padded["rollout_log_probs"] + 0.3 * torch.randn(values.shape)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(
            {"values": response_to_nested(values, data["response_mask"]),
             "old_log_probs": response_to_nested(old_log_probs, data["response_mask"])}, batch_size=len(batch)))
        yield trainer, batch, real_rows, replay(batch, tokenizer)
    finally:
        tq.close()
        if started:
            ray.shutdown()


def replay(batch, tokenizer):
    """Each trajectory in the batch played again by capo_train's rollout with the tokens verl recorded:
    ``{uid_session: Trajectory}``, in batch order, numbered as verl's keys group them."""
    keys = [k for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding")]
    rows = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                           select_fields=["prompts", "responses", "rollout_log_probs", "extra_info"])
    by_traj: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_traj.setdefault(key.rsplit("_", 1)[0], []).append(i)
    groups: dict[str, int] = {}
    trajs = {}
    settings = RolloutSettings(max_action_tokens=MAX_ACTION_TOKENS, max_prompt_tokens=4096)
    for n, (traj_key, idx) in enumerate(by_traj.items()):
        table = {tuple(rows["prompts"][i].tolist()): (rows["responses"][i].tolist(),
                                                      rows["rollout_log_probs"][i].tolist()) for i in idx}
        info = rows["extra_info"][idx[0]]
        env = gym.make(info["env_id"], **json.loads(info["env_kwargs"]))
        (traj,) = collect([env], ReplayBackend(tokenizer, table), tokenizer, settings, tasks_per_batch=1,
                          group_size=1, task_ids=[info["task_id"]], seed=int(info["index"]))
        env.close()
        traj.traj_id, traj.group_id = n, groups.setdefault(traj_key.rsplit("_", 1)[0], len(groups))
        trajs[traj_key] = traj
    return trajs


def row_kinds(batch) -> tuple[list[int], dict[str, int]]:
    """Indices of the batch's action rows, and ``{trajectory key: index}`` of its bootstrap rows."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    actions, boots = [], {}
    for i, (key, tag) in enumerate(zip(batch.keys, batch.tags)):
        if tag.get("is_padding"):
            continue
        if data["extra_fields"][i].get("capo_bootstrap"):
            boots[key.rsplit("_", 1)[0]] = i
        else:
            actions.append(i)
    return actions, boots


def test_v1_rows_are_one_per_action_of_every_sampled_episode(v1_step):
    trainer, batch, real_rows, trajs = v1_step
    actions, boots = row_kinds(batch)
    assert len(actions) == sum(len(t.actions) for t in trajs.values())
    truncated = {k for k, t in trajs.items() if t.truncated}
    assert len(truncated) == SESSIONS and set(boots) == truncated  # one bootstrap row per truncated episode
    assert real_rows == len(actions) + len(boots)
    assert len(trajs) == PROMPTS * SESSIONS and len({t.group_id for t in trajs.values()}) == PROMPTS
    assert len(batch) % trainer._get_required_batch_multiple(DP_RANKS) == 0
    assert sum(bool(tag.get("is_padding")) for tag in batch.tags) == len(batch) - real_rows
    lengths = [len(t.actions) for t in trajs.values()]
    assert min(lengths) >= 1 and len(set(lengths)) > 1  # rows per prompt vary: verl's mini-batches count rows
    # the rows hold exactly what capo_train's rollout recorded for the same tokens
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["prompts", "responses", "response_mask", "extra_fields"])
    for i in actions:
        traj_key, step = batch.keys[i].rsplit("_", 1)
        action = trajs[traj_key].actions[int(step)]
        assert data["prompts"][i].tolist() == action.prompt_ids and data["responses"][i].tolist() == action.action_ids
        assert data["extra_fields"][i]["capo_reward"] == action.reward
    for traj_key, i in boots.items():  # the state the env stopped in, as capo_train records it, no loss tokens
        assert data["prompts"][i].tolist() == trajs[traj_key].final_prompt_ids != []
        assert data["response_mask"][i].sum() == 0


@pytest.mark.parametrize("estimator", ["capo_action_gae", "capo_grpo"])
def test_advantages_through_transfer_queue_match_capo_train(v1_step, estimator):
    trainer, batch, _, trajs = v1_step
    trainer.capo_estimator, trainer.capo_overrides = estimator, {"gamma": 0.9, "lam": 0.95}
    trainer.use_critic, trainer.capo_kl_in_reward = estimator == "capo_action_gae", False
    metrics = {}
    trainer._compute_advantage(batch, metrics)

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["advantages", "returns", "values"])
    real, boots = row_kinds(batch)
    ordered = list(trajs.values())
    native_rows = build_rows(ordered, "per_action", pad_id=0)  # actions in trajectory order
    position = {}
    a = 0
    for traj_key, traj in trajs.items():
        for t in range(len(traj.actions)):
            position[f"{traj_key}_{t}"] = a
            a += 1
    critic = torch.zeros(native_rows.input_ids.shape)  # V(s_t) at each action's boundary, from verl's values
    for i in real:
        r = position[batch.keys[i]]
        start = int(native_rows.boundary_pos[r])
        v = data["values"][i]
        critic[r, start : start + len(v)] = v
    step = native_step_batch(native_rows, critic)
    # capo train's final_values: V of the state a truncated episode stopped in, here the critic's value there
    final = {k: float(data["values"][i][0]) for k, i in boots.items()}
    step.final_value = torch.tensor([final.get(k, 0.0) for k, t in trajs.items() for _ in t.actions])
    expected = get(ESTIMATORS[estimator]).bind({"gamma": 0.9, "lam": 0.95}).estimate(step)
    for i in real:
        r = position[batch.keys[i]]
        adv, ret = data["advantages"][i], data["returns"][i]
        torch.testing.assert_close(adv, expected.advantages[r].expand_as(adv), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ret, expected.returns[r].expand_as(ret), rtol=1e-5, atol=1e-6)
    for i in set(range(len(batch))) - set(real):  # padding and bootstrap rows
        assert data["advantages"][i].abs().sum() == 0
    assert metrics["capo/actions"] == len(real) and metrics["capo/trajectories"] == len(trajs)
    assert expected.advantages.abs().sum() > 0  # a batch where every advantage is 0 would prove nothing


def test_verls_rollout_correction_weights_capo_rows(v1_step):
    """``algorithm.rollout_correction`` (truncated IS between the engine's and the actor's log-probs) runs
    through verl's own function in capo_sync, as in verl's trainer, and leaves its weights for the loss."""
    from omegaconf import open_dict

    trainer, batch, _, _ = v1_step
    trainer.capo_estimator, trainer.capo_overrides = "capo_action_gae", {"gamma": 0.9, "lam": 0.95}
    trainer.use_critic, trainer.capo_kl_in_reward = True, False
    with open_dict(trainer.config):
        trainer.config.algorithm.rollout_correction.rollout_is = "token"
        trainer.config.algorithm.rollout_correction.rollout_is_threshold = 2.0
    try:
        metrics = {}
        trainer._compute_advantage(batch, metrics)
    finally:
        with open_dict(trainer.config):
            trainer.config.algorithm.rollout_correction.rollout_is = None
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["rollout_is_weights", "old_log_probs", "rollout_log_probs", "response_mask"])
    padded = data.to_padded_tensor()
    mask = padded["response_mask"].bool()
    expected = torch.exp(padded["old_log_probs"] - padded["rollout_log_probs"]).clamp(max=2.0)  # TIS, per token
    torch.testing.assert_close(padded["rollout_is_weights"][mask], expected[mask], rtol=1e-5, atol=1e-6)
    assert (padded["rollout_is_weights"][mask] < 2.0).any() and (padded["rollout_is_weights"][mask] == 2.0).any()
    assert any(name.startswith("rollout_corr/") for name in metrics)


@pytest.mark.parametrize("key, value, message", [
    ("use_kl_in_reward", True, "use_kl_in_reward"),  # verl's KL-in-reward step is not run by capo_sync
    ("rollout_correction.rollout_rs", "token_k1", "boundary critic"),  # would move V(s_t)'s position
])
def test_settings_capo_sync_cannot_honour_are_refused(v1_step, key, value, message):
    from omegaconf import OmegaConf, open_dict

    from capo_train.integrations.verl.trainer import CapoSyncTrainer

    trainer, *_ = v1_step
    config = trainer.config.copy()
    with open_dict(config):
        OmegaConf.update(config, f"algorithm.{key}", value)
        config.trainer.v1.trainer_mode = "capo_sync"
    with pytest.raises(ValueError, match=message):
        CapoSyncTrainer(config)
