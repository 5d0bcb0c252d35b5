"""Paper search's BM25 ranker (``capo_envs/papers/search.py``) against FTS5: the same hits where the two
rankings must agree, date cut-offs, ties, the saved index, the ranker chosen by size, the server, and the
SynthScholar oracle's search-alone recall."""

from __future__ import annotations

import json
import statistics
import urllib.parse
import urllib.request

import pytest

import capo_envs.papers.db as dbmod
import capo_envs.papers.search as searchmod
from capo_envs.papers.db import Paper, PaperDB, build_database

RANKERS = ("fts5", "bm25")


def _agreeing_papers() -> list[Paper]:
    """Papers of equal length whose query-word sets are nested ({x,y,z} > {x,y} > {x} > none), each word
    at most once: every BM25 variant ranks them in that order, and equal papers by rowid (date)."""
    papers, words = [], ["xylophone", "yodeling", "zeppelin"]
    for group, matched in enumerate((3, 2, 1, 0)):
        for copy in range(4):
            i = group * 4 + copy
            filler = [f"f{i}w{j}" for j in range(8 - matched)]
            date = f"20{10 + copy * 3:02d}-0{1 + group}-15"  # copies spread over 2010-2019
            papers.append(Paper(f"{1001 + i}.{i:05d}", f"t{i}a t{i}b", " ".join(words[:matched] + filler),
                                2000 + copy, (), date))
    return papers


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    path = tmp_path_factory.mktemp("agree") / "p.sqlite"
    build_database(path, _agreeing_papers())
    dbs = {ranker: PaperDB(path, ranker=ranker) for ranker in RANKERS}
    yield dbs
    for db in dbs.values():
        db.close()


def _ids(papers):
    return [p.arxiv_id for p in papers]


@pytest.mark.parametrize("query", ["xylophone yodeling zeppelin", "zeppelin yodeling", "xylophone",
                                   "Which papers about the xylophone and zeppelin?", "nothing matches", "the of"])
@pytest.mark.parametrize("max_date", [None, "2016-06-30", "2010-01-01", "2000-01-01"])
def test_bm25_returns_the_same_hits_as_fts5_where_they_must_agree(agreeing, query, max_date):
    fts, bm25 = agreeing["fts5"], agreeing["bm25"]
    assert fts.ranking == "fts5" and bm25.ranking == "bm25"
    for limit, offset in ((10, 0), (3, 2), (100, 0), (5, 11)):
        expected = fts.search(query, limit, offset, max_date=max_date)
        assert _ids(bm25.search(query, limit, offset, max_date=max_date)) == _ids(expected)
        assert all(not max_date or p.date <= max_date for p in expected)
    assert bm25.search_total(query, max_date=max_date) == fts.search_total(query, max_date=max_date)
    full = bm25.search(query, 100, max_date=max_date)
    assert full == fts.search(query, 100, max_date=max_date)  # the whole Paper records, not only ids


def test_ties_come_in_rowid_order_and_the_cutoff_hides_later_papers(agreeing):
    bm25 = agreeing["bm25"]
    hits = bm25.search("xylophone yodeling zeppelin", 12)
    # within each group (equal scores) the copies come in publication order, as FTS5's ORDER BY rowid
    for group in range(3):
        dates = [p.date for p in hits[group * 4 : group * 4 + 4]]
        assert dates == sorted(dates)
    assert all(p.date <= "2013-12-31" for p in bm25.search("xylophone", 10, max_date="2013-12-31"))
    assert len(bm25.search("xylophone", 10, max_date="2013-12-31")) == 6
    assert bm25.search("xylophone", 10, max_date="1999-01-01") == []


def test_cutoff_asks_for_more_until_enough_survive(tmp_path, monkeypatch):
    monkeypatch.setattr(searchmod, "DATE_WINDOW", 1)
    monkeypatch.setattr(searchmod, "GROWTH", 2)
    papers = [Paper(f"2101.{i:05d}", f"Graph paper {i}", "graph graph graph", 2021, (), "2021-01-01") for i in range(30)]
    papers += [Paper(f"1501.{i:05d}", f"Old graph {i}", "graph", 2015, (), "2015-01-01") for i in range(3)]
    path = tmp_path / "g.sqlite"
    build_database(path, papers)
    with PaperDB(path, ranker="bm25") as db, PaperDB(path, ranker="fts5") as fts:
        old = db.search("graph", 10, max_date="2016-01-01")
        assert {p.arxiv_id for p in old} == {f"1501.{i:05d}" for i in range(3)}
        assert _ids(old) == _ids(fts.search("graph", 10, max_date="2016-01-01"))
        assert len(db.search("graph", 10)) == 10 and db.search("graph", 5, offset=30)[0].arxiv_id.startswith("1501")
        assert db.search_total("graph", max_date="2016-01-01") == 3 and db.search_total("graph") == 33


@pytest.mark.parametrize("query", ['"', 'a" OR "b', "NEAR(x y)", "title:bert", "*", "AND OR NOT", "(", "\x00",
                                   "\ud800", "x" * 10_000, "ünïcödé 中文", "the of and"])
def test_bm25_never_breaks_on_odd_queries(agreeing, query):
    assert isinstance(agreeing["bm25"].search(query), list)
    assert agreeing["bm25"].search_total(query) >= 0


def test_the_index_is_saved_beside_the_file_and_rebuilt_when_stale(tmp_path):
    path = tmp_path / "p.sqlite"
    build_database(path, _agreeing_papers())
    with PaperDB(path, ranker="bm25") as db:
        first = _ids(db.search("xylophone"))
        assert not db.bm25_index().loaded and (tmp_path / "p.sqlite.bm25" / searchmod.STAMP_FILE).is_file()
        assert not list((tmp_path / "p.sqlite.bm25").rglob("*.jsonl"))[0].read_text().count("xylophone")  # ids only
    with PaperDB(path, ranker="bm25") as db:
        assert _ids(db.search("xylophone")) == first and db.bm25_index().loaded
    build_database(path, [Paper("2301.00001", "Only xylophone", "here", 2023, (), "2023-01-01")])
    with PaperDB(path, ranker="bm25") as db:
        assert _ids(db.search("xylophone")) == ["2301.00001"] and not db.bm25_index().loaded
    custom = tmp_path / "elsewhere"
    with PaperDB(path, ranker="bm25", index_dir=custom) as db:
        assert len(db.search("xylophone")) == 1 and (custom / searchmod.STAMP_FILE).is_file()


def test_auto_picks_fts5_for_small_databases_and_bm25_from_the_threshold(monkeypatch, tmp_path):
    papers = _agreeing_papers()
    db = PaperDB.from_records(papers)
    assert db.ranker == "auto" and db.ranking == "fts5"
    monkeypatch.setattr(dbmod, "BM25_MIN_PAPERS", len(papers))
    assert db.ranking == "fts5"  # an in-memory database has its own, higher threshold
    build_database(tmp_path / "p.sqlite", papers)
    with PaperDB(tmp_path / "p.sqlite") as file_db:
        assert file_db.ranking == "bm25"
    monkeypatch.setattr(dbmod, "BM25_MIN_PAPERS_IN_MEMORY", len(papers))
    assert db.ranking == "bm25" and _ids(db.search("zeppelin")) == _ids(PaperDB.from_records(papers).search("zeppelin"))
    with pytest.raises(ValueError, match="ranker"):
        db.ranker = "lucene"
    db.ranker = "fts5"
    assert db.ranking == "fts5"
    db.close()


def test_equal_in_memory_databases_share_one_index():
    papers = _agreeing_papers()
    one, two = (PaperDB.from_records(papers, ranker="bm25") for _ in range(2))
    other = PaperDB.from_records(papers[:-1], ranker="bm25")
    assert one.bm25_index() is two.bm25_index() and other.bm25_index() is not one.bm25_index()
    one.close()
    assert _ids(two.search("zeppelin")) == _ids(PaperDB.from_records(papers, ranker="fts5").search("zeppelin"))
    two.close(), other.close()


def test_server_answers_the_same_with_either_engine():
    from capo_envs.papers.server import make_server

    papers = _agreeing_papers()
    answers = {}
    for ranker in RANKERS:
        srv = make_server(PaperDB.from_records(papers, ranker=ranker)).start_in_thread()
        try:
            got = []
            for params in ({"query": "xylophone yodeling", "limit": 5}, {"query": "zeppelin", "offset": 2, "limit": 3},
                           {"query": "xylophone", "year": "-2013"}, {"query": "xylophone", "year": "2012-2016"}):
                url = srv.url + "/graph/v1/paper/search?" + urllib.parse.urlencode({**params, "fields": "title,year"})
                with urllib.request.urlopen(url, timeout=10) as response:
                    got.append(json.loads(response.read()))
            answers[ranker] = got
        finally:
            srv.shutdown()
            srv.db.close()
    assert answers["bm25"] == answers["fts5"]
    assert answers["bm25"][0]["total"] == 12


def _search_recall(db: PaperDB, tasks) -> float:
    recalls = []
    for task in tasks:
        found = set()
        for phrase in task.search_phrases or (task.question,):
            found |= {p.arxiv_id for p in db.search(phrase, 10, max_date=task.cutoff)}
        recalls.append(len(found & set(task.gold)) / len(task.gold))
    return statistics.mean(recalls)


def test_synthscholar_small_dev_recall_is_not_below_fts5():
    from capo_envs.papers.world import cached_world

    world = cached_world(0, "small")
    recall = {}
    for ranker in RANKERS:
        db = PaperDB.from_records(world.papers, world.edges(), ranker=ranker)
        recall[ranker] = _search_recall(db, world.splits["dev"])
        db.close()
    assert recall["bm25"] >= recall["fts5"] - 0.01, recall
