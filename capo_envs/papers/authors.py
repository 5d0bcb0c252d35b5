"""Authors for ``capo serve papers``'s S2 author routes, from the author names the paper database holds.

The database has names, not identities: an author here is one exact name string (two spellings are two
authors, two people of the same name are one; S2 itself disambiguates). Its ``authorId`` is a number
derived from the name (a 48-bit BLAKE2b hash, as a decimal string like S2's ids), so a paper's authors get
their ids without any index, and the same name has the same id in every database and every run.

The index (author -> papers, name search) is built on first use, from one scan of the ``papers`` table:
0.4 s for SynthScholar's 50,000 papers (medium), growing linearly (not measured on a full arXiv database
of 2-3 million, where it would hold a few hundred MB); ``capo serve papers`` builds it in the background
at start, and a request that needs it before then waits for it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .db import PaperDB

logger = logging.getLogger(__name__)
_WORD = re.compile(r"\w+")
SCAN_BATCH = 50_000
STATS_CACHE = 50_000


def clean_name(name: object) -> str | None:
    if not isinstance(name, str):
        return None
    name = " ".join(name.split())
    return name or None


def author_id(name: str) -> str:
    """The stable numeric id of an author name."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=6, person=b"capo-author").digest()
    return str(int.from_bytes(digest, "big") or 1)


class AuthorIndex:
    """Author ids, names, their papers (rowids, newest first) and citation statistics over a PaperDB."""

    def __init__(self, db: "PaperDB"):
        self.db = db
        self._lock = threading.Lock()
        self._built = False
        self._names: list[str] = []
        self._by_id: dict[str, int] = {}
        self._offsets = np.zeros(1, dtype=np.int64)
        self._papers = np.zeros(0, dtype=np.int64)
        self._search_keys: list[str] | None = None
        self._stats: dict[int, tuple[int, int]] = {}

    def _ensure(self) -> None:
        if self._built:
            return
        with self._lock:
            if self._built:
                return
            by_name: dict[str, int] = {}
            names: list[str] = []
            owners, rowids = array("q"), array("q")
            last = 0
            while True:
                rows = self.db._rows("SELECT rowid, authors FROM papers WHERE rowid > ? ORDER BY rowid LIMIT ?",
                                     (last, SCAN_BATCH))
                if not rows:
                    break
                for rowid, raw in rows:
                    try:
                        listed = json.loads(raw or "[]")
                    except ValueError:
                        continue
                    seen: set[int] = set()
                    for name in listed if isinstance(listed, list) else ():
                        if not isinstance(name, str):
                            continue
                        k = by_name.get(name)
                        if k is None:
                            clean = clean_name(name)
                            if clean is None:
                                continue
                            k = by_name.get(clean)
                            if k is None:
                                k = len(names)
                                names.append(clean)
                            by_name[name] = by_name[clean] = k
                        if k not in seen:
                            seen.add(k)
                            owners.append(k)
                            rowids.append(rowid)
                last = rows[-1][0]
            owner = np.frombuffer(owners, dtype=np.int64) if owners else np.zeros(0, dtype=np.int64)
            rowid = np.frombuffer(rowids, dtype=np.int64) if rowids else np.zeros(0, dtype=np.int64)
            order = np.lexsort((-rowid, owner))  # by author, then newest (highest rowid) first
            self._papers = rowid[order].copy()
            self._offsets = np.searchsorted(owner[order], np.arange(len(names) + 1)).astype(np.int64)
            by_id: dict[str, int] = {}
            for k, name in enumerate(names):
                by_id.setdefault(author_id(name), k)  # a hash collision (~1e-4 in 10M names) keeps the first
            self._names, self._by_id = names, by_id
            self._built = True

    def warm(self) -> None:
        """Build the index now (``capo serve papers`` does, in a background thread, at start); a failure
        (the database closed under it at shutdown) is logged, and the next request that needs it retries."""
        try:
            self._ensure()
        except Exception:  # noqa: BLE001 - a background warm-up must not print tracebacks at exit
            logger.debug("building the author index failed", exc_info=True)

    # --- lookups -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        self._ensure()
        return len(self._names)

    def lookup(self, author: str) -> int | None:
        """The index of an author by id (``1234``, also ``AUTHOR:1234``-free forms only), or None."""
        self._ensure()
        return self._by_id.get(author.strip())

    def by_name(self, name: str) -> int | None:
        clean = clean_name(name)
        return None if clean is None else self.lookup(author_id(clean))

    def name(self, k: int) -> str:
        return self._names[k]

    def id(self, k: int) -> str:
        return author_id(self._names[k])

    def paper_rowids(self, k: int) -> np.ndarray:
        self._ensure()
        return self._papers[self._offsets[k] : self._offsets[k + 1]]

    def paper_count(self, k: int) -> int:
        self._ensure()
        return int(self._offsets[k + 1] - self._offsets[k])

    def stats(self, k: int) -> tuple[int, int]:
        """(citationCount, hIndex) over the author's papers, counting the edges inside this database."""
        cached = self._stats.get(k)
        if cached is not None:
            return cached
        rowids = [int(r) for r in self.paper_rowids(k)]
        counts: dict[int, int] = {}
        for start in range(0, len(rowids), 500):
            chunk = rowids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            counts.update(self.db._rows(f"SELECT cited, count(*) FROM edges WHERE cited IN ({marks}) GROUP BY cited",
                                        chunk))
        values = sorted(counts.values(), reverse=True)
        h_index = sum(1 for i, c in enumerate(values, 1) if c >= i)
        result = (sum(values), h_index)
        if len(self._stats) >= STATS_CACHE:
            self._stats.clear()
        self._stats[k] = result
        return result

    def search(self, query: str) -> list[int]:
        """Authors whose name holds every word of ``query`` (each as a word or the start of one, ignoring
        case), those with an exact word match first, then by paper count, then by name."""
        self._ensure()
        words = [w for w in _WORD.findall(query.lower())][:16]
        if not words:
            return []
        if self._search_keys is None:
            with self._lock:
                if self._search_keys is None:
                    self._search_keys = [" " + " ".join(_WORD.findall(n.lower())) + " " for n in self._names]
        keys = self._search_keys
        needles = [" " + w for w in words]
        hits = [k for k, key in enumerate(keys) if all(n in key for n in needles)]
        exact = [" " + w + " " for w in words]
        counts = self._offsets[1:] - self._offsets[:-1]
        hits.sort(key=lambda k: (-sum(e in keys[k] for e in exact), -int(counts[k]), self._names[k]))
        return hits
