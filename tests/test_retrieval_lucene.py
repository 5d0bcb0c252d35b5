"""The optional Lucene (pyserini/Anserini) BM25 backend; skipped without pyserini, pyjnius or Java."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from capo_envs.retrieval.base import Hit
from corpora import capitals_corpus

pytestmark = pytest.mark.java

pytest.importorskip("pyserini", reason="pip install --no-deps pyserini==0.22.1 pyjnius")
# jnius_config, not jnius: importing jnius starts the JVM before the Anserini jar is on its classpath
pytest.importorskip("jnius_config", reason="pip install --no-deps pyserini==0.22.1 pyjnius")

from capo_envs.retrieval.lucene import LuceneRetriever, java_home  # noqa: E402

try:
    java_home()
except RuntimeError as e:
    pytest.skip(str(e), allow_module_level=True)

CORPUS = capitals_corpus()


@pytest.fixture(scope="module")
def lucene():
    with LuceneRetriever.build(CORPUS, threads=2) as retriever:
        yield retriever


def ids(hits: list[Hit]) -> list[str]:
    return [h.id for h in hits]


def test_ranking(lucene):
    paris, danube, relativity = lucene.search(["capital of France", "river Vienna", "relativity theory"], 3)
    assert ids(paris)[0] == "paris"
    assert set(ids(paris)[:3]) >= {"paris", "berlin"}
    assert ids(danube) == ["danube"]
    assert ids(relativity) == ["einstein"]
    assert relativity[0] == Hit("einstein", "Albert Einstein", CORPUS[6].text, relativity[0].score)
    assert all(a.score >= b.score for a, b in zip(paris, paris[1:]))
    assert lucene.search(["capital of France"], 3) == [paris]  # the single-query path agrees with the batch one
    assert ids(lucene.search(["Einstein"], 1)[0]) == ["einstein"]  # titles are indexed too


def test_ties_follow_corpus_order(lucene):
    """Built with 2 threads, so Lucene's internal order is not corpus order; ties still are."""
    assert ids(lucene.search(["lighthouses"], 3)[0]) == ["twin-a", "twin-b", "twin-c"]
    assert ids(lucene.search(["lighthouses"], 2)[0]) == ["twin-a", "twin-b"]
    assert ids(lucene.search(["lighthouses"], 1)[0]) == ["twin-a"]


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        '"unbalanced quote',
        "title:Paris",
        "capital AND (France OR",
        "NOT",
        "*",
        "cap*",
        "?",
        "paris~2^3",
        "[a TO",
        "\\",
        "/regex/",
        "+ - && || ! { } ^ ~",
        "東京",
        "😀 naïve façade",
        "\x00\x01",
        " ".join(f"word{i}" for i in range(3000)),  # more clauses than Lucene's default limit
    ],
)
def test_adversarial_queries_return_lists(lucene, query):
    results = lucene.search([query, "capital of France"], 3)
    assert isinstance(results[0], list) and all(isinstance(h, Hit) for h in results[0])
    assert ids(results[1])[0] == "paris"
    assert isinstance(lucene.search([query], 3)[0], list)


def test_unicode_text_is_searchable(lucene):
    assert "tokyo" in ids(lucene.search(["Tokyo Japan"], 3)[0])


def test_save_load_round_trip(lucene, tmp_path: Path):
    queries = ["capital of France", "lighthouses", "river", "nothing here at all"]
    lucene.save(tmp_path / "idx")
    lucene.save(tmp_path / "idx")  # replacing an existing index works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no staging leftovers
    with LuceneRetriever.load(tmp_path / "idx") as loaded:
        assert loaded.search(queries, 4) == lucene.search(queries, 4)
        assert loaded.num_passages == len(CORPUS)
        assert [loaded.passage(i) for i in range(len(CORPUS))] == CORPUS


def test_threads_get_correct_answers(lucene):
    expected = lucene.search(["capital of France", "river"], 2)
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(lucene.search(["capital of France", "river"], 2))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [expected] * 6


def test_close(tmp_path: Path):
    retriever = LuceneRetriever.build(CORPUS[:3])
    workdir = retriever.index_dir
    retriever.save(tmp_path / "kept")
    retriever.close()
    retriever.close()  # twice is fine
    assert not workdir.exists()  # the unsaved build's temp dir is removed
    assert (tmp_path / "kept" / "meta.json").exists()  # a saved copy is not
    with pytest.raises(RuntimeError, match="closed"):
        retriever.search(["paris"], 1)


def test_empty_corpus_and_bad_args():
    with LuceneRetriever.build([]) as empty:
        assert empty.search(["anything", ""], 5) == [[], []]
        assert empty.search([], 5) == []
        with pytest.raises(TypeError):
            empty.search("not a list", 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            empty.search(["x"], 0)


def test_load_rejects_other_indexes(tmp_path: Path):
    (tmp_path / "meta.json").write_text('{"retriever": "bm25"}')
    with pytest.raises(ValueError, match="not a lucene index"):
        LuceneRetriever.load(tmp_path)
