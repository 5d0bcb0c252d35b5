"""Finding ALFWorld games on disk, with the official loader's filter, and never an endless wait.

The layout is the one ``$ALFWORLD_DATA`` has (ALFWorld ``alfworld/info.py``, ``scripts/alfworld-download``)::

    <data_dir>/json_2.1.1/{train,valid_seen,valid_unseen}/<task>-<Object>-<Movable>-<Recep>-<scene>/trial_T.../
        traj_data.json, game.tw-pddl (and initial_state.pddl)
    <data_dir>/logic/alfred.pddl, alfred.twl2

``find_games`` applies ``AlfredTWEnv.collect_game_files``'s rules (alfworld 0.4.2): a folder counts when it has
``traj_data.json``; it is skipped when its path contains ``movable`` or ``Sliced``, when its ``task_type`` is
not among the chosen ones, when ``game.tw-pddl`` is missing, or when the game has no ``solvable`` key or has
``solvable: false``. The official loader then cycles over the list forever, so an empty list spins at 100%
CPU (alfworld#104); here an empty list is a ``NoGamesError`` that names the folder and what was skipped.

Stdlib only (and capo_envs.core.paths): it works without the engine installed.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..core.paths import DataNotPreparedError

# alfworld/agents/environment/alfred_tw_env.py: TASK_TYPES (config ``env.task_types: [1, ..., 6]``).
TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
TASK_TYPE_NAMES = tuple(TASK_TYPES.values())

GAMES_FOLDER = "json_2.1.1"
# Our names for the three official splits, and the names ALFWorld's config uses for them (``train_eval``);
# ``dev``/``test`` let the trainer's default ``env.eval_split=dev`` pick valid_seen.
SPLITS = ("train", "valid_seen", "valid_unseen")
SPLIT_ALIASES = {
    "eval_in_distribution": "valid_seen",
    "eval_out_of_distribution": "valid_unseen",
    "dev": "valid_seen",
    "test": "valid_unseen",
}
# Official game counts after the filter (ALFWorld data/README.md, the paper; CAPO's parquets agree).
OFFICIAL_COUNTS = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}


class NoGamesError(DataNotPreparedError):
    """No playable game in a folder: the engine would wait forever, so this is raised instead."""


@dataclass(frozen=True)
class GameRef:
    """One playable game: its id (the trial folder relative to the split folder), file and task type."""

    task_id: str
    path: Path
    task_type: str


def canonical_split(split: str) -> str:
    name = SPLIT_ALIASES.get(split, split)
    if name not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS) + sorted(SPLIT_ALIASES)}, got {split!r}")
    return name


def resolve_task_types(task_types: Iterable[int | str] | None) -> tuple[str, ...]:
    """Task types as names, from ids (1-6, as in ALFWorld's config) or names; None means all six."""
    if task_types is None:
        return TASK_TYPE_NAMES
    if isinstance(task_types, (str, int)):
        task_types = [task_types]
    names = []
    for item in task_types:
        if isinstance(item, bool):
            raise ValueError(f"task_types holds ids 1-6 or names {list(TASK_TYPE_NAMES)}, got {item!r}")
        name = TASK_TYPES.get(item) if isinstance(item, int) else item
        if name not in TASK_TYPE_NAMES:
            raise ValueError(f"task_types holds ids 1-6 or names {list(TASK_TYPE_NAMES)}, got {item!r}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("task_types is empty: give at least one of 1-6")
    return tuple(names)


def is_playable(game_file: Path) -> tuple[bool, str]:
    """The official check on a ``game.tw-pddl``: it exists, parses, and says ``"solvable": true``."""
    if not game_file.is_file():
        return False, "no game.tw-pddl"
    try:
        data = json.loads(game_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return False, f"unreadable game.tw-pddl ({type(error).__name__})"
    if not isinstance(data, dict) or "solvable" not in data:
        return False, "no 'solvable' key"
    if not data["solvable"]:
        return False, "solvable is false"
    return True, ""


def find_games(data_dir: str | os.PathLike, split: str, task_types: Sequence[str] = TASK_TYPE_NAMES) -> list[GameRef]:
    """Every playable game of ``split`` under ``data_dir``, sorted by id; ``NoGamesError`` when there is none.

    With the index ``capo data prepare alfworld`` writes (``games.json``), no game file is opened; without it,
    every traj_data.json of the split is parsed, which takes seconds for the train split (docs/envs/alfworld.md)."""
    split = canonical_split(split)
    data_dir = Path(data_dir).expanduser()
    root = data_dir / GAMES_FOLDER / split
    indexed = read_index(data_dir, split)
    if indexed is not None:
        games = [GameRef(i, root / i / "game.tw-pddl", t) for i, t in indexed if t in task_types]
        skipped: Counter[str] = Counter({"other task type": len(indexed) - len(games)} if indexed else {"none indexed": 1})
    else:
        games, skipped = collect(root, task_types)
    if not games:
        why = ", ".join(f"{n} {reason}" for reason, n in skipped.most_common()) or "no traj_data.json found"
        raise NoGamesError(
            f"no playable ALFWorld game in {root} (split={split}, task_types={list(task_types)}; skipped: {why}). "
            "Run: capo data prepare alfworld (or pass data_dir= a folder in the $ALFWORLD_DATA layout)"
        )
    return games


def collect(root: Path, task_types: Sequence[str] = TASK_TYPE_NAMES) -> tuple[list[GameRef], Counter[str]]:
    """The playable games under ``root`` and a count of the reasons the others were skipped."""
    games: list[GameRef] = []
    skipped: Counter[str] = Counter()
    if not root.is_dir():
        skipped["missing folder"] += 1
        return games, skipped
    for folder, _dirs, files in os.walk(root):
        if "traj_data.json" not in files:
            continue
        path = Path(folder)
        if "movable" in folder or "Sliced" in folder:
            skipped["movable or sliced"] += 1
            continue
        try:
            task_type = json.loads((path / "traj_data.json").read_text(encoding="utf-8"))["task_type"]
        except (OSError, ValueError, KeyError, TypeError):
            skipped["unreadable traj_data.json"] += 1
            continue
        if task_type not in task_types:
            skipped["other task type"] += 1
            continue
        ok, reason = is_playable(path / "game.tw-pddl")
        if not ok:
            skipped[reason] += 1
            continue
        games.append(GameRef(path.relative_to(root).as_posix(), path / "game.tw-pddl", task_type))
    games.sort(key=lambda g: g.task_id)
    return games, skipped


INDEX = "games.json"


def write_index(data_dir: str | os.PathLike, games: dict[str, list[GameRef]]) -> Path:
    """``games.json``: the playable games of each split with their task types (written by data prep)."""
    path = Path(data_dir) / INDEX
    payload = {"format": 1, "splits": {split: [[g.task_id, g.task_type] for g in found] for split, found in games.items()}}
    tmp = path.with_name(INDEX + ".tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_index(data_dir: Path, split: str) -> list[tuple[str, str]] | None:
    path = data_dir / INDEX
    if not path.is_file():
        return None
    try:
        return [(str(i), str(t)) for i, t in json.loads(path.read_text(encoding="utf-8"))["splits"][split]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable index: walk the folder instead


def count_games(data_dir: str | os.PathLike) -> dict[str, int]:
    """Playable games per split (0 where a split folder is missing): what the manifest records."""
    root = Path(data_dir).expanduser() / GAMES_FOLDER
    return {split: len(collect(root / split)[0]) for split in SPLITS}
