"""BM25 ranking of paper search: the project's BM25 (``capo_envs.retrieval``, bm25s scored by numba)
over title and abstract, with SQLite keeping everything else (metadata, dates, citation edges).

``PaperDB.search`` ranks with FTS5 or with this index (``PaperDB(ranker=...)``, ``"auto"`` by
size: ``BM25_MIN_PAPERS``). FTS5 ranks every paper that holds a query word inside SQLite, which at 1M
papers takes 80-100 ms a search; this index answers in about 1-2 ms (docs/envs/papers.md, "Measured").

* **Ranking**: BM25 (Lucene's analysis: its stop words, Porter stems, k1 0.9, b 0.4) over
  ``title + title + abstract``: the title written twice weighs it twice, as FTS5's
  ``bm25(papers_fts, 2.0, 1.0)`` does. The query is the same as FTS5's, ``db.query_words`` (stop words
  dropped, at most ``MAX_QUERY_TERMS`` words); no word is dropped for being common (FTS5 drops them for
  speed, ``MAX_POSTINGS``), so the ranking uses all of them.
* **Order and ties**: passages are indexed in rowid order and BM25 breaks ties by corpus position, so
  equal scores come out in rowid order, as FTS5's ``ORDER BY score, rowid`` does.
* **Date cut-off**: the index ranks ``need x DATE_WINDOW`` hits and keeps those dated on or before
  ``max_date`` (a date per rowid held in memory, compared as SQLite compares the ``date`` text), asking
  for 4x more until enough survive or every match has been seen: the survivors are exactly the ranking
  of the papers the cut-off leaves.
* **Storage**: a file database keeps its index beside it (``<db>.bm25/``: the bm25s matrix and the
  rowids, no text), stamped with what it was built from; a stale or foreign one is rebuilt. An in-memory
  database, or one in a read-only folder, builds it in memory. Build: title and abstract read from
  SQLite in rowid order, then ``open_retriever("bm25", library="bm25s")``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .db import PaperDB

log = logging.getLogger(__name__)

RANKERS = ("auto", "fts5", "bm25")
# "auto" ranks with FTS5 below these sizes: a file database keeps its BM25 index (built once), an in-memory
# one builds it in every process, which costs more than FTS5's searches save over a short run (FTS5: about
# 1 ms a search at 6k papers, 20 ms at 50k; building BM25: 0.3-0.6 ms a paper, docs/envs/papers.md).
BM25_MIN_PAPERS = 20_000
BM25_MIN_PAPERS_IN_MEMORY = 200_000
DATE_WINDOW = 5
GROWTH = 4
STAMP_FILE = "capo-papers-search.json"
_STAMP_FORMAT = "capo-papers-bm25/1"
_BATCH = 20_000


def index_text(title: str, abstract: str) -> str:
    """What the index holds for one paper: the title twice (weight 2, as FTS5's) and the abstract."""
    return f"{title}\n{title}\n{abstract}" if abstract else f"{title}\n{title}"


def _stamp(db: "PaperDB") -> dict:
    """What the index was built from: a database rebuilt, or another one at the same path, differs."""
    meta = db.meta()
    last = db._rows("SELECT max(rowid) FROM papers")[0][0]
    return {"format": _STAMP_FORMAT, "papers": len(db), "max_rowid": last, "meta": meta}


class BM25PaperIndex:
    """BM25 over a :class:`PaperDB`'s titles and abstracts; see the module docstring."""

    def __init__(self, retriever, rowids: np.ndarray, dates: np.ndarray):
        self._retriever = retriever
        self.rowids = rowids  # corpus position -> rowid
        self.dates = dates  # corpus position -> date, as UTF-8 bytes (compared as SQLite compares text)
        self.build_seconds = 0.0
        self.loaded = False

    # --- building ----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, db: "PaperDB", index_dir: str | Path | None = None) -> "BM25PaperIndex":
        """Load the saved index in ``index_dir`` when it was built from this database, else build one (and
        save it there when ``index_dir`` is given and writable)."""
        from ..retrieval import open_retriever

        start = time.perf_counter()
        rowids, dates = cls._read_dates(db)
        stamp = _stamp(db)
        if index_dir is not None:
            index_dir = Path(index_dir)
            try:
                saved = json.loads((index_dir / STAMP_FILE).read_text())
            except (OSError, ValueError):
                saved = None
            if saved == stamp:
                try:
                    retriever = open_retriever("bm25", index_dir=index_dir / "bm25", cache_size=0)
                    index = cls(retriever, rowids, dates)
                    index.build_seconds, index.loaded = time.perf_counter() - start, True
                    return index
                except (OSError, ValueError, KeyError) as e:
                    log.warning("paper search: the saved BM25 index in %s is unreadable (%s); rebuilding", index_dir, e)
        retriever = cls._build_retriever(db)
        index = cls(retriever, rowids, dates)
        if index_dir is not None:
            try:
                index_dir.mkdir(parents=True, exist_ok=True)
                (index_dir / STAMP_FILE).unlink(missing_ok=True)
                retriever.save(index_dir / "bm25")
                (index_dir / STAMP_FILE).write_text(json.dumps(stamp))
            except OSError as e:
                log.warning("paper search: cannot save the BM25 index in %s (%s); it lives in memory", index_dir, e)
        index.build_seconds = time.perf_counter() - start
        return index

    @staticmethod
    def _read_dates(db: "PaperDB") -> tuple[np.ndarray, np.ndarray]:
        rowids, dates, last = [], [], 0
        while True:
            rows = db._rows("SELECT rowid, date FROM papers WHERE rowid > ? ORDER BY rowid LIMIT ?", (last, _BATCH * 5))
            if not rows:
                break
            rowids.extend(r[0] for r in rows)
            dates.extend((r[1] or "").encode() for r in rows)
            last = rows[-1][0]
        return np.array(rowids, dtype=np.int64), np.array(dates, dtype=np.bytes_) if dates else np.array([], "S1")

    @staticmethod
    def _build_retriever(db: "PaperDB"):
        from ..retrieval import Passage, open_retriever

        passages, last = [], 0
        while True:
            rows = db._rows("SELECT rowid, title, abstract FROM papers WHERE rowid > ? ORDER BY rowid LIMIT ?",
                            (last, _BATCH))
            if not rows:
                break
            # The id is the rowid; the text is only read while indexing (dropped below).
            passages.extend(Passage(str(r[0]), "", index_text(r[1] or "", r[2] or "")) for r in rows)
            last = rows[-1][0]
        retriever = open_retriever("bm25", passages=passages, library="bm25s", cache_size=0)
        # BM25Retriever keeps its passages for the hits' text; paper search reads papers from SQLite, so
        # keep ids only (1M abstracts would hold about a gigabyte, and be saved with the index).
        if hasattr(retriever, "passages"):
            retriever.passages = [Passage(p.id, "", "") for p in passages]
        return retriever

    # --- searching ---------------------------------------------------------------------------------------
    def ranked(self, words: list[str], need: int, max_date: str | None = None) -> list[int]:
        """The rowids of the best ``need`` papers for ``words`` (dated on or before ``max_date`` when
        given), best first, ties in rowid order; fewer when fewer papers hold any of the words."""
        n = len(self.rowids)
        if not words or need <= 0 or n == 0:
            return []
        text = " ".join(words)
        k = min(n, need * DATE_WINDOW if max_date else need)
        cut = max_date.encode("utf-8", "replace") if max_date else None
        while True:
            hits = self._retriever.search([text], k)[0]
            rowids = np.fromiter((int(h.id) for h in hits), dtype=np.int64, count=len(hits))
            if cut is None:
                return rowids[:need].tolist()
            kept = rowids[self.dates[np.searchsorted(self.rowids, rowids)] <= cut]
            if len(kept) >= need or len(hits) < k or k >= n:
                return kept[:need].tolist()
            k = min(n, k * GROWTH)

    def close(self) -> None:
        self._retriever.close()


_SHARED: dict[str, BM25PaperIndex] = {}  # in-memory databases' indexes, by content (SHARED_INDEXES at most)
_SHARED_LOCK = threading.Lock()
SHARED_INDEXES = 2


def _fingerprint(db: "PaperDB") -> str:
    """A hash of every paper's rowid, id, title, abstract and date: equal databases share one index."""
    import hashlib

    digest, last = hashlib.blake2b(digest_size=16), 0
    while True:
        rows = db._rows("SELECT rowid, arxiv_id, title, abstract, date FROM papers WHERE rowid > ? ORDER BY rowid "
                        "LIMIT ?", (last, _BATCH))
        if not rows:
            return digest.hexdigest()
        digest.update(json.dumps(rows, ensure_ascii=False).encode())
        last = rows[-1][0]


class LazyIndex:
    """Builds (or loads) a database's BM25 index once, on first use, whichever thread asks first.

    In-memory databases with the same papers (SynthScholar: every env of a vector env builds its own
    database of one world) share one index per process: hashing the papers costs seconds, building minutes."""

    def __init__(self):
        self._index: BM25PaperIndex | None = None
        self._shared = False
        self._lock = threading.Lock()

    def get(self, db: "PaperDB", index_dir: Path | None) -> BM25PaperIndex:
        if self._index is None:
            with self._lock:
                if self._index is None:
                    if index_dir is not None:
                        self._index = BM25PaperIndex.open(db, index_dir)
                    else:
                        self._index, self._shared = self._shared_index(db), True
        return self._index

    @staticmethod
    def _shared_index(db: "PaperDB") -> BM25PaperIndex:
        key = _fingerprint(db)
        with _SHARED_LOCK:  # one build at a time: a second env of the same world waits for the first
            index = _SHARED.pop(key, None) or BM25PaperIndex.open(db, None)
            _SHARED[key] = index  # most recently used last
            while len(_SHARED) > SHARED_INDEXES:
                _SHARED.pop(next(iter(_SHARED)))
        return index

    @property
    def ready(self) -> BM25PaperIndex | None:
        return self._index

    def close(self) -> None:
        if self._index is not None and not self._shared:
            self._index.close()
        self._index = None
