"""Measured success of the oracle and of simple baseline policies on the diagnostic envs (docs/diagnostics.md).

    python benchmarks/diagnostics_baselines.py [--episodes 2000] [--split test]

Policies: ``oracle`` (``expert_action()``), ``random`` (a uniformly random legal action at each step; the
long write of SynthLength is that many random words), and one per env that isolates its property:
SynthLength ``random pick, copy`` (a random pick, then a perfect copy of the text shown) and SynthTrap
``shortcut`` (takes the malformed shortcut whenever it is shown). Prints a markdown table: success and
mean return over ``--episodes`` episodes (task ``reset(seed=i)``), next to the success theory predicts.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time

import gymnasium as gym

import capo_envs  # noqa: F401  (registers the ids)


def run(env_id: str, kwargs: dict, policy: str, episodes: int, split: str) -> dict[str, float]:
    env = gym.make(env_id, split=split, **kwargs)
    base = env.unwrapped
    rng = random.Random(0)
    successes, returns, steps = [], [], 0
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        done, total = False, 0.0
        while not done:
            if policy == "oracle":
                action = base.expert_action()
            elif policy == "shortcut":
                action = base.shortcut_action()
            elif policy == "random pick, copy" and (shown := re.search(r"\): (.*)\. Copy its text\.$", obs)):
                action = f"<write>{shown.group(1)}</write>"
            else:
                action = base.random_action(rng)
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            steps += 1
            done = terminated or truncated
        successes.append(info["metrics"]["success"])
        returns.append(total)
    env.close()
    return {"success": statistics.fmean(successes), "return": statistics.fmean(returns), "steps": steps}


# (env id, kwargs, policy, theoretical success)
ROWS = [
    ("capo/SynthChain-v0", {}, "oracle", 1.0),
    ("capo/SynthChain-v0", {}, "random", 0.5**8),
    ("capo/SynthChain-v0", {"k": 4}, "random", 0.5**4),
    ("capo/SynthChain-v0", {"k": 16, "choices": 4}, "random", 0.25**16),
    ("capo/SynthChain-v0", {"k": 4, "choices": 3, "distractor": True, "reward": "all"}, "random", 3.0**-4),
    ("capo/SynthLength-v0", {}, "oracle", 1.0),
    ("capo/SynthLength-v0", {}, "random", 0.0),
    ("capo/SynthLength-v0", {}, "random pick, copy", 0.25),
    ("capo/SynthLength-v0", {"records": 2, "long_words": 64}, "random pick, copy", 0.5),
    ("capo/SynthLength-v0", {"long_words": 8, "texts": "recall", "ask_by": "number"}, "oracle", 1.0),
    ("capo/SynthLength-v0", {"long_words": 8, "texts": "recall", "ask_by": "number"}, "random", 0.0),
    ("capo/SynthTrap-v0", {}, "oracle", 1.0),
    ("capo/SynthTrap-v0", {}, "random", (1 / 9) ** 3),
    ("capo/SynthTrap-v0", {}, "shortcut", 0.5**3),
    ("capo/SynthTrap-v0", {"steps": 1}, "random", 1 / 9),
    ("capo/SynthTrap-v0", {"steps": 1}, "shortcut", 0.5),
    ("capo/SynthTrap-v0", {"temptation": 1.0}, "shortcut", 0.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    print(f"{args.episodes} episodes per row, split {args.split}\n")
    print("| env | kwargs | policy | success | theory | mean return |")
    print("| --- | --- | --- | --- | --- | --- |")
    start, steps = time.perf_counter(), 0
    for env_id, kwargs, policy, theory in ROWS:
        out = run(env_id, kwargs, policy, args.episodes, args.split)
        steps += out["steps"]
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "defaults"
        print(f"| `{env_id}` | {shown} | {policy} | {out['success']:.4f} | {theory:.4f} | {out['return']:.3f} |")
    seconds = time.perf_counter() - start
    print(f"\n{steps} env steps in {seconds:.1f} s ({steps / seconds:,.0f} steps/s)")


if __name__ == "__main__":
    main()
