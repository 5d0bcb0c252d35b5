"""``capo compare``'s results, from the cells' logs: one row of numbers per (env, algo) (``results.csv``,
``results.md``) and the learning curves (``curves.png``). No torch: ``capo view`` reads grids with it too.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

# (column, eval key): read from each run's last held-out evaluation.
# env_score: WebShop's and SynthShop's score in [0, 1], whatever reward the env was trained on.
EVAL_METRICS = (("success", "eval/success"), ("env_score", "eval/env_score"), ("env_em", "eval/env_em"),
                ("env_f1", "eval/env_f1"), ("invalid_rate", "eval/invalid_action_rate"),
                ("actions", "eval/actions_per_episode"))
METRICS = ("success", "env_score", "env_em", "env_f1", "invalid_rate", "actions", "tokens", "train_success",
           "trajectories", "rl_tokens", "seconds_per_iteration")
ALWAYS = ("success", "trajectories", "seconds_per_iteration")  # columns kept even when no cell has them yet
LABELS = {
    "success": "held-out success",
    "env_score": "score",
    "env_em": "EM",
    "env_f1": "F1",
    "invalid_rate": "invalid actions",
    "actions": "actions / episode",
    "tokens": "tokens / episode",
    "train_success": "rollout success, last 10%",
    "trajectories": "trajectories",
    "rl_tokens": "RL tokens",
    "seconds_per_iteration": "s / iteration",
}


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


# ----------------------------------------------------------------------------- aggregation


def run_metrics(records: list[dict]) -> dict[str, float]:
    """One run's numbers: the last held-out evaluation after RL (not the warm start's), episodes
    and tokens generated in RL, mean wall time per iteration. Metrics a run does not report are left out."""
    rl = [r for r in records if r.get("iteration", 0) >= 1]
    out: dict[str, float] = {"trajectories": float(sum(r.get("rollout/episodes", 0.0) for r in rl)),
                             "rl_tokens": float(sum(r.get("rollout/tokens_generated", 0.0) for r in rl))}
    final = next((r for r in reversed(rl) if any(k.startswith("eval/") for k in r)), None)
    for name, key in EVAL_METRICS:
        if final is not None and key in final:
            out[name] = float(final[key])
    if final is not None and final.get("eval/episodes") and "eval/tokens_generated" in final:
        out["tokens"] = final["eval/tokens_generated"] / final["eval/episodes"]
    rollouts = [r["rollout/success"] for r in rl if "rollout/success" in r]
    if rollouts:  # the last tenth of the run's iterations: how well it does on its own training tasks by then
        out["train_success"] = statistics.fmean(rollouts[-max(1, len(rollouts) // 10) :])
    times = [r["time/iteration_s"] for r in rl if "time/iteration_s" in r]
    if times:
        out["seconds_per_iteration"] = sum(times) / len(times)
    return out


def summarise_seeds(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Mean and sample std (ddof=1; empty for one seed) of each metric over the runs that report it."""
    row: dict[str, Any] = {"seeds_done": len(runs)}
    for name in METRICS:
        values = [r[name] for r in runs if name in r and math.isfinite(r[name])]
        if values:
            row[f"{name}_mean"] = statistics.fmean(values)
            row[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else None
    return row


def columns(rows: list[dict]) -> list[str]:
    """Metrics no cell reports (e.g. F1 on an env without it) get no column; the basic ones always do."""
    shown = [m for m in METRICS if m in ALWAYS or any(f"{m}_mean" in r for r in rows)]
    return ["env", "algo", "group_size", "seeds_done"] + [f"{m}_{s}" for m in shown for s in ("mean", "std")]


def _fmt(mean: float | None, std: float | None, digits: int) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def markdown_table(rows: list[dict], grid) -> str:
    """The results table, ``grid`` (a ``GridConfig``) saying how many seeds each row should have."""
    shown = [c[: -len("_mean")] for c in columns(rows) if c.endswith("_mean")]
    digits = {"trajectories": 0, "rl_tokens": 0, "tokens": 1, "actions": 2, "seconds_per_iteration": 2}
    header = ["env", "algo", "seeds"] + [LABELS[m] for m in shown]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["env"], row["algo"], f"{row['seeds_done']}/{len(grid.seeds)}"]
        cells += [_fmt(row.get(f"{m}_mean"), row.get(f"{m}_std"), digits.get(m, 3)) for m in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- learning curves


def learning_curve(records: list[dict], key: str = "rollout/success") -> list[tuple[float, float]]:
    """``(trajectories collected so far, record[key])`` for each RL iteration that logged ``key``:
    training rollout success by default, ``eval/success`` for the held-out curve. A held-out key also
    gets the warm start's evaluation (iteration 0) at x = 0, so a run evaluated only before and after RL
    draws its gain as a line, not one point."""
    points, seen = [], 0.0
    for r in records:
        if r.get("iteration", 0) >= 1:
            seen += r.get("rollout/episodes", 0.0)
            if key in r:
                points.append((seen, r[key]))
        elif key.startswith("eval/") and key in r:
            points.append((0.0, r[key]))
    return points


def moving_average(points: list[tuple[float, float]], width: int) -> list[tuple[float, float]]:
    """Each y replaced by the mean of the last ``width`` ys (fewer at the start): one iteration's rollout
    success is a mean over a handful of episodes, too noisy to read as a curve."""
    ys = [y for _, y in points]
    return [(x, statistics.fmean(ys[max(0, i + 1 - width) : i + 1])) for i, (x, _) in enumerate(points)]


def band(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float, float, float]]:
    """``(x, mean, min, max)`` over seeds at each position the seeds share (their x agree by construction)."""
    out = []
    for i in range(max((len(c) for c in curves), default=0)):
        at = [c[i] for c in curves if len(c) > i]
        ys = [y for _, y in at]
        out.append((statistics.fmean(x for x, _ in at), statistics.fmean(ys), min(ys), max(ys)))
    return out


def plot_grid(runs: dict[tuple[str, str], list[tuple[int, list[dict]]]], env_names: list[str], algos: list[str],
              path: Path) -> None:
    """``curves.png``: a column per env, training rollout success (moving mean) and held-out success against
    trajectories collected, one line per algorithm (mean over seeds; band: min-max). ``runs``:
    ``(env name, algo) -> [(seed, log records)]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("rollout/success", "training rollout success (moving mean)"),
              ("eval/success", "held-out success (greedy)"))
    fig, axes = plt.subplots(len(panels), len(env_names), figsize=(5.5 * len(env_names), 3.8 * len(panels)), squeeze=False)
    for row, (key, label) in zip(axes, panels):
        for ax, env in zip(row, env_names):
            top = 0.0
            for algo in algos:
                curves = [c for c in (learning_curve(records, key) for _, records in runs[(env, algo)]) if c]
                if key == "rollout/success":
                    curves = [moving_average(c, max(1, len(c) // 15)) for c in curves]
                points = band(curves)
                if not points:
                    continue
                xs, mean, low, high = zip(*points)
                top = max(top, *high)
                (line,) = ax.plot(xs, mean, marker="o" if len(xs) < 12 else None, label=f"{algo} ({len(curves)})")
                if len(curves) > 1:
                    ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_title(env)
            ax.set_xlabel("trajectories collected")
            ax.set_ylabel(label)
            ax.set_ylim(-0.02, min(1.02, max(0.3, top + 0.1)))  # low success rates stay readable
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small", title="algo (seeds); band: min–max", title_fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
