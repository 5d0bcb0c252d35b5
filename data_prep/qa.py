"""``capo data prepare hotpotqa|2wiki|musique|wiki18``: a QA dataset's official files, its corpus and indexes.

Layout of ``<data_dir>/<name>/``::

    raw/            the official files the loaders read (extracted from archives)
    corpus.jsonl    {id, title, text}: the de-duplicated union of all context paragraphs of all
                    splits (what CAPO retrieves from); for wiki18 the downloaded corpus, converted
    index/<kind>/   one folder per retriever (bm25, optionally dense)
    manifest.json   files with sha256s, counts, sources, versions; written last

Everything is built in ``<name>.tmp-<pid>/`` and renamed into place at the end, so an error or
Ctrl-C leaves no half-built dataset. Downloads wait in ``<data_dir>/.downloads/<name>/`` (a rerun
resumes their ``.part`` files) and are removed once the dataset is complete. The downloads are listed
in ``data_prep/sources.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from capo_envs.qa.datasets import QA_DATASETS, SPLITS, passages_from_files
from capo_envs.retrieval.base import read_corpus, write_corpus

from .archive import ArchiveError, extract
from .building import building, data_root, link_or_copy, versions
from .download import forget, sha256_file
from .manifest import FORMAT, file_records, is_complete, read_manifest, write_manifest
from .progress import progress_bar
from .sources import MIRROR_ENV, SOURCES, Remote, fetch

log = logging.getLogger(__name__)

DATASETS = tuple(SOURCES)
CORPUS = "corpus.jsonl"


def _check_name(name: str) -> None:
    if name not in SOURCES:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``capo data prepare NAME`` beyond the common ones; each is a keyword of :func:`prepare`."""
    parser.add_argument("--dense", dest="retrievers", action="store_const", const=("bm25", "dense"),
                        default=("bm25",), help="also build the dense index (needs the [dense] extra)")


def prepare(
    name: str,
    *,
    data_dir: str | Path | None = None,
    force: bool = False,
    base_url: str | None = None,
    progress: bool = True,
    retrievers: Sequence[str] = ("bm25",),
) -> Path:
    """Build ``<data_dir>/<name>/`` and return it; a prepared dataset is left alone unless ``force``.

    ``base_url`` (else ``$CAPO_DATA_MIRROR``) replaces the hosts of the download URLs; ``force`` also
    fetches again the downloads already complete.
    """
    _check_name(name)
    root = data_root(data_dir)
    final = root / name
    if is_complete(final) and not force:
        log.info("%s is already prepared in %s (use --force to rebuild)", name, final)
        return final
    cache = root / ".downloads" / name
    with building(root, name) as build:
        sources = [fetch(remote, cache, base_url=base_url, progress=progress, force=force,
                         pinned_in="data_prep/sources.py") for remote in SOURCES[name]]
        counts = _build_contents(name, [path for _, path in sources], build, progress)
        for kind in retrievers:
            log.info("%s: building the %s index", name, kind)
            _build_index(kind, build / CORPUS, build / "index" / kind, progress)
        write_manifest(build, _manifest(name, sources, counts, retrievers, build, base_url))
    shutil.rmtree(cache, ignore_errors=True)
    log.info("%s: prepared in %s (%s passages)", name, final, counts["passages"])
    return final


def data_info(name: str, data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: the dataset's folder, whether it is prepared, and its counts
    (questions per split, passages)."""
    _check_name(name)
    path = data_root(data_dir) / name
    manifest = read_manifest(path)
    return [{"name": name, "path": path, "prepared": manifest is not None, "prepare": f"capo data prepare {name}",
             "counts": (manifest or {}).get("counts", {})}]


# --- steps ------------------------------------------------------------------------------------------


def _build_contents(name: str, downloads: list[Path], build: Path, progress: bool) -> dict[str, int]:
    """Fill ``raw/`` and write the corpus; returns the counts for the manifest."""
    raw = build / "raw"
    raw.mkdir()
    if name == "wiki18":
        (gz,) = downloads
        passages = _bar(read_corpus(gz), "wiki18 corpus", progress)
        return {"passages": write_corpus(passages, build / CORPUS)}
    for remote, path in zip(SOURCES[name], downloads):
        if remote.archive:
            try:
                _take_from_archive(name, remote, path, build, raw)
            except ArchiveError:
                forget(path)  # corrupt, hostile or over a cap: the rerun fetches it again
                raise
        else:
            link_or_copy(path, raw / remote.filename)
    spec = QA_DATASETS[name]
    counts = {}
    for split in SPLITS:
        counts[split] = len(spec.load(raw / spec.files[split]))  # parse now: a bad file fails here
    files = [raw / spec.files[split] for split in SPLITS]
    passages = _bar(passages_from_files(name, files), f"{name} corpus", progress)
    counts["passages"] = write_corpus(passages, build / CORPUS)
    return counts


def _take_from_archive(name: str, remote: Remote, archive: Path, build: Path, raw: Path) -> None:
    """Extract, move the dataset's official files (found by name at any depth) into ``raw/``."""
    spec = QA_DATASETS[name]
    extracted = extract(archive, build / "extracted")
    for filename, required in [(f, True) for f in spec.files.values()] + [(f, False) for f in spec.optional_files]:
        found = [p for p in extracted.rglob(filename) if p.is_file() and "__MACOSX" not in p.parts]
        if len(found) > 1:
            raise ValueError(f"{archive}: {filename} appears {len(found)} times: {[str(p.relative_to(extracted)) for p in found]}")
        if not found:
            if required:
                raise ValueError(f"{archive}: has no {filename}; the upstream release may have changed")
            continue
        os.replace(found[0], raw / filename)
        pinned = remote.members.get(filename)
        if pinned and (actual := sha256_file(raw / filename)) != pinned:
            raise ValueError(f"{archive}: {filename} has sha256 {actual}, expected {pinned}")
    shutil.rmtree(extracted)


def _bar(passages: Iterable, desc: str, progress: bool) -> Iterable:
    """A tqdm bar on a terminal, else a line every 30 s, on stderr beside the log messages."""
    return progress_bar(passages, desc, unit=" passages", tag="capo data", file=sys.stderr, disable=not progress)


def _build_index(kind: str, corpus: Path, index_dir: Path, progress: bool) -> None:
    """Build and save the index; the backend keeps its own copy of the passages, so moving is safe."""
    from capo_envs.retrieval import open_retriever

    index_dir.parent.mkdir(parents=True, exist_ok=True)
    open_retriever(kind, corpus=corpus, index_dir=index_dir, cache_size=0, show_progress=progress).close()


def _manifest(
    name: str, sources: list[tuple[dict, Path]], counts: dict, retrievers: Iterable[str], build: Path, base_url: str | None
) -> dict:
    return {
        "name": name,
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mirror": base_url or os.environ.get(MIRROR_ENV) or None,
        "sources": [record for record, _ in sources],
        "counts": counts,
        "retrievers": list(retrievers),
        "versions": versions(),
        "files": file_records(build),
    }
