"""BM25 libraries at growing corpus sizes, each in its own process: cost per size, a fitted curve, 21M.

    python benchmarks/bench_retrieval_scale.py --sizes 10000,100000 --threads 1,2
    python benchmarks/bench_retrieval_scale.py --sizes 1000000,5000000 --work-dir /big/disk/scale

For every (library, size) cell: build time (``--build-threads``), index size on disk, peak RSS of the
build, RSS of a fresh process serving the saved index, single-query latency (p50, p99, k=10),
batched throughput at each ``--threads`` count, recall@5 against the gold passage and top-10 overlap
with Lucene. Timings are taken on the wall clock and, for robustness on a shared machine, also in
CPU time of the serving process (all its threads, a JVM's included): ``*_cpu_*`` keys. On a quiet
machine the two agree for one thread; under load only the CPU figures stay comparable. Each cell's build and serve run in separate child processes (``worker`` subcommand),
so memory is measured on a clean process. Results are appended to ``results.jsonl`` in the work dir;
a rerun skips the cells already there (``--force`` redoes them), so a long run can be resumed.
At the end ``retrieval_scale_plot.py`` fits cost-vs-size per library (log-log), extrapolates to
21M passages, prints the side-by-side ratios and draws the plot.

Libraries (each skipped with a note when it does not import here):
  bm25s-numba      this package's bm25s index scored by its numba kernel (``kernel="numba"``)
  bm25s-lucene     the same with ``analyzer="lucene"`` (pyserini's analysis, k1/b and length norms)
  bm25s-scipy      the same index scored by a scipy sparse product (``kernel="scipy"``)
  bm25s-lib-numba  the same index scored by bm25s's own ``retrieve`` with its numba backend
  bm25s-lib-numpy  bm25s's own ``retrieve`` with its numpy backend (dense scores per query)
  tantivy          tantivy (Rust, block-max WAND) through this package's ``library="tantivy"``
  lucene           Lucene 9 via pyserini 0.22.1 / Anserini (JDK 17): ``LuceneRetriever``
  pisa             PISA (C++, MaxScore, the library's default) through pyterrier-pisa's extension, with
                   Lucene's BM25 scores stored as 16-bit impacts: ``PisaRetriever`` (``library="pisa"``)
  pisa-bmm         the same index queried with block-max MaxScore
  pisa-bmw         the same index queried with block-max WAND
  pisa-8bit        the same with 8-bit impacts (PISA's usual quantisation)
  pisa-native      PISA as pyterrier-pisa indexes and scores by default: its own tokeniser, Porter2 stems,
                   Lucene's stopwords at query time, PISA's BM25 (k1 0.9, b 0.4): why ``pisa`` stores
                   Lucene's scores instead (its top-10 overlap with Lucene)

Thread counts are set explicitly: ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``
and ``NUMBA_NUM_THREADS`` are exported to the children (the last as the largest ``--threads``), and
each library is told its thread count (numba lanes, tantivy searcher threads, Lucene's
``batch_search`` threads). The scipy kernel and the bm25s numpy backend are single-threaded.

The corpus (the same for every library, written once per size under the work dir) is generated
deterministically, with a gold passage per query. What is matched to the real sample (``shared/data/wiki_passages/sample_data.jsonl``: 1,000 wiki-18
passages, FlashRAG's quick-start corpus, each exactly 100 words after its title):

* **length**: each passage's token count is drawn from the sample's own counts (``\\w+`` tokens of the
  100-word text), each title's from the sample's titles;
* **vocabulary**: the sample's word frequencies are the head of the unigram distribution (its words
  seen at least ``HEAD_MIN_COUNT`` times, in rank order); the rest of the sample's mass (the words it
  saw once or twice) is spread over a Zipf tail of ranks up to ``VOCAB_SIZE``, whose exponent is
  solved so that the tail continues the head's last frequency and carries exactly that mass. The
  tail's first ranks are the sample's rarer real words, then pronounceable pseudo-words. (Large
  English corpora show this shape: a kernel lexicon with Zipf exponent ~1, then a steeper tail.)
* **burstiness**: passages come in articles (geometric, mean ``PASSAGES_PER_ARTICLE``: our estimate of wiki-18's
  21M passages over the roughly 6M articles of the 2018 English Wikipedia); each article has ``TOPIC_WORDS`` topic words, drawn from the
  content part of the distribution (rank >= ``CONTENT_RANK``), which make up ``TOPIC_SHARE`` of its
  passages' tokens, and its title is its first topic words.

Queries look like Natural Questions (``shared/data/wiki_passages/nq``: 9 words on average): a
question word, one or two common words, one topic word of the gold passage's article, one or two
content words of the gold passage itself, and in 30% of queries an unrelated content word. Same-article passages
compete, so recall@5 is below 1, as with real questions.

The stream is generated in chunks of ``CHUNK`` passages, each seeded by (seed, chunk index): the
corpus of size n is the first n passages of the same stream for every n, and is identical on any
machine with the same numpy. Without the sample a built-in fallback profile (English function words
and a Zipf head of pseudo-words) is used, and the corpus metadata says so.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki_passages" / "sample_data.jsonl"
CHUNK = 10_000
VOCAB_SIZE = 2_000_000
HEAD_MIN_COUNT = 3
CONTENT_RANK = 300  # below this rank words are function words or very common ones
TOPIC_WORDS = 6
TOPIC_SHARE = 0.2
PASSAGES_PER_ARTICLE = 3.6
GUIDE_BUCKETS = 1 << 22  # slices of the guide table that replaces most binary searches (_guided_search)
RESUME_EVERY = 20  # chunks (200k passages) between write_corpus_files's checkpoints
GUIDE_MIN_DRAWS = 100_000  # smaller draws search directly: building the table costs ~0.5 s once
_WORD = re.compile(r"\w+")
_SYLLABLES = (
    "ka lo ver mi tra son del qua rin bel osh tek mar vin dra zul fen har po lis gar nu ith cor sel wyn "
    "bro tal ge fu an te bi ro sa du me ni ko za pe ul ix ry"
).split()
_QUESTION_WORDS = ("who", "what", "when", "where", "which", "how many", "what year", "who was")
_FALLBACK_HEAD = (
    "the of and in a to was is for on as by with that at he from his it an were which are this had be "
    "has also or first its their after one new two who but her she they been not have all other into "
    "when more most there later world during years would between used may city war some these made "
    "time can several national over school three under both then american film about season until"
).split()


@dataclass
class Profile:
    """The unigram distribution and the length distributions the generator draws from."""

    words: list[str]  # real words by rank (head first); ranks beyond are pseudo-words
    probs: np.ndarray  # float64, VOCAB_SIZE, sums to 1
    text_lengths: np.ndarray  # tokens per passage text, one entry per sample passage
    title_lengths: np.ndarray
    source: str
    tail_exponent: float
    info: dict = field(default_factory=dict)

    @property
    def cdf(self) -> np.ndarray:
        if "_cdf" not in self.info:
            self.info["_cdf"] = np.cumsum(self.probs)
        return self.info["_cdf"]


def _solve_tail(p_last: float, head_len: int, mass: float, vocab: int) -> tuple[np.ndarray, float]:
    """Zipf tail p(r) = p_last * (r / head_len) ** -s over ranks head_len+1..vocab with total ``mass``."""
    ranks = np.arange(head_len + 1, vocab + 1, dtype=np.float64) / head_len
    lo, hi = 0.5, 8.0
    for _ in range(80):  # the tail mass falls as s grows: bisect
        s = (lo + hi) / 2
        if p_last * np.sum(ranks**-s) > mass:
            lo = s
        else:
            hi = s
    tail = p_last * ranks**-s
    return tail * (mass / tail.sum()), s


def load_profile(sample: Path | None = SAMPLE, vocab_size: int = VOCAB_SIZE) -> Profile:
    """The profile of the real sample, or the built-in fallback when it is absent."""
    if sample is not None and Path(sample).is_file():
        counts: Counter = Counter()
        text_lengths, title_lengths = [], []
        for line in open(sample, encoding="utf-8"):
            record = json.loads(line)
            title, _, text = record["contents"].partition("\n")
            tokens = _WORD.findall(text.lower())
            counts.update(tokens)
            text_lengths.append(len(tokens))
            title_lengths.append(max(1, len(_WORD.findall(title))))
        ranked = [w for w, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))]
        freqs = np.array([counts[w] for w in ranked], dtype=np.float64) / sum(counts.values())
        head_len = sum(1 for w in ranked if counts[w] >= HEAD_MIN_COUNT)
        source = f"sample {Path(sample).name} ({len(text_lengths)} passages, {sum(counts.values())} tokens)"
        words = ranked
    else:
        words = list(_FALLBACK_HEAD)
        head_len = 5000
        freqs = np.arange(1, head_len + 1, dtype=np.float64) ** -1.0
        freqs *= 0.85 / freqs.sum()
        text_lengths, title_lengths = [110], [1, 2, 3, 3, 4]
        source = "built-in fallback (no sample found)"
    head = freqs[:head_len]
    tail, s = _solve_tail(head[-1], head_len, 1.0 - head.sum(), vocab_size)
    probs = np.concatenate([head, tail])
    return Profile(words, probs / probs.sum(), np.asarray(text_lengths), np.asarray(title_lengths), source, float(s),
                   {"head_words": head_len, "tail_mass": float(tail.sum()), "vocab_size": vocab_size})


def pseudo_word(rank: int) -> str:
    """A pronounceable, unique word for a rank (mixed-radix over syllables)."""
    n, parts = rank, []
    base = len(_SYLLABLES)
    while True:
        n, digit = divmod(n, base)
        parts.append(_SYLLABLES[digit])
        if n == 0:
            break
    return "".join(parts) + ("x" if len(parts) == 1 else "")


class CorpusGenerator:
    """The passage stream for one profile and seed; see the module docstring."""

    def __init__(self, profile: Profile, seed: int = 0):
        self.profile = profile
        self.seed = seed
        cdf = profile.cdf
        # topic words come from the content part of the distribution only
        self._content_cdf = (cdf[CONTENT_RANK:] - cdf[CONTENT_RANK - 1]) / (1.0 - cdf[CONTENT_RANK - 1])
        self._words: dict[int, str] = {}
        self._guides: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # each rank's JSON-escaped word followed by a space, appended as ranks first occur (chunk_lines)
        self._word_bytes = bytearray()
        self._word_start = np.zeros(len(cdf), dtype=np.int64)
        self._word_len = np.zeros(len(cdf), dtype=np.int64)  # 0: not yet in _word_bytes

    def word(self, rank: int) -> str:
        w = self._words.get(rank)
        if w is None:
            w = self.profile.words[rank] if rank < len(self.profile.words) else pseudo_word(rank)
            self._words[rank] = w
        return w

    def _draw(self, rng: np.random.Generator, cdf: np.ndarray, size, offset: int = 0) -> np.ndarray:
        u = rng.random(size)
        if u.size < GUIDE_MIN_DRAWS:
            idx = np.searchsorted(cdf, u * cdf[-1], side="right")
        else:
            idx = self._guided_search(cdf, u)
        return np.minimum(idx, len(cdf) - 1) + offset

    def _guided_search(self, cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``np.searchsorted(cdf, u * cdf[-1], side="right")``, the same integers, ~4x faster on big draws.

        A guide table over ``GUIDE_BUCKETS`` equal slices of u: u in [j/M, (j+1)/M) (exact, M a power of 2)
        gives u * cdf[-1] between the products at the slice's two ends (a product by a positive constant is
        monotone in floating point), so the answer lies between the searches of those two ends; where they
        agree (most draws: the head's words span many slices) it is known without a search, the rest are
        searched as before. The binary search of 2M ranks per token was most of the generation's time."""
        guide = self._guides.get(id(cdf))
        if guide is None:
            edges = np.arange(GUIDE_BUCKETS + 1, dtype=np.float64) / GUIDE_BUCKETS * cdf[-1]
            bound = np.searchsorted(cdf, edges, side="right")
            guide = self._guides[id(cdf)] = (bound[:-1], bound[1:])
        lo, hi = guide
        flat = u.reshape(-1)
        j = (flat * GUIDE_BUCKETS).astype(np.int64)
        idx, upper = lo[j], hi[j]
        open_ = np.flatnonzero(idx != upper)
        idx[open_] = np.searchsorted(cdf, flat[open_] * cdf[-1], side="right")
        return idx.reshape(u.shape)

    def _chunk_ranks(self, index: int):
        """Chunk ``index`` as ranks: every random draw of the chunk, in the order the stream has always made them."""
        rng = np.random.default_rng([self.seed, index])
        p = self.profile
        article_sizes, total = [], 0
        while total < CHUNK:  # one geometric draw at a time, as chunk() draws them
            article_sizes.append(int(rng.geometric(1.0 / PASSAGES_PER_ARTICLE)))
            total += article_sizes[-1]
        n_articles = len(article_sizes)
        article_of = np.repeat(np.arange(n_articles), article_sizes)[:CHUNK]
        topics = self._draw(rng, self._content_cdf, (n_articles, TOPIC_WORDS), CONTENT_RANK)
        title_lens = rng.choice(p.title_lengths, n_articles)
        lengths = rng.choice(p.text_lengths, CHUNK)
        starts = np.zeros(CHUNK + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        tokens = self._draw(rng, p.cdf, int(starts[-1]))
        topical = np.flatnonzero(rng.random(len(tokens)) < TOPIC_SHARE)
        pick = rng.integers(0, TOPIC_WORDS, len(tokens))
        # the passage of each topical token, found by search rather than a per-token repeat
        passage_of_topical = np.searchsorted(starts, topical, side="right") - 1
        tokens[topical] = topics[article_of[passage_of_topical], pick[topical]]
        return n_articles, article_of, topics, title_lens, starts, tokens

    def chunk_lines(self, index: int, first_id: int, count: int = CHUNK) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
        """The first ``count`` passages of chunk ``index`` as ``corpus.jsonl`` lines (ids from ``first_id``),
        byte for byte what ``json.dumps`` of ``chunk``'s titles and texts writes, with their token ranks
        (flat), token offsets per passage and topic ranks per passage.

        The texts are assembled in numpy from each word's escaped bytes instead of one Python string per
        token: this is what makes a 21M corpus take minutes, not hours."""
        n_articles, article_of, topics, title_lens, starts, tokens = self._chunk_ranks(index)
        new = np.unique(tokens[self._word_len[tokens] == 0])
        if new.size:
            for r in new.tolist():
                w = (json.dumps(self.word(r))[1:-1] + " ").encode("ascii")  # escaping is per character
                self._word_start[r], self._word_len[r] = len(self._word_bytes), len(w)
                self._word_bytes += w
        table = np.frombuffer(bytes(self._word_bytes), dtype=np.uint8)
        tokens = tokens[: starts[count]]
        sizes = self._word_len[tokens].astype(np.int32)  # int32 halves the big arrays: the table stays < 2 GB
        ends = np.cumsum(sizes, dtype=np.int64)
        # byte b of the texts is table[start of its token's word + b - the token's first byte]: a step per token
        steps = np.ones(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
        first_byte = ends - sizes
        word_start = self._word_start[tokens]
        steps[first_byte[1:]] = word_start[1:] - (word_start[:-1] + sizes[:-1] - 1)
        if len(steps):
            steps[0] = word_start[0]
        text = table[np.cumsum(steps, out=steps)].tobytes()
        byte_at = np.concatenate(([0], ends))[starts[: count + 1]].tolist()
        titles: dict[int, str] = {}
        parts = []
        for i, a in enumerate(article_of[:count].tolist()):
            title = titles.get(a)
            if title is None:
                title = titles[a] = json.dumps(" ".join(self.word(r) for r in topics[a, : title_lens[a]].tolist()).title())
            # the text's last word carries a space in the table: cut it
            parts.append(f'{{"id": "{first_id + i}", "title": {title}, "text": "'.encode("ascii"))
            parts.append(text[byte_at[i] : byte_at[i + 1] - 1])
            parts.append(b'"}\n')
        return b"".join(parts), tokens, starts[: count + 1], topics[article_of[:count]]

    def chunk(self, index: int) -> tuple[list[str], list[str], list[np.ndarray], np.ndarray]:
        """Chunk ``index``: titles, texts, token ranks per passage, topic-word ranks per passage. The string
        path, which ``chunk_lines`` reproduces byte for byte from the same draws."""
        n_articles, article_of, topics, title_lens, starts, tokens = self._chunk_ranks(index)
        unique, inverse = np.unique(tokens, return_inverse=True)
        strings = np.array([self.word(int(r)) for r in unique], dtype=object)[inverse]
        titles_by_article = [" ".join(self.word(int(r)) for r in topics[a, : title_lens[a]]).title() for a in range(n_articles)]
        titles = [titles_by_article[a] for a in article_of]
        texts = [" ".join(strings[starts[i] : starts[i + 1]]) for i in range(CHUNK)]
        per_passage = [tokens[starts[i] : starts[i + 1]] for i in range(CHUNK)]
        return titles, texts, per_passage, topics[article_of]

    def passages(self, n: int) -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
        """The first ``n`` passages: (title, text, token ranks, topic ranks)."""
        for c in range((n + CHUNK - 1) // CHUNK):
            titles, texts, tokens, topics = self.chunk(c)
            for i in range(min(CHUNK, n - c * CHUNK)):
                yield titles[i], texts[i], tokens[i], topics[i]

    def query(self, rng: np.random.Generator, tokens: np.ndarray, topics: np.ndarray) -> str:
        """A question about the passage with these token and topic ranks."""
        parts = [_QUESTION_WORDS[rng.integers(len(_QUESTION_WORDS))]]
        parts += [self.word(int(r)) for r in rng.integers(0, 60, rng.integers(1, 3))]
        topic_set = set(topics.tolist())
        present_topics = [t for t in topic_set if t in set(tokens.tolist())] or list(topic_set)
        parts.append(self.word(int(present_topics[rng.integers(len(present_topics))])))
        own = sorted({int(t) for t in tokens if t >= CONTENT_RANK and t not in topic_set})
        if own:
            parts += [self.word(own[i]) for i in rng.choice(len(own), min(int(rng.integers(1, 3)), len(own)), replace=False)]
        if rng.random() < 0.3:  # a word the passage does not have (a paraphrase, a wrong guess)
            parts.append(self.word(int(self._draw(rng, self._content_cdf, 1, CONTENT_RANK)[0])))
        order = [0] + list(1 + rng.permutation(len(parts) - 1))
        return " ".join(parts[i] for i in order)


def write_corpus_files(folder: Path, n: int, n_queries: int, seed: int = 0, sample: Path | None = SAMPLE) -> dict:
    """Write ``corpus.jsonl`` ({id, title, text}), ``queries.jsonl`` ({query, gold}) and ``meta.json``
    (written last: a folder with it is complete) into ``folder``; reuse them when already there.

    An interrupted run resumes: every ``RESUME_EVERY`` chunks the state so far (the corpus's length in
    bytes, the queries drawn, their generator's state, the counts for meta.json) goes to ``progress.json``,
    and a later call with the same arguments truncates the corpus there and goes on, writing the same bytes
    as an uninterrupted run. On a loaded machine a 21M corpus can take longer than one session."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if (meta["passages"], meta["seed"]) == (n, seed) and meta["queries"] == min(n_queries, n):
            return meta
    folder.mkdir(parents=True, exist_ok=True)
    profile = load_profile(sample)
    gen = CorpusGenerator(profile, seed)
    rng = np.random.default_rng([seed, 7, n])
    golds = rng.choice(n, min(n_queries, n), replace=False)
    gold_set = {int(g): i for i, g in enumerate(golds)}
    queries: list[str | None] = [None] * len(golds)
    q_rng = np.random.default_rng([seed, 11, n])
    vocab: set[int] = set()
    tokens_total, done_chunks, done_bytes = 0, 0, 0
    progress_path = folder / "progress.json"
    key = {"passages": n, "seed": seed, "queries": len(golds), "profile": profile.source}
    corpus_path = folder / "corpus.jsonl"
    if progress_path.is_file() and corpus_path.is_file():
        state = json.loads(progress_path.read_text())
        if state["key"] == key and corpus_path.stat().st_size >= state["bytes"]:
            done_chunks, done_bytes, tokens_total = state["chunks"], state["bytes"], state["tokens"]
            vocab, queries = set(state["vocab"]), state["query_texts"]
            q_rng.bit_generator.state = state["q_rng"]
    with open(corpus_path, "r+b" if done_bytes else "wb") as f:
        f.truncate(done_bytes)
        f.seek(done_bytes)
        n_chunks = (n + CHUNK - 1) // CHUNK
        for c in range(done_chunks, n_chunks):
            first = c * CHUNK
            lines, tokens, starts, topics = gen.chunk_lines(c, first, min(CHUNK, n - first))
            f.write(lines)
            tokens_total += len(tokens)
            for i in range((-first) % 97, len(starts) - 1, 97):  # a cheap estimate of vocabulary growth
                vocab.update(tokens[starts[i] : starts[i + 1]].tolist())
            # golds in passage order, as the stream always drew their queries from q_rng
            for pos in sorted(g for g in gold_set if first <= g < first + len(starts) - 1):
                i = pos - first
                queries[gold_set[pos]] = gen.query(q_rng, tokens[starts[i] : starts[i + 1]], topics[i])
            if (c + 1) % RESUME_EVERY == 0 and c + 1 < n_chunks:
                f.flush()
                os.fsync(f.fileno())  # the bytes the checkpoint counts are on disk before it is
                state = {"key": key, "chunks": c + 1, "bytes": f.tell(), "tokens": tokens_total, "vocab": sorted(vocab),
                         "query_texts": queries, "q_rng": q_rng.bit_generator.state}
                progress_path.with_suffix(".tmp").write_text(json.dumps(state))
                os.replace(progress_path.with_suffix(".tmp"), progress_path)
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as f:
        for q, g in zip(queries, golds):
            f.write(json.dumps({"query": q, "gold": str(int(g))}) + "\n")
    meta = {"passages": n, "queries": len(golds), "seed": seed, "profile": profile.source,
            "tail_exponent": round(profile.tail_exponent, 3), "tokens": tokens_total,
            "distinct_ranks_in_1_of_97_passages": len(vocab), **{k: v for k, v in profile.info.items() if not k.startswith("_")}}
    meta_path.write_text(json.dumps(meta, indent=1))
    progress_path.unlink(missing_ok=True)
    return meta


def read_queries(folder: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in open(Path(folder) / "queries.jsonl", encoding="utf-8")]
    return [r["query"] for r in rows], [r["gold"] for r in rows]


# ---------------------------------------------------------------------------------------------------
# Libraries, as the worker processes open them
# ---------------------------------------------------------------------------------------------------

LIBRARY_NAMES = ("bm25s-numba", "bm25s-lucene", "bm25s-scipy", "bm25s-lib-numba", "bm25s-lib-numpy", "tantivy", "lucene",
                 "pisa", "pisa-bmm", "pisa-bmw", "pisa-8bit", "pisa-native")
INDEX_OF = {"bm25s-numba": "bm25s", "bm25s-scipy": "bm25s", "bm25s-lib-numba": "bm25s", "bm25s-lib-numpy": "bm25s",
            "bm25s-lucene": "bm25s-lucene", "tantivy": "tantivy", "lucene": "lucene", "pisa": "pisa",
            "pisa-bmm": "pisa", "pisa-bmw": "pisa", "pisa-8bit": "pisa-8bit", "pisa-native": "pisa-native"}
# index kinds built from the corpus file as a stream, never held in memory (at 21M the passages alone would
# take ~21 GB); Lucene joined on 2026-12-03, so its build peaks before that held the passages (4a: 5,152 MB at 5M)
STREAMED = ("pisa", "pisa-8bit", "pisa-native", "lucene")
K = 10  # every library returns its top 10: recall@5 reads the first 5, the Lucene overlap all 10


def library_unavailable(name: str) -> str | None:
    """Why ``name`` cannot run here, or None."""
    try:
        if INDEX_OF[name].startswith("bm25s"):
            import bm25s  # noqa: F401
            import Stemmer  # noqa: F401
        if name in ("bm25s-numba", "bm25s-lucene", "bm25s-lib-numba"):
            import numba  # noqa: F401
        if name == "tantivy":
            import tantivy  # noqa: F401
        if name.startswith("pisa"):
            from capo_envs.retrieval.pisa import pisa_unavailable

            return pisa_unavailable()
        if name == "lucene":
            import importlib.util

            for module in ("pyserini", "jnius_config"):
                if importlib.util.find_spec(module) is None:
                    return f"{module} is not installed (pip install --no-deps pyserini==0.22.1 pyjnius)"
            from capo_envs.retrieval.lucene import anserini_jar, java_home

            java_home(), anserini_jar()
    except (ImportError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _build(kind: str, passages, threads: int):
    if kind == "pisa-native":
        return _PisaNative.build(passages, threads)
    if kind.startswith("pisa"):
        from capo_envs.retrieval.pisa import PisaRetriever

        return PisaRetriever.build(passages, threads=threads, impact_bits=8 if kind == "pisa-8bit" else 16)
    if kind == "lucene":
        from capo_envs.retrieval.lucene import LuceneRetriever

        return LuceneRetriever.build(passages, threads=threads)
    from capo_envs.retrieval.bm25 import BM25Retriever

    if kind == "bm25s-lucene":
        return BM25Retriever.build(passages, library="bm25s", kernel="scipy", threads=threads, analyzer="lucene")
    # bm25s-numba/-scipy measure the snowball analysis (the default until 2026-12); bm25s-lucene the default now
    return BM25Retriever.build(passages, library=kind, kernel="scipy", threads=threads,
                               analyzer="snowball" if kind == "bm25s" else None)


class _PisaNative:
    """PISA's own pipeline (pyterrier-pisa's defaults but k1/b and stopwords): its tokeniser and Porter2
    stemmer index the text, its BM25 scorer ranks; positions are the document names."""

    def __init__(self, folder: Path, threads: int = 1, owned: bool = False):
        from capo_envs.retrieval.bm25_libraries import LUCENE_STOPWORDS
        from capo_envs.retrieval.pisa import ENCODING, pisathon

        self._lib, self._folder, self._owned, self.threads = pisathon(), Path(folder), owned, threads
        (self._folder / "stopwords.txt").write_text("".join(w + "\n" for w in sorted(LUCENE_STOPWORDS)))
        self._context = self._lib.RetrievalContext()
        self._lib.prepare_index(self._context, str(self._folder), ENCODING, "bm25", "porter2", bm25_k1=0.9, bm25_b=0.4,
                                stop_fname=str(self._folder / "stopwords.txt"))

    @classmethod
    def build(cls, passages, threads: int) -> "_PisaNative":
        import tempfile

        from capo_envs.retrieval.pisa import pisathon

        folder = Path(tempfile.mkdtemp(prefix="pisa-native-"))
        with open(folder / "collection.txt", "w", encoding="utf-8") as f:
            for pos, p in enumerate(passages):
                f.write(f"{pos} " + f"{p.title} {p.text}".replace("\n", " ").replace("\r", " ") + "\n")
        pisathon().index(str(folder / "collection.txt"), str(folder), "porter2", 100_000, max(1, threads))
        (folder / "collection.txt").unlink()
        return cls(folder, threads, owned=True)

    @classmethod
    def load(cls, folder: Path, threads: int = 1) -> "_PisaNative":
        return cls(folder, threads)

    def save(self, index_dir: Path) -> None:
        import shutil

        shutil.copytree(self._folder, index_dir, ignore=shutil.ignore_patterns("inv.*", "fwd", "fwd.terms", "fwd.documents"))

    def search(self, queries: list[str], k: int) -> np.ndarray:
        n = len(queries)
        qidx, docnos = np.empty(n * k, dtype=np.int32), np.empty(n * k, dtype=object)
        ranks, scores = np.empty(n * k, dtype=np.int32), np.empty(n * k, dtype=np.float32)
        size = self._lib.retrieve(self._context, "block_max_wand", list(enumerate(queries)), k=k, threads=self.threads,
                                  pretokenised=0, query_weighted=0, result_qidxs=qidx, result_docnos=docnos,
                                  result_ranks=ranks, result_scores=scores)
        out = np.full((n, k), -1, dtype=np.int64)
        for i in range(size):
            out[qidx[i], ranks[i]] = int(docnos[i])
        return out

    def close(self) -> None:
        import shutil

        self._context = None
        if self._owned:
            shutil.rmtree(self._folder, ignore_errors=True)


class _Bm25sLibrary:
    """bm25s's own ``retrieve`` (numba or numpy backend) over this package's saved bm25s index,
    with this package's tokenisation, so only the scoring path differs from bm25s-numba/-scipy."""

    def __init__(self, index_dir: Path, backend: str):
        from capo_envs.retrieval.bm25 import BM25Retriever

        self._retriever = BM25Retriever.load(index_dir, kernel="scipy")
        self._index = self._retriever._index
        self._model = self._index._model
        self._model.backend = backend
        self.threads = 1

    def search(self, queries: list[str], k: int) -> np.ndarray:
        ids = [self._index._term_ids(q) for q in queries]
        out = np.full((len(queries), k), -1, dtype=np.int64)
        rows = [i for i, t in enumerate(ids) if t]
        if rows:
            kk = min(k, self._model.scores["num_docs"])
            docs, scores = self._model.retrieve([ids[i] for i in rows], k=kk, show_progress=False,
                                                n_threads=self.threads if self.threads > 1 else 0)
            for row, d, s in zip(rows, docs, scores):
                keep = s > 0
                out[row, : keep.sum()] = d[keep]
        return out

    def close(self) -> None:
        self._retriever.close()


class _Served:
    """One library over a saved index: ``search`` gives corpus positions (-1 padded), ``threads`` is settable."""

    def __init__(self, name: str, index_dir: Path, threads: int = 1):
        self.name = name
        if name.startswith("bm25s-lib-"):
            self._impl = _Bm25sLibrary(index_dir, name.removeprefix("bm25s-lib-"))
        elif name == "pisa-native":
            self._impl = _PisaNative.load(index_dir, threads=threads)
        elif name == "lucene":
            from capo_envs.retrieval.lucene import LuceneRetriever

            self._impl = LuceneRetriever.load(index_dir, threads=threads)
        elif name.startswith("pisa"):
            from capo_envs.retrieval.pisa import DEFAULT_ALGORITHM, PisaRetriever

            algorithm = {"pisa-bmw": "block_max_wand", "pisa-bmm": "block_max_maxscore"}.get(name, DEFAULT_ALGORITHM)
            self._impl = PisaRetriever.load(index_dir, threads=threads, algorithm=algorithm)
        else:
            from capo_envs.retrieval.bm25 import BM25Retriever

            kernel = {"bm25s-numba": "numba", "bm25s-lucene": "numba", "bm25s-scipy": "scipy"}.get(name, "auto")
            self._impl = BM25Retriever.load(index_dir, kernel=kernel, threads=threads)
        self.threads = threads

    @property
    def threads(self) -> int:
        return self._impl.threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._impl.threads = value

    def search(self, queries: list[str], k: int = K) -> np.ndarray:
        if isinstance(self._impl, (_Bm25sLibrary, _PisaNative)):
            return self._impl.search(queries, k)
        out = np.full((len(queries), k), -1, dtype=np.int64)
        for row, hits in enumerate(self._impl.search(queries, k)):
            out[row, : len(hits)] = [int(h.id) for h in hits]  # ids are corpus positions
        return out

    def close(self) -> None:
        self._impl.close()


# ---------------------------------------------------------------------------------------------------
# Worker processes: one builds an index, another serves it
# ---------------------------------------------------------------------------------------------------

def _rss_mb(field_name: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb() -> tuple[float, float]:
    import resource

    own = _rss_mb("VmHWM")  # not ru_maxrss: that survives exec, so it would include the parent's peak
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # e.g. Anserini's indexer JVM
    return own, children


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _dir_mb(path: Path, skip: tuple[str, ...] = ()) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and f.name not in skip) / 2**20


def worker_build(kind: str, corpus_dir: Path, index_dir: Path, threads: int) -> dict:
    import time

    from capo_envs.retrieval.base import read_corpus

    t0 = time.perf_counter()
    # a streamed build reads the corpus as it indexes (in build_s): at 21M the passages do not fit in memory
    passages = read_corpus(corpus_dir / "corpus.jsonl") if kind in STREAMED else list(read_corpus(corpus_dir / "corpus.jsonl"))
    read_s = time.perf_counter() - t0
    rss_passages = _rss_mb()
    t0, cpu0, child0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    index = _build(kind, passages, threads)
    build_s = time.perf_counter() - t0
    build_cpu_s = time.process_time() - cpu0 + _children_cpu_s() - child0  # Lucene indexes in a java child
    rss_built = _rss_mb()
    t0 = time.perf_counter()
    fresh = getattr(index, "_owned_tmpdir", None)
    if fresh is not None and Path(index.index_dir).parent == Path(fresh):
        # a fresh PISA or Lucene build is a temp dir on the same disk: moved (a rename), not copied by
        # save(), which at 21M would hold the index and its ~14 GB of passages twice on disk
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        import shutil

        shutil.move(str(index.index_dir), str(index_dir))
    else:
        index.save(index_dir)
    save_s = time.perf_counter() - t0
    index.close()
    own_peak, child_peak = _peak_rss_mb()
    return {"build_s": build_s, "build_cpu_s": build_cpu_s, "save_s": save_s, "read_corpus_s": read_s, "build_threads": threads,
            "build_rss_passages_mb": rss_passages, "build_rss_built_mb": rss_built,
            "build_peak_rss_mb": own_peak, "build_child_peak_rss_mb": child_peak,
            "disk_mb": _dir_mb(index_dir), "disk_index_only_mb": _dir_mb(index_dir, ("passages.jsonl", "offsets.npy"))}


def worker_serve(library: str, corpus_dir: Path, index_dir: Path, threads: list[int], singles: int, batch: int,
                 warmup: int, topk_path: Path, repeats: int = 3) -> dict:
    import time

    queries, golds = read_queries(corpus_dir)
    rss_start = _rss_mb()
    t0 = time.perf_counter()
    served = _Served(library, index_dir, threads=1)
    load_s = time.perf_counter() - t0
    warm = queries[-warmup:] if warmup else []
    for q in warm:  # JIT compilation, the JVM's warm-up, page cache: not part of the timings
        served.search([q])
    served.search(warm[:64] or queries[:64])
    rss_serving = _rss_mb()
    latencies, cpu_latencies = [], []
    for q in queries[:singles]:
        t0, c0 = time.perf_counter(), time.process_time()
        served.search([q])
        latencies.append((time.perf_counter() - t0) * 1000)
        cpu_latencies.append((time.process_time() - c0) * 1000)
    lat, cpu_lat = np.asarray(latencies), np.asarray(cpu_latencies)
    batch_queries = (queries * (batch // len(queries) + 1))[:batch]
    result = {"load_s": load_s, "rss_start_mb": rss_start, "rss_serving_mb": rss_serving,
              "rss_index_mb": rss_serving - rss_start, "singles": len(lat), "batch": batch,
              "single_p50_ms": float(np.percentile(lat, 50)), "single_p99_ms": float(np.percentile(lat, 99)),
              "single_mean_ms": float(lat.mean()), "single_p50_cpu_ms": float(np.percentile(cpu_lat, 50)),
              "single_p99_cpu_ms": float(np.percentile(cpu_lat, 99))}
    for t in threads:
        served.threads = t
        served.search(batch_queries[:64])
        seconds, cpu_seconds = [], []
        for _ in range(repeats):  # best of several: other processes only ever slow a run down
            t0, c0 = time.perf_counter(), time.process_time()
            served.search(batch_queries)
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(time.process_time() - c0)
        result[f"batch_qps_t{t}"] = batch / min(seconds)
        result[f"batch_qps_t{t}_median"] = batch / float(np.median(seconds))
        # queries per CPU-second of this process (all its threads, the JVM's included): robust to
        # other processes' load, and equal to the 1-thread q/s on a quiet machine
        result[f"batch_cpu_qps_t{t}"] = batch / min(cpu_seconds)
    served.threads = 1
    top = served.search(queries)
    served.close()
    gold = np.asarray([int(g) for g in golds])
    result["recall5"] = float(np.mean([(row[:5] == g).any() for row, g in zip(top, gold)]))
    result["recall10"] = float(np.mean([(row == g).any() for row, g in zip(top, gold)]))
    result["queries"] = len(queries)
    result["empty_results"] = int((top[:, 0] < 0).sum())
    np.save(topk_path, top)
    result["peak_rss_mb"] = _peak_rss_mb()[0]
    return result


# ---------------------------------------------------------------------------------------------------
# The parent: one cell at a time, resumable
# ---------------------------------------------------------------------------------------------------

def _child_env(max_threads: int) -> dict:
    import os

    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"  # every library's parallelism is its own, counted in --threads
    env["NUMBA_NUM_THREADS"] = str(max_threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join([here, str(Path(here).parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _run_worker(argv: list[str], env: dict, timeout: float) -> tuple[dict | None, str]:
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, str(Path(__file__).resolve()), "worker", *argv, "--out", out.name]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f}s"
        text = Path(out.name).read_text()
        if done.returncode != 0 or not text:
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
            return None, f"exit {done.returncode}: {' | '.join(tail)}"
        return json.loads(text), ""


def load_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cell_done(rows: list[dict], library: str, n: int, seed: int) -> bool:
    return any(r["library"] == library and r["passages"] == n and r["seed"] == seed and "error" not in r for r in rows)


def run(args) -> Path:
    import os
    import platform
    import shutil
    import time

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results_path = work / "results.jsonl"
    threads = [int(t) for t in args.threads.split(",")]
    env = _child_env(max(threads))
    libraries = list(LIBRARY_NAMES) if args.libraries == "all" else args.libraries.split(",")
    unknown = set(libraries) - set(LIBRARY_NAMES)
    if unknown:
        raise SystemExit(f"unknown libraries {sorted(unknown)}; choose from {LIBRARY_NAMES}")
    runnable = []
    for e in libraries:
        reason = library_unavailable(e)
        if reason:
            print(f"note: skipping {e}: {reason}")
        else:
            runnable.append(e)
    for n in [int(float(s)) for s in args.sizes.split(",")]:
        corpus_dir = work / "corpora" / f"n{n}-s{args.seed}"
        t0 = time.perf_counter()
        meta = write_corpus_files(corpus_dir, n, args.queries, args.seed)
        print(f"corpus {n:,} passages ({meta['tokens']:,} tokens, profile: {meta['profile']}) ready in {time.perf_counter() - t0:.0f}s")
        for position, library in enumerate(runnable):
            rows = load_results(results_path)
            if _cell_done(rows, library, n, args.seed) and not args.force:
                print(f"  {library:<16} n={n:,}: already measured, skipped")
                continue
            kind = INDEX_OF[library]
            index_dir = work / "indexes" / f"{kind}-n{n}-s{args.seed}"
            build_json = index_dir.with_name(index_dir.name + ".build.json")
            row = {"library": library, "passages": n, "seed": args.seed, "index": kind, "host": platform.node(),
                   "cpus": os.cpu_count(), "threads": threads, "loadavg_start": os.getloadavg()[0],
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if not build_json.is_file() or args.force:
                shutil.rmtree(index_dir, ignore_errors=True)
                built, err = _run_worker(["build", "--kind", kind, "--corpus", str(corpus_dir), "--index", str(index_dir),
                                          "--build-threads", str(args.build_threads)], env, args.cell_timeout)
                if built is None:
                    row["error"] = f"build: {err}"
                    print(f"  {library:<16} n={n:,}: {row['error']}")
                    with open(results_path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    continue
                build_json.write_text(json.dumps(built))
            row.update(json.loads(build_json.read_text()))
            topk = work / "topk" / f"{library}-n{n}-s{args.seed}.npy"
            topk.parent.mkdir(exist_ok=True)
            served, err = _run_worker(["serve", "--library", library, "--corpus", str(corpus_dir), "--index", str(index_dir),
                                       "--threads", args.threads, "--singles", str(args.singles), "--batch", str(args.batch),
                                       "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--topk", str(topk)], env, args.cell_timeout)
            if served is None:
                row["error"] = f"serve: {err}"
            else:
                row.update(served)
                row["topk"] = str(topk.relative_to(work))
            row["loadavg_end"] = os.getloadavg()[0]
            with open(results_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            if served is None:
                print(f"  {library:<16} n={n:,}: {row['error']}")
            else:
                print(f"  {library:<16} n={n:,}: build {row['build_s']:.1f}s  p50 {row['single_p50_ms']:.2f} ms  "
                      f"batch {row[f'batch_qps_t{threads[0]}']:.0f} q/s  RSS {row['rss_serving_mb']:.0f} MB  "
                      f"recall@5 {row['recall5']:.3f}  (load avg {row['loadavg_start']:.1f})")
            if not args.keep_indexes and kind not in {INDEX_OF[e] for e in runnable[position + 1 :]}:
                # its last library this size: at 21M, PISA's index (~19 GB with its passages) and Lucene's
                # build (~31 GB while indexing) would not both fit beside the corpus on a 70 GB disk
                shutil.rmtree(index_dir, ignore_errors=True)
                build_json.unlink(missing_ok=True)
        if not args.keep_indexes:
            shutil.rmtree(work / "indexes", ignore_errors=True)
    return results_path


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        w = argparse.ArgumentParser(prog="bench_retrieval_scale.py worker")
        w.add_argument("phase", choices=("build", "serve"))
        w.add_argument("--kind")
        w.add_argument("--library")
        w.add_argument("--corpus", type=Path, required=True)
        w.add_argument("--index", type=Path, required=True)
        w.add_argument("--build-threads", type=int, default=1)
        w.add_argument("--threads", default="1,2")
        w.add_argument("--singles", type=int, default=300)
        w.add_argument("--batch", type=int, default=1000)
        w.add_argument("--warmup", type=int, default=100)
        w.add_argument("--repeats", type=int, default=3)
        w.add_argument("--topk", type=Path)
        w.add_argument("--out", type=Path, required=True)
        a = w.parse_args(argv[1:])
        if a.phase == "build":
            out = worker_build(a.kind, a.corpus, a.index, a.build_threads)
        else:
            out = worker_serve(a.library, a.corpus, a.index, [int(t) for t in a.threads.split(",")], a.singles,
                               a.batch, a.warmup, a.topk, a.repeats)
        a.out.write_text(json.dumps(out))
        return 0

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated passage counts (1e6 works)")
    parser.add_argument("--libraries", default="all", help=f"comma-separated, from {', '.join(LIBRARY_NAMES)}")
    parser.add_argument("--threads", default="1,2", help="thread counts for the batched throughput")
    parser.add_argument("--build-threads", type=int, default=1, help="indexing threads (tantivy, Lucene)")
    parser.add_argument("--queries", type=int, default=1000, help="queries (each with a gold passage)")
    parser.add_argument("--singles", type=int, default=300, help="queries timed one at a time")
    parser.add_argument("--batch", type=int, default=1000, help="queries in each batched timing")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="batched timings per thread count; the best is kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default="/tmp/capo-retrieval-scale", help="corpora, indexes, results.jsonl")
    parser.add_argument("--cell-timeout", type=float, default=4 * 3600, help="seconds per build or serve")
    parser.add_argument("--force", action="store_true", help="remeasure cells already in results.jsonl")
    parser.add_argument("--keep-indexes", action="store_true", help="keep indexes after each size (disk!)")
    parser.add_argument("--report-only", action="store_true", help="only print the report of results.jsonl")
    parser.add_argument("--plot", default=None, help="plot file (default: <work-dir>/retrieval_scale.png)")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    results = work / "results.jsonl" if args.report_only else run(args)
    from retrieval_scale_plot import report

    report(results, plot=Path(args.plot) if args.plot else work / "retrieval_scale.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
