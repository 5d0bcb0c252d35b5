"""Retrieval backends behind one interface, and ``open_retriever`` to get one by name.

Only the torch-free parts are imported here; dense (torch, transformers, faiss), Lucene (Java), PISA and
HTTP backends are imported when ``open_retriever`` is asked for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from .base import CachedRetriever, Hit, Passage, Retriever, read_corpus, write_corpus
from .bm25 import BM25Retriever, choose_library, refuse_removed_keywords

__all__ = [
    "Passage", "Hit", "Retriever", "CachedRetriever", "read_corpus", "write_corpus",
    "BM25Retriever", "open_retriever", "KINDS",
]

KINDS = ("bm25", "lucene", "pisa", "dense", "hybrid")
_BM25_KWARGS = {"library", "show_progress", "kernel", "threads", "analyzer", "memory_bytes"}
_HYBRID_KWARGS = {"rrf_k", "depth", "weights"}


def _index_class(kind: str):
    if kind == "bm25":
        return BM25Retriever
    if kind == "dense":
        from .dense import DenseRetriever

        return DenseRetriever
    if kind == "pisa":
        from .pisa import PisaRetriever

        return PisaRetriever
    from .lucene import LuceneRetriever

    return LuceneRetriever


def _saved_retriever(index_dir: Path) -> str | None:
    """``lucene`` or ``pisa`` when ``index_dir`` holds such an index (kind ``bm25`` saves one when it
    handed over), else None."""
    try:
        saved = json.loads((index_dir / "meta.json").read_text()).get("retriever")
    except (OSError, ValueError, AttributeError):
        return None
    return saved if saved in ("lucene", "pisa") else None


def _build_bm25(passages: Sequence[Passage], kwargs: dict[str, Any]) -> Retriever:
    """Kind ``bm25``: ``BM25Retriever``; or PISA (``library="pisa"``, or ``"auto"`` where it is installed and
    faster), or Lucene when ``library="auto"`` finds that no Java-free build fits in memory and Lucene is
    installed (``bm25_choice.library_choice``)."""
    kwargs = dict(kwargs)
    memory_bytes = kwargs.pop("memory_bytes", None)
    if kwargs.get("library", "auto") == "auto":  # only "auto" hands over; library="lucene" is kind lucene, not bm25
        kwargs["library"] = choose_library(
            len(passages), kwargs.get("kernel", "auto"), memory_bytes, analyzer=kwargs.get("analyzer")
        )
        if kwargs["library"] == "lucene":
            from .lucene import LuceneRetriever

            return LuceneRetriever.build(passages, threads=kwargs.get("threads") or 1, show_progress=kwargs.get("show_progress", False))
    if kwargs["library"] == "pisa":
        from .pisa import PisaRetriever

        if kwargs.get("analyzer") not in (None, "lucene"):
            raise ValueError(f'library="pisa" ranks as Lucene only: analyzer {kwargs["analyzer"]!r} needs library="bm25s"')
        return PisaRetriever.build(passages, threads=kwargs.get("threads") or 1, show_progress=kwargs.get("show_progress", False))
    return BM25Retriever.build(passages, **kwargs)


def _load_or_build(kind: str, get_passages: Callable[[], Sequence[Passage]], index_dir: Path | None, kwargs: dict[str, Any]) -> Retriever:
    cls = _index_class(kind)
    if index_dir is not None and index_dir.is_dir() and any(index_dir.iterdir()):
        saved = _saved_retriever(index_dir) if kind == "bm25" else None
        if saved is not None:
            return _index_class(saved).load(index_dir, threads=kwargs.get("threads") or 1)
        if kind == "bm25":  # how to score a saved index is chosen at load time
            return cls.load(index_dir, **{key: v for key, v in kwargs.items() if key in ("kernel", "threads")})
        if kind == "pisa":
            return cls.load(index_dir, **{key: v for key, v in kwargs.items() if key in ("algorithm", "threads")})
        return cls.load(index_dir)
    retriever = _build_bm25(get_passages(), kwargs) if kind == "bm25" else cls.build(get_passages(), **kwargs)
    if index_dir is not None:
        retriever.save(index_dir)
    return retriever


def open_retriever(
    kind: str,
    *,
    passages: Sequence[Passage] | None = None,
    corpus: str | Path | None = None,
    index_dir: str | Path | None = None,
    cache_size: int = 10_000,
    **kwargs: Any,
) -> Retriever:
    """A ready retriever: ``kind`` is one of ``KINDS`` or an ``http(s)://`` retrieval server URL.

    A saved index in ``index_dir`` is loaded; otherwise one is built from ``passages`` (or the JSONL
    ``corpus``) and saved to ``index_dir`` when given. ``hybrid`` keeps its BM25 and dense indexes
    in ``index_dir/bm25`` and ``index_dir/dense``. ``kwargs`` go to the backend's ``build`` (for
    hybrid: ``library``/``kernel``/``threads``/``analyzer``/``memory_bytes`` to BM25,
    ``rrf_k``/``depth``/``weights`` to the fusion, the rest to dense); a saved BM25 index is loaded
    with ``kernel``/``threads``.

    ``bm25`` with ``library="auto"`` (``capo_envs.retrieval.bm25_choice``) picks a BM25 library for
    speed first: bm25s at every size when numba is installed (scored by numba from 20k passages on, by
    scipy below, bit-identically); without numba, bm25s up to 50k passages and tantivy above. Then for
    memory: when that build's estimated peak (``bm25_choice.BUILD_MEMORY``, on top of the loaded passages)
    exceeds 80% of the memory available (``memory_bytes=`` overrides what the machine reports), it builds
    PISA (``pisa.PisaRetriever``: streams its build, Lucene's ranking) or else the ``lucene`` kind instead
    when installed (saved in ``index_dir`` and loaded back as such), else
    tantivy if that fits, else raises ``MemoryError`` naming the options. ``library="pisa"`` builds PISA
    as asked; so does kind ``pisa`` (kwargs ``threads``, ``impact_bits``, ``algorithm``). A switch is logged in one line; an explicit ``library="bm25s"``/``"tantivy"``
    is always built as asked. bm25s ranks as the ``lucene`` kind (pyserini) does, without Java
    (``analyzer="lucene"``, the default; ``analyzer="snowball"``: bm25s's own analysis).
    With ``cache_size > 0`` the result sits behind an LRU query cache.
    """
    if kind in ("bm25", "hybrid"):
        refuse_removed_keywords({k: v for k, v in kwargs.items() if k == "engine"})
    if kind.startswith(("http://", "https://")):
        from .http import HTTPRetriever

        retriever: Retriever = HTTPRetriever(kind, **kwargs)
    elif kind not in KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; choose one of {KINDS} or an http(s):// URL")
    else:
        index_path = Path(index_dir) if index_dir is not None else None
        cached: list[Passage] = []

        def get_passages() -> Sequence[Passage]:
            # Read the corpus at most once, and only if some index has to be built.
            if passages is not None:
                return passages
            if corpus is None:
                where = f"no saved index in {index_path} and " if index_path is not None else ""
                raise ValueError(f"open_retriever({kind!r}): {where}neither passages nor corpus given to build one from")
            if not cached:
                cached.extend(read_corpus(corpus))
            return cached

        if kind == "hybrid":
            bm25_kwargs = {key: v for key, v in kwargs.items() if key in _BM25_KWARGS}
            fusion = {key: v for key, v in kwargs.items() if key in _HYBRID_KWARGS}
            dense_kwargs = {key: v for key, v in kwargs.items() if key not in _BM25_KWARGS | _HYBRID_KWARGS}
            if "show_progress" in kwargs:
                dense_kwargs["show_progress"] = kwargs["show_progress"]
            sub = (lambda name: index_path / name) if index_path is not None else (lambda name: None)
            from .hybrid import HybridRetriever

            members = [
                _load_or_build("bm25", get_passages, sub("bm25"), bm25_kwargs),
                _load_or_build("dense", get_passages, sub("dense"), dense_kwargs),
            ]
            retriever = HybridRetriever(members, **fusion)
        else:
            retriever = _load_or_build(kind, get_passages, index_path, kwargs)
    return CachedRetriever(retriever, cache_size) if cache_size > 0 else retriever
