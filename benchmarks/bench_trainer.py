"""Seconds per training iteration of capo, ppo and grpo on one config, side by side in one run.

    python benchmarks/bench_trainer.py [--model smollm2|PATH] [--iterations 2] [--trajectories 8]

Every algorithm collects the same number of trajectories per iteration (group methods as
trajectories/4 tasks x 4 rollouts), from the same model, env and lengths, without a warm start. Prints
rollout, update and total seconds per iteration, and each algorithm's cost relative to ppo: CAPO's
critic is trained at the action boundaries only, so it should not cost more than PPO's token critic.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from capo_train.config import load_config
from capo_train.trainer import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--algos", default="capo,ppo,grpo")
    args = parser.parse_args()

    rows = {}
    for algo in args.algos.split(","):
        grouped = algo not in ("capo", "ppo", "capo_no_action_credit", "capo_no_action_ratio")
        tasks, group = (args.trajectories // 4, 4) if grouped else (args.trajectories, 1)
        with tempfile.TemporaryDirectory() as out:
            config = load_config(None, [
                f"algo={algo}", f"model.path={args.model}", f"out_dir={out}", f"iterations={args.iterations}",
                f"rollout.tasks_per_batch={tasks}", f"rollout.group_size={group}",
                f"optim.minibatch_rows={tasks}", "sft.episodes=0", "eval_every=0", "log_tensorboard=false",
            ])
            train(config, progress=False)
            records = [json.loads(line) for line in open(f"{out}/log.jsonl")]
        mean = lambda key: sum(r[key] for r in records) / len(records)  # noqa: E731
        rows[algo] = {k: mean(f"time/{k}_s") for k in ("rollout", "update", "iteration")}
        rows[algo]["action_tokens"] = mean("rollout/tokens_generated")

    print(f"{'algo':<8} {'rollout s':>10} {'update s':>10} {'iteration s':>12} {'tokens':>8} "
          f"{'update/ppo':>11} {'iteration/ppo':>14}")
    ppo = rows.get("ppo")
    for algo, r in rows.items():
        ratio_u = f"{r['update'] / ppo['update']:.2f}x" if ppo else "-"
        ratio_i = f"{r['iteration'] / ppo['iteration']:.2f}x" if ppo else "-"
        print(f"{algo:<8} {r['rollout']:>10.1f} {r['update']:>10.1f} {r['iteration']:>12.1f} "
              f"{r['action_tokens']:>8.0f} {ratio_u:>11} {ratio_i:>14}")


if __name__ == "__main__":
    main()
