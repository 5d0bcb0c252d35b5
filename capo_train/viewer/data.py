"""What ``capo view`` shows, read from run folders: no torch, only the files a run writes.

A **run** folder holds ``log.jsonl`` (one record per iteration), ``checkpoint/config.json``, ``summary.json``
and ``episodes/iter-*.jsonl`` (``capo_train.episodes``). A **grid** folder (``capo bench``) holds
``grid.json``, ``results.csv`` and its cells as runs under ``runs/<env>/<algo>/seed-<s>``. Any other folder is
searched for runs (folders with a ``log.jsonl`` or ``episodes/``), five levels deep.

The page gets its data as small JavaScript files (``data/*.js``, each ``CAPO.put(key, {...})``), so that the
same files work served over HTTP and opened from disk (a static export: browsers refuse ``fetch`` of
``file://`` URLs but not ``<script src>``). Episodes travel in two parts: a columnar index of every recorded
episode of a run (the browser's table and filters) and one file per recorded iteration (the episodes' texts
and per-action numbers, loaded when one is opened).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bench import read_log, slug  # the cell folders' names and the log reader capo bench uses

EPISODES_DIR = "episodes"
ITER_FILE = re.compile(r"^iter-(\d+)\.jsonl$")  # training episodes, with their credit
EVAL_FILE = re.compile(r"^eval-(\d+)\.jsonl$")  # held-out (greedy) episodes of an evaluation
SEARCH_DEPTH = 5


@dataclass
class RunRef:
    path: Path
    name: str
    grid: int | None = None  # index of the grid it belongs to


@dataclass
class GridRef:
    path: Path
    name: str
    runs: list[int] = field(default_factory=list)


def is_run(path: Path) -> bool:
    return (path / "log.jsonl").is_file() or (path / EPISODES_DIR).is_dir()


def discover(paths: list[str | Path]) -> tuple[list[RunRef], list[GridRef]]:
    """The runs and grids behind the folders given on the command line (see the module doc)."""
    runs: list[RunRef] = []
    grids: list[GridRef] = []
    seen: set[Path] = set()

    def add(path: Path, name: str, grid: int | None = None) -> int | None:
        resolved = path.resolve()
        if resolved in seen:
            return None
        seen.add(resolved)
        runs.append(RunRef(path, name, grid))
        return len(runs) - 1

    for given in map(Path, paths):
        if not given.is_dir():
            raise FileNotFoundError(f"{given} is not a folder")
        if (given / "grid.json").is_file():
            grid = GridRef(given, given.name or str(given))
            grids.append(grid)
            for log in sorted((given / "runs").glob("*/*/*/log.jsonl")):
                cell = log.parent
                index = add(cell, f"{given.name}/{cell.relative_to(given / 'runs')}", len(grids) - 1)
                if index is not None:
                    grid.runs.append(index)
        elif is_run(given):
            add(given, given.resolve().name)
        else:
            for found in sorted(_search(given, SEARCH_DEPTH)):
                add(found, str(found.relative_to(given)) if found != given else given.name)
    return runs, grids


def _search(root: Path, depth: int):
    if is_run(root):
        yield root
        return
    if depth == 0:
        return
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return
    for child in children:
        yield from _search(child, depth - 1)


# ----------------------------------------------------------------------------- reading a run


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def series(records: list[dict]) -> dict[str, list[list[float]]]:
    """Every numeric key of the log as ``[[iteration, value], ...]``."""
    out: dict[str, list[list[float]]] = {}
    for record in records:
        it = record.get("iteration", 0)
        for key, value in record.items():
            v = _finite(value)
            if key != "iteration" and v is not None:
                out.setdefault(key, []).append([it, v])
    return out


def iteration_files(run: Path, held_out: bool = False) -> dict[int, Path]:
    """``{iteration: file}`` of the recorded training episodes (``held_out``: of the held-out evaluations)."""
    folder = run / EPISODES_DIR
    if not folder.is_dir():
        return {}
    pattern = EVAL_FILE if held_out else ITER_FILE
    found = {}
    for p in folder.iterdir():
        m = pattern.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def read_episodes(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            episode = json.loads(line)
        except json.JSONDecodeError:  # a torn last line of a file copied mid-write
            continue
        if isinstance(episode, dict):
            out.append(episode)
    return out


_INDEX_CACHE: dict[Path, tuple[tuple[float, int], list[list]]] = {}
INDEX_COLUMNS = ("it", "ep", "task", "succ", "ret", "n", "inv", "clip", "adv", "valid", "eval")


def _index_rows(path: Path) -> list[list]:
    """One row per episode of an iteration file (``INDEX_COLUMNS``), cached by the file's mtime and size."""
    stat = path.stat()
    key = (stat.st_mtime, stat.st_size)
    cached = _INDEX_CACHE.get(path)
    if cached and cached[0] == key:
        return cached[1]
    rows = []
    for e in read_episodes(path):
        actions = e.get("actions") or []
        rows.append([
            e.get("iteration"), e.get("episode"), str(e.get("task_id", "")), _finite(e.get("success")),
            _finite(e.get("return")), e.get("num_actions", len(actions)), e.get("invalid_actions", 0),
            sum(bool(a.get("clipped")) for a in actions),
            [None if _finite(a.get("advantage")) is None else round(a["advantage"], 4) for a in actions],
            "".join("1" if a.get("valid", True) else "0" for a in actions),
            1 if e.get("split") == "held-out" else 0,
        ])
    _INDEX_CACHE[path] = (key, rows)
    return rows


def episode_index(run: Path) -> dict[str, list]:
    """Every recorded episode of a run, columnar (``INDEX_COLUMNS``): what the episode browser filters."""
    columns: dict[str, list] = {c: [] for c in INDEX_COLUMNS}
    for path in [*iteration_files(run).values(), *iteration_files(run, held_out=True).values()]:
        for row in _index_rows(path):
            for c, v in zip(INDEX_COLUMNS, row):
                columns[c].append(v)
    return columns


def run_payload(ref: RunRef) -> dict:
    """A run's page data: curves, config, summary, recording settings and the episode index."""
    run = ref.path
    config = _json(run / "checkpoint" / "config.json")
    summary = _json(run / "summary.json")
    return {
        "name": ref.name,
        "path": str(run),
        "config": config,
        "summary": summary,
        "meta": _json(run / EPISODES_DIR / "meta.json"),
        "series": series(read_log(run / "log.jsonl", skip_bad_lines=True)),
        "iterations": list(iteration_files(run)),
        "eval_iterations": list(iteration_files(run, held_out=True)),
        "episodes": episode_index(run),
    }


def run_brief(ref: RunRef) -> dict:
    """One line of the runs table (no episode index: cheap for many runs)."""
    run = ref.path
    config = _json(run / "checkpoint" / "config.json") or {}
    summary = _json(run / "summary.json") or {}
    records = read_log(run / "log.jsonl", skip_bad_lines=True)
    evals = [r["eval/success"] for r in records if _finite(r.get("eval/success")) is not None]
    rollouts = [r["rollout/success"] for r in records if _finite(r.get("rollout/success")) is not None]
    return {
        "name": ref.name,
        "path": str(run),
        "grid": ref.grid,
        "algo": config.get("algo") or summary.get("algo"),
        "env": (config.get("env") or {}).get("id") or summary.get("env"),
        "seed": config.get("seed"),
        "iterations": max((r.get("iteration", 0) for r in records), default=0),
        "eval_success": evals[-1] if evals else None,
        "rollout_success": rollouts[-1] if rollouts else None,
        "recorded_iterations": len(iteration_files(run)),
    }


def iteration_payload(ref: RunRef, iteration: int, held_out: bool = False) -> dict:
    path = iteration_files(ref.path, held_out).get(iteration)
    return {"iteration": iteration, "episodes": read_episodes(path) if path else []}


def grid_payload(grid: GridRef, runs: list[RunRef]) -> dict:
    """The bench table (results.csv as written by ``capo bench``) and, per (env, algo) row, its cells' runs."""
    rows: list[dict] = []
    header: list[str] = []
    results = grid.path / "results.csv"
    if results.is_file():
        with open(results, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = [dict(r) for r in reader]
    cells: dict[str, list[dict]] = {}
    for i in grid.runs:
        rel = runs[i].path.relative_to(grid.path / "runs")
        env, algo, seed = rel.parts[:3]
        cells.setdefault(f"{env}|{algo}", []).append({"run": i, "seed": seed})
    known = {f"{slug(r.get('env', ''))}|{r.get('algo', '')}" for r in rows}
    for key in cells:  # cells not (yet) in results.csv still get a row
        if key not in known:
            env, algo = key.split("|")
            rows.append({"env": env, "algo": algo})
    for r in rows:
        r["runs"] = cells.get(f"{slug(r.get('env', ''))}|{r.get('algo', '')}", [])
    return {"name": grid.name, "path": str(grid.path), "header": header, "rows": rows,
            "grid": _json(grid.path / "grid.json")}


def site_payload(runs: list[RunRef], grids: list[GridRef]) -> dict:
    return {"runs": [run_brief(r) for r in runs], "grids": [grid_payload(g, runs) for g in grids]}
