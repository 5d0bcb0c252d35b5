"""Java-free BM25 over a passage list, with two interchangeable engines and two scoring kernels.

* ``bm25s`` (the default): bm25s builds the sparse (term x passage) BM25 score matrix; we tokenise
  ourselves (``\\w+``, lowercase, stopwords, PyStemmer stems). A batch of queries is scored by one of
  two kernels with bit-identical results: ``numba`` (``bm25_kernel.py``: accumulate the postings
  into a reused array, keep the top k; used whenever numba imports) or ``scipy`` (one sparse matrix
  product per batch).
* ``tantivy``: a Rust inverted index with the ``en_stem`` analyzer. Queries are analysed in Python
  and assembled as term queries, never parsed, so query syntax (``AND``, quotes, ``:``, ``*``...)
  cannot raise.

Analysis (bm25s only; ``analysis``): ``snowball`` (the default: bm25s's stopwords, Snowball stems,
k1 1.2, b 0.75) or ``lucene`` (pyserini's: Lucene's stopwords, Porter stems, k1 0.9, b 0.4, Lucene's
rounded length norms), whose top 10 agrees with the ``lucene`` retriever's 0.99 of the time.

How ``engine="auto"`` picks (``choose_engine``), from ``benchmarks/bench_retrieval_scale.py`` at
10k, 30k and 100k generated Wikipedia-like passages (1000 NQ-like queries, k=10; 2 shared cores
under load, so CPU time of the serving process is compared; load average 4.7-9.8):

* with numba: bm25s at every size, scored by numba from ``NUMBA_MIN_PASSAGES`` (20k) on and by
  scipy below (bit-identical; small corpora keep today's scorer and skip numba's load time). The
  numba kernel answered a single query in 0.046 / 0.062 / 0.124 ms (CPU p50) against Lucene's
  1.2 / 1.5 / 2.5 ms through pyserini, tantivy's 0.081 / 0.140 / 0.272 and the scipy kernel's
  0.164 / 0.251 / 0.510; batches at 30,038 / 22,319 / 10,331 queries per CPU-second (Lucene 1,193 /
  916 / 609, tantivy 11,577 / 6,686 / 3,410, scipy 15,367 / 7,385 / 2,224). Its cost is linear in
  the postings a query reads: an affine fit gives 0.04 ms + 0.9 ms per million passages for a
  single query, i.e. ~0.9 ms at 1M and ~18 ms at 21M if the trend holds (a quiet 1M/5M run has to
  show whether Lucene's pruning overtakes it at the largest sizes).
* without numba: bm25s up to ``SCIPY_MAX_PASSAGES`` (50k), tantivy above: tantivy is faster for
  single queries at every size measured, and for batches from between 30k and 100k passages on.

Ranking: bm25s and tantivy mostly agree (top-10 overlap 0.94 / 0.93 / 0.93, recall@5 within 0.003); against Lucene the
``snowball`` analysis reaches 0.86-0.88 overlap and 0.004-0.015 lower recall@5 (0.771 vs 0.786 at
100k), ``lucene`` 0.993-0.994 and the same recall@5 (0.956 / 0.900 / 0.786 vs Lucene's 0.956 / 0.898 /
0.786) at the same speed. tantivy builds fastest and takes the least memory of the Java-free
engines (at 100k: 4.1 vs 7.7 CPU-s to build, 87 vs 115 MB on disk, 283 vs 379 MB RSS serving).

Both engines break score ties by corpus position (lower first) and only return passages that share
at least one term with the query, so a query can get fewer than ``k`` hits, or none.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import Hit, Passage, Retriever, check_search_args, read_corpus, write_corpus
from .index_files import atomic_directory, read_index_meta, top_k_with_ties

ENGINES = ("bm25s", "tantivy")
DEFAULT_ENGINE = "bm25s"  # what "auto" builds for small corpora (and at every size with numba)
KERNELS = ("numba", "scipy")
# Above this many passages, without numba, "auto" builds tantivy (see choose_engine).
SCIPY_MAX_PASSAGES = 50_000
# From this many passages on, "auto" scores bm25s with numba when it imports (see resolve_kernel).
NUMBA_MIN_PASSAGES = 20_000
_FORMAT = "capo-bm25/1"
# Lucene's default BM25 constants (tantivy's are fixed to these), so the two engines rank alike.
_K1, _B = 1.2, 0.75
_WORD = re.compile(r"\w+")
ANALYZERS = ("snowball", "lucene")
DEFAULT_ANALYZER = "snowball"
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, which Anserini's default analyzer uses.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)


@lru_cache(maxsize=None)
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@dataclass(frozen=True)
class Analysis:
    """How text becomes terms and terms become scores; see ``analysis``."""

    name: str
    stemmer: str  # a PyStemmer algorithm
    k1: float
    b: float
    quantise_lengths: bool  # Lucene's one-byte document length norms


def analysis(name: str) -> Analysis:
    """``snowball`` (the default): bm25s's English stopwords, Snowball English stems, k1 1.2, b 0.75.
    ``lucene``: what pyserini's default ``SimpleSearcher`` (this package's ``lucene`` retriever)
    does: Lucene's 33 English stopwords, Porter stems, Anserini's k1 0.9 and b 0.4, and document
    lengths rounded as Lucene's one-byte norms store them. On the generated 10k corpus of
    ``benchmarks/bench_retrieval_scale.py`` its top 10 agrees with Lucene's 0.99 (0.88 for snowball)."""
    if name == "snowball":
        return Analysis("snowball", "english", _K1, _B, False)
    if name == "lucene":
        return Analysis("lucene", "porter", 0.9, 0.4, True)
    raise ValueError(f"unknown analyzer {name!r}; choose one of {ANALYZERS}")


def _stopwords_for(name: str) -> frozenset[str]:
    return LUCENE_STOPWORDS if name == "lucene" else _stopwords()


def _lucene_length(length: np.ndarray) -> np.ndarray:
    """Document lengths as Lucene decodes its one-byte norms (``SmallFloat.intToByte4`` then
    ``byte4ToInt``): exact below 24, then 4 significant bits."""
    free = 24  # 255 - longToInt4(Integer.MAX_VALUE)
    out = np.asarray(length, dtype=np.int64).copy()
    big = out >= free
    rest = out[big] - free
    shift = np.maximum(np.floor(np.log2(np.maximum(rest, 1))).astype(np.int64) + 1 - 4, 0)
    out[big] = free + ((rest >> shift) << shift)  # keep the top 4 bits of (length - 24)
    return out


def _passage_text(p: Passage) -> str:
    return f"{p.title}\n{p.text}" if p.title else p.text


def _requantise(model, corpus_tokens: list[list[str]], spec: Analysis) -> None:
    """Recompute bm25s's scores with Lucene's rounded document lengths (same postings, same idf,
    Lucene's BM25 without the constant (k1 + 1) factor, as bm25s's "lucene" method)."""
    import scipy.sparse as sp

    vocab, scores = model.vocab_dict, model.scores
    n = scores["num_docs"]
    lengths = np.fromiter((len(t) for t in corpus_tokens), dtype=np.int64, count=n)
    doc_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=doc_ptr[1:])
    term_ids = np.fromiter((vocab[t] for tokens in corpus_tokens for t in tokens), dtype=np.int32, count=int(doc_ptr[-1]))
    # bm25s may add an empty token to its vocabulary after the matrix, with no postings: not a column
    n_terms = len(scores["indptr"]) - 1
    counts = sp.csr_matrix((np.ones(len(term_ids), dtype=np.float32), term_ids, doc_ptr), shape=(n, max(n_terms, int(term_ids.max(initial=-1)) + 1)))
    counts.sum_duplicates()  # term frequencies
    tf = counts.tocsc()
    tf.sort_indices()
    if tf.shape[1] != n_terms or not (np.array_equal(tf.indptr, scores["indptr"]) and np.array_equal(tf.indices, scores["indices"])):
        raise RuntimeError("bm25s's score matrix does not have the postings expected; cannot requantise")
    df = np.diff(tf.indptr)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    norm = spec.k1 * (1 - spec.b + spec.b * _lucene_length(lengths) / max(lengths.mean(), 1e-9))
    term_of = np.repeat(np.arange(len(df)), df)
    scores["data"] = (idf[term_of] * tf.data / (tf.data + norm[tf.indices])).astype(scores["data"].dtype)


class _Bm25sEngine:
    name = "bm25s"

    def __init__(self, model, vocab: dict[str, int], kernel: str = "auto", threads: int = 1, analyzer: str = DEFAULT_ANALYZER):
        import scipy.sparse as sp

        self.analyzer = analysis(analyzer).name
        self._stop = _stopwords_for(self.analyzer)
        self._model = model
        self._vocab = vocab
        s = model.scores
        # bm25s stores (passage x term) scores column-major; the same arrays read row-major are the
        # (term x passage) matrix a batch of query-term counts multiplies.
        self._term_matrix = sp.csr_matrix(
            (s["data"], s["indices"], s["indptr"]), shape=(len(s["indptr"]) - 1, s["num_docs"])
        )
        import Stemmer

        self._stemmer = Stemmer.Stemmer(analysis(self.analyzer).stemmer)
        self.kernel = resolve_kernel(kernel, int(s["num_docs"]))
        self._scorer = None
        if self.kernel == "numba":
            from .bm25_kernel import NumbaScorer

            m = self._term_matrix
            self._scorer = NumbaScorer(m.indptr, m.indices, m.data, m.shape[1], threads=threads)

    @property
    def threads(self) -> int:
        return self._scorer.threads if self._scorer is not None else 1

    @threads.setter
    def threads(self, value: int) -> None:
        if self._scorer is not None:
            self._scorer.threads = max(1, int(value))

    @classmethod
    def build(cls, texts: Sequence[str], show_progress: bool, kernel: str = "auto", threads: int | None = None,
              analyzer: str = DEFAULT_ANALYZER) -> "_Bm25sEngine":
        import bm25s
        import Stemmer

        spec = analysis(analyzer)
        stemmer, stop = Stemmer.Stemmer(spec.stemmer), _stopwords_for(spec.name)
        stems: dict[str, str] = {}  # a corpus repeats words: stem each distinct word once
        corpus_tokens = []
        for text in texts:
            tokens = []
            for word in _WORD.findall(text.lower()):
                if word not in stop:
                    stem = stems.get(word)
                    if stem is None:
                        stem = stems[word] = stemmer.stemWord(word)
                    tokens.append(stem)
            corpus_tokens.append(tokens)
        model = bm25s.BM25(k1=spec.k1, b=spec.b, method="lucene")
        model.index(corpus_tokens, show_progress=show_progress)
        if spec.quantise_lengths:
            _requantise(model, corpus_tokens, spec)
        return cls(model, model.vocab_dict, kernel, threads or 1, spec.name)

    def save(self, path: Path) -> None:
        self._model.save(str(path), show_progress=False)

    @classmethod
    def load(cls, path: Path, kernel: str = "auto", threads: int = 1, analyzer: str = DEFAULT_ANALYZER) -> "_Bm25sEngine":
        import bm25s

        model = bm25s.BM25.load(str(path), show_progress=False)
        return cls(model, model.vocab_dict, kernel, threads, analyzer)

    def _term_ids(self, query: str) -> list[int]:
        stop = self._stop
        words = [w for w in _WORD.findall(query.lower()) if w not in stop]
        return [self._vocab[s] for s in self._stemmer.stemWords(words) if s in self._vocab and s != ""]

    def _weighted_terms(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """Sorted distinct term ids and how often each occurs: the order and weights in which the
        scipy product sums a query's terms, so both kernels compute bit-identical float32 scores."""
        counts: dict[int, int] = {}
        for term in self._term_ids(query):
            counts[term] = counts.get(term, 0) + 1
        ids = sorted(counts)
        return np.array(ids, dtype=np.int64), np.array([counts[t] for t in ids], dtype=np.float32)

    def search(self, queries: Sequence[str], k: int, chunk: int = 256) -> list[list[tuple[int, float]]]:
        if self._scorer is not None:
            return self._scorer.search([self._weighted_terms(q) for q in queries], k)
        return self._search_scipy(queries, k, chunk)

    def _search_scipy(self, queries: Sequence[str], k: int, chunk: int = 256) -> list[list[tuple[int, float]]]:
        import scipy.sparse as sp

        out: list[list[tuple[int, float]]] = []
        n_terms = self._term_matrix.shape[0]
        # Chunked so a batch of queries full of common terms cannot build a huge result matrix.
        for start in range(0, len(queries), chunk):
            rows, cols = [], []
            for row, query in enumerate(queries[start : start + chunk]):
                ids = self._term_ids(query)
                rows.extend([row] * len(ids))
                cols.extend(ids)
            n = len(queries[start : start + chunk])
            counts = sp.csr_matrix(
                (np.ones(len(cols), dtype=np.float32), (rows, cols)), shape=(n, n_terms)
            )  # duplicate (row, term) pairs sum, so a repeated query word weighs more, as in bm25s
            result = (counts @ self._term_matrix).tocsr()
            for row in range(n):
                lo, hi = result.indptr[row], result.indptr[row + 1]
                scores, positions = result.data[lo:hi], result.indices[lo:hi]
                positive = scores > 0
                out.append(top_k_with_ties(positions[positive], scores[positive], k))
        return out

    def close(self) -> None:
        pass


class _TantivyEngine:
    name = "tantivy"

    kernel = "tantivy"

    def __init__(self, index, path: Path, owned: bool, threads: int = 1):
        import tantivy

        self.threads = max(1, int(threads))  # searcher threads for a batch (tantivy drops the GIL)
        self._tantivy = tantivy
        self._index = index
        self._index.reload()
        self._searcher = index.searcher()
        self._path = path
        self._owned = owned  # build() indexes into a temp dir, deleted on close
        # en_stem = simple tokenizer + remove_long(40) + lowercase + English stemmer; we add
        # stopword removal on the query side only, like the bm25s engine.
        f = tantivy.Filter
        self._analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(f.remove_long(40))
            .filter(f.lowercase())
            .filter(f.custom_stopword(sorted(_stopwords())))
            .filter(f.stemmer("english"))
            .build()
        )

    @staticmethod
    def _schema():
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("body", stored=False, tokenizer_name="en_stem")
        builder.add_unsigned_field("pos", stored=False, indexed=False, fast=True)
        return builder.build()

    @classmethod
    def build(cls, texts: Sequence[str], show_progress: bool, kernel: str = "auto", threads: int | None = None) -> "_TantivyEngine":
        import tantivy
        from tqdm.auto import tqdm

        path = Path(tempfile.mkdtemp(prefix="capo-tantivy-"))
        index = tantivy.Index(cls._schema(), path=str(path))
        # tantivy splits heap_size between its indexing threads and wants >= 15 MB each; 0 lets it
        # pick (one per core, at most 8), as before ``threads`` existed
        writer = index.writer(heap_size=512_000_000, num_threads=0 if threads is None else max(1, int(threads)))
        for pos, text in enumerate(tqdm(texts, disable=not show_progress, desc="tantivy index")):
            doc = tantivy.Document()
            doc.add_text("body", text)
            doc.add_unsigned("pos", pos)  # segments need not keep corpus order; this does
            writer.add_document(doc)
        writer.commit()
        writer.wait_merging_threads()
        return cls(index, path, owned=True, threads=threads or 1)

    def save(self, path: Path) -> None:
        shutil.copytree(self._path, path, ignore=shutil.ignore_patterns(".tantivy-*.lock"))

    @classmethod
    def load(cls, path: Path, kernel: str = "auto", threads: int = 1) -> "_TantivyEngine":
        import tantivy

        return cls(tantivy.Index.open(str(path)), path, owned=False, threads=threads)

    def _query(self, text: str):
        terms: dict[str, int] = {}
        for token in self._analyzer.analyze(text):
            terms[token] = terms.get(token, 0) + 1
        if not terms:
            return None
        schema, q = self._index.schema, self._tantivy.Query
        clauses = []
        for term, count in terms.items():
            tq = q.term_query(schema, "body", term, index_option="freq")
            # a repeated query word counts once per occurrence, as in the bm25s engine
            clauses.append((self._tantivy.Occur.Should, q.boost_query(tq, float(count)) if count > 1 else tq))
        return q.boolean_query(clauses)

    def _search_one(self, text: str, k: int) -> list[tuple[int, float]]:
        query = self._query(text)
        if query is None:
            return []
        limit = 2 * k + 8  # ties at the cut are common (tantivy quantises lengths): start wide
        while True:
            hits = self._searcher.search(query, limit, count=False).hits
            # Widen until the k-th score is strictly beaten, so every tie at the cut is seen.
            if len(hits) < limit or hits[-1][0] < hits[k - 1][0]:
                break
            limit *= 2
        positions = self._searcher.fast_field_values("pos", [addr for _, addr in hits])
        scores = np.array([score for score, _ in hits], dtype=np.float32)
        return top_k_with_ties(np.array(positions, dtype=np.int64), scores, k)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        if self.threads == 1 or len(queries) < 2 * self.threads:
            return [self._search_one(q, k) for q in queries]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(lambda q: self._search_one(q, k), queries, chunksize=16))

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self._path, ignore_errors=True)
            self._owned = False


_ENGINE_CLASSES = {"bm25s": _Bm25sEngine, "tantivy": _TantivyEngine}


def resolve_kernel(kernel: str = "auto", n_passages: int | None = None) -> str:
    """How the bm25s engine scores: ``"numba"`` (compiled) or ``"scipy"`` (a sparse matrix
    product); both give bit-identical scores. "auto" takes numba when it imports and the corpus has
    at least ``NUMBA_MIN_PASSAGES`` passages (or its size is not given): below that, importing
    numba and loading its compiled code (~1-2.5 s per process, ~5 s to compile the first time)
    costs more than it saves (~0.12 ms a query at 10k passages) in short-lived env workers."""
    from . import bm25_kernel

    if kernel not in KERNELS + ("auto",):
        raise ValueError(f"unknown bm25s kernel {kernel!r}; choose one of {('auto',) + KERNELS}")
    if kernel == "auto":
        small = n_passages is not None and n_passages < NUMBA_MIN_PASSAGES
        return "numba" if bm25_kernel.available() and not small else "scipy"
    if kernel == "numba" and not bm25_kernel.available():
        raise ImportError('kernel="numba" needs numba: pip install "capo-gym[bm25-fast]"')
    return kernel


def choose_engine(n_passages: int, kernel: str = "auto") -> str:
    """The engine ``engine="auto"`` builds for a corpus of ``n_passages``; see the module docstring.

    bm25s everywhere when its numba kernel runs; with the scipy kernel alone, bm25s up to
    ``SCIPY_MAX_PASSAGES`` and tantivy above it, where tantivy answered batches faster (and single
    queries at every size measured). Corpora this small keep today's engine either way.
    """
    if resolve_kernel(kernel, n_passages) == "numba" or n_passages <= SCIPY_MAX_PASSAGES:
        return "bm25s"
    return "tantivy"


def _engine_class(engine: str, n_passages: int = 0, kernel: str = "auto"):
    name = choose_engine(n_passages, kernel) if engine == "auto" else engine
    if name not in _ENGINE_CLASSES:
        raise ValueError(f"unknown BM25 engine {engine!r}; choose one of {('auto',) + ENGINES}")
    return _ENGINE_CLASSES[name]


class BM25Retriever(Retriever):
    """BM25 over passages (title + text); see the module docstring for the engines."""

    def __init__(self, passages: Sequence[Passage], engine) -> None:
        self.passages = list(passages)
        self._engine = engine

    @property
    def engine(self) -> str:
        return self._engine.name

    @property
    def analyzer(self) -> str:
        """How text is analysed and scored (``analysis``); tantivy's is ``snowball``-like."""
        return getattr(self._engine, "analyzer", "snowball")

    @property
    def kernel(self) -> str:
        """What scores queries: ``numba`` or ``scipy`` for bm25s, ``tantivy`` for tantivy."""
        return self._engine.kernel

    @property
    def threads(self) -> int:
        """Threads one batch of queries is spread over (numba kernel and tantivy; scipy uses 1)."""
        return self._engine.threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._engine.threads = max(1, int(value))

    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        *,
        engine: str = "auto",
        show_progress: bool = False,
        kernel: str = "auto",
        threads: int | None = None,
        analyzer: str = DEFAULT_ANALYZER,
    ) -> "BM25Retriever":
        """``engine="auto"`` picks by corpus size (``choose_engine``); ``kernel`` and ``analyzer``
        (``analysis``: ``"lucene"`` ranks as pyserini does) are bm25s's; ``threads`` is used for
        indexing (tantivy; None: its own default, one per core) and for searching batches (None: 1)."""
        passages = list(passages)
        spec = analysis(analyzer)
        engine_cls = _engine_class("bm25s" if spec.name != DEFAULT_ANALYZER and engine == "auto" else engine, len(passages), kernel)
        if not passages:
            raise ValueError("cannot build a BM25 index over zero passages")
        texts = [_passage_text(p) for p in passages]
        if engine_cls is _TantivyEngine:
            if spec.name != "snowball":
                raise ValueError(f'analyzer {spec.name!r} needs engine="bm25s": tantivy\'s BM25 constants are fixed')
            return cls(passages, engine_cls.build(texts, show_progress, kernel=kernel, threads=threads))
        return cls(passages, engine_cls.build(texts, show_progress, kernel=kernel, threads=threads, analyzer=spec.name))

    def save(self, index_dir: str | Path) -> None:
        with atomic_directory(index_dir) as tmp:
            self._engine.save(tmp / self.engine)
            write_corpus(self.passages, tmp / "passages.jsonl")
            meta = {"format": _FORMAT, "engine": self.engine, "passages": len(self.passages), "analyzer": self.analyzer}
            (tmp / "meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, index_dir: str | Path, *, kernel: str = "auto", threads: int = 1) -> "BM25Retriever":
        """A saved bm25s index is the same whichever kernel built it: ``kernel`` picks the scorer now."""
        index_dir = Path(index_dir)
        meta = read_index_meta(index_dir, _FORMAT, "BM25")
        options = {"analyzer": meta["analyzer"]} if meta["engine"] == "bm25s" and "analyzer" in meta else {}
        engine = _engine_class(meta["engine"]).load(index_dir / meta["engine"], kernel=kernel, threads=threads, **options)
        return cls(list(read_corpus(index_dir / "passages.jsonl")), engine)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        results = []
        for pairs in self._engine.search(list(queries), k):
            hits = []
            for pos, score in pairs:
                p = self.passages[pos]
                hits.append(Hit(p.id, p.title, p.text, score))
            results.append(hits)
        return results

    def close(self) -> None:
        self._engine.close()
