"""BM25Retriever (both libraries), CachedRetriever and open_retriever for bm25/http."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capo_envs.retrieval as retrieval
from capo_envs.retrieval import BM25Retriever, CachedRetriever, Passage, open_retriever, write_corpus

from corpora import TOPICS

LIBRARIES = ["bm25s", "tantivy"]

QUERIES = [
    ("which mountains erupt lava and ash", "Volcano"),
    ("instrument with hammers striking strings", "Piano"),
    ("how do plants use sunlight to make sugar", "Photosynthesis"),
    ("slowly moving ice", "Glacier"),
    ("board game with kings and queens", "Chess"),
    ("bees storing honey in combs", "Honey bee"),
    ("tower guiding ships", "Lighthouse"),
    ("bread leavened with wild yeast", "Sourdough"),
]
ADVERSARIAL = [
    "", " ", "!!!", "?", "AND", "OR NOT", "a AND OR b", '"unclosed quote', "title:(x", "body:lava", "*", "lava*",
    "~", "lava~2", "a^3", "(((", ")", "[1 TO 5]", "{x}", "\\", "-lava +ice", "\x00", "🌋🔥 火山", "Ünïcödé ß ﬁ",
    "lava " * 20_000, "x" * 100_000, "\n\t\r", "IN [a b]",
]


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return [Passage(f"t{i}", title, text) for i, (title, text) in enumerate(TOPICS)]


@pytest.fixture(scope="module", params=LIBRARIES)
def retriever(request, passages):
    r = BM25Retriever.build(passages, library=request.param)
    yield r
    r.close()


def test_topic_query_ranks_its_passage_first(retriever):
    results = retriever.search([q for q, _ in QUERIES], 3)
    assert [hits[0].title for hits in results] == [title for _, title in QUERIES]


def test_hits_carry_passage_fields_and_descending_scores(retriever, passages):
    hits = retriever.search(["lava ash ice"], 5)[0]
    by_id = {p.id: p for p in passages}
    for hit in hits:
        assert (hit.title, hit.text) == (by_id[hit.id].title, by_id[hit.id].text)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert {h.title for h in hits} == {"Volcano", "Glacier"}


def test_batch_equals_one_at_a_time(retriever):
    queries = [q for q, _ in QUERIES] + ["", "piano ice"]
    assert retriever.search(queries, 4) == [retriever.search([q], 4)[0] for q in queries]


@pytest.mark.parametrize("library", LIBRARIES)
def test_ties_broken_by_corpus_position(library):
    dup = ("Twin", "identical twin passage about comets")
    corpus = [Passage("a", "Other", "comets and asteroids orbit the sun, comets have tails")]
    corpus += [Passage(f"d{i}", *dup) for i in range(20)]
    corpus += [Passage("z", "Filler", "nothing relevant here at all")]
    r = BM25Retriever.build(corpus, library=library)
    hits = r.search(["identical twin"], 3)[0]
    assert [h.id for h in hits] == ["d0", "d1", "d2"]
    assert len({h.score for h in hits}) == 1
    assert [h.id for h in r.search(["identical twin"], 20)[0]] == [f"d{i}" for i in range(20)]
    r.close()


@pytest.mark.parametrize("library", LIBRARIES)
def test_builds_are_deterministic(library, passages):
    queries = [q for q, _ in QUERIES]
    a, b = BM25Retriever.build(passages, library=library), BM25Retriever.build(passages, library=library)
    assert a.search(queries, 8) == b.search(queries, 8)
    a.close(), b.close()


def test_k_larger_than_corpus(retriever, passages):
    # one word from every passage, so all of them match
    hits = retriever.search(["lava piano sunlight ice kings honey ships bread"], 1000)[0]
    assert len(hits) == len(passages)
    assert len({h.id for h in hits}) == len(passages)


def test_unmatched_query_returns_no_hits(retriever):
    assert retriever.search(["zzyzx qwertyuiop"], 5) == [[]]


@pytest.mark.parametrize("query", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_queries_never_raise(retriever, query):
    result = retriever.search([query], 5)
    assert isinstance(result, list) and len(result) == 1 and isinstance(result[0], list)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=200))
def test_random_unicode_queries_never_raise(retriever, query):
    assert len(retriever.search([query, query.upper()], 3)) == 2


def test_bad_arguments(retriever):
    with pytest.raises(TypeError):
        retriever.search("lava", 3)
    with pytest.raises(TypeError):
        retriever.search(["lava", 3], 3)
    with pytest.raises(ValueError):
        retriever.search(["lava"], 0)
    assert retriever.search([], 3) == []


def test_build_rejects_unknown_library_and_empty_corpus(passages):
    with pytest.raises(ValueError, match="tantivy"):
        BM25Retriever.build(passages, library="elastic")
    with pytest.raises(ValueError):
        BM25Retriever.build([])


def test_the_old_engine_keyword_is_refused_with_its_new_name(passages, tmp_path):
    """``engine=`` was renamed ``library=``: the retriever, open_retriever and hybrid say so."""
    with pytest.raises(ValueError, match=r"engine= is now library=: pass library='tantivy'"):
        BM25Retriever.build(passages, engine="tantivy")
    for kind in ("bm25", "hybrid"):
        with pytest.raises(ValueError, match="engine= is now library="):
            open_retriever(kind, passages=passages, engine="bm25s", cache_size=0)
    with pytest.raises(TypeError, match="bogus"):
        BM25Retriever.build(passages, bogus=1)


def test_an_index_saved_with_the_old_engine_key_loads(passages, tmp_path):
    r = BM25Retriever.build(passages, library="bm25s")
    r.save(tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["library"] == "bm25s"
    meta["engine"] = meta.pop("library")
    (tmp_path / "idx" / "meta.json").write_text(json.dumps(meta))
    loaded = BM25Retriever.load(tmp_path / "idx")
    assert loaded.library == "bm25s" and loaded.search(["lava"], 3) == r.search(["lava"], 3)


def test_auto_library_is_the_default(passages):
    r = BM25Retriever.build(passages)
    assert r.library == retrieval.bm25.DEFAULT_LIBRARY
    r.close()


@pytest.mark.parametrize("library", LIBRARIES)
def test_save_load_round_trip_and_overwrite(library, passages, tmp_path):
    queries = [q for q, _ in QUERIES] + ["lava ice"]
    r = BM25Retriever.build(passages, library=library)
    expected = r.search(queries, 5)
    r.save(tmp_path / "idx")
    r.save(tmp_path / "idx")  # overwriting an existing index works
    r.close()
    loaded = BM25Retriever.load(tmp_path / "idx")
    assert loaded.library == library
    assert loaded.passages == passages
    assert loaded.search(queries, 5) == expected
    loaded.save(tmp_path / "idx")  # a loaded index can be saved over itself
    assert BM25Retriever.load(tmp_path / "idx").search(queries, 5) == expected
    assert not [p for p in tmp_path.iterdir() if p.name != "idx"]  # no temp dirs left behind
    loaded.close()


def test_load_missing_index_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        BM25Retriever.load(tmp_path)


def test_cached_retriever_counts_hits_and_misses(retriever):
    cached = CachedRetriever(retriever, maxsize=2)
    first = cached.search(["lava", "ice", "lava"], 3)
    assert (cached.hits, cached.misses) == (1, 2)
    assert cached.search(["lava"], 3) == [first[0]]
    assert (cached.hits, cached.misses) == (2, 2)
    cached.search(["lava"], 4)  # a different k is a different entry
    assert cached.misses == 3
    cached.search(["piano"], 3)  # evicts the least recently used, ("ice", 3)
    cached.search(["ice"], 3)
    assert cached.misses == 5


def test_cached_retriever_shared_by_threads_answers_as_alone(retriever):
    """The trainer's default env pool runs envs in threads that share one cached retriever: a cache
    too small for the queries, so entries are evicted while other threads read them."""
    import concurrent.futures

    queries = [q for q, _ in QUERIES] + ["lava", "ice", "piano strings", "honey"]
    alone = {q: retriever.search([q], 3)[0] for q in queries}
    cached = CachedRetriever(retriever, maxsize=3)

    def worker(offset: int) -> bool:
        return all(cached.search([queries[(offset + i) % len(queries)]], 3)[0] == alone[queries[(offset + i) % len(queries)]]
                   for i in range(300))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(worker, range(8)))
    assert cached.hits + cached.misses == 8 * 300 and len(cached._cache) <= 3


def test_open_retriever_bm25_builds_saves_then_loads(passages, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(passages, corpus)
    r = open_retriever("bm25", corpus=corpus, index_dir=tmp_path / "idx", library="tantivy")
    assert isinstance(r, CachedRetriever) and r.inner.library == "tantivy"
    expected = r.search(["tower guiding ships"], 2)
    assert expected[0][0].title == "Lighthouse"
    r.close()

    def no_build(*args, **kwargs):
        raise AssertionError("should load the saved index, not rebuild")

    monkeypatch.setattr(BM25Retriever, "build", no_build)
    again = open_retriever("bm25", index_dir=tmp_path / "idx", cache_size=0)
    assert isinstance(again, BM25Retriever) and again.library == "tantivy"
    assert again.search(["tower guiding ships"], 2) == expected
    again.close()


def test_open_retriever_errors(tmp_path):
    with pytest.raises(ValueError, match="bm25.*dense.*hybrid"):
        open_retriever("elasticsearch", passages=[])
    with pytest.raises(ValueError, match="neither passages nor corpus"):
        open_retriever("bm25", index_dir=tmp_path / "empty")


def test_open_retriever_http_url_is_lazy():
    from capo_envs.retrieval.http import HTTPRetriever

    r = open_retriever("http://127.0.0.1:9/retrieve", cache_size=0)
    assert isinstance(r, HTTPRetriever)


def test_import_does_not_pull_in_torch_transformers_or_faiss():
    code = (
        "import sys, capo_envs.retrieval, capo_envs.retrieval.bm25, capo_envs.retrieval.hybrid;"
        "heavy = [m for m in ('torch', 'transformers', 'faiss') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
