"""The numbers ``capo eval`` reports from repeated episodes: success with a 95% interval, and pass@k.

Pure Python (no torch), so they are checked against hand computations in tests/test_eval_cli.py.

- **pass@k** is the unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on
  Code", section 2.1 (https://arxiv.org/abs/2107.03374): with n episodes of a task of which c succeeded,
  ``1 - C(n - c, k) / C(n, k)``, averaged over tasks, computed as their numerically stable product. An episode
  counts as a success for pass@k when its success is 1 (an env whose success is a fraction, such as
  SynthLength's F1, counts only perfect episodes).
- **The interval** of the mean success: Wilson's score interval (Wilson 1927; Brown, Cai and DasGupta 2001,
  "Interval Estimation for a Binomial Proportion", https://doi.org/10.1214/ss/1009213286) when every episode
  is one independent 0/1 outcome (one episode per task); otherwise a percentile bootstrap over **tasks** (each
  task's mean over its repeats resampled as one unit, because repeats of one task are not independent),
  with a fixed seed so the same episodes give the same interval. Where every task has the same mean (all
  episodes failed, say) the bootstrap has no spread to resample and would claim an interval of width 0;
  there, Wilson's interval with the number of tasks as n (a pass over the panel as one sample).
"""

from __future__ import annotations

import math
import random
from typing import Sequence

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased pass@k of one task with ``n`` episodes, ``c`` of them successes (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k episodes holds a success
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_ks(per_task: Sequence[Sequence[float]]) -> dict[str, float]:
    """Mean pass@k over tasks for k = 1, 2, 4, ... and n (the smallest repeat count over tasks)."""
    if not per_task:
        return {}
    n = min(len(s) for s in per_task)
    ks = sorted({k for k in (2 ** i for i in range(n.bit_length())) if k <= n} | {n})
    return {str(k): sum(pass_at_k(len(s), sum(x >= 1.0 for x in s), k) for s in per_task) / len(per_task)
            for k in ks}


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # rounded so that p = 0 or 1 gives an exact 0 or 1 bound, not float noise such as 1.7e-18
    return (max(0.0, round(centre - half, 12)), min(1.0, round(centre + half, 12)))


def bootstrap_interval(task_means: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap (2.5%, 97.5%) of the mean of ``task_means``, resampling tasks."""
    n = len(task_means)
    if n == 0:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(task_means, k=n)) / n for _ in range(resamples))
    return (means[int(0.025 * (resamples - 1))], means[int(math.ceil(0.975 * (resamples - 1)))])


def success_summary(per_task: Sequence[Sequence[float]]) -> dict:
    """``{"mean", "ci95", "ci_method", "std_over_repeats"}`` of the episodes' success, grouped by task."""
    episodes = [x for s in per_task for x in s]
    if not episodes:
        return {"mean": math.nan, "ci95": [math.nan, math.nan], "ci_method": "none (no episodes)"}
    mean = sum(episodes) / len(episodes)
    binary = all(x in (0.0, 1.0) for x in episodes)
    if binary and all(len(s) == 1 for s in per_task):
        low, high = wilson_interval(sum(episodes), len(episodes))
        method = f"Wilson score interval, {len(episodes)} independent 0/1 episodes"
    else:
        task_means = [sum(s) / len(s) for s in per_task if s]
        low, high = bootstrap_interval(task_means)
        method = (f"percentile bootstrap over {len(per_task)} tasks ({BOOTSTRAP_RESAMPLES} resamples, seed "
                  f"{BOOTSTRAP_SEED}; a task's repeats resampled together)")
        if binary and len(set(task_means)) == 1:  # every task alike (all failed, say): nothing to resample
            low, high = wilson_interval(mean * len(task_means), len(task_means))
            method += f"; every task's mean is {mean:g}, so Wilson's interval over the {len(task_means)} tasks"
    summary = {"mean": mean, "ci95": [low, high], "ci_method": method}
    repeats = min(len(s) for s in per_task)
    if repeats > 1:  # how much the figure moves between whole passes over the panel (repeat r of every task)
        passes = [sum(s[r] for s in per_task) / len(per_task) for r in range(repeats)]
        centre = sum(passes) / repeats
        summary["std_over_repeats"] = math.sqrt(sum((p - centre) ** 2 for p in passes) / (repeats - 1))
    return summary


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """Mean and nearest-rank p50/p90/max, as ``rollout_stats`` reports action lengths."""
    if not values:
        return {}
    s = sorted(values)
    return {"mean": sum(s) / len(s), "p50": float(s[math.ceil(0.5 * len(s)) - 1]),
            "p90": float(s[math.ceil(0.9 * len(s)) - 1]), "max": float(s[-1])}
