"""``capo compare``: train every (env, algorithm, seed) cell of a grid, then compare the algorithms.

Each cell is an ordinary ``capo train`` run in ``<out_dir>/runs/<env>/<algo>/seed-<seed>`` (checkpoint,
``log.jsonl``, ``summary.json``), so a cell can be inspected, resumed or rerun on its own. The grid only
decides what each cell's config is, skips the finished ones and aggregates their logs:

- ``results.csv`` / ``results.md``: one row per (env, algo), mean and std over the seeds done;
- ``curves.png``: training rollout success and held-out success against trajectories collected, a column per env;
- ``grid.json``: the grid config used.

The numbers and the plots are made by ``compare_report.py``; this module runs the grid.

Fairness: every algorithm sees the same number of episodes per iteration. Group methods (registry default
``group_size > 1``) spend them as ``episodes_per_batch / group_size`` tasks x ``group_size`` rollouts; the
others as ``episodes_per_batch`` tasks x 1.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .compare_report import columns, markdown_table, plot_grid, run_metrics, slug, summarise_seeds
from .config import (
    ConfigError, TrainConfig, apply_updates, batch_shape, env_kwargs, flatten, parse_overrides, read_mapping, to_dict,
    validate,
)
from .models.checkpoints import read_run_state
from .report import read_log
from .trainer import train

# TrainConfig keys each cell gets from the grid itself; setting them in ``base`` would be silently overwritten.
GRID_OWNED = {
    "algo": "algos",
    "seed": "seeds",
    "iterations": "iterations",
    "out_dir": "out_dir",
    "env.id": "envs",
    "rollout.group_size": "group_size",
    "rollout.episodes_per_batch": "episodes_per_batch",
    "rollout.tasks_per_batch": "episodes_per_batch",
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
    episodes_per_batch: int = 8  # episodes per iteration, the same for every algorithm (rollout.episodes_per_batch)
    group_size: int = 4  # rollouts per task for the group methods (the others use 1)
    out_dir: str = "runs/compare"
    base: dict = field(default_factory=dict)  # TrainConfig overrides for every cell, e.g. {"model": {"path": ...}}
    # TrainConfig overrides for one algorithm's cells, applied after base, e.g. {"capo": {"algo_overrides":
    # {"clip_low": 1e-3}}}: an action-level ratio and a token-level one do not share a clip range.
    per_algo: dict = field(default_factory=dict)
    # One warm start per (env, seed), in <out_dir>/warm_starts, that every algorithm's cell of that seed starts
    # from (sft.from_run) with its held-out evaluation, instead of one per cell: the cells then differ by the
    # algorithm alone, and a grid of 4 algorithms clones and evaluates the warm start once a seed, not 4 times.
    shared_warm_start: bool = False

    RENAMED: ClassVar[dict[str, str]] = {"trajectories_per_iteration": "episodes_per_batch"}  # old key: new key


@dataclass
class GridEnv:
    """One env of the grid: an entry of ``GridConfig.envs``."""

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
        if key == "per_algo":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(f"per_algo maps an algorithm to TrainConfig keys, got {value!r}")
            _merge(grid.per_algo, value)
            continue
        if key in ("algos", "envs", "seeds"):
            value = _as_list(value, key)
        apply_updates(grid, {key: value})  # unknown keys and wrong types: the same messages as TrainConfig's
    return grid


def load_grid(path: str | Path | None = None, overrides: Sequence[str] = (), flags: dict | None = None) -> GridConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides, then explicit flags; checked."""
    grid = GridConfig()
    if path is not None:
        apply_grid(grid, read_mapping(path, "grid keys"))
    apply_grid(grid, parse_overrides(overrides))
    apply_grid(grid, flags or {})
    check_grid(grid)
    grid.base = typed_base(grid.base)
    grid.per_algo = {algo: typed_base(updates) for algo, updates in grid.per_algo.items()}
    return grid


def typed_base(base: dict) -> dict:
    """``base`` with each value as TrainConfig reads it (``"2e-3"`` -> 0.002), so grid.json and the
    results header show what the cells were trained with."""
    config = TrainConfig()
    apply_updates(config, copy.deepcopy(base), "base.")

    def read(updates: dict, obj: Any) -> dict:
        return {k: read(v, getattr(obj, k)) if dataclasses.is_dataclass(getattr(obj, k)) else getattr(obj, k)
                for k, v in updates.items()}

    return read(base, config)


def is_group_algo(name: str) -> bool:
    from .algorithms import ALGORITHMS

    return int(ALGORITHMS[name].defaults.get("group_size", 1)) > 1


def grid_envs(grid: GridConfig) -> list[GridEnv]:
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
        specs.append(GridEnv(entry["id"], kwargs, name))
    slugs = [slug(s.name) for s in specs]
    for s in set(slugs):
        if slugs.count(s) > 1:
            raise ConfigError(f"envs: two entries share the folder {s!r}; give them distinct `name`s")
    return specs



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
    for key in ("iterations", "episodes_per_batch", "group_size"):
        if getattr(grid, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(grid, key)}")
    if any(is_group_algo(a) for a in grid.algos):
        if grid.group_size < 2:
            raise ConfigError("group_size must be >= 2: a group baseline over one rollout has zero advantage")
        if grid.episodes_per_batch % grid.group_size:
            raise ConfigError(
                f"episodes_per_batch ({grid.episodes_per_batch}) must be a multiple of "
                f"group_size ({grid.group_size}) so the group methods see as many episodes as the others"
            )
    for algo in grid.per_algo:  # a registered one the grid does not run is fine: `algos=capo` on a full grid
        if algo not in ALGORITHMS:
            raise ConfigError(f"per_algo.{algo}: unknown algorithm; choose from {list(ALGORITHMS)}")
        if grid.shared_warm_start and {"sft", "model"} & set(grid.per_algo[algo]):
            raise ConfigError(f"per_algo.{algo} sets sft or model keys, but with shared_warm_start every algorithm "
                              "of a seed starts from one warm start; set them in base")
    if grid.shared_warm_start and flatten(grid.base).get("sft.from_run"):
        raise ConfigError("base.sft.from_run is set by the grid when shared_warm_start is on")
    for where, updates in [("base", grid.base)] + [(f"per_algo.{a}", u) for a, u in grid.per_algo.items()]:
        flat = flatten(updates)
        for key, grid_key in GRID_OWNED.items():
            if key in flat:
                raise ConfigError(f"{where}.{key} is set by the grid; use the grid key {grid_key!r} instead")
        apply_updates(TrainConfig(), copy.deepcopy(updates), f"{where}.")  # unknown/mistyped keys, with hints
    import capo_envs

    for spec in grid_envs(grid):
        card = capo_envs.CATALOG.get(spec.id)
        if card is not None and not card.data_ready():
            raise ConfigError(f"env {spec.id} has no data yet: run `{card.prepare}`")
        for algo in grid.algos:  # env id, algorithm and the rest of TrainConfig's own checks
            validate(cell_config(grid, spec, algo, grid.seeds[0]))


# ----------------------------------------------------------------------------- cells


def cell_dir(grid: GridConfig, env: GridEnv, algo: str, seed: int) -> Path:
    return Path(grid.out_dir) / "runs" / slug(env.name) / algo / f"seed-{seed}"


def warm_start_dir(grid: GridConfig, env: GridEnv, seed: int) -> Path:
    return Path(grid.out_dir) / "warm_starts" / slug(env.name) / f"seed-{seed}"


def warm_start_config(grid: GridConfig, env: GridEnv, seed: int) -> TrainConfig:
    """The shared warm start of ``(env, seed)``: the first algorithm's cell stopped after its warm start and
    its held-out evaluation (what `capo sft` runs)."""
    config = cell_config(grid, env, grid.algos[0], seed)
    config.sft.from_run, config.iterations = "", 0
    config.out_dir = str(warm_start_dir(grid, env, seed))
    return config


def warm_start_done(directory: Path) -> bool:
    state = read_run_state(directory)
    return state is not None and state.sft_done


def cell_config(grid: GridConfig, env: GridEnv, algo: str, seed: int) -> TrainConfig:
    config = TrainConfig()
    apply_updates(config, copy.deepcopy(grid.base), "base.")
    apply_updates(config, copy.deepcopy(grid.per_algo.get(algo, {})), f"per_algo.{algo}.")
    group = grid.group_size if is_group_algo(algo) else 1
    config.algo, config.seed, config.iterations = algo, seed, grid.iterations
    config.env.id = env.id
    if env.kwargs is not None:
        config.env.kwargs = copy.deepcopy(env.kwargs)
    # Explicit 1 for the critic methods: 0 would mean "the algorithm's default", which is not the grid's.
    config.rollout.group_size = group
    config.rollout.episodes_per_batch = grid.episodes_per_batch
    # Written out (batch_shape would derive it) so the config matches cells started before episodes_per_batch.
    config.rollout.tasks_per_batch = batch_shape(config)[0]
    # The held-out numbers in the table come from the end of each cell.
    if "eval_every" not in grid.base and "eval_every" not in grid.per_algo.get(algo, {}):
        config.eval_every = grid.iterations
    config.out_dir = str(cell_dir(grid, env, algo, seed))
    if grid.shared_warm_start:
        config.sft.from_run = str(warm_start_dir(grid, env, seed))
    return config


def rl_iterations_done(directory: Path) -> int:
    return sum(1 for r in read_log(directory / "log.jsonl") if r.get("iteration", 0) >= 1)


def is_done(grid: GridConfig, directory: Path) -> bool:
    # A summary with fewer iterations than asked is a grid that was extended: resume it, don't skip it.
    return (directory / "summary.json").exists() and rl_iterations_done(directory) >= grid.iterations


# Settings a resumed cell may change: how far it runs, where it lives, and how env steps are scheduled
# (the env pool gives identical trajectories whatever its kind and size: tests/test_envpool.py).
# sft.from_run lives in the grid's folder and moves with it; a cell reads it only before its first checkpoint.
_MAY_CHANGE_ON_RESUME = ("iterations", "eval_every", "out_dir", "rollout.env_pool", "rollout.env_workers",
                         "sft.from_run")


def _check_same_config(config: TrainConfig, directory: Path) -> None:
    """Refuse to mix results of different settings in one table: a cell already started must have been
    started with this config (iterations and eval_every may grow, the grid folder may move; keys one side
    lacks are ignored, so a field added to TrainConfig later does not invalidate old cells, and so are
    keys null here: "auto" values, e.g. optim.actor_lr, which the cell resolved when it started)."""
    saved_path = directory / "checkpoint" / "config.json"
    if not saved_path.exists():
        return
    saved = flatten(json.loads(saved_path.read_text()))
    now = flatten(to_dict(config))
    changed = {k: (saved[k], now[k]) for k in saved.keys() & now.keys()
               if saved[k] != now[k] and now[k] is not None and k not in _MAY_CHANGE_ON_RESUME}
    if changed:
        diff = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()))
        raise ConfigError(f"{directory} was started with other settings ({diff}); use another out_dir or delete it")


def cells(grid: GridConfig) -> list[tuple[GridEnv, str, int]]:
    # Seed-major: after the first len(algos) cells every algorithm has one seed, so a partial grid compares.
    return [(env, algo, seed) for env in grid_envs(grid) for seed in grid.seeds for algo in grid.algos]


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
    warm_starts = []
    if grid.shared_warm_start:  # before the cells that start from them
        for env in grid_envs(grid):
            for seed in grid.seeds:
                config = warm_start_config(grid, env, seed)
                if not warm_start_done(Path(config.out_dir)):
                    name = f"warm start {slug(env.name)}/seed-{seed}"
                    warm_starts.append((name, name, config))
    _train_all(grid, command, warm_starts, jobs)
    pending = []
    for i, config in enumerate(todo, 1):
        name = str(Path(config.out_dir).relative_to(out / "runs"))
        if is_done(grid, Path(config.out_dir)):
            print(f"[{i}/{len(todo)}] {name}: done, skipped", flush=True)
        else:
            pending.append((f"[{i}/{len(todo)}] {name}", name, config))
    _train_all(grid, command, pending, jobs)
    return write_results(grid, command)


def _train_all(grid: GridConfig, command: str | None, items: list, jobs: int) -> None:
    """Train ``items`` (``(label, progress tag, config)``) one after the other, or ``jobs`` at once, writing
    the results after each."""
    if jobs == 1:
        for where, tag, config in items:
            print(f"{where}: training", flush=True)
            train_cell(config, progress_tag=f"capo compare {tag}")
            write_results(grid, command)
    elif items:
        _run_parallel(grid, command, [(where, config) for where, _, config in items], jobs)


def train_cell(config: TrainConfig, threads: int | None = None, progress_tag: str | None = None) -> None:
    """Train (or resume) one cell; with ``progress_tag`` its phase and iteration lines are printed under that
    tag (one cell at a time; parallel cells print only queued/finished)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    train(config, resume=True, progress=progress_tag is not None, tag=progress_tag or "capo train")


def _run_parallel(grid: GridConfig, command: str | None, pending: list, jobs: int) -> None:
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // jobs)
    # spawn, not fork: a forked child would inherit the parent's torch thread pools and locks.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {}
        for where, config in pending:
            futures[pool.submit(train_cell, config, threads)] = where
            print(f"{where}: queued", flush=True)
        drain(futures, lambda: write_results(grid, command))


def drain(futures: dict, after_each: Callable[[], Any]) -> None:
    """Wait for ``futures`` ({future: label}), printing each as it finishes and calling ``after_each`` then, so
    that results.md shows a grid's finished cells while the others still train (a grid of 45-minute cells
    used to print nothing until the last one ended). The first failure cancels the queued cells and raises."""
    from concurrent.futures import FIRST_COMPLETED, wait

    remaining = set(futures)
    while remaining:
        finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
        for future in finished:
            if future.exception() is not None:
                for other in remaining:
                    other.cancel()
                raise future.exception()
            print(f"{futures[future]}: finished", flush=True)
        after_each()


# ----------------------------------------------------------------------------- results


def collect_runs(grid: GridConfig) -> dict[tuple[str, str], list[tuple[int, list[dict]]]]:
    """``(env name, algo) -> [(seed, log records)]`` for the finished cells of this grid only."""
    runs: dict[tuple[str, str], list[tuple[int, list[dict]]]] = {}
    for env in grid_envs(grid):
        for algo in grid.algos:
            done = []
            for seed in grid.seeds:
                directory = cell_dir(grid, env, algo, seed)
                if is_done(grid, directory):
                    done.append((seed, read_log(directory / "log.jsonl")))
            runs[(env.name, algo)] = done
    return runs


def aggregate(grid: GridConfig) -> list[dict]:
    """One row per (env, algo): its group size and the mean and std of each metric over its finished seeds."""
    rows = []
    for (env, algo), done in collect_runs(grid).items():
        group = grid.group_size if is_group_algo(algo) else 1
        row = {"env": env, "algo": algo, "group_size": group}
        rows.append(row | summarise_seeds([run_metrics(records) for _, records in done]))
    return rows


def describe(grid: GridConfig, command: str | None) -> str:
    """The header of results.md: enough to rerun the grid and to read the table right."""
    T = grid.episodes_per_batch
    shapes = []
    for algo in grid.algos:
        g = grid.group_size if is_group_algo(algo) else 1
        shapes.append(f"{algo} ({T // g} tasks x {g} rollout{'s' if g > 1 else ''})")
    envs = []
    for env in grid_envs(grid):  # the kwargs actually used: an id alone takes base's (or the default) env.kwargs
        kwargs = json.dumps(env_kwargs(cell_config(grid, env, grid.algos[0], grid.seeds[0]).env), sort_keys=True)
        envs.append(f"{env.id} {kwargs}" + (f" as {env.name}" if env.name != env.id else ""))
    return "\n".join([
        f"Grid: `{command}`" if command else "Grid: `run_grid` with the config in grid.json",
        "",
        f"- algos: {', '.join(shapes)}",
        f"- envs: {', '.join(envs)}",
        f"- seeds: {', '.join(map(str, grid.seeds))}; iterations: {grid.iterations}; episodes per iteration: {T}",
        f"- base: {json.dumps(grid.base, sort_keys=True)}",
        *[f"- {algo} only: {json.dumps(updates, sort_keys=True)}" for algo, updates in grid.per_algo.items()],
        "",
        ("Held-out success, score, EM, F1, invalid-action rate, actions and generated tokens per episode: greedy "
         "decoding at the end of each run; rollout success: sampled training episodes over the last tenth of "
         "the iterations; trajectories and RL tokens: episodes collected and tokens generated in RL; "
         "mean ± sample std over the seeds done."),
    ])


def write_results(grid: GridConfig, command: str | None = None) -> list[dict]:
    out = Path(grid.out_dir)
    rows = aggregate(grid)
    fields = columns(rows)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in fields} for row in rows)
    (out / "results.md").write_text(describe(grid, command) + "\n\n" + markdown_table(rows, grid) + "\n")
    plot_grid(collect_runs(grid), [env.name for env in grid_envs(grid)], grid.algos, out / "curves.png")
    return rows
