"""Saved-index folders: written atomically, labelled by a format tag in ``meta.json``, and the shared
top-k selection that keeps ties deterministic."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np


@contextmanager
def atomic_directory(index_dir: str | Path) -> Iterator[Path]:
    """Yield a temp dir beside ``index_dir``; on success it replaces ``index_dir``.

    A crash mid-save then leaves the previous index (or nothing), never a half-written one that a
    later ``load`` would trust.
    """
    index_dir = Path(index_dir)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{index_dir.name}.tmp-", dir=index_dir.parent))
    try:
        yield tmp
        old = None
        if index_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{index_dir.name}.old-", dir=index_dir.parent))
            os.rename(index_dir, old / "index")
        os.rename(tmp, index_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def top_k_with_ties(positions: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(position, score)`` pairs, ties broken by lower position.

    ``argpartition`` alone picks arbitrarily among passages tied at the k-th score; keeping every
    passage at or above that score before sorting makes the cut deterministic.
    """
    if len(scores) > k:
        threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= threshold
        positions, scores = positions[keep], scores[keep]
    order = np.lexsort((positions, -scores))[:k]
    return [(int(positions[i]), float(scores[i])) for i in order]


def read_index_meta(index_dir: Path, fmt: str, what: str) -> dict:
    """Read ``meta.json`` and check that the folder holds an index of format ``fmt``."""
    meta_path = Path(index_dir) / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{index_dir} holds no saved {what} index (no meta.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != fmt:
        raise ValueError(f"{index_dir} is not a {what} index (format {meta.get('format')!r}, expected {fmt!r})")
    return meta
