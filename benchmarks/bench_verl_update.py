"""CPU cost of the verl path's CAPO pieces against capo_train's native ones, on the same tiny batch.

    OMP_NUM_THREADS=1 .venv-verl/bin/python benchmarks/bench_verl_update.py

Three comparisons, median of ``--repeats`` runs each (milliseconds):

- advantages: ``capo_train`` estimator on a ``StepBatch`` vs ``capo_train.integrations.verl.core.action_targets`` on verl's rows
  (TransferQueue keys parsed, padded ``[R, L]`` tensors, per-action results broadcast back);
- policy loss, forward + backward: ``capo_train.algorithms.action_ppo_loss`` vs the registered
  ``capo_action_ratio`` (verl's ``agg_loss``);
- rollout, one SynthChain episode per task with a scripted policy (no model): ``capo_train.rollout.collect``
  vs the ``capo_env`` agent loop (asyncio, env calls in threads, one output per action).

What it does not measure: verl's Ray actors, TransferQueue and FSDP workers, which need GPUs to run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import gymnasium as gym
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.rollout.replica import TokenOutput

import capo_envs  # noqa: F401  registers capo/* ids
from capo_train.algorithms import StepBatch, action_ppo_loss, get
from capo_train.backends.base import Generation
from capo_train.models import make_tiny_tokenizer
from capo_train.rollout import RolloutSettings, collect
from capo_train.rows import ActionRecord, Trajectory

from capo_train.integrations.verl import plugin  # noqa: F401  registrations
from capo_train.integrations.verl.agent_loop import CapoEnvAgentLoop
from capo_train.integrations.verl.core import action_targets

ENV_ID, ENV_KWARGS, MAX_TOKENS = "capo/SynthChain-v0", {"k": 8}, 24
TEXTS = ["<go>left</go>", "<go>right</go>"]


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def synthetic_trajectories(n: int, steps: int, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        acts = [ActionRecord(prompt_ids=[1] * 8, action_ids=[2] * rng.randint(4, 24),
                             old_logprobs=[], reward=float(t == steps - 1 and rng.random() < 0.5),
                             action_valid=True, obs_ids=[]) for t in range(steps)]
        for a in acts:
            a.old_logprobs = [-0.5] * len(a.action_ids)
        out.append(Trajectory(traj_id=i, task_id=str(i), group_id=i, actions=acts, terminated=True,
                              truncated=False, metrics={}, anchors=[""] * steps))
    return out


def bench_algorithms(trajs: list[Trajectory], repeats: int) -> dict[str, float]:
    rows = [(f"u{tr.group_id}_{tr.traj_id}_{t}", a) for tr in trajs for t, a in enumerate(tr.actions)]
    outputs = [o for tr in trajs for o in CapoEnvAgentLoop.outputs(tr, ["stop"] * len(tr.actions), [])]
    A, L = len(rows), max(len(a.action_ids) for _, a in rows)
    mask = torch.zeros(A, L)
    for r, (_, a) in enumerate(rows):
        mask[r, : len(a.action_ids)] = 1
    g = torch.Generator().manual_seed(0)
    values = torch.randn(A, L, generator=g)
    keys, extras = [k for k, _ in rows], [o.extra_fields for o in outputs]
    traj = torch.tensor([tr.traj_id for tr in trajs for _ in tr.actions])
    step = torch.tensor([t for tr in trajs for t in range(len(tr.actions))])
    reward = torch.tensor([a.reward for _, a in rows])
    algo = get("capo").bind({"bootstrap_truncated": False})

    def native_adv():
        algo.estimate(StepBatch(reward=reward, traj_index=traj, step_index=step, group_index=traj,
                                values=values[:, 0], response_mask=mask))

    def verl_adv():
        action_targets(keys, mask, extras, estimator="capo_action_gae", values=values)

    old = -torch.rand(A, L, generator=g)
    new = old + 0.01 * torch.randn(A, L, generator=g)
    adv = torch.randn(A, generator=g)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4,
                      clip_ratio_low=1e-3, clip_ratio_high=1e-3,
                      policy_loss=PolicyLossConfig(loss_mode="capo_action_ratio"))
    verl_loss = get_policy_loss_fn("capo_action_ratio")

    def native_loss():
        logp = new.clone().requires_grad_(True)
        action_ppo_loss(logp, old, adv, mask, ratio_mode="capo", clip_low=1e-3, clip_high=1e-3)[0].backward()

    def verl_loss_step():
        logp = new.clone().requires_grad_(True)
        verl_loss(old_log_prob=old, log_prob=logp, advantages=adv[:, None] * mask, response_mask=mask.bool(),
                  loss_agg_mode="seq-mean-token-mean", config=cfg)[0].backward()

    return {"actions": A, "advantages_native_ms": median_ms(native_adv, repeats),
            "advantages_verl_ms": median_ms(verl_adv, repeats),
            "policy_loss_native_ms": median_ms(native_loss, repeats),
            "policy_loss_verl_ms": median_ms(verl_loss_step, repeats)}


class _Server:
    def __init__(self, tok):
        self.tok = tok

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        ids = self.tok.encode(TEXTS[sum(prompt_ids) % 2], add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason="completed")


class _Backend:
    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, *, stop, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        out = []
        for p in prompts:
            ids = self.tok.encode(TEXTS[sum(p) % 2], add_special_tokens=False)
            out.append(Generation(ids, [-0.1] * len(ids), self.tok.decode(ids, skip_special_tokens=True), "stop"))
        return out


def bench_rollout(episodes: int, repeats: int) -> dict[str, float]:
    tok = make_tiny_tokenizer()
    env = gym.make(ENV_ID, **ENV_KWARGS)
    task_ids = env.unwrapped.task_ids()[:episodes]
    env.close()
    settings = RolloutSettings(max_action_tokens=MAX_TOKENS, max_prompt_tokens=8192)
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 8192, "response_length": MAX_TOKENS}},
                            "data": {}})
    loop = CapoEnvAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=_Server(tok), tokenizer=tok,
                            processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data))

    def native():
        envs = [gym.make(ENV_ID, **ENV_KWARGS) for _ in task_ids]
        collect(envs, _Backend(tok), tok, settings, tasks_per_batch=len(task_ids), group_size=1,
                task_ids=task_ids, seed=0)
        for e in envs:
            e.close()

    async def verl_batch():
        return await asyncio.gather(*(loop.run({}, extra_info={"env_id": ENV_ID, "env_kwargs": ENV_KWARGS,
                                                                "task_id": t, "seed": 0}) for t in task_ids))

    return {"episodes": len(task_ids), "rollout_native_ms": median_ms(native, repeats),
            "rollout_verl_agent_loop_ms": median_ms(lambda: asyncio.run(verl_batch()), repeats)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CPU cost: verl path vs capo_train native, same tiny batch")
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {**bench_algorithms(synthetic_trajectories(args.trajectories, args.steps), args.repeats),
               **bench_rollout(args.trajectories, max(3, args.repeats // 4))}
    for key, value in results.items():
        print(f"{key:32s} {value:10.2f}" if isinstance(value, float) else f"{key:32s} {value:10d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
