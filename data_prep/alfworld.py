"""``capo data prepare alfworld``: ALFWorld's release archives into ``$CAPO_DATA_DIR/alfworld``.

What ``alfworld-download`` fetches (ALFWorld ``scripts/alfworld-download``), as GitHub release assets:
``json_2.1.1_json.zip`` (traj_data.json) and ``json_2.1.1_pddl.zip`` (initial_state.pddl) from release 0.2.2,
and the games: ``json_2.1.2_tw-pddl.zip`` from release 0.4.0, the ones the PyPI ``alfworld`` 0.4.2 engine
downloads (``--games 2.1.3``: release 0.4.2's, what the repository's HEAD downloads; ``--games 2.1.1``: the
old-grammar games of alfworld <= 0.3). All three unpack into ``json_2.1.1/``. No checksum is published for
any of them, so each archive is checked by the CRC of every member, and its sha256 is recorded in the
manifest (``capo data verify`` re-checks it).

Result: ``$CAPO_DATA_DIR/alfworld/{raw/<archives>, json_2.1.1/<split>/<task>/<trial>/, logic/, games.json,
manifest.json}``, the ``$ALFWORLD_DATA`` layout plus ``games.json``, the index of playable games by split
and task type (the env reads it instead of parsing every traj_data.json). Downloads resume (``data_prep.download``); the tree is built in a temporary
folder and moved into place, and ``manifest.json`` (game counts per split after the official loader's filter,
per task type, and why the other folders are skipped) is written last: an interrupted run leaves no dataset,
and a rerun resumes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

from capo_envs.alfworld.games import GAMES_FOLDER, INDEX, OFFICIAL_COUNTS, SPLITS, collect, write_index
from capo_envs.core.paths import data_dir as default_data_dir

from .archive import extract
from .download import DownloadError, download, sha256_file
from .manifest import read_manifest, write_manifest
from .sources import mirrored

log = logging.getLogger(__name__)

NAME = "alfworld"
RELEASES = "https://github.com/alfworld/alfworld/releases/download"
ARCHIVES = {
    "json": f"{RELEASES}/0.2.2/json_2.1.1_json.zip",
    "pddl": f"{RELEASES}/0.2.2/json_2.1.1_pddl.zip",
}
GAMES = {
    "2.1.2": f"{RELEASES}/0.4.0/json_2.1.2_tw-pddl.zip",  # PyPI alfworld 0.4.2
    "2.1.3": f"{RELEASES}/0.4.2/json_2.1.3_tw-pddl.zip",  # alfworld HEAD (0.5.0)
    "2.1.1": f"{RELEASES}/0.2.2/json_2.1.1_tw-pddl.zip",  # alfworld <= 0.3.x (put in/on, "loc N")
}


class PrepareError(RuntimeError):
    pass


def archive_urls(games: str = "2.1.2", base_url: str | None = None) -> dict[str, str]:
    if games not in GAMES:
        raise ValueError(f"--games must be one of {sorted(GAMES)}, got {games!r}")
    return {name: mirrored(url, base_url) for name, url in {**ARCHIVES, "tw-pddl": GAMES[games]}.items()}


def check_zip(path: Path) -> None:
    """Every member's CRC: the release publishes no checksum, so this is what says the bytes are whole."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except zipfile.BadZipFile as error:
        raise PrepareError(f"{path.name} is not a valid zip archive ({error}); delete it and rerun") from None
    if bad is not None:
        raise PrepareError(f"{path.name}: member {bad} fails its CRC check; delete the archive and rerun")


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


def prepare_alfworld(
    *,
    data_dir: str | Path | None = None,
    games: str = "2.1.2",
    base_url: str | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    target = root / NAME
    if read_manifest(target) is not None and not force:
        log.info("alfworld is already prepared in %s (use --force to rebuild)", target)
        return target
    urls = archive_urls(games, base_url)
    raw = target / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (target / "manifest.json").unlink(missing_ok=True)
    (target / INDEX).unlink(missing_ok=True)

    archives: dict[str, Path] = {}
    for name, url in urls.items():
        path = download(url, raw / url.rsplit("/", 1)[-1].split("?")[0], progress=progress, force=force)
        check_zip(path)
        archives[name] = path

    build = target / f".build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    try:
        for name, path in archives.items():
            unpacked = extract(path, build / f"unpacked-{name}")
            moved = merge_tree(unpacked, build / "tree")
            shutil.rmtree(unpacked)
            log.info("%s: %d files", path.name, moved)
        if not (build / "tree" / GAMES_FOLDER).is_dir():
            raise PrepareError(f"the archives hold no {GAMES_FOLDER}/ folder: not ALFWorld's release layout")
        shutil.rmtree(target / GAMES_FOLDER, ignore_errors=True)
        os.replace(build / "tree" / GAMES_FOLDER, target / GAMES_FOLDER)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    logic = copy_logic(target)
    counts = game_counts(target)
    if not any(c["games"] for c in counts.values()):
        raise PrepareError(f"no playable game in {target / GAMES_FOLDER}: {counts}")
    files = {f"raw/{p.name}": {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in archives.values()}
    write_manifest(target, {
        "name": NAME,
        "format": 1,
        "prepared": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "games_version": games,
        "sources": {name: url for name, url in urls.items()},
        "files": files,
        "logic": logic,
        "splits": counts,
    })  # fmt: skip
    for split, c in counts.items():
        log.info("%s: %d playable games (official: %d)", split, c["games"], c["official"])
    return target


def data_info(data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: the folder :func:`prepare_alfworld` writes, with playable games per
    split. Its manifest hashes the release archives in ``raw/``, not the tree unpacked from them."""
    target = (Path(data_dir).expanduser() if data_dir else default_data_dir()) / NAME
    manifest = read_manifest(target)
    return [{"name": NAME, "path": target, "prepared": manifest is not None, "prepare": "capo data prepare alfworld",
             "counts": {f"{split} games": c["games"] for split, c in (manifest or {}).get("splits", {}).items()}}]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capo data prepare alfworld", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", help="where datasets live (default $CAPO_DATA_DIR or ~/.cache/capo)")
    p.add_argument("--games", default="2.1.2", choices=sorted(GAMES),
                   help="which release of the game files (default 2.1.2: the one alfworld 0.4.2 uses)")  # fmt: skip
    p.add_argument("--mirror", help="replace the download host with this base URL (or set $CAPO_DATA_MIRROR)")
    p.add_argument("--force", action="store_true", help="download and rebuild even if prepared")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def prepare_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        path = prepare_alfworld(data_dir=args.data_dir, games=args.games, base_url=args.mirror,
                                force=args.force, progress=not args.quiet)  # fmt: skip
    except (DownloadError, PrepareError, ValueError, OSError) as error:
        print(f"capo data prepare alfworld: {error}", file=sys.stderr)
        return 1
    counts = read_manifest(path)["splits"]
    print(f"alfworld prepared in {path}: " + ", ".join(f"{s} {c['games']}" for s, c in counts.items()))
    return 0


__all__ = ["prepare_main", "prepare_alfworld", "archive_urls", "game_counts", "data_info"]
