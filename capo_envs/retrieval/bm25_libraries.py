"""The two Java-free BM25 libraries behind ``BM25Retriever``, and how text becomes terms and scores.

* ``bm25s``: bm25s builds the sparse (term x passage) BM25 score matrix; we tokenise ourselves
  (``\\w+``, lowercase, stopwords, PyStemmer stems; ``analysis``). A batch of queries is scored by one of
  two kernels with bit-identical results (``resolve_kernel``): ``numba`` (``bm25_kernel.py``: accumulate
  the postings into a reused array, keep the top k) or ``scipy`` (one sparse matrix product per batch).
* ``tantivy``: a Rust inverted index with the ``en_stem`` analyzer. Queries are analysed in Python and
  assembled as term queries, never parsed, so query syntax (``AND``, quotes, ``:``, ``*``...) cannot raise.

Both break score ties by corpus position (lower first) and only return passages that share at least one
term with the query.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .index_files import top_k_with_ties

KERNELS = ("numba", "scipy")
# From this many passages on, kernel "auto" scores with numba when it imports (see resolve_kernel).
NUMBA_MIN_PASSAGES = 20_000
# Lucene's default BM25 constants (tantivy's are fixed to these), so the two libraries rank alike.
_K1, _B = 1.2, 0.75
_WORD = re.compile(r"\w+")
ANALYZERS = ("snowball", "lucene")
DEFAULT_ANALYZER = "lucene"  # bm25s's default: Lucene's ranking, as the lucene retriever (pyserini) does
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
    """``lucene`` (the default): what pyserini's default ``SimpleSearcher`` (this package's ``lucene``
    retriever) does: Lucene's 33 English stopwords, Porter stems, Anserini's k1 0.9 and b 0.4, and
    document lengths rounded as Lucene's one-byte norms store them, so bm25s ranks as Lucene does
    (docs/results/performance.md, section 4a, measures the agreement). ``snowball``: bm25s's English
    stopwords, Snowball English stems, k1 1.2, b 0.75 (tantivy's own analysis is close to it); indexes
    saved without an analyzer in their meta were built with it."""
    if name == "snowball":
        return Analysis("snowball", "english", _K1, _B, False)
    if name == "lucene":
        return Analysis("lucene", "porter", 0.9, 0.4, True)
    raise ValueError(f"unknown analyzer {name!r}; choose one of {ANALYZERS}")


def stopwords_for(name: str) -> frozenset[str]:
    return LUCENE_STOPWORDS if name == "lucene" else _stopwords()


def lucene_length(length: np.ndarray) -> np.ndarray:
    """Document lengths as Lucene decodes its one-byte norms (``SmallFloat.intToByte4`` then
    ``byte4ToInt``): exact below 24, then 4 significant bits."""
    free = 24  # 255 - longToInt4(Integer.MAX_VALUE)
    out = np.asarray(length, dtype=np.int64).copy()
    big = out >= free
    rest = out[big] - free
    shift = np.maximum(np.floor(np.log2(np.maximum(rest, 1))).astype(np.int64) + 1 - 4, 0)
    out[big] = free + ((rest >> shift) << shift)  # keep the top 4 bits of (length - 24)
    return out


def requantise(model, corpus_tokens: list[list[str]], spec: Analysis) -> None:
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
    norm = spec.k1 * (1 - spec.b + spec.b * lucene_length(lengths) / max(lengths.mean(), 1e-9))
    term_of = np.repeat(np.arange(len(df)), df)
    scores["data"] = (idf[term_of] * tf.data / (tf.data + norm[tf.indices])).astype(scores["data"].dtype)


def resolve_kernel(kernel: str = "auto", n_passages: int | None = None) -> str:
    """How a bm25s index scores: ``"numba"`` (compiled) or ``"scipy"`` (a sparse matrix
    product); both give bit-identical scores. "auto" takes numba when it imports and the corpus has
    at least ``NUMBA_MIN_PASSAGES`` passages (or its size is not given): below that, importing
    numba and loading its compiled code costs more than it saves in short-lived env workers
    (docs/results/performance.md, section 4a)."""
    from . import bm25_kernel

    if kernel not in KERNELS + ("auto",):
        raise ValueError(f"unknown bm25s kernel {kernel!r}; choose one of {('auto',) + KERNELS}")
    if kernel == "auto":
        small = n_passages is not None and n_passages < NUMBA_MIN_PASSAGES
        return "numba" if bm25_kernel.available() and not small else "scipy"
    if kernel == "numba" and not bm25_kernel.available():
        raise ImportError('kernel="numba" needs numba: pip install "capo-gym[bm25-fast]"')
    return kernel


class Bm25sIndex:
    name = "bm25s"

    def __init__(self, model, vocab: dict[str, int], kernel: str = "auto", threads: int = 1, analyzer: str = DEFAULT_ANALYZER):
        import scipy.sparse as sp

        self.analyzer = analysis(analyzer).name
        self._stop = stopwords_for(self.analyzer)
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
              analyzer: str = DEFAULT_ANALYZER) -> "Bm25sIndex":
        import bm25s
        import Stemmer

        spec = analysis(analyzer)
        stemmer, stop = Stemmer.Stemmer(spec.stemmer), stopwords_for(spec.name)
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
            requantise(model, corpus_tokens, spec)
        return cls(model, model.vocab_dict, kernel, threads or 1, spec.name)

    def save(self, path: Path) -> None:
        self._model.save(str(path), show_progress=False)

    @classmethod
    def load(cls, path: Path, kernel: str = "auto", threads: int = 1, analyzer: str = DEFAULT_ANALYZER) -> "Bm25sIndex":
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


class TantivyIndex:
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
        # stopword removal on the query side only, as with bm25s.
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
    def build(cls, texts: Sequence[str], show_progress: bool, kernel: str = "auto", threads: int | None = None) -> "TantivyIndex":
        import tantivy
        from tqdm.auto import tqdm

        path = Path(tempfile.mkdtemp(prefix="capo-tantivy-"))
        index = tantivy.Index(cls._schema(), path=str(path))
        # tantivy splits heap_size between its indexing threads and wants >= 15 MB each; 0 lets it
        # pick (one per core, at most 8)
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
    def load(cls, path: Path, kernel: str = "auto", threads: int = 1) -> "TantivyIndex":
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
            # a repeated query word counts once per occurrence, as with bm25s
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


INDEXES = {"bm25s": Bm25sIndex, "tantivy": TantivyIndex}  # library name -> its index
