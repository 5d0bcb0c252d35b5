"""CAPO's action clip on the learning test's setting: clip fraction and training-success gain per clip value.

    python benchmarks/learning_clip_sweep.py [--clips 3e-4,1e-3,3e-3,1e-2,0.2] [--seeds 0] [--out runs/clip]

The setting is tests/test_learning.py's (a tiny Llama behaviour-cloned on SynthChain k=2 from a
half-right demonstrator, then 60 iterations of 16 episodes, actor lr 1e-3). CAPO's default clip, 3e-4 on
both sides, comes from the authors' launch script for the geometric-mean (StepPO) ratio; the
length-calibrated ratio scales a per-token drift by sqrt(L) rather than 1, so the clip that suits it is
measured here rather than inherited. Prints, per clip: the mean fraction of clipped actions, the mean
largest |ratio - 1| of an iteration, and training success over the first and last 15 iterations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_learning import ITERATIONS, RUN, WINDOW, build_warm_start  # noqa: E402  (the test's settings)

from capo_train.config import load_config  # noqa: E402
from capo_train.trainer import train  # noqa: E402


def warm_start(root: Path) -> Path:
    return root / "warm" if (root / "warm" / "config.json").is_file() else build_warm_start(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", default="3e-4,1e-3,3e-3,1e-2,0.2")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", default="runs/clip")
    args = parser.parse_args()
    root = Path(args.out)
    warm = warm_start(root)
    print("| clip | seed | clipped actions | largest abs(ratio - 1), mean over iterations | success first 15 | last 15 | gain |")
    print("|---|---|---|---|---|---|---|")
    for clip in args.clips.split(","):
        for seed in args.seeds.split(","):
            out = root / f"clip{clip}-seed{seed}"
            config = load_config(None, [f"model.path={warm}", f"out_dir={out}", "algo=capo", *RUN, f"seed={seed}",
                                        f"iterations={ITERATIONS}", "sft.episodes=0", "optim.actor_lr=1e-3",
                                        f"algo_overrides.clip_low={clip}", f"algo_overrides.clip_high={clip}"])
            train(config, progress=False)
            records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
            rl = [r for r in records if r["iteration"] >= 1]
            success = [r["rollout/success"] for r in rl]
            first, last = sum(success[:WINDOW]) / WINDOW, sum(success[-WINDOW:]) / WINDOW
            clipped = sum(r["actor/clip_frac"] for r in rl) / len(rl)
            drift = sum(max(r["actor/ratio_max"] - 1, 1 - r["actor/ratio_min"]) for r in rl) / len(rl)
            print(f"| {clip} | {seed} | {clipped:.3f} | {drift:.3f} | {first:.3f} | {last:.3f} | {last - first:+.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
