"""Env pools side by side: the same expert episodes through a serial, a thread and a process pool
(capo_train/envpool.py), wall time and speed-up over serial, and a check that every pool saw the same
trajectories.

    # SynthHouse (generated games on ALFWorld's engine), 8 envs, 2 workers, each pool twice
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_envpool.py
    # the real ALFWorld game(s) of a data folder in the $ALFWORLD_DATA layout
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_envpool.py --env capo/ALFWorld-v0 \\
        --env-kwargs '{"data_dir": "'"$ALFWORLD_DATA"'"}'
    # a cheap in-process env: what threads cost where there is nothing to overlap
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_envpool.py --env capo/SynthChain-v0 \\
        --env-kwargs '{"k": 4}' --envs 16 --rounds 50

Each round resets every env to a task (envs share tasks round-robin when there are fewer tasks than envs)
and steps each with the env's own expert until its episode ends: no model time, so the figure is the env
calls alone. Pools run interleaved (serial, thread, process, serial, ...) so that drift in the machine's
load hits them alike. Needs a quiet machine: on busy cores the workers only share the same CPU time
(docs/envpool.md has a run under load). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time

import capo_envs  # noqa: F401  (registers the ids)
from capo_train.envpool import EnvPool

POOLS = ("serial", "thread", "process")
FALLBACK_ACTION = "<action>look</action>"  # an expert with nothing to say (ALFWorld after a win): any action


def expert_rounds(kind: str, env_id: str, env_kwargs: dict, n_envs: int, workers: int, rounds: int
                  ) -> tuple[float, int, str]:
    """``(seconds, env calls, digest of every observation and reward)`` for ``rounds`` rounds of expert
    episodes on ``n_envs`` envs of a ``kind`` pool. Env creation is outside the timing."""
    with EnvPool(kind, workers) as pool:
        envs = [pool.make(env_id, **env_kwargs) for _ in range(n_envs)]
        tasks = list(envs[0].unwrapped.task_ids())
        digest = hashlib.sha256()
        calls, start = 0, time.perf_counter()
        for r in range(rounds):
            pairs = [(env, tasks[(r * n_envs + i) % len(tasks)]) for i, env in enumerate(envs)]
            for obs, _ in pool.map(lambda p: p[0].reset(seed=r, options={"task_id": p[1]}), pairs):
                digest.update(str(obs).encode())
            calls += n_envs
            live = list(envs)
            while live:
                actions = pool.map(lambda e: e.unwrapped.expert_action(), live)
                outs = pool.map(lambda p: p[0].step(p[1] or FALLBACK_ACTION), list(zip(live, actions)))
                for obs, reward, *_ in outs:
                    digest.update(f"{obs}|{reward}".encode())
                calls += len(live)
                live = [e for e, out in zip(live, outs) if not (out[2] or out[3])]
        seconds = time.perf_counter() - start
        for env in envs:
            env.close()
    return seconds, calls, digest.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="capo/SynthHouse-v0")
    p.add_argument("--env-kwargs", default='{"size": "tiny", "max_steps": 20}', help="JSON object for gym.make")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="episodes per env in one timed run")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per pool (interleaved)")
    p.add_argument("--pools", default=",".join(POOLS))
    args = p.parse_args()
    kwargs = json.loads(args.env_kwargs)
    pools = args.pools.split(",")
    print(f"{args.env} {kwargs}, {args.envs} envs, {args.workers} workers, {args.rounds} round(s) per run; "
          f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    runs: dict[str, list[float]] = {kind: [] for kind in pools}
    digests, calls = {}, {}
    expert_rounds(pools[0], args.env, kwargs, args.envs, args.workers, 1)  # warm-up: imports, engines, caches
    for _ in range(args.repeats):
        for kind in pools:
            seconds, calls[kind], digests[kind] = expert_rounds(kind, args.env, kwargs, args.envs, args.workers,
                                                                args.rounds)
            runs[kind].append(seconds)
    base = statistics.median(runs[pools[0]])
    print(f"\n| pool | env calls | seconds ({args.repeats} runs) | median | us per call | speed-up over {pools[0]} |")
    print("|---|---|---|---|---|---|")
    for kind in pools:
        med = statistics.median(runs[kind])
        print(f"| {kind}{'' if kind == 'serial' else f', {args.workers} workers'} | {calls[kind]} | "
              f"{', '.join(f'{s:.2f}' for s in runs[kind])} | {med:.3f} | {1e6 * med / calls[kind]:.0f} | "
              f"{base / med:.2f}x |")
    same = len(set(digests.values())) == 1
    print(f"\nsame trajectories in every pool: {same}")
    if not same:
        raise SystemExit(f"pools disagree: {digests}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":  # spawned workers re-import this module
    main()
