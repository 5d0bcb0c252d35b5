"""A run folder of made-up recorded episodes, in the format ``capo_train.episodes`` writes, to measure the
viewer at scale (tests/test_viewer_scale.py, benchmarks/bench_viewer.py) without training for hours.

The texts and numbers look like a SynthChain run's (a door per step, a critic, whitened advantages, CAPO's
action ratio and clip range) and are drawn from a seeded RNG, so a folder is the same on every machine.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CLIP = 3e-4


def synthetic_run(out_dir: str | Path, iterations: int = 200, episodes: int = 50, steps: int = 4,
                  seed: int = 0, algo: str = "capo") -> Path:
    """Write ``log.jsonl``, ``checkpoint/config.json``, ``summary.json`` and ``episodes/iter-*.jsonl`` with
    ``iterations x episodes`` episodes of ``steps`` actions each; returns the folder."""
    rng = random.Random(seed)
    out = Path(out_dir)
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    (out / "checkpoint").mkdir(exist_ok=True)
    config = {"algo": algo, "seed": seed, "iterations": iterations, "record_every": 1, "record_episodes": episodes,
              "env": {"id": "capo/SynthChain-v0", "kwargs": {"k": steps}}}
    (out / "checkpoint" / "config.json").write_text(json.dumps(config, indent=2))
    (out / "episodes" / "meta.json").write_text(json.dumps(
        {"algo": algo, "ratio": "capo", "clip_low": CLIP, "clip_high": CLIP, "dual_clip": None, "critic": "boundary"}))
    log = []
    for it in range(1, iterations + 1):
        skill = min(0.95, 0.5 + 0.45 * it / iterations)  # the chance of the right door grows with training
        lines, successes = [], 0
        for ep in range(episodes):
            task = f"synthchain-{steps}-train-{rng.randrange(5000)}"
            correct, actions = 0, []
            for t in range(steps):
                side = rng.choice(["left", "right"])
                valid = rng.random() > 0.05
                right = valid and rng.random() < skill
                correct += right
                door = side if right else ("right" if side == "left" else "left")
                text = f"The sign says {side}.<go>{door}</go>" if valid else f"I go {door}"
                value = round(rng.uniform(0.2, 0.9), 4)
                advantage = round(rng.gauss(0.4 if right else -0.4, 0.5), 4)
                ratio = 1 + rng.gauss(0, 4e-4)
                clipped = (advantage > 0 and ratio > 1 + CLIP) or (advantage < 0 and ratio < 1 - CLIP)
                actions.append({
                    "step": t,
                    "observation": f"Step {t + 1}/{steps}. Doors: left, right. The sign points to the {side} door.",
                    "action": text, "tokens": len(text) // 3, "valid": valid,
                    "reason": "" if valid else "no action found", "reward": 0.0, "value": value,
                    "return": None, "advantage_raw": None, "advantage": advantage, "ratio": ratio,
                    "clip_frac": float(clipped), "clipped": clipped,
                })
            success = float(correct == steps)
            successes += success
            actions[-1]["reward"] = correct / steps
            for a in actions:
                a["return"] = actions[-1]["reward"] * 0.99 ** (steps - 1 - a["step"])
                a["advantage_raw"] = a["return"] - a["value"]
            lines.append(json.dumps({
                "iteration": it, "episode": ep, "task_id": task, "group_id": ep, "success": success,
                "return": correct / steps, "terminated": True, "truncated": False,
                "invalid_actions": sum(not a["valid"] for a in actions), "num_actions": steps,
                "metrics": {"success": success, "correct_fraction": correct / steps, "steps": float(steps)},
                "prompt": "<|im_start|>system\nWalk through one door per step.<|im_end|>\n", "actions": actions,
            }))
        (out / "episodes" / f"iter-{it:06d}.jsonl").write_text("\n".join(lines) + "\n")
        record = {"iteration": it, "rollout/success": successes / episodes, "rollout/invalid_action_rate": 0.05,
                  "actor/approx_kl": abs(rng.gauss(1e-4, 3e-5)), "actor/clip_frac": rng.uniform(0.2, 0.5),
                  "critic/explained_variance": min(0.9, it / iterations), "actor/entropy": 1.5 - it / iterations}
        if it % 20 == 0:
            record["eval/success"] = skill ** steps
        log.append(json.dumps(record))
    (out / "log.jsonl").write_text("\n".join(log) + "\n")
    (out / "summary.json").write_text(json.dumps({"algo": algo, "iterations": iterations}))
    return out
