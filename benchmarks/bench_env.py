"""Env steps/s on capo/SynthHop-v0 with BM25 (target: >= 200 steps/s, so the env never bottlenecks training).

    python benchmarks/bench_env.py [--size small] [--episodes 300]

Runs the expert (valid searches and answers) and a policy of invalid actions side by side, and prints
steps/s for each and the ratio to the 200 steps/s target.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import capo_envs  # noqa: F401

TARGET = 200.0


def run(env, episodes: int, policy) -> tuple[int, float]:
    base = env.unwrapped
    steps, start = 0, time.perf_counter()
    for episode in range(episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(policy(base))
            steps += 1
            done = terminated or truncated
    return steps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--retriever", default="bm25")
    args = parser.parse_args()

    start = time.perf_counter()
    env = gym.make("capo/SynthHop-v0", size=args.size, retriever=args.retriever)
    build = time.perf_counter() - start
    print(f"SynthHop size={args.size}: {len(env.unwrapped.world.passages)} passages, env built in {build:.2f}s")
    policies = {
        "expert (search+answer)": lambda base: base.expert_action(),
        "invalid actions": lambda base: "no tags here",
        "uncached searches": lambda base: f"<search>{base.np_random.integers(1 << 30)} city founded</search>",
    }
    for name, policy in policies.items():
        steps, seconds = run(env, args.episodes, policy)
        rate = steps / seconds
        print(f"{name:>24}: {steps:6d} steps in {seconds:6.2f}s = {rate:9.1f} steps/s "
              f"({rate / TARGET:.1f}x the {TARGET:.0f} steps/s target)")
    env.close()


if __name__ == "__main__":
    main()
