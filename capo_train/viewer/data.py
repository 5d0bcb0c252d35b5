"""What ``capo view`` shows, read from run folders: no torch, only the files a run writes.

A **run** folder holds ``log.jsonl`` (one record per iteration), ``checkpoint/config.json``, ``summary.json``
and ``episodes/iter-*.jsonl`` (``capo_train.episodes``). A **grid** folder (``capo compare``) holds
``grid.json``, ``results.csv`` and its cells as runs under ``runs/<env>/<algo>/seed-<s>``. Any other folder is
searched for runs (folders with a ``log.jsonl`` or ``episodes/``), five levels deep.

The page gets its data as small JavaScript files (``data/*.js``, each ``CAPO.put(key, {...})``), so that the
same files work served over HTTP and opened from disk (a static export: browsers refuse ``fetch`` of
``file://`` URLs but not ``<script src>``). Episodes travel in two parts: a columnar index of every recorded
episode of a run (the browser's table and filters) and one file per recorded iteration (the episodes' texts
and per-action numbers, loaded when one is opened).

A folder the viewer did not write may hold anything: what it cannot read (a file that is not UTF-8, or not
the JSON it should be; a log or episodes line cut mid-write or of the wrong shape) is left out with a note
(``notes`` in the payloads, shown on the pages), per file, line or episode, and the rest of the run shows.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare_report import slug  # the cell folders' names capo compare uses
from ..report import ITERATION_PHASES, MAX_NOTES, read_log

EPISODES_DIR = "episodes"
# ASCII digits, at most 9 of them (re.fullmatch: no trailing newline; \d would take any script's digits)
ITER_FILE = re.compile(r"iter-([0-9]{1,9})\.jsonl")  # training episodes, with their credit
EVAL_FILE = re.compile(r"eval-([0-9]{1,9})\.jsonl")  # held-out (greedy) episodes of an evaluation
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


def _json(path: Path, notes: list[str] | None = None, name: str | None = None) -> Any:
    """The JSON in ``path``; None when it is absent, or unreadable (with a note in ``notes``)."""
    notes = [] if notes is None else notes
    name = name or path.name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        notes.append(f"{name}: cannot read it ({e.strerror or e})")
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        notes.append(f"{name} is not UTF-8: left out")
    except (ValueError, RecursionError):  # JSONDecodeError, an int over Python's digit limit, deep nesting
        notes.append(f"{name} is not valid JSON: left out")
    return None


def _json_object(path: Path, notes: list[str], name: str) -> dict | None:
    """``_json``, when it is a JSON object (a list or a number is left out, with a note)."""
    value = _json(path, notes, name)
    if value is None or isinstance(value, dict):
        return value
    notes.append(f"{name} holds a JSON {type(value).__name__}, not an object: left out")
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
    pattern = EVAL_FILE if held_out else ITER_FILE
    found = {}
    try:
        for p in folder.iterdir():
            m = pattern.fullmatch(p.name)
            if m:
                found[int(m.group(1))] = p
    except OSError:  # no episodes/ (or not readable)
        return {}
    return dict(sorted(found.items()))


def read_episodes(path: Path, notes: list[str] | None = None) -> list[dict]:
    """The episodes of an iteration file; a line that is not UTF-8 JSON (a torn last line of a file copied
    mid-write), not an object, or whose ``actions`` are not a list of objects is skipped, with a note."""
    notes = [] if notes is None else notes
    name = f"{EPISODES_DIR}/{path.name}"
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        notes.append(f"{name}: cannot read it ({e.strerror or e})")
        return []
    out, skipped = [], 0
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        why = None
        try:
            episode = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            why = "not UTF-8 (a line cut mid-write?)"
        except (ValueError, RecursionError):
            why = "not valid JSON (a line cut mid-write?)"
        else:
            why = _episode_problem(episode)
        if why is None:
            out.append(episode)
            continue
        skipped += 1
        if skipped <= MAX_NOTES:
            notes.append(f"{name} line {number}: episode skipped, {why}")
    if skipped > MAX_NOTES:
        notes.append(f"{name}: {skipped - MAX_NOTES} more episodes skipped")
    return out


def _episode_problem(episode: Any) -> str | None:
    """Why the page cannot show ``episode`` (None: it can)."""
    if not isinstance(episode, dict):
        return f"a JSON {type(episode).__name__}, not an object"
    actions = episode.get("actions", [])
    if not isinstance(actions, list):
        return f"its actions are a JSON {type(actions).__name__}, not a list"
    if not all(isinstance(a, dict) for a in actions):
        return "its actions are not all JSON objects"
    return None


_INDEX_CACHE: dict[Path, tuple[tuple[float, int], list[list], list[str]]] = {}
INDEX_COLUMNS = ("it", "ep", "task", "succ", "ret", "n", "inv", "clip", "adv", "valid", "eval")


def _index_rows(path: Path, notes: list[str]) -> list[list]:
    """One row per episode of an iteration file (``INDEX_COLUMNS``), cached by the file's mtime and size;
    what it skipped goes to ``notes``."""
    try:
        stat = path.stat()
    except OSError as e:  # gone since the folder was listed
        notes.append(f"{EPISODES_DIR}/{path.name}: cannot read it ({e.strerror or e})")
        return []
    key = (stat.st_mtime, stat.st_size)
    cached = _INDEX_CACHE.get(path)
    if cached and cached[0] == key:
        notes.extend(cached[2])
        return cached[1]
    rows, skipped = [], []
    for e in read_episodes(path, skipped):
        actions = e.get("actions") or []
        rows.append([
            e.get("iteration"), e.get("episode"), str(e.get("task_id", "")), _finite(e.get("success")),
            _finite(e.get("return")), e.get("num_actions", len(actions)), e.get("invalid_actions", 0),
            sum(bool(a.get("clipped")) for a in actions),
            [None if _finite(a.get("advantage")) is None else round(a["advantage"], 4) for a in actions],
            "".join("1" if a.get("valid", True) else "0" for a in actions),
            1 if e.get("split") == "held-out" else 0,
        ])
    _INDEX_CACHE[path] = (key, rows, skipped)
    notes.extend(skipped)
    return rows


def episode_index(run: Path, notes: list[str] | None = None) -> dict[str, list]:
    """Every recorded episode of a run, columnar (``INDEX_COLUMNS``): what the episode browser filters."""
    notes = [] if notes is None else notes
    columns: dict[str, list] = {c: [] for c in INDEX_COLUMNS}
    for path in [*iteration_files(run).values(), *iteration_files(run, held_out=True).values()]:
        for row in _index_rows(path, notes):
            for c, v in zip(INDEX_COLUMNS, row):
                columns[c].append(v)
    return columns


def run_payload(ref: RunRef) -> dict:
    """A run's page data: curves, config, summary, recording settings, the episode index, and ``notes``
    on what could not be read."""
    run, notes = ref.path, []
    try:
        return {
            "name": ref.name,
            "path": str(run),
            "config": _json_object(run / "checkpoint" / "config.json", notes, "checkpoint/config.json"),
            "summary": _json_object(run / "summary.json", notes, "summary.json"),
            "meta": _json_object(run / EPISODES_DIR / "meta.json", notes, f"{EPISODES_DIR}/meta.json"),
            "series": series(read_log(run / "log.jsonl", skip_bad_lines=True, notes=notes)),
            "iterations": list(iteration_files(run)),
            "eval_iterations": list(iteration_files(run, held_out=True)),
            "episodes": episode_index(run, notes),
            "time_phases": list(ITERATION_PHASES),
            "notes": notes,
        }
    except Exception as e:  # a safety net: a bug on a strange folder shows as a note, not a broken site
        return {"name": ref.name, "path": str(run), "config": None, "summary": None, "meta": None, "series": {},
                "iterations": [], "eval_iterations": [], "episodes": {c: [] for c in INDEX_COLUMNS},
                "time_phases": list(ITERATION_PHASES),
                "notes": [*notes, f"cannot show this run: {type(e).__name__}: {e}"]}


def _field(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...`` where each level is an object, else None."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def run_brief(ref: RunRef) -> dict:
    """One line of the runs table (no episode index: cheap for many runs)."""
    run, notes = ref.path, []
    brief = {"name": ref.name, "path": str(run), "grid": ref.grid, "algo": None, "env": None, "seed": None,
             "iterations": 0, "eval_success": None, "rollout_success": None, "recorded_iterations": 0,
             "notes": notes}
    try:
        config = _json_object(run / "checkpoint" / "config.json", notes, "checkpoint/config.json") or {}
        summary = _json_object(run / "summary.json", notes, "summary.json") or {}
        records = read_log(run / "log.jsonl", skip_bad_lines=True, notes=notes)
        evals = [r["eval/success"] for r in records if _finite(r.get("eval/success")) is not None]
        rollouts = [r["rollout/success"] for r in records if _finite(r.get("rollout/success")) is not None]
        brief |= {
            "algo": _field(config, "algo") or _field(summary, "algo"),
            "env": _field(config, "env", "id") or _field(summary, "env"),
            "seed": _field(config, "seed"),
            "iterations": max((r["iteration"] for r in records), default=0),
            "eval_success": evals[-1] if evals else None,
            "rollout_success": rollouts[-1] if rollouts else None,
            "recorded_iterations": len(iteration_files(run)),
        }
    except Exception as e:  # a safety net, as in run_payload: one strange run never breaks the runs table
        notes.append(f"cannot show this run: {type(e).__name__}: {e}")
    return brief


def iteration_payload(ref: RunRef, iteration: int, held_out: bool = False) -> dict:
    path = iteration_files(ref.path, held_out).get(iteration)
    notes: list[str] = []
    return {"iteration": iteration, "episodes": read_episodes(path, notes) if path else [], "notes": notes}


def grid_payload(grid: GridRef, runs: list[RunRef]) -> dict:
    """The grid's table (results.csv as written by ``capo compare``) and, per (env, algo) row, its cells' runs."""
    rows: list[dict] = []
    header: list[str] = []
    notes: list[str] = []
    results = grid.path / "results.csv"
    if results.is_file():
        try:
            with open(results, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                header = [str(h) for h in reader.fieldnames or []]
                rows = [{str(k): v for k, v in r.items()} for r in reader]
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            notes.append(f"results.csv cannot be read ({type(e).__name__}): the table lists the cells only")
            header, rows = [], []
    cells: dict[str, list[dict]] = {}
    for i in grid.runs:
        rel = runs[i].path.relative_to(grid.path / "runs")
        env, algo, seed = rel.parts[:3]
        cells.setdefault(f"{env}|{algo}", []).append({"run": i, "seed": seed})
    known = {f"{slug(r.get('env') or '')}|{r.get('algo') or ''}" for r in rows}
    for key in cells:  # cells not (yet) in results.csv still get a row
        if key not in known:
            env, algo = key.split("|")
            rows.append({"env": env, "algo": algo})
    for r in rows:
        r["runs"] = cells.get(f"{slug(r.get('env') or '')}|{r.get('algo') or ''}", [])
    return {"name": grid.name, "path": str(grid.path), "header": header, "rows": rows,
            "grid": _json_object(grid.path / "grid.json", notes, "grid.json"), "notes": notes}


def site_payload(runs: list[RunRef], grids: list[GridRef]) -> dict:
    return {"runs": [run_brief(r) for r in runs], "grids": [grid_payload(g, runs) for g in grids]}
