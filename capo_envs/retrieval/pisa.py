"""BM25 through PISA (C++, block-max dynamic pruning; https://github.com/pisa-engine/pisa), ranked as Lucene
ranks: the ``pisa`` BM25 library.

Optional: needs the ``_pisathon`` extension of the ``pyterrier-pisa`` wheel (manylinux, x86-64) and the TBB
2020 runtime it links to. PyTerrier itself is not needed and never imported::

    pip install "capo-gym[bm25-pisa]" && pip install --no-deps pyterrier-pisa==0.4.9

How it ranks as Lucene (Anserini's defaults, what the ``lucene`` retriever and bm25s's ``analyzer="lucene"``
do): the text is analysed here, not by PISA (``\\w+`` words, lowercased, Lucene's 33 stopwords dropped,
Porter stems), and each (term, passage) posting stores Lucene's own BM25 score for it, computed at build
time (idf ``log(1 + (N - df + 0.5) / (df + 0.5))``, k1 0.9, b 0.4, document lengths rounded as Lucene's
one-byte norms) and rounded to an integer of ``impact_bits`` bits. PISA then serves with its "quantized"
scorer, which adds up the stored integers (times the count of a repeated query word, as Lucene does), so
the exact, pruned top k of PISA is Lucene's top k up to that rounding. PISA's own BM25 scorer is not used:
its idf (``log((N - df + 0.5) / (df + 0.5))``, floored near 0 for terms in over half the passages) and its
exact lengths rank differently from Lucene (docs/results/performance.md, section 4a, measures both).
Ties fall in corpus order (PISA keeps the lower document id at equal score).

The build streams its passages (a 21M-passage corpus is never held in memory): batches of
``batch_size`` passages are tokenised into (term, passage, tf) triples kept on disk; once the corpus
statistics are known, each batch becomes a PISA posting batch of impacts, PISA merges them, and
builds its block-max metadata and the compressed index. Passages live beside it
(``passage_store.py``). Layout of a saved index::

    meta.json        {"retriever": "pisa", "format": ..., "num_passages", "impact_scale", ...}
    passages.jsonl   offsets.npy        the passages (PassageStore)
    pisa/            fwd.termlex, fwd.doclex, quantized.q0.bmw.<block>, quantized.q0.bmw.<block>.<encoding>
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from array import array
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .base import Hit, Passage, check_search_args
from .bm25_libraries import _WORD, analysis, lucene_length, stopwords_for
from .index_files import atomic_directory
from .passage_store import PassageStore, PassageWriter, StoredPassagesRetriever

INSTALL_HINT = 'pip install "capo-gym[bm25-pisa]" && pip install --no-deps pyterrier-pisa==0.4.9'
FORMAT = "capo-pisa/1"
ENCODING = "block_simdbp"  # SIMD binary packing, pyterrier-pisa's default
BLOCK_SIZE = 64  # postings per block of block-max metadata
ALGORITHMS = ("maxscore", "block_max_maxscore", "block_max_wand", "wand")
# MaxScore: 1.08 ms of CPU a query at 1M passages against 1.32 (block-max MaxScore), 2.05 (WAND) and 2.23
# (block-max WAND) on the scale benchmark's NQ-like queries (docs/results/performance.md, section 4d)
DEFAULT_ALGORITHM = "maxscore"
DEFAULT_IMPACT_BITS = 16
BATCH_SIZE = 200_000  # passages tokenised per on-disk batch: bounds the build's memory


def _load_pisathon():
    """``pyterrier_pisa._pisathon`` loaded from its file: importing it as a submodule would run
    ``pyterrier_pisa/__init__.py``, which needs PyTerrier (pandas, ir_datasets, ...)."""
    spec = importlib.util.find_spec("pyterrier_pisa")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the pisa BM25 library needs pyterrier-pisa: {INSTALL_HINT}")
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("_pisathon*.so"))
    if not found:
        raise ImportError(f"no _pisathon extension in {folder}: {INSTALL_HINT}")
    loader = importlib.machinery.ExtensionFileLoader("pyterrier_pisa._pisathon", str(found[0]))
    module_spec = importlib.util.spec_from_file_location("pyterrier_pisa._pisathon", found[0], loader=loader)
    module = importlib.util.module_from_spec(module_spec)
    try:
        loader.exec_module(module)
    except ImportError as e:  # libtbb.so.2 comes from the tbb wheel
        raise ImportError(f"pyterrier-pisa's extension does not load ({e}): {INSTALL_HINT}") from None
    return module


_PISATHON = None


def pisathon():
    global _PISATHON
    if _PISATHON is None:
        _PISATHON = _load_pisathon()
    return _PISATHON


def pisa_unavailable() -> str | None:
    """Why the pisa library cannot be used here, or None. Loads the extension (no side effects)."""
    try:
        pisathon()
    except ImportError as e:
        return str(e)
    return None


class _Terms:
    """Words to term ids for one analysis, each distinct word analysed once: a corpus repeats its words."""

    def __init__(self, analyzer: str = "lucene"):
        import Stemmer

        self.spec = analysis(analyzer)
        self._stem = Stemmer.Stemmer(self.spec.stemmer).stemWord
        self._stop = stopwords_for(self.spec.name)
        self._of_word: dict[str, int] = {}
        self._of_stem: dict[str, int] = {}
        self.names: list[str] = []  # term id -> stem, in order of first sight

    def _new(self, word: str) -> int:
        if word in self._stop:
            return -1
        stem = self._stem(word)
        term = self._of_stem.get(stem)
        if term is None:
            term = self._of_stem[stem] = len(self.names)
            self.names.append(stem)
        return term

    def add_text(self, text: str, out: array) -> int:
        """Append the term ids of ``text`` to ``out``; return how many (Lucene's document length)."""
        of_word, before = self._of_word, len(out)
        for word in _WORD.findall(text.lower()):
            term = of_word.get(word)
            if term is None:
                term = of_word[word] = self._new(word)
            if term >= 0:
                out.append(term)
        return len(out) - before


def _write_batch(folder: Path, batch: int, n_terms: int, terms: np.ndarray, docs: np.ndarray, impacts: np.ndarray,
                 first_doc: int, lengths: np.ndarray) -> None:
    """One PISA posting batch (``inv.batch.<i>.{docs,freqs,sizes}``): for every term id in order, its
    posting count then its documents (global ids) / impacts; ``terms`` sorted, documents sorted within."""
    counts = np.bincount(terms, minlength=n_terms).astype(np.uint32)
    starts = np.zeros(n_terms, dtype=np.int64)
    np.cumsum(counts[:-1] + 1, out=starts[1:])
    slot = np.arange(len(terms), dtype=np.int64) + terms.astype(np.int64) + 1  # past each term's count
    for suffix, values, header in (("docs", docs + first_doc, [1, len(lengths)]), ("freqs", impacts, [])):
        out = np.empty(n_terms + len(terms), dtype=np.uint32)
        out[starts] = counts
        out[slot] = values
        with open(folder / f"inv.batch.{batch}.{suffix}", "wb") as f:
            f.write(np.asarray(header, dtype=np.uint32).tobytes())
            f.write(out.tobytes())
    with open(folder / f"inv.batch.{batch}.sizes", "wb") as f:
        f.write(np.concatenate([[len(lengths)], lengths]).astype(np.uint32).tobytes())


def _build_pisa_files(passages: Iterable[Passage], out: Path, store: PassageWriter, impact_bits: int,
                      batch_size: int) -> dict:
    """Write the passages to ``store`` and PISA's uncompressed collection and lexicons into ``out``."""
    terms = _Terms("lucene")
    spec = terms.spec
    work = Path(tempfile.mkdtemp(prefix="tokens-", dir=out))
    lengths: list[np.ndarray] = []
    df = np.zeros(0, dtype=np.int64)
    batches = 0

    def flush(tokens: array, batch_lengths: array) -> None:
        nonlocal df, batches
        n = len(batch_lengths)
        lens = np.frombuffer(batch_lengths, dtype=np.int32).astype(np.uint32)
        term = np.frombuffer(tokens, dtype=np.int32).astype(np.int64)
        local = np.repeat(np.arange(n, dtype=np.int64), lens)
        keys, tf = np.unique(term * n + local, return_counts=True)  # sorted by term, then passage
        np.save(work / f"{batches}.npy", np.stack([keys // n, keys % n, np.minimum(tf, 2**31)]).astype(np.uint32))
        grown = np.bincount(keys // n, minlength=len(terms.names))
        grown[: len(df)] += df
        df = grown
        lengths.append(lens)
        batches += 1

    tokens, batch_lengths = array("i"), array("i")
    for p in passages:
        store.add(p)
        batch_lengths.append(terms.add_text(f"{p.title}\n{p.text}" if p.title else p.text, tokens))
        if len(batch_lengths) == batch_size:
            flush(tokens, batch_lengths)
            tokens, batch_lengths = array("i"), array("i")
    if len(batch_lengths) or not batches:
        flush(tokens, batch_lengths)
    df = np.pad(df, (0, len(terms.names) - len(df)))
    length = np.concatenate(lengths)
    n_passages, n_terms = len(length), len(terms.names)
    if n_terms == 0:
        shutil.rmtree(work, ignore_errors=True)
        raise ValueError(f"cannot build a BM25 index over {n_passages} passages without a single indexable word")
    # Lucene's collection statistics count only the passages that have a term in the field
    doc_count = int((length > 0).sum())
    avgdl = float(length.sum()) / max(doc_count, 1)
    idf = np.log(1 + (doc_count - df + 0.5) / (df + 0.5))
    norm = spec.k1 * (1 - spec.b + spec.b * lucene_length(length) / max(avgdl, 1e-9))
    scale = (2**impact_bits - 1) / max(float(idf.max(initial=0.0)), 1e-9)  # a tf/(tf + norm) factor is below 1
    order = sorted(range(n_terms), key=terms.names.__getitem__)  # PISA looks terms up by binary search
    rank = np.empty(n_terms, dtype=np.int64)
    rank[order] = np.arange(n_terms)
    first = 0
    for b in range(batches):
        term, local, tf = np.load(work / f"{b}.npy").astype(np.int64)
        (work / f"{b}.npy").unlink()
        score = idf[term] * tf / (tf + norm[first + local])
        impact = np.maximum(np.rint(score * scale), 1).astype(np.uint32)  # 0 would not be a posting
        new = rank[term]
        sort = np.argsort(new, kind="stable")  # passages stay sorted within a term
        _write_batch(out, b, n_terms, new[sort], local[sort], impact[sort], first, lengths[b])
        first += len(lengths[b])
    shutil.rmtree(work, ignore_errors=True)
    lib = pisathon()
    lib.merge_inv(str(out / "inv"), batches, n_terms)
    for b in range(batches):
        for suffix in ("docs", "freqs", "sizes"):
            (out / f"inv.batch.{b}.{suffix}").unlink()
    (out / "fwd.terms").write_text("".join(terms.names[i] + "\n" for i in order), encoding="utf-8")
    with open(out / "fwd.documents", "w") as f:
        for start in range(0, n_passages, 1_000_000):
            f.write("".join(f"{i}\n" for i in range(start, min(start + 1_000_000, n_passages))))
    lib.build_binlex(str(out / "fwd.terms"), str(out / "fwd.termlex"))
    lib.build_binlex(str(out / "fwd.documents"), str(out / "fwd.doclex"))
    return {"num_passages": n_passages, "num_terms": n_terms, "postings": int(df.sum()), "doc_count": doc_count,
            "avgdl": avgdl, "impact_bits": impact_bits, "impact_scale": scale, "k1": spec.k1, "b": spec.b}


@contextmanager
def _native_output(show: bool) -> Iterator[None]:
    """PISA's build logs and draws progress bars on the process's stdout and stderr from C++: sent to
    /dev/null unless ``show`` (a server or env worker may speak a protocol on its stdout)."""
    if show:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def _prepare(folder: Path):
    """PISA's retrieval context over ``folder``; builds the block-max data and compressed index if absent."""
    lib = pisathon()
    context = lib.RetrievalContext()
    lib.prepare_index(context, str(folder), ENCODING, "quantized", "", block_size=BLOCK_SIZE, quantize=0)
    return context


class PisaRetriever(StoredPassagesRetriever):
    """BM25 served by PISA with Lucene's ranking; see the module docstring. ``threads``: threads one
    batch of queries is spread over; ``algorithm``: PISA's query processing (``ALGORITHMS``; all give
    the same top k)."""

    def __init__(self, index_dir: str | Path, *, threads: int = 1, algorithm: str = DEFAULT_ALGORITHM,
                 _owned_tmpdir: Path | None = None):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown PISA algorithm {algorithm!r}; choose one of {ALGORITHMS}")
        self.index_dir = Path(index_dir)
        meta_path = self.index_dir / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        if meta.get("retriever") != "pisa" or meta.get("format") != FORMAT:
            raise ValueError(f"{self.index_dir} is not a pisa index (meta.json: {meta.get('retriever')!r}, {meta.get('format')!r})")
        self.meta = meta
        self.num_passages = int(meta["num_passages"])
        self.threads = max(1, int(threads))
        self.algorithm = algorithm
        self._owned_tmpdir = _owned_tmpdir  # a fresh build lives in a temp dir until saved
        import Stemmer

        spec = analysis("lucene")
        self._stem_words = Stemmer.Stemmer(spec.stemmer).stemWords
        self._stop = stopwords_for(spec.name)
        self._scale = float(meta["impact_scale"])
        self._store = PassageStore(self.index_dir)
        self._context = _prepare(self.index_dir / "pisa")
        self._closed = False

    library = "pisa"
    analyzer = "lucene"

    @classmethod
    def build(cls, passages: Iterable[Passage], *, threads: int = 1, show_progress: bool = False,
              impact_bits: int = DEFAULT_IMPACT_BITS, batch_size: int = BATCH_SIZE,
              algorithm: str = DEFAULT_ALGORITHM) -> "PisaRetriever":
        """Index ``passages`` (any iterable, streamed) into a temp dir, removed on ``close`` unless
        ``save``d elsewhere first. ``impact_bits``: precision of the stored scores (8 to 24; 24 keeps a
        sum of a few terms exact in PISA's float32)."""
        if not 8 <= impact_bits <= 24:
            raise ValueError(f"impact_bits must be in 8..24, got {impact_bits}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown PISA algorithm {algorithm!r}; choose one of {ALGORITHMS}")
        pisathon()  # fail before writing anything
        tmp = Path(tempfile.mkdtemp(prefix="capo-pisa-"))
        try:
            index_dir = tmp / "index"
            (index_dir / "pisa").mkdir(parents=True)
            with PassageWriter(index_dir) as store, _native_output(show_progress):
                stats = _build_pisa_files(passages, index_dir / "pisa", store, impact_bits, max(1, int(batch_size)))
                _prepare(index_dir / "pisa")  # block-max data and the compressed index
            for name in ("inv.docs", "inv.freqs", "inv.sizes", "fwd.terms", "fwd.documents"):
                (index_dir / "pisa" / name).unlink(missing_ok=True)  # only needed to build those
            meta = {"retriever": "pisa", "format": FORMAT, "encoding": ENCODING, "block_size": BLOCK_SIZE, **stats}
            (index_dir / "meta.json").write_text(json.dumps(meta) + "\n")
            return cls(index_dir, threads=threads, algorithm=algorithm, _owned_tmpdir=tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, index_dir: str | Path, *, threads: int = 1, algorithm: str = DEFAULT_ALGORITHM) -> "PisaRetriever":
        return cls(index_dir, threads=threads, algorithm=algorithm)

    def save(self, index_dir: str | Path) -> None:
        """Copy the index to ``index_dir`` (staged beside it, then renamed into place)."""
        if Path(index_dir).resolve() == self.index_dir.resolve():
            return
        with atomic_directory(index_dir) as tmp:
            shutil.copytree(self.index_dir, tmp, dirs_exist_ok=True)

    def _query_terms(self, query: str) -> dict[str, float]:
        # not through _Terms: a server's queries would grow its caches without end
        words = [w for w in _WORD.findall(query.lower()) if w not in self._stop]
        counts: dict[str, float] = {}
        for stem in self._stem_words(words):  # terms the index lacks are skipped by PISA
            counts[stem] = counts.get(stem, 0.0) + 1.0  # a repeated query word counts again, as in Lucene
        return counts

    def search_positions(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """(corpus position, BM25 score) pairs, best first, for each query."""
        if self._closed:
            raise RuntimeError("search on a closed PisaRetriever")
        n = len(queries)
        if n == 0:
            return []
        qidx = np.empty(n * k, dtype=np.int32)
        docnos = np.empty(n * k, dtype=object)
        ranks = np.empty(n * k, dtype=np.int32)
        scores = np.empty(n * k, dtype=np.float32)
        size = pisathon().retrieve(
            self._context, self.algorithm, [(i, self._query_terms(q)) for i, q in enumerate(queries)], k=k,
            threads=self.threads if n >= 2 * self.threads else 1, pretokenised=1, query_weighted=1,
            result_qidxs=qidx, result_docnos=docnos, result_ranks=ranks, result_scores=scores,
        )
        out: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        # threads write their queries' results in the order they finish; ranks say the order within one
        for i in np.lexsort((ranks[:size], qidx[:size])):
            out[qidx[i]].append((int(docnos[i]), float(scores[i]) / self._scale))
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        return self.hits(self.search_positions(list(queries), k))

    def _release(self) -> None:
        self._context = None  # frees PISA's memory maps
