"""Java-free BM25 over a passage list: ``BM25Retriever``, built with one of two libraries.

* ``bm25s`` (the default): a sparse BM25 score matrix, scored by a ``numba`` or ``scipy`` kernel with
  bit-identical results; its ``analyzer`` is ``lucene`` (the default: Lucene's stopwords, Porter stems,
  k1 0.9, b 0.4 and rounded length norms, so it ranks as the ``lucene`` retriever does) or ``snowball``
  (bm25s's stopwords, Snowball stems, k1 1.2, b 0.75). Indexes saved without an analyzer in their meta
  are snowball's.
* ``tantivy``: a Rust inverted index with its own, snowball-like analysis.

A third library, ``pisa`` (PISA's C++ engine with Lucene's BM25 scores stored as integer impacts), is a
retriever of its own, ``pisa.PisaRetriever``: it keeps its passages on disk and streams its build, so it
serves corpora of any size; ``open_retriever("bm25", library="pisa")`` builds it.

The libraries, their analysis and kernels are in ``bm25_libraries.py``. ``library="auto"`` (the default)
picks one (``bm25_choice.py``): by speed, bm25s at every size when numba is installed, else bm25s up to
``SCIPY_MAX_PASSAGES`` and tantivy above; then, when the estimated build does not fit in 80% of the
memory available, tantivy if it fits, else a ``MemoryError`` naming the options (``open_retriever("bm25")``
builds PISA, else the ``lucene`` kind, instead when installed). An explicit
``library="bm25s"`` or ``"tantivy"`` is always built as asked. A choice other than bm25s is logged in
one line with its reason (logger ``capo_envs.retrieval.bm25``).

Both libraries break score ties by corpus position (lower first) and only return passages that share at
least one term with the query, so a query can get fewer than ``k`` hits, or none. Speed, memory and
ranking against Lucene at 10k-21M passages: docs/results/performance.md, section 4
(``benchmarks/bench_retrieval_scale.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from .base import Hit, Passage, Retriever, check_search_args, read_corpus, write_corpus
from .bm25_choice import (
    BUILD_MEMORY, BUILD_MEMORY_SHARE, DEFAULT_LIBRARY, LIBRARIES, SCIPY_MAX_PASSAGES, LibraryChoice,
    available_memory_bytes, build_memory_bytes, choose_library, library_choice, lucene_unavailable,
)  # fmt: skip
from .bm25_libraries import (
    ANALYZERS, DEFAULT_ANALYZER, INDEXES, KERNELS, NUMBA_MIN_PASSAGES, Analysis, TantivyIndex, analysis,
    resolve_kernel,
)  # fmt: skip
from .index_files import atomic_directory, read_index_meta

__all__ = [
    "BM25Retriever", "LIBRARIES", "DEFAULT_LIBRARY", "KERNELS", "ANALYZERS", "DEFAULT_ANALYZER", "Analysis",
    "analysis", "resolve_kernel", "NUMBA_MIN_PASSAGES", "SCIPY_MAX_PASSAGES", "BUILD_MEMORY", "BUILD_MEMORY_SHARE",
    "LibraryChoice", "library_choice", "choose_library", "build_memory_bytes", "available_memory_bytes",
    "lucene_unavailable", "refuse_removed_keywords",
]  # fmt: skip

_FORMAT = "capo-bm25/1"


def refuse_removed_keywords(kwargs: dict) -> None:
    """A clear error for the keyword the BM25 library had before it was called ``library``; a TypeError,
    as Python gives, for any other unknown keyword."""
    if "engine" in kwargs:
        raise ValueError(f"the BM25 keyword engine= is now library=: pass library={kwargs['engine']!r}")
    if kwargs:
        raise TypeError(f"BM25Retriever.build() got unexpected keyword arguments: {', '.join(sorted(kwargs))}")


def _index_class(library: str):
    if library not in INDEXES:
        raise ValueError(f"unknown BM25 library {library!r}; choose one of {('auto',) + LIBRARIES}")
    return INDEXES[library]


def _passage_text(p: Passage) -> str:
    return f"{p.title}\n{p.text}" if p.title else p.text


class BM25Retriever(Retriever):
    """BM25 over passages (title + text); see the module docstring for the libraries."""

    def __init__(self, passages: Sequence[Passage], index) -> None:
        self.passages = list(passages)
        self._index = index

    @property
    def library(self) -> str:
        """The BM25 library that holds the index: ``bm25s`` or ``tantivy``."""
        return self._index.name

    @property
    def analyzer(self) -> str:
        """How text is analysed and scored (``analysis``); tantivy's is ``snowball``-like."""
        return getattr(self._index, "analyzer", "snowball")

    @property
    def kernel(self) -> str:
        """What scores queries: ``numba`` or ``scipy`` for bm25s, ``tantivy`` for tantivy."""
        return self._index.kernel

    @property
    def threads(self) -> int:
        """Threads one batch of queries is spread over (numba kernel and tantivy; scipy uses 1)."""
        return self._index.threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._index.threads = max(1, int(value))

    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        *,
        library: str = "auto",
        show_progress: bool = False,
        kernel: str = "auto",
        threads: int | None = None,
        analyzer: str | None = None,
        memory_bytes: int | None = None,
        **removed,
    ) -> "BM25Retriever":
        """``library="auto"`` picks by corpus size and the memory free now, or ``memory_bytes``
        (``choose_library``; never Lucene here: ``open_retriever("bm25")`` hands over to it, this
        raises ``MemoryError`` instead when neither Java-free library fits); ``kernel`` and
        ``analyzer`` (``analysis``; None: ``DEFAULT_ANALYZER``, ``"lucene"``, which ranks as pyserini
        does) are bm25s's (tantivy has its own, snowball-like analysis); ``threads`` is
        used for indexing (tantivy; None: its own default, one per core) and for searching batches
        (None: 1)."""
        refuse_removed_keywords(removed)
        passages = list(passages)
        spec = analysis(analyzer or DEFAULT_ANALYZER)
        if library == "pisa":
            raise ValueError('library="pisa" is a retriever of its own: open_retriever("bm25", library="pisa") or PisaRetriever.build')
        if library != "auto":
            _index_class(library)  # an unknown name fails before anything else
        if not passages:
            raise ValueError("cannot build a BM25 index over zero passages")
        if library == "auto":
            library = choose_library(len(passages), kernel, memory_bytes, analyzer=analyzer, lucene=False, pisa=False)
        index_cls = _index_class(library)
        texts = [_passage_text(p) for p in passages]
        if index_cls is TantivyIndex:
            if analyzer is not None and spec.name != "snowball":
                raise ValueError(f'analyzer {spec.name!r} needs library="bm25s": tantivy\'s BM25 constants are fixed')
            return cls(passages, index_cls.build(texts, show_progress, kernel=kernel, threads=threads))
        return cls(passages, index_cls.build(texts, show_progress, kernel=kernel, threads=threads, analyzer=spec.name))

    def save(self, index_dir: str | Path) -> None:
        with atomic_directory(index_dir) as tmp:
            self._index.save(tmp / self.library)
            write_corpus(self.passages, tmp / "passages.jsonl")
            meta = {"format": _FORMAT, "library": self.library, "passages": len(self.passages), "analyzer": self.analyzer}
            (tmp / "meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, index_dir: str | Path, *, kernel: str = "auto", threads: int = 1) -> "BM25Retriever":
        """A saved bm25s index is the same whichever kernel built it: ``kernel`` picks the scorer now."""
        index_dir = Path(index_dir)
        meta = read_index_meta(index_dir, _FORMAT, "BM25")
        library = meta.get("library") or meta["engine"]  # indexes saved before the rename say "engine"
        # bm25s indexes saved before the analyzer was recorded were all built with snowball
        options = {"analyzer": meta.get("analyzer", "snowball")} if library == "bm25s" else {}
        index = _index_class(library).load(index_dir / library, kernel=kernel, threads=threads, **options)
        return cls(list(read_corpus(index_dir / "passages.jsonl")), index)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        results = []
        for pairs in self._index.search(list(queries), k):
            hits = []
            for pos, score in pairs:
                p = self.passages[pos]
                hits.append(Hit(p.id, p.title, p.text, score))
            results.append(hits)
        return results

    def close(self) -> None:
        self._index.close()
