"""``capo data prepare alfworld``: ALFWorld's release archives into ``$CAPO_DATA_DIR/alfworld``.

What ``alfworld-download`` fetches (ALFWorld ``scripts/alfworld-download``), as GitHub release assets:
``json_2.1.1_json.zip`` (traj_data.json) and ``json_2.1.1_pddl.zip`` (initial_state.pddl) from release 0.2.2,
and the games: ``json_2.1.2_tw-pddl.zip`` from release 0.4.0, the ones the PyPI ``alfworld`` 0.4.2 engine
downloads (``--games 2.1.3``: release 0.4.2's, what the repository's HEAD downloads; ``--games 2.1.1``: the
old-grammar games of alfworld <= 0.3). All three unpack into ``json_2.1.1/``. ALFWorld publishes no
checksum (GitHub records no digest for these assets), so each archive is pinned by the sha256 and size that
independent public records of the downloaded assets agree on (``note`` of each :class:`Remote`): a mirror
or a changed upstream file is refused, and the manifest records the sha256 (``capo data verify`` re-checks
it). The archives are unpacked under the caps of ``data_prep.archive`` (size, member count, ratio).

Result: ``$CAPO_DATA_DIR/alfworld/{raw/<archives>, json_2.1.1/<split>/<task>/<trial>/, logic/, games.json,
manifest.json}``, the ``$ALFWORLD_DATA`` layout plus ``games.json``, the index of playable games by split
and task type (the env reads it instead of parsing every traj_data.json). Downloads wait in
``$CAPO_DATA_DIR/.downloads/alfworld/`` and resume (``data_prep.download``); the dataset is built in
``alfworld.tmp-<pid>/`` beside any earlier one (``data_prep.building``), ``manifest.json`` (game counts per
split after the official loader's filter, per task type, and why the other folders are skipped) written
last, and renamed into place only on success: an interrupted or refused run, ``--force`` included, leaves
the earlier dataset as it was, and a rerun resumes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from collections import Counter
from pathlib import Path

from capo_envs.alfworld.games import GAMES_FOLDER, OFFICIAL_COUNTS, SPLITS, collect, write_index
from .archive import ArchiveError, extract
from .building import PrepareError, building, data_root, link_or_copy
from .download import forget
from .manifest import is_complete, read_manifest, write_manifest
from .sources import MIRROR_ENV, Remote, fetch, mirrored

log = logging.getLogger(__name__)

NAME = "alfworld"
DATASETS = (NAME,)
RELEASES = "https://github.com/alfworld/alfworld/releases/download"
# GitHub gives no digest for these assets and ALFWorld publishes none: the pins are the sha256 and size
# that public records of the downloaded assets give (other projects' data manifests, READMEs and tests,
# found through a code search); how many independent records agree is in each note.
_OBSERVED = "no published checksum; sha256 and size as {} independent public records of the downloaded asset give"
ARCHIVES: dict[str, Remote] = {
    "json": Remote(f"{RELEASES}/0.2.2/json_2.1.1_json.zip", "json_2.1.1_json.zip",
                   sha256="25171f16e20ad7b048c47275c45b0babf3aa1cbab29cec97387922350a9844bc", size=72_018_818,
                   note=_OBSERVED.format("five")),
    "pddl": Remote(f"{RELEASES}/0.2.2/json_2.1.1_pddl.zip", "json_2.1.1_pddl.zip",
                   sha256="913942ebed06659ea0da2f8122512d98bc6add30d84961ca803132d8fbcad585", size=34_881_784,
                   note=_OBSERVED.format("four")),
}
GAMES: dict[str, Remote] = {
    "2.1.2": Remote(f"{RELEASES}/0.4.0/json_2.1.2_tw-pddl.zip", "json_2.1.2_tw-pddl.zip",  # PyPI alfworld 0.4.2
                    sha256="eea90499df27b9cb3147d1d1927264146d38194b575e25f70a82875545742dcb", size=36_493_542,
                    note=_OBSERVED.format("one (its size: two)")),
    "2.1.3": Remote(f"{RELEASES}/0.4.2/json_2.1.3_tw-pddl.zip", "json_2.1.3_tw-pddl.zip",  # alfworld HEAD (0.5.0)
                    sha256="5df77ea759f2211a4106082839ddbbb790f1ba4e7d097ed732cf453f72aa36cf", size=36_507_267,
                    note=_OBSERVED.format("several")),
    "2.1.1": Remote(f"{RELEASES}/0.2.2/json_2.1.1_tw-pddl.zip", "json_2.1.1_tw-pddl.zip",  # alfworld <= 0.3.x
                    sha256="d376c4bbb097c068528a2a9805e358e4cd14bc75c4d68a24e5141aebd234ef67", size=45_059_629,
                    note=_OBSERVED.format("one") + "; the asset was replaced on 2024-02-29, this is the new one"),
}


def archive_sources(games: str = "2.1.2") -> dict[str, Remote]:
    """The three downloads of one ``--games`` choice, by role (json, pddl, tw-pddl)."""
    if games not in GAMES:
        raise ValueError(f"--games must be one of {sorted(GAMES)}, got {games!r}")
    return {**ARCHIVES, "tw-pddl": GAMES[games]}


def archive_urls(games: str = "2.1.2", base_url: str | None = None) -> dict[str, str]:
    return {name: mirrored(remote.url, base_url) for name, remote in archive_sources(games).items()}


def merge_tree(src: Path, dest: Path) -> int:
    """Move every file of ``src`` to the same relative path under ``dest``; returns how many."""
    moved = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved += 1
    return moved


def copy_logic(root: Path) -> bool:
    """``logic/alfred.pddl`` and ``alfred.twl2`` from the installed alfworld wheel, as alfworld-download does
    (the games embed their own copy; these are for generating new games)."""
    from importlib.util import find_spec

    spec = find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        log.warning("alfworld is not installed: logic/ is left out (the games do not need it)")
        return False
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    (root / "logic").mkdir(parents=True, exist_ok=True)
    for name in ("alfred.pddl", "alfred.twl2"):
        shutil.copyfile(data / name, root / "logic" / name)
    return True


def game_counts(root: Path) -> dict:
    """Per split: playable games after the official filter, by task type, and the reasons for the others;
    also writes the index of playable games (``games.json``) the env reads instead of walking the folders."""
    counts: dict = {}
    playable = {}
    for split in SPLITS:
        games, skipped = collect(root / GAMES_FOLDER / split)
        playable[split] = games
        counts[split] = {
            "games": len(games),
            "by_task_type": dict(sorted(Counter(g.task_type for g in games).items())),
            "skipped": dict(skipped.most_common()),
            "official": OFFICIAL_COUNTS[split],
        }
    write_index(root, playable)
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``capo data prepare alfworld`` beyond the common ones; each is a keyword of :func:`prepare`."""
    parser.add_argument("--games", default="2.1.2", choices=sorted(GAMES),
                        help="which release of the game files (default 2.1.2: the one alfworld 0.4.2 uses)")


def prepare(
    name: str = NAME,
    *,
    data_dir: str | Path | None = None,
    force: bool = False,
    base_url: str | None = None,
    progress: bool = True,
    games: str = "2.1.2",
) -> Path:
    """Download the release archives (resumed, checked against their pins), unpack them (capped), index the
    playable games and write the manifest last, all in a build folder that replaces ``<data_dir>/alfworld``
    only on success; returns it. A prepared folder is left alone unless ``force``."""
    if name != NAME:
        raise KeyError(f"unknown dataset {name!r}; known: {NAME}")
    root = data_root(data_dir)
    target = root / NAME
    if is_complete(target) and not force:
        log.info("alfworld is already prepared in %s (use --force to rebuild)", target)
        return target
    remotes = archive_sources(games)
    cache = root / ".downloads" / NAME
    with building(root, NAME) as build:
        fetched = {role: fetch(remote, cache, base_url=base_url, progress=progress, force=force,
                               pinned_in="data_prep/alfworld.py") for role, remote in remotes.items()}
        (build / "raw").mkdir()
        for role, (_, path) in fetched.items():
            try:
                unpacked = extract(path, build / f".unpacked-{role}")
            except ArchiveError:
                forget(path)  # a rerun fetches it again rather than refusing the same bytes
                raise
            moved = merge_tree(unpacked, build / ".tree")
            shutil.rmtree(unpacked)
            log.info("%s: %d files", path.name, moved)
            link_or_copy(path, build / "raw" / path.name)
        if not (build / ".tree" / GAMES_FOLDER).is_dir():
            raise PrepareError(f"the archives hold no {GAMES_FOLDER}/ folder: not ALFWorld's release layout")
        os.replace(build / ".tree" / GAMES_FOLDER, build / GAMES_FOLDER)
        shutil.rmtree(build / ".tree")
        logic = copy_logic(build)
        counts = game_counts(build)
        if not any(c["games"] for c in counts.values()):
            raise PrepareError(f"no playable game in the archives' {GAMES_FOLDER}/: {counts}")
        files = {f"raw/{path.name}": {"sha256": record["sha256"], "bytes": record["bytes"]}
                 for record, path in fetched.values()}
        write_manifest(build, {
            "name": NAME,
            "format": 1,
            "prepared": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "games_version": games,
            "mirror": base_url or os.environ.get(MIRROR_ENV) or None,
            "sources": {role: record for role, (record, _) in fetched.items()},
            "files": files,
            "logic": logic,
            "splits": counts,
        })  # fmt: skip
    shutil.rmtree(cache, ignore_errors=True)
    for split, c in counts.items():
        log.info("%s: %d playable games (official: %d)", split, c["games"], c["official"])
    return target


def data_info(name: str = NAME, data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: the folder :func:`prepare` writes, with playable games per
    split. Its manifest hashes the release archives in ``raw/``, not the tree unpacked from them."""
    target = data_root(data_dir) / NAME
    manifest = read_manifest(target)
    return [{"name": NAME, "path": target, "prepared": manifest is not None, "prepare": "capo data prepare alfworld",
             "counts": {f"{split} games": c["games"] for split, c in (manifest or {}).get("splits", {}).items()}}]
