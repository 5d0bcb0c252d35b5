"""``prepare(name)``: download a dataset, build its corpus and indexes, all or nothing.

Layout of ``<data_dir>/<name>/``::

    raw/            the official files the loaders read (extracted from archives)
    corpus.jsonl    {id, title, text}: the de-duplicated union of all context paragraphs of all
                    splits (what CAPO retrieves from); for wiki18 the downloaded corpus, converted
    index/<kind>/   one folder per retriever (bm25, optionally dense)
    manifest.json   files with sha256s, counts, sources, versions; written last

Everything is built in ``<name>.tmp-<pid>/`` and renamed into place at the end, so an error or
Ctrl-C leaves no half-built dataset. Downloads wait in ``<data_dir>/.downloads/<name>/`` (a rerun
resumes their ``.part`` files) and are removed once the dataset is complete.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

from capo_train.progress import progress_bar

from capo_envs.core.paths import DataNotPreparedError, is_prepared
from capo_envs.core.paths import data_dir as default_data_dir
from capo_envs.qa.datasets import QA_DATASETS, SPLITS, passages_from_files
from capo_envs.retrieval.base import read_corpus, write_corpus

from .archive import extract
from .download import download, sha256_file
from .manifest import FORMAT, MANIFEST, file_records, folder_bytes, read_manifest, verify_files, write_manifest
from .sources import MIRROR_ENV, SOURCES, Remote, mirrored

log = logging.getLogger(__name__)

DATASETS = tuple(SOURCES)
CORPUS = "corpus.jsonl"


def _root(data_dir: str | Path | None) -> Path:
    return Path(data_dir).expanduser() if data_dir else default_data_dir()


def _check_name(name: str) -> None:
    if name not in SOURCES:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")


def prepare(
    name: str,
    *,
    data_dir: str | Path | None = None,
    force: bool = False,
    retrievers: Sequence[str] = ("bm25",),
    base_url: str | None = None,
    progress: bool = True,
) -> Path:
    """Build ``<data_dir>/<name>/`` and return it; a prepared dataset is left alone unless ``force``.

    ``base_url`` (else ``$CAPO_DATA_MIRROR``) replaces the hosts of the download URLs.
    """
    _check_name(name)
    root = _root(data_dir)
    final = root / name
    if is_prepared(name, root) and not force:
        log.info("%s is already prepared in %s (use --force to rebuild)", name, final)
        return final
    cache = root / ".downloads" / name
    with building(root, name) as build:
        sources = [_fetch(remote, cache, base_url, progress, force) for remote in SOURCES[name]]
        counts = _build_contents(name, [path for _, path in sources], build, progress)
        for kind in retrievers:
            log.info("%s: building the %s index", name, kind)
            _build_index(kind, build / CORPUS, build / "index" / kind, progress)
        write_manifest(build, _manifest(name, sources, counts, retrievers, build, base_url))
    shutil.rmtree(cache, ignore_errors=True)
    log.info("%s: prepared in %s (%s passages)", name, final, counts["passages"])
    return final


# --- steps ------------------------------------------------------------------------------------------


def _fetch(remote: Remote, cache: Path, base_url: str | None, progress: bool, force: bool) -> tuple[dict, Path]:
    """``force`` fetches again even a complete earlier download (``capo data prepare --force``)."""
    url = mirrored(remote.url, base_url)
    log.info("downloading %s", url)
    path = download(url, cache / remote.filename, sha256=remote.sha256, size=remote.size, progress=progress,
                    force=force)
    record = {
        "url": url,
        "upstream_url": remote.url,
        "file": remote.filename,
        "bytes": path.stat().st_size,
        "sha256": remote.sha256 or sha256_file(path),
        "sha256_source": "pinned in data_prep/sources.py, verified" if remote.sha256 else "computed after download",
    }
    return record, path


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
            _take_from_archive(name, remote, path, build, raw)
        else:
            _link_or_copy(path, raw / remote.filename)
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


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link keeps the download in the cache (for a rerun) without a second copy on disk."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _bar(passages: Iterable, desc: str, progress: bool) -> Iterable:
    """A tqdm bar on a terminal, else a line every 30 s, on stderr beside the log messages."""
    return progress_bar(passages, desc, unit=" passages", tag="capo data", file=sys.stderr, disable=not progress)


def _build_index(kind: str, corpus: Path, index_dir: Path, progress: bool) -> None:
    """Build and save the index; the backend keeps its own copy of the passages, so moving is safe."""
    from capo_envs.retrieval import open_retriever

    index_dir.parent.mkdir(parents=True, exist_ok=True)
    open_retriever(kind, corpus=corpus, index_dir=index_dir, cache_size=0, show_progress=progress).close()


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("capo-gym", "bm25s", "tantivy", "faiss-cpu", "torch", "transformers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


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
        "versions": _versions(),
        "files": file_records(build),
    }


@contextmanager
def building(root: Path, name: str) -> Iterator[Path]:
    """A fresh, empty ``<root>/<name>.tmp-<pid>`` to build a dataset in. When the block ends normally it
    replaces ``<root>/<name>`` (:func:`_swap_into_place`); on any error (Ctrl-C included) it is deleted, so
    a failed or interrupted run never leaves a half-written dataset. Builds abandoned by killed processes
    are removed first."""
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(root, name)
    build = root / f"{name}.tmp-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    try:
        yield build
        _swap_into_place(build, root / name)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise


def _swap_into_place(build: Path, final: Path) -> None:
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(build, final)
    shutil.rmtree(old, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned_builds(root: Path, name: str) -> None:
    """Delete ``<name>.tmp-<pid>`` / ``.old-<pid>`` folders left by processes that were killed."""
    for path in list(root.glob(f"{name}.tmp-*")) + list(root.glob(f"{name}.old-*")):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


# --- inspection ---------------------------------------------------------------------------------------


def dataset_info(name: str, data_dir: str | Path | None = None) -> dict:
    """What ``capo data list`` shows for one dataset."""
    _check_name(name)
    path = _root(data_dir) / name
    manifest = read_manifest(path)
    return {
        "name": name,
        "prepared": manifest is not None,
        "path": str(path),
        "bytes": folder_bytes(path),
        "counts": (manifest or {}).get("counts", {}),
        "created": (manifest or {}).get("created"),
    }


def verify(name: str, data_dir: str | Path | None = None) -> list[str]:
    """Re-check the sha256 of every file in the manifest; returns the problems (empty when all match)."""
    _check_name(name)
    path = _root(data_dir) / name
    manifest = read_manifest(path)
    if manifest is None:
        raise DataNotPreparedError(f"{name} is not prepared (no {path / MANIFEST}). Run: capo data prepare {name}")
    return verify_files(path, manifest)
