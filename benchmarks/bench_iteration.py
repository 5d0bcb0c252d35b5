"""Where one RL iteration's time goes with a boolean setting off and on, side by side in one run on the same
env, model, seed and episodes. The setting (``--toggle``) is by default ``rollout.values_from_rollout``: the
critic's values from the rollout's recorded hidden states (true, the default) or from the critic's own pass over
the batch (false); ``--toggle rollout.frozen_layers_from_rollout``: the update runs only the trainable layers on
the frozen layers' states the rollout recorded (true) or the whole actor (false, the default). Several keys,
comma-separated, are switched together: ``--toggle rollout.values_from_rollout,rollout.frozen_layers_from_rollout``
compares the trainer before both levers (false) with both on (true).

    python benchmarks/bench_iteration.py [--env capo/SynthHouse-v0] [--episodes 4] [--repeats 1]
        [--model smollm2] [--toggle KEY] [key=value ...]

Each setting runs one CAPO iteration without a warm start (extra ``key=value`` overrides go to both runs),
alternating the two settings ``--repeats`` times so that a machine's load hits both alike. Prints each
phase (``time/*``, docs/metrics.md) as the median over repeats, and the ratio off / on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from capo_train.config import load_config
from capo_train.trainer import train

PHASES = ("rollout_generate", "rollout_env", "rollout", "rows", "values", "estimate", "update", "iteration")


def one_iteration(args, on: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        config = load_config(None, [
            "algo=capo", f"env.id={args.env}", f"model.path={args.model}", f"out_dir={out}", "iterations=1",
            f"rollout.episodes_per_batch={args.episodes}", "sft.episodes=0", "eval_every=0",
            "log_tensorboard=false", "record_every=0",
            *(f"{key}={str(on).lower()}" for key in args.toggle.split(",")), *args.overrides,
        ])
        train(config, progress=False)
        record = json.loads(open(f"{out}/log.jsonl").readline())
    seconds = {k: record.get(f"time/{k}_s", 0.0) for k in PHASES}
    seconds["tokens"] = record.get("rollout/tokens_generated", 0.0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="capo/SynthHouse-v0")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--toggle", default="rollout.values_from_rollout", help="the boolean config key compared (several: comma-separated, switched together)")
    parser.add_argument("overrides", nargs="*", help="config key=value for both runs")
    args = parser.parse_args()

    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.repeats):
        for setting in (False, True):
            runs[setting].append(one_iteration(args, setting))
            print(json.dumps({args.toggle: setting, **runs[setting][-1]}), flush=True)
    median = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in runs.items()}
    print(f"\n{args.env}, {args.episodes} episodes, {args.repeats} repeat(s), medians in seconds")
    print(f"{'phase':<18} {args.toggle + '=false':>12} {'true':>15} {'ratio':>7}")
    for key in (*PHASES, "tokens"):
        before, after = median[False][key], median[True][key]
        ratio = f"{before / after:.2f}x" if after > 0 else "-"
        print(f"{key:<18} {before:>12.1f} {after:>15.1f} {ratio:>7}")


if __name__ == "__main__":
    main()
