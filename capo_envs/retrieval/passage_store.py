"""Passages kept on disk beside an index that only stores positions (Lucene, PISA): ``passages.jsonl``
in corpus order and ``offsets.npy`` (N + 1 byte offsets into it), read through a memory map, so a
21M-passage corpus costs no Python memory while serving."""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .base import Hit, Passage, Retriever

PASSAGES_FILE, OFFSETS_FILE = "passages.jsonl", "offsets.npy"
_CAN_ADVISE = hasattr(os, "posix_fadvise")  # Linux and most Unixes; not macOS or Windows


class PassageWriter:
    """Write passages one at a time: ``add`` returns the passage's corpus position; ``close`` writes
    the offsets (use it as a context manager)."""

    def __init__(self, folder: str | Path):
        self._folder = Path(folder)
        self._file = open(self._folder / PASSAGES_FILE, "wb")
        self._offsets = [0]

    def add(self, p: Passage) -> int:
        line = json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n"
        self._offsets.append(self._offsets[-1] + self._file.write(line.encode("utf-8")))
        return len(self._offsets) - 2

    @property
    def count(self) -> int:
        return len(self._offsets) - 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            np.save(self._folder / OFFSETS_FILE, np.asarray(self._offsets, dtype=np.int64))

    def __enter__(self) -> "PassageWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PassageStore:
    """The passages a ``PassageWriter`` wrote into ``folder``, by corpus position."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self._offsets = np.load(folder / OFFSETS_FILE)
        self._file = open(folder / PASSAGES_FILE, "rb")
        empty = int(self._offsets[-1]) == 0  # mmap cannot map an empty file
        self._data = b"" if empty else mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        if not empty and hasattr(mmap, "MADV_RANDOM"):
            # Reads land anywhere in the file: without this, each page fault reads around it (up to the
            # disk's read_ahead_kb: 8 MB on a measured VM, 50 MB of disk reads for a query's 10 passages).
            self._data.madvise(mmap.MADV_RANDOM)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def record(self, position: int) -> dict:
        """The passage's JSON object: ``id``, ``title``, ``text``."""
        return json.loads(self._data[int(self._offsets[position]) : int(self._offsets[position + 1])])

    def passage(self, position: int) -> Passage:
        record = self.record(position)
        return Passage(record["id"], record["title"], record["text"])

    def prefetch(self, positions: Iterable[int]) -> None:
        """Ask the kernel to start reading these passages now, all at once: a query's hits lie anywhere in a
        file larger than the page cache (14.7 GB at 21M passages), and read one after another each waits for
        its own disk read, where asked together the reads overlap (a cold query's 10 passages at 21M: 1.17 ms
        one by one, 0.37 ms so; benchmarks/bench_passage_prefetch.py). A hint: it returns at once."""
        if not _CAN_ADVISE or isinstance(self._data, bytes):
            return
        fd = self._file.fileno()
        for position in positions:
            start = int(self._offsets[position])
            os.posix_fadvise(fd, start, int(self._offsets[position + 1]) - start, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        if isinstance(self._data, mmap.mmap) and not self._data.closed:
            self._data.close()
        self._file.close()


class StoredPassagesRetriever(Retriever):
    """Base of the retrievers whose index holds only corpus positions (Lucene, PISA): hits are read from
    ``self._store``; a fresh build lives in ``self._owned_tmpdir`` until saved, removed on ``close``."""

    _store: PassageStore
    _owned_tmpdir: Path | None = None
    _closed = False

    def passage(self, position: int) -> Passage:
        return self._store.passage(position)

    def hit(self, position: int, score: float) -> Hit:
        record = self._store.record(position)  # no Passage in between: a hit costs one JSON decode
        return Hit(record["id"], record["title"], record["text"], score)

    def hits(self, results: Sequence[Sequence[tuple[int, float]]]) -> list[list[Hit]]:
        """Each query's (position, score) pairs as hits, the passages of all of them read ahead together."""
        self._store.prefetch(position for pairs in results for position, _ in pairs)
        return [[self.hit(position, score) for position, score in pairs] for pairs in results]

    def _release(self) -> None:
        """Free the engine's own handles (called once, by ``close``)."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._release()
        self._store.close()
        if self._owned_tmpdir is not None:
            shutil.rmtree(self._owned_tmpdir, ignore_errors=True)
