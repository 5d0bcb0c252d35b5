"""The retrieval interface every backend implements, the corpus format, and the LRU query cache.

A corpus is JSONL, one passage a line: ``{"id": str, "title": str, "text": str}``. Search-R1's wiki-18
layout ``{"id", "contents"}`` (title on the first line of ``contents``, often quoted) is read too.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float

    def to_document(self) -> dict:
        """The ``document`` object of Search-R1's ``/retrieve`` answer."""
        return {"id": self.id, "title": self.title, "text": self.text, "contents": f'"{self.title}"\n{self.text}'}


def passage_from_record(record: dict, line_no: int = 0) -> Passage:
    if not isinstance(record, dict):
        raise ValueError(f"corpus line {line_no}: expected a JSON object, got {type(record).__name__}")
    pid = record.get("id", record.get("_id", line_no))
    if "contents" in record and "text" not in record:
        title, _, text = str(record["contents"]).partition("\n")
        return Passage(str(pid), title.strip().strip('"'), text.strip())
    if "text" not in record:
        raise ValueError(f'corpus line {line_no}: needs "text" (or "contents"); keys are {sorted(record)}')
    return Passage(str(pid), str(record.get("title", "")), str(record["text"]))


def read_corpus(path: str | Path) -> Iterator[Passage]:
    """Stream the passages of a JSONL corpus (plain or .gz)."""
    path = Path(path)
    if path.suffix == ".gz":
        import gzip

        handle = gzip.open(path, "rt", encoding="utf-8")
    else:
        handle = open(path, encoding="utf-8")
    with handle:
        for line_no, line in enumerate(handle, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                yield passage_from_record(record, line_no)


def write_corpus(passages: Iterable[Passage], path: str | Path) -> int:
    """Write passages as JSONL; returns how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
            count += 1
    return count


class Retriever:
    """``search(queries, k)`` returns, for each query, up to ``k`` hits ordered by score.

    Ties in score are broken by the passage's position in the corpus, so results are deterministic.
    """

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        raise NotImplementedError

    def close(self) -> None:
        """Release index handles, processes and connections. Safe to call twice."""

    def __enter__(self) -> "Retriever":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_search_args(queries: Sequence[str], k: int) -> None:
    if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
        raise TypeError("queries must be a sequence of str (wrap a single query in a list)")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")


class CachedRetriever(Retriever):
    """An LRU cache of ``(query, k)`` in front of any retriever: agents repeat queries a lot.

    Safe to share between threads (the trainer's default env pool): the cache's bookkeeping is locked,
    the inner search is not (two threads missing the same query may both search it)."""

    def __init__(self, inner: Retriever, maxsize: int = 10_000):
        self.inner = inner
        self.maxsize = maxsize
        self._cache: OrderedDict[tuple[str, int], list[Hit]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        with self._lock:
            known = {q: self._cache[(q, k)] for q in queries if (q, k) in self._cache}
            missing = list(dict.fromkeys(q for q in queries if q not in known))
            self.hits += len(queries) - len(missing)
            self.misses += len(missing)
        if missing:
            known.update(zip(missing, self.inner.search(missing, k)))
        with self._lock:
            for q in queries:
                self._cache[(q, k)] = known[q]
                self._cache.move_to_end((q, k))
            while len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
        return [known[q] for q in queries]

    def close(self) -> None:
        self._cache.clear()
        self.inner.close()
