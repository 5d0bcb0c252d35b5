"""ALFWorld envs: reset and step latency, steps/s with 1 and 2 workers, memory per env and over many resets,
and the handcoded expert's success per task type on SynthHouse.

    .venv/bin/python benchmarks/bench_alfworld.py                      # SynthHouse small, 10 tasks per type
    .venv/bin/python benchmarks/bench_alfworld.py --real "$ALFWORLD_DATA" --per-type 20 --resets 1000

Needs the alfworld extra. Prints markdown tables; numbers depend on the machine's load (say what else ran).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym

import capo_envs  # noqa: F401  (registers the ids)
from capo_envs.alfworld.games import TASK_TYPE_NAMES


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def play(env, task_index: int) -> tuple[float, list[float], float, int]:
    """One expert episode: (reset seconds, step seconds, success, steps)."""
    start = time.perf_counter()
    env.reset(options={"task_index": task_index})
    reset_s = time.perf_counter() - start
    steps, done = [], False
    while not done:
        action = env.unwrapped.expert_action()
        start = time.perf_counter()
        _, _, terminated, truncated, info = env.step(action)
        steps.append(time.perf_counter() - start)
        done = terminated or truncated
    return reset_s, steps, info["metrics"]["success"], len(steps)


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.0f} (mean {1000 * statistics.mean(values):.0f})"


def expert_table(env_id: str, kwargs: dict, per_type: int) -> None:
    env = gym.make(env_id, **kwargs)
    start = time.perf_counter()
    env.reset(options={"task_index": 0})
    first_reset = time.perf_counter() - start
    results, new_resets, steps = defaultdict(list), [], []
    n = min(per_type * len(env.unwrapped.task_types), len(env.unwrapped.task_ids()))
    for index in range(n):
        reset_s, step_s, success, length = play(env, index)
        kind = env.unwrapped.task_type(env.unwrapped.task_ids()[index])
        results[kind].append((success, length))
        new_resets.append(reset_s)
        steps += step_s
    seen = [play(env, i)[0] for i in range(min(6, n))]  # generated before: its draw is known, its translation cached
    same = [play(env, 0)[0] for _ in range(5)]  # the game the engine holds: a plain reset
    pid = env.unwrapped.engine_pid
    print(f"\n### {env_id} {kwargs}: the handcoded expert, {per_type} tasks per type\n")
    print("| task type | success | mean steps |\n|---|---|---|")
    for kind in TASK_TYPE_NAMES:
        if kind in results:
            wins = [s for s, _ in results[kind]]
            print(f"| {kind} | {sum(wins):.0f}/{len(wins)} | {statistics.mean(l for _, l in results[kind]):.1f} |")
    print(f"\nfirst reset (starts the engine process): {first_reset:.2f} s; reset, ms: of a new task {ms(new_resets)},"
          f" of a task met before {ms(seen)}, of the task just played {ms(same)}; step, ms: {ms(steps)} over"
          f" {len(steps)} steps")
    print(f"memory: engine process RSS {rss_mb(pid):.0f} MB; this process {rss_mb(os.getpid()):.0f} MB")
    env.close()


def throughput(env_id: str, kwargs: dict, workers: int, seconds: float) -> float:
    """Expert steps per second over all sub-envs of an AsyncVectorEnv (1 worker: the env itself)."""
    if workers == 1:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **kwargs)])
    else:
        envs = gym.vector.AsyncVectorEnv([lambda: gym.make(env_id, **kwargs) for _ in range(workers)], shared_memory=False)
    envs.reset(seed=list(range(workers)))
    for _ in range(5):  # warm-up: every engine started and a few tasks generated
        envs.step([a or "<action>look</action>" for a in envs.call("expert_action")])
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step([a or "<action>look</action>" for a in envs.call("expert_action")])
        count += workers
    rate = count / (time.perf_counter() - start)
    envs.close()
    return rate


def memory_over_resets(env_id: str, kwargs: dict, resets: int) -> None:
    env = gym.make(env_id, **kwargs)
    tasks = min(4, len(env.unwrapped.task_ids()))
    for i in range(50):
        env.reset(options={"task_index": i % tasks})
    pid = env.unwrapped.engine_pid
    before = (rss_mb(os.getpid()), rss_mb(pid))
    start = time.perf_counter()
    for i in range(resets):
        env.reset(options={"task_index": i % tasks})
        env.step("<action>look</action>")
    took = time.perf_counter() - start
    after = (rss_mb(os.getpid()), rss_mb(env.unwrapped.engine_pid))
    print(f"\n{resets} resets (+1 step each) of {tasks} tasks in {took:.0f} s: this process {before[0]:.0f} -> "
          f"{after[0]:.0f} MB, engine process {before[1]:.0f} -> {after[1]:.0f} MB")
    env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--per-type", type=int, default=10)
    p.add_argument("--seconds", type=float, default=20.0, help="per throughput measurement")
    p.add_argument("--resets", type=int, default=0, help="also measure memory over this many resets")
    p.add_argument("--real", help="an ALFWorld data folder ($ALFWORLD_DATA layout): also time its games")
    args = p.parse_args()
    synth = ("capo/SynthHouse-v0", {"size": args.size, "split": "dev"})
    expert_table(*synth, args.per_type)
    if args.real:
        expert_table("capo/ALFWorld-v0", {"data_dir": args.real, "split": "train"}, 1)
    # Steps/s over whole expert episodes, resets included: every task new (each generated and expert-checked
    # on first use, as in training), and 6 tasks met again and again (the engine's own speed).
    cycling = ("capo/SynthHouse-v0", {**synth[1], "num_tasks": 6})
    print("\n| workers | expert steps/s, new tasks | expert steps/s, 6 tasks again |\n|---|---|---|")
    for workers in (1, 2):
        print(f"| {workers} | {throughput(*synth, workers, args.seconds):.1f} | {throughput(*cycling, workers, args.seconds):.1f} |")
    if args.resets:
        memory_over_resets("capo/SynthHouse-v0", {"size": "tiny", "split": "dev"}, args.resets)


if __name__ == "__main__":
    main()
