"""The BM25 library rule of ``open_retriever``, the numba kernel's parity with the scipy one, ranking
parity between libraries on a generated corpus, and the scale benchmark's generator and report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import capo_envs.retrieval.bm25 as bm25
import capo_envs.retrieval.bm25_choice as bm25_choice
import capo_envs.retrieval.bm25_libraries as bm25_libraries
from capo_envs.retrieval import BM25Retriever, Passage, open_retriever
from capo_envs.retrieval import bm25_kernel

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import bench_retrieval_scale as scale  # noqa: E402
import retrieval_scale_plot  # noqa: E402

SHARED_SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki_passages" / "sample_data.jsonl"
needs_numba = pytest.mark.skipif(not bm25_kernel.available(), reason='pip install "capo-gym[bm25-fast]"')
N_PASSAGES, N_QUERIES = 2000, 150


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[list[Passage], list[str], list[str]]:
    """A small generated corpus (fallback profile: no shared data needed) with gold passages."""
    folder = tmp_path_factory.mktemp("corpus")
    scale.write_corpus_files(folder, N_PASSAGES, N_QUERIES, seed=0, sample=None)
    from capo_envs.retrieval.base import read_corpus

    queries, golds = scale.read_queries(folder)
    return list(read_corpus(folder / "corpus.jsonl")), queries, golds


def overlap_at_10(a: list[list], b: list[list]) -> float:
    """Mean |a ∩ b| / |b| over queries where b found something (b is the reference)."""
    scores = [len({h.id for h in x} & {h.id for h in y}) / len(y) for x, y in zip(a, b) if y]
    return float(np.mean(scores))


def recall_at_5(results: list[list], golds: list[str]) -> float:
    return float(np.mean([g in {h.id for h in hits[:5]} for hits, g in zip(results, golds)]))


# --- the rule -------------------------------------------------------------------------------------


def test_rule_with_numba_is_bm25s_at_every_size(monkeypatch):
    monkeypatch.setattr(bm25_kernel, "available", lambda: True)
    assert bm25.resolve_kernel() == "numba"
    plenty = 10**15  # memory is not the question here (tests/test_bm25_library_choice.py)
    assert {bm25.choose_library(n, memory_bytes=plenty, pisa=False) for n in (1, 10_000, 10**6, 21 * 10**6)} == {"bm25s"}


def test_rule_without_numba_switches_to_tantivy_above_the_threshold(monkeypatch):
    monkeypatch.setattr(bm25_kernel, "available", lambda: False)
    assert bm25.resolve_kernel() == "scipy"
    plenty = 10**15
    assert bm25.choose_library(bm25.SCIPY_MAX_PASSAGES, memory_bytes=plenty) == "bm25s"
    assert bm25.choose_library(bm25.SCIPY_MAX_PASSAGES + 1, memory_bytes=plenty, pisa=False) == "tantivy"
    assert bm25.choose_library(10**9, kernel="scipy", memory_bytes=plenty, pisa=False) == "tantivy"
    with pytest.raises(ImportError, match="numba"):
        bm25.resolve_kernel("numba")


def test_unknown_kernel_is_rejected():
    with pytest.raises(ValueError, match="numba"):
        bm25.resolve_kernel("cuda")
    with pytest.raises(ValueError, match="kernel"):
        BM25Retriever.build([Passage("a", "", "x")], kernel="fortran")


def test_small_corpora_keep_the_bm25s_index(generated):
    passages, _, _ = generated
    r = open_retriever("bm25", passages=passages[:500], cache_size=0)
    assert isinstance(r, BM25Retriever)
    assert r.library == bm25.DEFAULT_LIBRARY == "bm25s"
    assert r.kernel == "scipy"  # below NUMBA_MIN_PASSAGES: today's scorer, no numba load time
    r.close()


def test_auto_kernel_by_size(monkeypatch):
    monkeypatch.setattr(bm25_kernel, "available", lambda: True)
    assert bm25.resolve_kernel("auto", bm25.NUMBA_MIN_PASSAGES - 1) == "scipy"
    assert bm25.resolve_kernel("auto", bm25.NUMBA_MIN_PASSAGES) == "numba"
    assert bm25.resolve_kernel("auto") == "numba"
    assert bm25.resolve_kernel("scipy", 10**7) == "scipy"


def test_auto_builds_tantivy_for_a_large_corpus_without_numba(monkeypatch, generated):
    """The size rule is applied by build (here with the threshold lowered, to stay fast)."""
    passages, queries, _ = generated
    monkeypatch.setattr(bm25_kernel, "available", lambda: False)
    monkeypatch.setattr(bm25_choice, "SCIPY_MAX_PASSAGES", 100)
    r = BM25Retriever.build(passages[:101])
    assert (r.library, r.kernel) == ("tantivy", "tantivy")
    assert BM25Retriever.build(passages[:100]).kernel == "scipy"
    r.close()


@needs_numba
def test_open_retriever_passes_kernel_and_threads_on_load(generated, tmp_path):
    passages, queries, _ = generated
    built = open_retriever("bm25", passages=passages[:300], index_dir=tmp_path / "idx", kernel="scipy", cache_size=0)
    assert built.kernel == "scipy"
    loaded = open_retriever("bm25", index_dir=tmp_path / "idx", kernel="numba", threads=2, cache_size=0)
    assert (loaded.kernel, loaded.threads) == ("numba", 2)
    assert loaded.search(queries[:20], 10) == built.search(queries[:20], 10)
    loaded.close(), built.close()


# --- kernel parity: numba and scipy give the same hits, scores and ties ---------------------------------


@needs_numba
def test_numba_kernel_equals_scipy_bit_for_bit(generated):
    passages, queries, _ = generated
    scipy_r = BM25Retriever.build(passages, kernel="scipy")
    numba_r = BM25Retriever.build(passages, kernel="numba")
    extra = ["", "the of and", queries[0] + " " + queries[0], "x" * 300]
    for k in (1, 5, 10, 100, 5000):
        assert numba_r.search(queries + extra, k) == scipy_r.search(queries + extra, k)
    assert [numba_r.search([q], 10)[0] for q in queries[:50]] == numba_r.search(queries[:50], 10)
    numba_r.threads = 2  # the parallel path gives the same answers
    assert numba_r.search(queries, 10) == scipy_r.search(queries, 10)
    numba_r.close(), scipy_r.close()


@needs_numba
def test_numba_kernel_breaks_ties_by_corpus_position():
    twins = [Passage(f"d{i}", "Twin", "identical twin passage about comets") for i in range(30)]
    corpus = [Passage("a", "Other", "comets and asteroids, comets have tails")] + twins
    r = BM25Retriever.build(corpus, kernel="numba")
    assert [h.id for h in r.search(["identical twin"], 3)[0]] == ["d0", "d1", "d2"]
    assert [h.id for h in r.search(["identical twin"], 30)[0]] == [f"d{i}" for i in range(30)]


@needs_numba
def test_numba_kernel_is_thread_safe(generated):
    import threading

    passages, queries, _ = generated
    r = BM25Retriever.build(passages[:1000], kernel="numba")
    expected = r.search(queries[:40], 5)
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(r.search(queries[:40], 5))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [expected] * 4


# --- ranking parity between libraries --------------------------------------------------------------------


def test_tantivy_ranks_like_bm25s(generated):
    passages, queries, golds = generated
    a, b = BM25Retriever.build(passages), BM25Retriever.build(passages, library="tantivy")
    ra, rb = a.search(queries, 10), b.search(queries, 10)
    # Same BM25 constants and analysis; tantivy quantises document lengths (as Lucene does), so
    # near-ties reorder: 0.93-0.94 top-10 overlap at 10k-100k in bench_retrieval_scale.py.
    assert overlap_at_10(rb, ra) >= 0.9
    assert abs(recall_at_5(ra, golds) - recall_at_5(rb, golds)) <= 0.02
    a.close(), b.close()


@pytest.mark.java
@pytest.mark.slow
def test_lucene_analysis_has_lucenes_ranking(generated):
    """The issue's bar: top-10 overlap >= 0.9 with Lucene (pyserini's defaults) and recall@5 within
    0.005. ``analyzer="lucene"`` (the default) reached 0.993-0.994 at 10k-1M in bench_retrieval_scale.py;
    the ``snowball`` analysis 0.85-0.88 (different stemmer, stopwords, k1/b and length norms)."""
    from corpora import lucene_or_skip

    passages, queries, golds = generated
    with lucene_or_skip().build(passages) as lucene:
        rl = lucene.search(queries, 10)
    lucene_like = BM25Retriever.build(passages).search(queries, 10)
    assert overlap_at_10(lucene_like, rl) >= 0.95
    assert abs(recall_at_5(lucene_like, golds) - recall_at_5(rl, golds)) <= 0.005
    snowball = BM25Retriever.build(passages, analyzer="snowball").search(queries, 10)
    assert overlap_at_10(snowball, rl) < overlap_at_10(lucene_like, rl)


# --- the generator and the report ----------------------------------------------------------------------


def test_generator_is_deterministic_and_prefix_stable():
    profile = scale.load_profile(None, vocab_size=200_000)
    gen = scale.CorpusGenerator(profile, seed=3)
    titles, texts, _, _ = gen.chunk(0)
    again = [(t, x) for t, x, _, _ in scale.CorpusGenerator(profile, seed=3).passages(5)]
    assert list(zip(titles, texts))[:5] == again  # the corpus of size n is the first n passages of one stream
    assert scale.CorpusGenerator(profile, seed=3).chunk(1)[1][:3] == gen.chunk(1)[1][:3]  # chunks are independent
    other = [(t, x) for t, x, _, _ in scale.CorpusGenerator(profile, seed=4).passages(5)]
    assert other != again


def test_fast_corpus_lines_are_the_string_path_byte_for_byte():
    """write_corpus_files assembles the texts in numpy (chunk_lines, a guide table instead of most binary
    searches) so that 21M passages take minutes: it must write what json.dumps of chunk()'s strings wrote,
    so corpora generated before and after stay the same corpus. A partial last chunk included."""
    import json

    profile = scale.load_profile(None, vocab_size=200_000)
    slow, fast = scale.CorpusGenerator(profile, seed=5), scale.CorpusGenerator(profile, seed=5)
    for index, count in ((0, scale.CHUNK), (3, 1234)):
        titles, texts, tokens, topics = slow.chunk(index)
        first = index * scale.CHUNK
        expected = "".join(json.dumps({"id": str(first + i), "title": titles[i], "text": texts[i]}) + "\n" for i in range(count))
        lines, flat, starts, topics_fast = fast.chunk_lines(index, first, count)
        assert lines.decode("ascii") == expected
        for i in (0, count // 2, count - 1):
            assert np.array_equal(flat[starts[i] : starts[i + 1]], tokens[i]) and np.array_equal(topics_fast[i], topics[i])
    u = np.random.default_rng(0).random(300_000)
    cdf = profile.cdf
    assert np.array_equal(fast._guided_search(cdf, u), np.searchsorted(cdf, u * cdf[-1], side="right"))


def test_interrupted_corpus_resumes_to_the_same_files(tmp_path, monkeypatch):
    """A 21M corpus may outlast a session on a loaded machine: a rerun resumes from the last checkpoint and
    writes what an uninterrupted run writes (corpus, queries, meta)."""
    whole = tmp_path / "whole"
    scale.write_corpus_files(whole, 25_000, 40, seed=2, sample=None)
    monkeypatch.setattr(scale, "RESUME_EVERY", 1)
    real = scale.CorpusGenerator.chunk_lines

    class Killed(Exception):
        pass

    def dies_at_chunk_2(self, index, *args):
        if index == 2:
            raise Killed
        return real(self, index, *args)

    monkeypatch.setattr(scale.CorpusGenerator, "chunk_lines", dies_at_chunk_2)
    resumed = tmp_path / "resumed"
    with pytest.raises(Killed):
        scale.write_corpus_files(resumed, 25_000, 40, seed=2, sample=None)
    assert (resumed / "progress.json").is_file() and not (resumed / "meta.json").exists()
    with open(resumed / "corpus.jsonl", "ab") as f:
        f.write(b'{"id": "half a line')  # what a kill in the middle of a write leaves
    monkeypatch.setattr(scale.CorpusGenerator, "chunk_lines", real)
    scale.write_corpus_files(resumed, 25_000, 40, seed=2, sample=None)
    for name in ("corpus.jsonl", "queries.jsonl", "meta.json"):
        assert (resumed / name).read_bytes() == (whole / name).read_bytes()
    assert not (resumed / "progress.json").exists()


def test_generated_corpus_has_realistic_shape(generated):
    passages, queries, golds = generated
    lengths = [len(p.text.split()) for p in passages]
    assert 90 <= np.mean(lengths) <= 130  # the fallback profile's ~110 tokens
    assert len({p.title for p in passages}) < len(passages)  # articles span several passages
    assert len(queries) == len(set(golds)) == N_QUERIES
    assert all(4 <= len(q.split()) <= 12 for q in queries)
    assert recall_at_5(BM25Retriever.build(passages).search(queries, 5), golds) >= 0.6


@pytest.mark.shared
@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason="needs ../shared/data/wiki_passages")
def test_profile_matches_the_wiki_sample():
    profile = scale.load_profile(SHARED_SAMPLE)
    assert 95 <= profile.text_lengths.mean() <= 110  # 100 words each, counted as \w+ tokens
    assert profile.words[:3] == ["the", "of", "and"]
    assert abs(profile.probs.sum() - 1) < 1e-9 and 1.5 < profile.tail_exponent < 3


def test_report_fits_and_resumes(tmp_path, generated):
    """Two fake cells per library: the fit recovers the exponent and the report reads the overlap files."""
    rows = []
    (tmp_path / "topk").mkdir()
    top = np.arange(20).reshape(2, 10)
    for library, slope in (("lucene", 0.5), ("bm25s-numba", 1.0)):
        for n in (10_000, 100_000):
            np.save(tmp_path / "topk" / f"{library}-{n}.npy", top)
            rows.append({"library": library, "passages": n, "seed": 0, "single_p50_ms": 0.01 * (n / 1e4) ** slope,
                         "single_p50_cpu_ms": 0.01 * (n / 1e4) ** slope, "batch_qps_t1": 1e4 / (n / 1e4) ** slope,
                         "batch_cpu_qps_t1": 1e4 / (n / 1e4) ** slope, "build_s": n / 1e4, "recall5": 0.9,
                         "topk": f"topk/{library}-{n}.npy", "loadavg_start": 0.1, "loadavg_end": 0.2})
    rows.append({"library": "tantivy", "passages": 10_000, "seed": 0, "error": "build: exit 1"})
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    import io

    out = io.StringIO()
    fits = retrieval_scale_plot.report(results, plot=tmp_path / "plot.png", out=out)
    assert fits[("bm25s-numba", "single_p50_ms")][1] == pytest.approx(1.0)
    assert fits[("lucene", "single_p50_ms")][1] == pytest.approx(0.5)
    assert "top-10 overlap w/ Lucene" in out.getvalue() and (tmp_path / "plot.png").is_file()
    assert scale._cell_done(scale.load_results(results), "lucene", 10_000, 0)
    assert not scale._cell_done(scale.load_results(results), "tantivy", 10_000, 0)  # errors are retried


def test_dense_vector_generator_and_choice():
    import bench_dense_scale as dense

    base = np.random.default_rng(0).standard_normal((200, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    gen = dense.VectorGenerator(base, seed=0)
    vectors = gen.passages(1000)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.array_equal(dense.VectorGenerator(base, seed=0).passages(10), vectors[:10])
    queries, gold = gen.queries(vectors, 100)
    assert abs(float(np.mean(np.sum(queries * vectors[gold], 1))) - dense.TARGET_QUERY_COS) < 0.05
    rows = [{"config": "pq", "bytes_per_passage": 60, "recall5_vs_flat": 0.74},
            {"config": "sq8", "bytes_per_passage": 400, "recall5_vs_flat": 0.97},
            {"config": "flat", "bytes_per_passage": 1536, "recall5_vs_flat": 1.0}]
    assert dense.choose(rows)["config"] == "sq8"
    assert dense.choose(rows, floor=0.99)["config"] == "flat"


# --- the lucene analysis -------------------------------------------------------------------------------


def test_lucene_length_norms_match_smallfloat():
    """Values checked against Lucene's own SmallFloat.byte4ToInt(intToByte4(n)) (Anserini's jar)
    for every n below 3000 and a few large ones when this was written."""
    lengths = [0, 23, 24, 31, 40, 56, 100, 150, 1000]
    expected = [0, 23, 24, 31, 40, 56, 96, 144, 984]
    assert bm25_libraries.lucene_length(np.array(lengths)).tolist() == expected


def test_lucene_analysis_round_trip_and_rules(generated, tmp_path):
    passages, queries, _ = generated
    r = BM25Retriever.build(passages[:500], analyzer="lucene")
    assert (r.library, r.analyzer) == ("bm25s", "lucene")
    r.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx")
    assert loaded.analyzer == "lucene" and loaded.search(queries, 10) == r.search(queries, 10)
    assert BM25Retriever.build(passages[:500]).search(queries, 10) == r.search(queries, 10)  # the default
    snowball = BM25Retriever.build(passages[:500], analyzer="snowball")
    assert snowball.analyzer == "snowball" and snowball.search(queries, 10) != r.search(queries, 10)
    with pytest.raises(ValueError, match="tantivy"):
        BM25Retriever.build(passages[:10], library="tantivy", analyzer="lucene")
    with pytest.raises(ValueError, match="analyzer"):
        BM25Retriever.build(passages[:10], analyzer="klingon")
