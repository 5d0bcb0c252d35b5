"""``capo bench``: train every (env, algorithm, seed) cell of a grid, then compare the algorithms.

Each cell is an ordinary ``capo train`` run in ``<out_dir>/runs/<env>/<algo>/seed-<seed>`` (checkpoint,
``log.jsonl``, ``summary.json``), so a cell can be inspected, resumed or rerun on its own. The grid only
decides what each cell's config is, skips the finished ones and aggregates their logs:

- ``results.csv`` / ``results.md``: one row per (env, algo), mean and std over the seeds done;
- ``curves.png``: training rollout success and held-out success against trajectories collected, a column per env;
- ``grid.json``: the grid config used.

Fairness: every algorithm sees the same number of episodes per iteration. Group methods (registry default
``group_size > 1``) spend them as ``trajectories_per_iteration / group_size`` tasks x ``group_size``
rollouts; the others as ``trajectories_per_iteration`` tasks x 1.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import (
    ConfigError, TrainConfig, _apply, batch_shape, env_kwargs, parse_overrides, read_yaml, to_dict, validate,
)

# TrainConfig keys each cell gets from the grid itself; setting them in ``base`` would be silently overwritten.
GRID_OWNED = {
    "algo": "algos",
    "seed": "seeds",
    "iterations": "iterations",
    "out_dir": "out_dir",
    "env.id": "envs",
    "rollout.group_size": "group_size",
    "rollout.episodes_per_batch": "trajectories_per_iteration",
    "rollout.tasks_per_batch": "trajectories_per_iteration",
}
# (column, eval key): read from each run's last held-out evaluation.
EVAL_METRICS = (("success", "eval/success"), ("env_em", "eval/env_em"), ("env_f1", "eval/env_f1"),
                ("invalid_rate", "eval/invalid_action_rate"), ("actions", "eval/actions_per_episode"))
METRICS = ("success", "env_em", "env_f1", "invalid_rate", "actions", "tokens", "train_success", "trajectories",
           "rl_tokens", "seconds_per_iteration")
ALWAYS = ("success", "trajectories", "seconds_per_iteration")  # columns kept even when no cell has them yet
LABELS = {
    "success": "held-out success",
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


def _all_algorithms() -> list[str]:
    from .algorithms import ALGORITHMS

    return list(ALGORITHMS)


@dataclass
class GridConfig:
    algos: list = field(default_factory=_all_algorithms)  # registered names; default: every one
    envs: list = field(default_factory=lambda: ["capo/SynthHop-v0"])  # ids, or {id, kwargs, name} mappings
    seeds: list = field(default_factory=lambda: [0, 1, 2])
    iterations: int = 12
    trajectories_per_iteration: int = 8  # episodes per iteration, the same for every algorithm
    group_size: int = 4  # rollouts per task for the group methods (the others use 1)
    out_dir: str = "runs/bench"
    base: dict = field(default_factory=dict)  # TrainConfig overrides for every cell, e.g. {"model": {"path": ...}}


@dataclass
class EnvSpec:
    id: str
    kwargs: dict | None  # None: the base config's env.kwargs (what `capo train --env ID` would use)
    name: str  # folder name and label in the results


# ----------------------------------------------------------------------------- loading and checking


def _merge(into: dict, updates: dict) -> dict:
    """Deep merge, so ``base.optim.actor_lr=...`` on the command line keeps the YAML's other base keys."""
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def _as_list(value: Any, key: str) -> list:
    """Lists may come as YAML lists, ``a,b,c`` strings (flags, key=value) or one scalar."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, (int, dict)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(f"{key} expects a list (e.g. {key}=a,b or {key}=[a, b]), got {value!r}")
    if key == "seeds":
        if not all(isinstance(v, int) and not isinstance(v, bool) or str(v).lstrip("-").isdigit() for v in value):
            raise ConfigError(f"seeds expects integers, got {value!r}")
        value = [int(v) for v in value]
    return value


def apply_grid(grid: GridConfig, updates: dict) -> GridConfig:
    for key, value in updates.items():
        if key == "base":
            if not isinstance(value, dict):
                raise ConfigError(f"base is a mapping of TrainConfig keys, got {value!r}")
            _merge(grid.base, value)
            continue
        if key in ("algos", "envs", "seeds"):
            value = _as_list(value, key)
        _apply(grid, {key: value})  # unknown keys and wrong types: the same messages as TrainConfig's
    return grid


def load_grid(path: str | Path | None = None, overrides: Sequence[str] = (), flags: dict | None = None) -> GridConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides, then explicit flags; checked."""
    grid = GridConfig()
    if path is not None:
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of grid keys")
        apply_grid(grid, data)
    apply_grid(grid, parse_overrides(overrides))
    apply_grid(grid, flags or {})
    check_grid(grid)
    grid.base = typed_base(grid.base)
    return grid


def typed_base(base: dict) -> dict:
    """``base`` with each value as TrainConfig reads it (``"2e-3"`` -> 0.002), so grid.json and the
    results header show what the cells were trained with."""
    config = TrainConfig()
    _apply(config, copy.deepcopy(base), "base.")

    def read(updates: dict, obj: Any) -> dict:
        return {k: read(v, getattr(obj, k)) if dataclasses.is_dataclass(getattr(obj, k)) else getattr(obj, k)
                for k, v in updates.items()}

    return read(base, config)


def is_group_algo(name: str) -> bool:
    from .algorithms import ALGORITHMS

    return int(ALGORITHMS[name].defaults.get("group_size", 1)) > 1


def env_specs(grid: GridConfig) -> list[EnvSpec]:
    specs = []
    for entry in grid.envs:
        if isinstance(entry, str):
            entry = {"id": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ConfigError(f"envs: each entry is an id or a mapping {{id, kwargs, name}}, got {entry!r}")
        unknown = set(entry) - {"id", "kwargs", "name"}
        if unknown:
            raise ConfigError(f"envs: unknown keys {sorted(unknown)} in {entry!r}; an entry has id, kwargs, name")
        kwargs = entry.get("kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ConfigError(f"envs: kwargs of {entry['id']} must be a mapping, got {kwargs!r}")
        name = str(entry.get("name") or entry["id"])
        specs.append(EnvSpec(entry["id"], kwargs, name))
    slugs = [slug(s.name) for s in specs]
    for s in set(slugs):
        if slugs.count(s) > 1:
            raise ConfigError(f"envs: two entries share the folder {s!r}; give them distinct `name`s")
    return specs


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def check_grid(grid: GridConfig) -> None:
    """Fail before any training: a typo in the last cell should not cost the first cells' hours."""
    from .algorithms import ALGORITHMS

    if not grid.algos:
        raise ConfigError("algos is empty")
    for name in grid.algos:
        if name not in ALGORITHMS:
            raise ConfigError(f"unknown algorithm {name!r}; choose from {list(ALGORITHMS)}")
    if not grid.seeds or not grid.envs:
        raise ConfigError("seeds and envs must not be empty")
    if len(set(grid.algos)) != len(grid.algos) or len(set(grid.seeds)) != len(grid.seeds):
        raise ConfigError(f"algos and seeds must not repeat: {grid.algos}, {grid.seeds}")
    for key in ("iterations", "trajectories_per_iteration", "group_size"):
        if getattr(grid, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(grid, key)}")
    if any(is_group_algo(a) for a in grid.algos):
        if grid.group_size < 2:
            raise ConfigError("group_size must be >= 2: a group baseline over one rollout has zero advantage")
        if grid.trajectories_per_iteration % grid.group_size:
            raise ConfigError(
                f"trajectories_per_iteration ({grid.trajectories_per_iteration}) must be a multiple of "
                f"group_size ({grid.group_size}) so the group methods see as many episodes as the others"
            )
    flat = _flatten(grid.base)
    for key, grid_key in GRID_OWNED.items():
        if key in flat:
            raise ConfigError(f"base.{key} is set by the grid; use the grid key {grid_key!r} instead")
    _apply(TrainConfig(), copy.deepcopy(grid.base), "base.")  # unknown/mistyped base keys, with hints
    import capo_envs

    for spec in env_specs(grid):
        card = capo_envs.CATALOG.get(spec.id)
        if card is not None and not card.data_ready():
            raise ConfigError(f"env {spec.id} has no data yet: run `{card.prepare}`")
        for algo in grid.algos:  # env id, algorithm and the rest of TrainConfig's own checks
            validate(cell_config(grid, spec, algo, grid.seeds[0]))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("kwargs", "algo_overrides"):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


# ----------------------------------------------------------------------------- cells


def cell_dir(grid: GridConfig, env: EnvSpec, algo: str, seed: int) -> Path:
    return Path(grid.out_dir) / "runs" / slug(env.name) / algo / f"seed-{seed}"


def cell_config(grid: GridConfig, env: EnvSpec, algo: str, seed: int) -> TrainConfig:
    config = TrainConfig()
    _apply(config, copy.deepcopy(grid.base), "base.")
    group = grid.group_size if is_group_algo(algo) else 1
    config.algo, config.seed, config.iterations = algo, seed, grid.iterations
    config.env.id = env.id
    if env.kwargs is not None:
        config.env.kwargs = copy.deepcopy(env.kwargs)
    # Explicit 1 for the critic methods: 0 would mean "the algorithm's default", which is not the grid's.
    config.rollout.group_size = group
    config.rollout.episodes_per_batch = grid.trajectories_per_iteration
    # Written out (batch_shape would derive it) so the config matches cells started before episodes_per_batch.
    config.rollout.tasks_per_batch = batch_shape(config)[0]
    if "eval_every" not in grid.base:  # the held-out numbers in the table come from the end of each cell
        config.eval_every = grid.iterations
    config.out_dir = str(cell_dir(grid, env, algo, seed))
    return config


def read_log(path: Path, skip_bad_lines: bool = False) -> list[dict]:
    """The run's records, one per iteration: a run killed between logging and checkpointing repeats an
    iteration when resumed, so the last record of each iteration wins. ``skip_bad_lines``: ignore lines that
    are not a JSON object (``capo view`` reads folders it did not write) instead of raising."""
    if not path.exists():
        return []
    by_iteration: dict[int, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if skip_bad_lines:
                continue
            raise
        if not isinstance(record, dict):
            if skip_bad_lines:
                continue
            raise ValueError(f"{path}: a line that is not a JSON object: {line[:80]!r}")
        by_iteration[int(record.get("iteration", 0))] = record
    return [by_iteration[i] for i in sorted(by_iteration)]


def rl_iterations_done(directory: Path) -> int:
    return sum(1 for r in read_log(directory / "log.jsonl") if r.get("iteration", 0) >= 1)


def is_done(grid: GridConfig, directory: Path) -> bool:
    # A summary with fewer iterations than asked is a grid that was extended: resume it, don't skip it.
    return (directory / "summary.json").exists() and rl_iterations_done(directory) >= grid.iterations


# Settings a resumed cell may change: how far it runs, where it lives, and how env steps are scheduled
# (the env pool gives identical trajectories whatever its kind and size: tests/test_envpool.py).
_MAY_CHANGE_ON_RESUME = ("iterations", "eval_every", "out_dir", "rollout.env_pool", "rollout.env_workers")


def _check_same_config(config: TrainConfig, directory: Path) -> None:
    """Refuse to mix results of different settings in one table: a cell already started must have been
    started with this config (iterations and eval_every may grow, the grid folder may move; keys one side
    lacks are ignored, so a field added to TrainConfig later does not invalidate old cells, and so are
    keys null here: "auto" values, e.g. optim.actor_lr, which the cell resolved when it started)."""
    saved_path = directory / "checkpoint" / "config.json"
    if not saved_path.exists():
        return
    saved = _flatten(json.loads(saved_path.read_text()))
    now = _flatten(to_dict(config))
    changed = {k: (saved[k], now[k]) for k in saved.keys() & now.keys()
               if saved[k] != now[k] and now[k] is not None and k not in _MAY_CHANGE_ON_RESUME}
    if changed:
        diff = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
        raise ConfigError(f"{directory} was started with other settings ({diff}); use another out_dir or delete it")


def cells(grid: GridConfig) -> list[tuple[EnvSpec, str, int]]:
    # Seed-major: after the first len(algos) cells every algorithm has one seed, so a partial grid compares.
    return [(env, algo, seed) for env in env_specs(grid) for seed in grid.seeds for algo in grid.algos]


def run_grid(grid: GridConfig, command: str | None = None, jobs: int = 1) -> list[dict]:
    """Train the unfinished cells, re-aggregating after each; returns the table rows.

    ``jobs > 1`` trains that many cells at once, each in its own process with ``cpu_count // jobs`` torch
    threads: on a CPU, small models use cores better as parallel runs than as threads of one run. Each run
    seeds itself, so ``jobs`` changes a cell's numbers only through the float rounding of its thread count."""
    check_grid(grid)
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1, got {jobs}")
    todo = [cell_config(grid, env, algo, seed) for env, algo, seed in cells(grid)]
    for config in todo:  # before anything is written or trained; finished cells too: they go in this table
        _check_same_config(config, Path(config.out_dir))
    out = Path(grid.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps(dataclasses.asdict(grid), indent=2))
    pending = []
    for i, config in enumerate(todo, 1):
        where = f"[{i}/{len(todo)}] {Path(config.out_dir).relative_to(out / 'runs')}"
        if is_done(grid, Path(config.out_dir)):
            print(f"{where}: done, skipped", flush=True)
        else:
            pending.append((where, config))
    if jobs == 1:
        for where, config in pending:
            print(f"{where}: training", flush=True)
            train_cell(config, progress_tag=f"capo bench {Path(config.out_dir).relative_to(out / 'runs')}")
            write_results(grid, command)
    else:
        _run_parallel(grid, command, pending, jobs)
    return write_results(grid, command)


def train_cell(config: TrainConfig, threads: int | None = None, progress_tag: str | None = None) -> None:
    """Train (or resume) one cell; with ``progress_tag`` its phase and iteration lines are printed under that
    tag (one cell at a time; parallel cells print only queued/finished)."""
    from .trainer import train

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    train(config, resume=True, progress=progress_tag is not None, tag=progress_tag or "capo train")


def _run_parallel(grid: GridConfig, command: str | None, pending: list, jobs: int) -> None:
    import multiprocessing
    import os
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    threads = max(1, (os.cpu_count() or 1) // jobs)
    # spawn, not fork: a forked child would inherit the parent's torch thread pools and locks.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {}
        for where, config in pending:
            futures[pool.submit(train_cell, config, threads)] = where
            print(f"{where}: queued", flush=True)
        remaining = set(futures)
        while remaining:
            finished, remaining = wait(remaining, return_when=FIRST_EXCEPTION)
            for future in finished:
                if future.exception() is not None:
                    for other in remaining:
                        other.cancel()
                    raise future.exception()
                print(f"{futures[future]}: finished", flush=True)
            write_results(grid, command)


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


def collect_runs(grid: GridConfig) -> dict[tuple[str, str], list[tuple[int, list[dict]]]]:
    """``(env name, algo) -> [(seed, log records)]`` for the finished cells of this grid only."""
    runs: dict[tuple[str, str], list[tuple[int, list[dict]]]] = {}
    for env in env_specs(grid):
        for algo in grid.algos:
            done = []
            for seed in grid.seeds:
                directory = cell_dir(grid, env, algo, seed)
                if is_done(grid, directory):
                    done.append((seed, read_log(directory / "log.jsonl")))
            runs[(env.name, algo)] = done
    return runs


def aggregate(grid: GridConfig) -> list[dict]:
    rows = []
    for (env, algo), done in collect_runs(grid).items():
        group = grid.group_size if is_group_algo(algo) else 1
        row = {"env": env, "algo": algo, "group_size": group}
        rows.append(row | summarise_seeds([run_metrics(records) for _, records in done]))
    return rows


def columns(rows: list[dict]) -> list[str]:
    """Metrics no cell reports (e.g. F1 on an env without it) get no column; the basic ones always do."""
    shown = [m for m in METRICS if m in ALWAYS or any(f"{m}_mean" in r for r in rows)]
    return ["env", "algo", "group_size", "seeds_done"] + [f"{m}_{s}" for m in shown for s in ("mean", "std")]


def describe(grid: GridConfig, command: str | None) -> str:
    """The header of results.md: enough to rerun the grid and to read the table right."""
    T = grid.trajectories_per_iteration
    shapes = []
    for algo in grid.algos:
        g = grid.group_size if is_group_algo(algo) else 1
        shapes.append(f"{algo} ({T // g} tasks x {g} rollout{'s' if g > 1 else ''})")
    envs = []
    for env in env_specs(grid):  # the kwargs actually used: an id alone takes base's (or the default) env.kwargs
        kwargs = json.dumps(env_kwargs(cell_config(grid, env, grid.algos[0], grid.seeds[0]).env), sort_keys=True)
        envs.append(f"{env.id} {kwargs}" + (f" as {env.name}" if env.name != env.id else ""))
    return "\n".join([
        f"Grid: `{command}`" if command else "Grid: `run_grid` with the config in grid.json",
        "",
        f"- algos: {', '.join(shapes)}",
        f"- envs: {', '.join(envs)}",
        f"- seeds: {', '.join(map(str, grid.seeds))}; iterations: {grid.iterations}; trajectories per iteration: {T}",
        f"- base: {json.dumps(grid.base, sort_keys=True)}",
        "",
        ("Held-out success, EM, F1, invalid-action rate, actions and generated tokens per episode: greedy "
         "decoding at the end of each run; rollout success: sampled training episodes over the last tenth of "
         "the iterations; trajectories and RL tokens: episodes collected and tokens generated in RL; "
         "mean ± sample std over the seeds done."),
    ])


def _fmt(mean: float | None, std: float | None, digits: int) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def markdown_table(rows: list[dict], grid: GridConfig) -> str:
    shown = [c[: -len("_mean")] for c in columns(rows) if c.endswith("_mean")]
    digits = {"trajectories": 0, "rl_tokens": 0, "tokens": 1, "actions": 2, "seconds_per_iteration": 2}
    header = ["env", "algo", "seeds"] + [LABELS[m] for m in shown]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["env"], row["algo"], f"{row['seeds_done']}/{len(grid.seeds)}"]
        cells += [_fmt(row.get(f"{m}_mean"), row.get(f"{m}_std"), digits.get(m, 3)) for m in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(grid: GridConfig, command: str | None = None) -> list[dict]:
    out = Path(grid.out_dir)
    rows = aggregate(grid)
    fields = columns(rows)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in fields} for row in rows)
    (out / "results.md").write_text(describe(grid, command) + "\n\n" + markdown_table(rows, grid) + "\n")
    plot_grid(grid, out / "curves.png")
    return rows


# ----------------------------------------------------------------------------- learning curves


def learning_curve(records: list[dict], key: str = "rollout/success") -> list[tuple[float, float]]:
    """``(trajectories collected so far, record[key])`` for each RL iteration that logged ``key``:
    training rollout success by default, ``eval/success`` for the held-out curve."""
    points, seen = [], 0.0
    for r in records:
        if r.get("iteration", 0) >= 1:
            seen += r.get("rollout/episodes", 0.0)
            if key in r:
                points.append((seen, r[key]))
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


def plot_grid(grid: GridConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = collect_runs(grid)
    envs = env_specs(grid)
    panels = (("rollout/success", "training rollout success (moving mean)"),
              ("eval/success", "held-out success (greedy)"))
    fig, axes = plt.subplots(len(panels), len(envs), figsize=(5.5 * len(envs), 3.8 * len(panels)), squeeze=False)
    for row, (key, label) in zip(axes, panels):
        for ax, env in zip(row, envs):
            top = 0.0
            for algo in grid.algos:
                curves = [c for c in (learning_curve(records, key) for _, records in runs[(env.name, algo)]) if c]
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
            ax.set_title(env.name)
            ax.set_xlabel("trajectories collected")
            ax.set_ylabel(label)
            ax.set_ylim(-0.02, min(1.02, max(0.3, top + 0.1)))  # low success rates stay readable
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small", title="algo (seeds); band: min–max", title_fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
