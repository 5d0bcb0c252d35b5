"""Java-free BM25 over a passage list, with two interchangeable engines and two scoring kernels.

* ``bm25s`` (the default): bm25s builds the sparse (term x passage) BM25 score matrix; we tokenise
  ourselves (``\\w+``, lowercase, stopwords, PyStemmer stems). A batch of queries is scored by one of
  two kernels with bit-identical results: ``numba`` (``bm25_kernel.py``: accumulate the postings
  into a reused array, keep the top k; used whenever numba imports) or ``scipy`` (one sparse matrix
  product per batch).
* ``tantivy``: a Rust inverted index with the ``en_stem`` analyzer. Queries are analysed in Python
  and assembled as term queries, never parsed, so query syntax (``AND``, quotes, ``:``, ``*``...)
  cannot raise.

Analysis (bm25s only; ``analysis``): ``lucene`` (the default since 2026-12: pyserini's Lucene stopwords,
Porter stems, k1 0.9, b 0.4, Lucene's rounded length norms), whose top 10 agrees with the ``lucene``
retriever's 0.99 of the time and whose recall@5 is within 0.001 of it at every size measured, or
``snowball`` (the default before: bm25s's stopwords, Snowball stems, k1 1.2, b 0.75; top-10 overlap
0.85-0.88, recall@5 up to 0.026 lower). Indexes saved without an analyzer in their meta are snowball's.

Measured quietly (``benchmarks/bench_retrieval_scale.py --sizes 10000,100000,1000000``, 2 cores,
nothing else running; generated Wikipedia-like passages, 1000 NQ-like queries, k=10, one thread;
docs/results/performance.md section 4a, raw cells in docs/results/retrieval_scale.jsonl), wall
clock at 10k / 100k / 1M passages:

* single query p50: bm25s-numba 0.044 / 0.119 / 1.05 ms, tantivy 0.075 / 0.266 / 1.92, bm25s-scipy
  0.170 / 0.418 / 4.60, Lucene through pyserini 1.10 / 1.84 / 3.79;
* batches: bm25s-numba 36,600 / 10,140 / 1,052 queries/s, tantivy 13,220 / 3,526 / 482, bm25s-scipy
  16,379 / 2,783 / 172, Lucene 2,350 / 1,255 / 328;
* so bm25s-numba is faster than Lucene at every size measured (1M: 3.6x single, 3.2x batch),
  tantivy 2.0x / 1.5x at 1M and bm25s-scipy 0.8x / 0.5x;
* memory at 1M: build peak RSS bm25s 5,558 MB (6,011 MB with ``analyzer="lucene"``), tantivy 2,252,
  Lucene 1,112 (its indexer JVM 1,052); serving RSS 1,681 / 1,151 / 265 MB. bm25s and tantivy keep the
  passages in Python memory (~1 KB each here), Lucene keeps them on disk;
* ranking at 1M: recall@5 Lucene 0.554, bm25s 0.528 (0.555 with ``analyzer="lucene"``, whose top 10
  agrees with Lucene's 0.994), tantivy 0.530.

How ``engine="auto"`` picks (``engine_choice``; ``choose_engine`` gives the name and logs a switch):

1. Speed. With numba: bm25s at every size, scored by numba from ``NUMBA_MIN_PASSAGES`` (20k) on and
   by scipy below (bit-identical; small corpora skip numba's load time). Without numba: bm25s up to
   ``SCIPY_MAX_PASSAGES`` (50k), tantivy above (tantivy answers single queries faster at every size
   and batches faster from between 10k and 100k on; the 50k cut is from an earlier run under load,
   which put the crossing between 30k and 100k).
2. Memory. The build's peak on top of the passages already in memory is estimated from the quiet
   cells (``BUILD_MEMORY``: a least-squares line over 10k/100k/1M, 5.1 KB per passage for bm25s
   with Lucene's analysis (the default), 4.6 KB with snowball's, 1.2 KB for tantivy) and must fit in ``BUILD_MEMORY_SHARE`` (80%)
   of the memory available now (``available_memory_bytes``: MemAvailable, capped by the cgroup
   limit). When the pick of step 1 does not fit: Lucene (``open_retriever`` builds the ``lucene``
   kind) when pyserini, pyjnius and Java are installed, else tantivy if it fits (not for an explicit
   ``analyzer="lucene"``, which tantivy cannot do), else a ``MemoryError`` that names the options.
   On the 24 GB machine of the benchmark (~22.6 GB available before the corpus is read, ~1 KB per
   loaded passage) bm25s fits up to ~3.0M passages (~3.3M with ``analyzer="snowball"``), tantivy up
   to ~9M (measured at 5M: it ties Lucene's speed there); wiki-18's 21M go to Lucene.

An explicit ``engine="bm25s"`` or ``"tantivy"`` is always built as asked. A choice other than bm25s
is logged in one line with its reason (logger ``capo_envs.retrieval.bm25``).

Both engines break score ties by corpus position (lower first) and only return passages that share
at least one term with the query, so a query can get fewer than ``k`` hits, or none.
"""

from __future__ import annotations

import json
import logging
import os
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
# What building an index adds to a process that already holds the passages, as (fixed bytes, bytes
# per passage): least-squares lines through build_peak_rss_mb - build_rss_passages_mb of the quiet
# 10k/100k/1M cells in docs/results/retrieval_scale.jsonl (tests/test_bm25_engine_choice.py refits
# them). Generated Wikipedia-like passages (~100 words); longer passages need more.
BUILD_MEMORY = {
    ("bm25s", "snowball"): (148_000_000, 4_627),  # 1M: 5,558 MB peak, 1,005 MB of it the passages
    ("bm25s", "lucene"): (148_000_000, 5_101),  # 1M: 6,011 MB (the requantising pass)
    ("tantivy", "snowball"): (123_000_000, 1_184),  # 1M: 2,252 MB (512 MB writer heap included)
}
# "auto" plans a build to use at most this share of the available memory: the estimate is from one
# corpus, and the rest of the process (env workers, the trainer) keeps allocating.
BUILD_MEMORY_SHARE = 0.8
logger = logging.getLogger(__name__)
_FORMAT = "capo-bm25/1"
# Lucene's default BM25 constants (tantivy's are fixed to these), so the two engines rank alike.
_K1, _B = 1.2, 0.75
_WORD = re.compile(r"\w+")
ANALYZERS = ("snowball", "lucene")
DEFAULT_ANALYZER = "lucene"  # bm25s's default: Lucene's ranking (top-10 overlap 0.99 with pyserini)
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
    """``snowball``: bm25s's English stopwords, Snowball English stems, k1 1.2, b 0.75 (the default
    before 2026-12; tantivy's own analysis is close to it). ``lucene`` (the default): what pyserini's
    default ``SimpleSearcher`` (this package's ``lucene`` retriever)
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


def build_memory_bytes(engine: str, n_passages: int, analyzer: str = DEFAULT_ANALYZER) -> int:
    """Estimated peak memory that building ``engine`` over ``n_passages`` adds to a process that
    already holds the passages (``BUILD_MEMORY``)."""
    fixed, per_passage = BUILD_MEMORY[(engine, analysis(analyzer).name if engine == "bm25s" else "snowball")]
    return int(fixed + per_passage * max(0, int(n_passages)))


def _cgroup_free_bytes() -> int | None:
    """What this process's memory cgroup (v2, or v1) still allows, counting reclaimable page cache as
    free; None without a limit. Only the process's own cgroup is read, not its ancestors."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2
            names, root = ("memory.max", "memory.current", "inactive_file"), Path("/sys/fs/cgroup")
        elif "memory" in controllers.split(","):  # v1
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            root = Path("/sys/fs/cgroup/memory")
        else:
            continue
        # inside a container's cgroup namespace the listed path may not exist: its root is the limit
        for folder in (root / rel.lstrip("/"), root):
            try:
                limit = (folder / names[0]).read_text().strip()
                used = int((folder / names[1]).read_text())
                stat = dict(l.split() for l in (folder / "memory.stat").read_text().splitlines() if l.count(" ") == 1)
            except (OSError, ValueError):
                continue
            if limit == "max" or int(limit) >= 2**60:  # no limit (v1 writes a huge number)
                break
            return max(0, int(limit) - used + int(stat.get(names[2], 0)))
    return None


def available_memory_bytes() -> int | None:
    """Memory a build may take now: Linux's MemAvailable (free + reclaimable), capped by the cgroup
    limit; elsewhere the free pages from ``os.sysconf``; None when neither can be read."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    cgroup = _cgroup_free_bytes()
    return free if cgroup is None else min(free, cgroup)


def lucene_unavailable() -> str | None:
    """Why the ``lucene`` retriever cannot be built here (pyserini's Anserini jar, pyjnius, a Java
    runtime: what ``capo_envs.retrieval.lucene`` needs), or None when it can. Starts no JVM."""
    import importlib.util

    from .lucene import anserini_jar, java_home

    try:
        anserini_jar()
        home = java_home()
    except (ImportError, RuntimeError) as e:
        return str(e)
    if importlib.util.find_spec("jnius_config") is None:  # not jnius itself: importing it starts the JVM
        return "the lucene retriever needs pyjnius"
    if not (home / "bin" / "java").exists() and shutil.which("java") is None:
        return f"no java executable in {home}/bin or on PATH"
    return None


@dataclass(frozen=True)
class EngineChoice:
    """What ``engine="auto"`` builds and why; ``reason`` is empty for the plain default."""

    engine: str  # "bm25s", "tantivy" or "lucene" (the lucene retriever kind; open_retriever builds it)
    reason: str = ""


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def engine_choice(
    n_passages: int,
    kernel: str = "auto",
    memory_bytes: int | None = None,
    *,
    analyzer: str | None = None,
    lucene: bool | None = None,
) -> EngineChoice:
    """The engine ``engine="auto"`` builds for ``n_passages`` (rule and figures: module docstring).

    ``memory_bytes``: memory free for the build, the passages already loaded (None: what
    ``available_memory_bytes`` reads now; no memory check if it cannot be read). ``lucene``: whether
    Lucene may be chosen (None: if ``lucene_unavailable`` finds it installed, asked only when the
    first pick does not fit; ``BM25Retriever.build`` passes False, as it builds only the Java-free
    engines). ``analyzer`` None: each engine's own default (bm25s: ``DEFAULT_ANALYZER``); an explicit
    one other than ``snowball`` rules tantivy out. Raises ``MemoryError`` when nothing fits.
    """
    spec = analysis(analyzer or DEFAULT_ANALYZER)  # what bm25s would build
    tantivy_can = analyzer is None or spec.name == "snowball"  # tantivy's analysis is fixed, snowball-like
    if not tantivy_can:
        fast = "bm25s"
    elif resolve_kernel(kernel, n_passages) == "numba" or n_passages <= SCIPY_MAX_PASSAGES:
        fast = "bm25s"
    else:
        fast = "tantivy"
    speed = "" if fast == "bm25s" else f"no numba kernel, {n_passages:,} > {SCIPY_MAX_PASSAGES:,} passages: tantivy is faster"
    if memory_bytes is None:
        memory_bytes = available_memory_bytes()
    if memory_bytes is None:
        return EngineChoice(fast, speed)
    budget = BUILD_MEMORY_SHARE * memory_bytes
    estimate = {engine: build_memory_bytes(engine, n_passages, spec.name) for engine in ENGINES}
    if estimate[fast] <= budget:
        return EngineChoice(fast, speed)
    need = f"{fast}'s build needs ~{_gb(estimate[fast])} for {n_passages:,} passages"
    have = f"{_gb(budget)} usable ({BUILD_MEMORY_SHARE:.0%} of {_gb(memory_bytes)} available)"
    if lucene is False:
        why_not_lucene = "not tried: BM25Retriever.build makes only bm25s or tantivy; open_retriever(\"bm25\") " \
            "switches to Lucene when it is installed"
    else:
        why_not_lucene = None if lucene else lucene_unavailable()
    if why_not_lucene is None:
        return EngineChoice("lucene", f"{need}, {have}: Lucene (pyserini) builds with ~1 GB and serves from disk")
    tantivy_can = tantivy_can and fast != "tantivy"
    if tantivy_can and estimate["tantivy"] <= budget:
        return EngineChoice("tantivy", f"{need}, {have}: tantivy's needs ~{_gb(estimate['tantivy'])}")
    also = f" (tantivy's ~{_gb(estimate['tantivy'])})" if tantivy_can else ""
    raise MemoryError(
        f"BM25 over {n_passages:,} passages will not fit in memory: {need}{also}, {have}. Options: "
        f"retriever=\"lucene\" (pyserini + Java; builds with ~1 GB, serves from disk; here: {why_not_lucene}); "
        "a retrieval server on a machine with more memory (`capo serve-retriever`, then "
        "retriever=\"http://host:port/retrieve\"); more memory; or an explicit engine=\"bm25s\"/\"tantivy\" to build anyway."
    )


def choose_engine(
    n_passages: int,
    kernel: str = "auto",
    memory_bytes: int | None = None,
    *,
    analyzer: str | None = None,
    lucene: bool | None = None,
) -> str:
    """The name of the engine ``engine="auto"`` builds (``engine_choice(...).engine``), logging one line
    with the reason when it is not bm25s."""
    choice = engine_choice(n_passages, kernel, memory_bytes, analyzer=analyzer, lucene=lucene)
    if choice.engine != DEFAULT_ENGINE:
        logger.warning("BM25 engine %s for %d passages: %s", choice.engine, n_passages, choice.reason)
    return choice.engine


def _engine_class(engine: str):
    if engine not in _ENGINE_CLASSES:
        raise ValueError(f"unknown BM25 engine {engine!r}; choose one of {('auto',) + ENGINES}")
    return _ENGINE_CLASSES[engine]


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
        analyzer: str | None = None,
        memory_bytes: int | None = None,
    ) -> "BM25Retriever":
        """``engine="auto"`` picks by corpus size and the memory free now, or ``memory_bytes``
        (``choose_engine``; never Lucene here: ``open_retriever("bm25")`` hands over to it, this
        raises ``MemoryError`` instead when neither Java-free engine fits); ``kernel`` and
        ``analyzer`` (``analysis``; None: ``DEFAULT_ANALYZER``, ``"lucene"``, which ranks as pyserini
        does) are bm25s's (tantivy has its own, snowball-like analysis); ``threads`` is
        used for indexing (tantivy; None: its own default, one per core) and for searching batches
        (None: 1)."""
        passages = list(passages)
        spec = analysis(analyzer or DEFAULT_ANALYZER)
        if engine != "auto":
            _engine_class(engine)  # an unknown name fails before anything else
        if not passages:
            raise ValueError("cannot build a BM25 index over zero passages")
        if engine == "auto":
            engine = choose_engine(len(passages), kernel, memory_bytes, analyzer=analyzer, lucene=False)
        engine_cls = _engine_class(engine)
        texts = [_passage_text(p) for p in passages]
        if engine_cls is _TantivyEngine:
            if analyzer is not None and spec.name != "snowball":
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
        # bm25s indexes saved before the analyzer was recorded were all built with snowball
        options = {"analyzer": meta.get("analyzer", "snowball")} if meta["engine"] == "bm25s" else {}
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
