"""The local paper database: arXiv id forms, the builder, FTS5 search, citations and references."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from capo_envs.papers.db import Paper, PaperDB, build_database, fts_query
from capo_envs.papers.ids import normalize_arxiv_id, strip_version

PAPERS = [
    Paper("1706.03762", "Attention Is All You Need", "We propose the Transformer, based solely on attention.",
          2017, ("A. Vaswani", "N. Shazeer"), "2017-06-12", "cs.CL"),
    Paper("1810.04805v2", "BERT: Pre-training of Deep Bidirectional Transformers",
          "Masked language model pretraining of transformers for language understanding.", 2018, ("J. Devlin",),
          "2018-10-11", "cs.CL"),
    Paper("ARXIV:2005.14165", "Language Models are Few-Shot Learners", "GPT-3 shows in-context learning at scale.",
          2020, ("T. Brown",), "2020-05-28", "cs.CL"),
    Paper("cs/0112017", "An Old Paper on Parsing", "Statistical parsing with probabilistic grammars.", 2001,
          ("E. Charniak",), "2001-12-10", "cs.CL"),
    Paper("solv-int/9901001v3", "Solitons in Integrable Systems", "Soliton solutions of integrable equations.",
          1999, ("M. Ablowitz",), "1999-01-05", "nlin.SI"),
    Paper("1409.0473", "Neural Machine Translation by Jointly Learning to Align and Translate", "", 2014,
          ("D. Bahdanau",), "2014-09-01", "cs.CL"),  # no abstract: an expand drops it
    Paper("1706.03762v5", "A duplicate record", "ignored", 2017, (), "2017-06-12"),  # the first record wins
    Paper("not-an-id", "Bad", "bad id"),
]
EDGES = [
    ("1810.04805", "1706.03762"),
    ("2005.14165", "1706.03762"),
    ("2005.14165", "1810.04805v1"),
    ("1706.03762", "1409.0473"),
    ("1706.03762", "cs/0112017"),
    ("1810.04805", "9999.99999"),  # an end outside the database: dropped
    ("1810.04805", "1810.04805"),  # a self-citation: dropped
    ("2005.14165", "1706.03762"),  # a repeat: kept once
]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2309.06180", "2309.06180"),
        ("2309.06180v2", "2309.06180"),
        ("ARXIV:2309.06180", "2309.06180"),
        ("arXiv:2309.06180v1", "2309.06180"),
        ("  1409.0473 ", "1409.0473"),
        ("cs/0112017", "cs/0112017"),
        ("math.GT/0309136v2", "math.GT/0309136"),
        ("solv-int/9901001", "solv-int/9901001"),
        ("ARXIV:solv-int/9901001v1", "solv-int/9901001"),
        ("https://arxiv.org/abs/2309.06180v3", "2309.06180"),
        ("https://arxiv.org/pdf/2309.06180.pdf", "2309.06180"),
        ("URL:https://arxiv.org/abs/cs/0112017", "cs/0112017"),
        ("2309.061", None),
        ("23.06180", None),
        ("CorpusId:12345", None),
        ("", None),
        (None, None),
        (42, None),
        ("2309.06180" * 100, None),
    ],
)
def test_normalize_arxiv_id(text, expected):
    assert normalize_arxiv_id(text) == expected


def test_strip_version_keeps_old_style_ids_whole():
    assert strip_version("solv-int/9901001v2") == "solv-int/9901001"  # CAPO's split("v") would cut at "sol"
    assert strip_version("1803.00316v1") == "1803.00316"


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("papers") / "papers.sqlite"
    report = build_database(path, PAPERS, EDGES, meta={"source": "test"})
    assert (report.papers, report.duplicate_papers, report.bad_ids) == (6, 1, 1)
    assert (report.edges, report.edges_dropped) == (5, 2)
    assert not path.with_name(path.name + ".building").exists()
    return path


@pytest.fixture
def db(db_path):
    with PaperDB(db_path) as database:
        yield database


def test_lookup_accepts_every_id_form(db):
    assert len(db) == 6 and db.meta()["source"] == "test" and db.meta()["edges"] == "5"
    for spelling in ("1706.03762", "1706.03762v7", "ARXIV:1706.03762", "arXiv:1706.03762v1",
                     "https://arxiv.org/abs/1706.03762"):
        assert db.get(spelling).title == "Attention Is All You Need"
    assert db.get("ARXIV:2005.14165").authors == ("T. Brown",)
    assert db.get("solv-int/9901001").year == 1999
    assert db.get("cs/0112017v1").date == "2001-12-10"
    assert db.get("9999.99999") is None and db.get("garbage") is None and db.get("") is None


def test_search_ranks_by_bm25_with_the_title_first(db):
    hits = db.search("transformers attention")
    assert hits[0].arxiv_id in {"1706.03762", "1810.04805"}
    assert {h.arxiv_id for h in hits} >= {"1706.03762", "1810.04805"}
    assert db.search("soliton")[0].arxiv_id == "solv-int/9901001"
    assert db.search("the of and") == []  # stop words only
    assert [h.arxiv_id for h in db.search("transformers attention", limit=1, offset=1)] == [hits[1].arxiv_id]
    assert db.search_total("transformers attention") == len(hits)


def test_search_honours_a_date_cutoff(db):
    assert {h.arxiv_id for h in db.search("language", max_date="2019-01-01")} == {"1810.04805"}


@pytest.mark.parametrize("query", ['"', 'a" OR "b', "NEAR(x y)", "title:bert", "*", "^bert", "AND OR NOT", "(",
                                   "\x00", "\ud800", "x" * 10_000, "ünïcödé 中文"])
def test_search_never_breaks_on_fts_syntax(db, query):
    assert isinstance(db.search(query), list)


def test_fts_query_quotes_every_word_and_caps_length():
    assert fts_query('Which "BERT" papers?') == '"bert" OR "papers"'
    assert fts_query(" ".join(f"w{i}" for i in range(100))).count(" OR ") == 31


def test_citations_and_references_newest_first(db):
    assert [p.arxiv_id for p in db.citations("1706.03762")] == ["2005.14165", "1810.04805"]
    assert [p.arxiv_id for p in db.citations("1706.03762", limit=1)] == ["2005.14165"]
    assert [p.arxiv_id for p in db.citations("1706.03762", limit=1, offset=1)] == ["1810.04805"]
    assert [p.arxiv_id for p in db.references("2005.14165")] == ["1810.04805", "1706.03762"]
    assert [p.arxiv_id for p in db.references("ARXIV:1706.03762v2")] == ["1409.0473", "cs/0112017"]
    assert db.count_links("1706.03762", "citations") == 2 and db.count_links("1706.03762", "references") == 2
    assert db.count_links("1706.03762", "citations", max_date="2019-01-01") == 1
    assert db.citations("9999.99999") == [] and db.references("nonsense") == []


def test_expand_drops_papers_without_abstracts_and_caps_each_side(db):
    expanded = [p.arxiv_id for p in db.expand("1706.03762")]
    assert expanded == ["2005.14165", "1810.04805", "cs/0112017"]  # 1409.0473 has no abstract
    assert [p.arxiv_id for p in db.expand("1706.03762", citations_limit=1, references_limit=1)] == ["2005.14165"]


def test_in_memory_database_and_threads(db_path):
    memory = PaperDB.from_records(PAPERS, EDGES, source="memory")
    assert len(memory) == 6 and memory.meta()["source"] == "memory"
    file_db = PaperDB(db_path)
    errors = []

    def work():
        try:
            for _ in range(50):
                assert memory.get("1706.03762") and file_db.search("transformers")
                assert len(file_db.citations("1706.03762")) == 2
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    memory.close()
    file_db.close()


def test_file_database_is_opened_read_only(db_path):
    db = PaperDB(db_path)
    with pytest.raises(sqlite3.OperationalError):
        db._rows("DELETE FROM papers")
    db.close()
    with pytest.raises(FileNotFoundError):
        PaperDB(db_path.with_name("missing.sqlite"))


def test_rebuild_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "p.sqlite"
    build_database(path, PAPERS[:2])
    build_database(path, PAPERS[:3])
    assert len(PaperDB(path)) == 3


def test_common_words_are_dropped_past_the_postings_budget(db, monkeypatch):
    import capo_envs.papers.db as dbmod

    # "transformers" is in 2 papers, "attention" in 1, "soliton" in 1; a budget of 2 postings keeps the rarest.
    assert db.match_expression("transformers attention soliton") == '"transformers" OR "attention" OR "soliton"'
    monkeypatch.setattr(dbmod, "MAX_POSTINGS", 2)
    assert db.match_expression("transformers attention soliton") == '"attention" OR "soliton"'
    assert db.match_expression("transformers") == '"transformers"'  # one word is always kept
    monkeypatch.setattr(dbmod, "MAX_POSTINGS", 1)
    assert db.match_expression("zzzunknown transformers") == '"zzzunknown"'  # unknown words cost nothing
    assert db._document_frequency("transformers") == 2  # porter-stemmed as FTS5 stems ("transform")


def test_date_cutoff_falls_back_when_the_window_is_too_small(tmp_path, monkeypatch):
    import capo_envs.papers.db as dbmod

    papers = [Paper(f"2101.{i:05d}", f"Graph paper {i}", "graph graph graph", 2021, (), "2021-01-01") for i in range(30)]
    papers += [Paper(f"1501.{i:05d}", f"Old graph {i}", "graph", 2015, (), "2015-01-01") for i in range(3)]
    path = tmp_path / "g.sqlite"
    build_database(path, papers)
    monkeypatch.setattr(dbmod, "DATE_WINDOW", 1)
    with PaperDB(path) as db:
        # The 30 newer papers outrank the old ones; a window of 10 holds none of the old: the full join runs.
        assert {p.arxiv_id for p in db.search("graph", 10, max_date="2016-01-01")} == {f"1501.{i:05d}" for i in range(3)}
        assert len(db.search("graph", 10)) == 10 and db.search("graph", 5, offset=30)[0].arxiv_id.startswith("1501")


def test_edge_order_by_rowid_equals_newest_first_then_id(tmp_path):
    import random

    rng = random.Random(0)
    papers = [Paper(f"2{rng.randint(0, 4)}01.{i:05d}", f"P{i}", "a", 2020, (), f"202{rng.randint(0, 3)}-01-0{rng.randint(1, 3)}")
              for i in range(60)]
    hub = Paper("1901.00001", "Hub", "h", 2019, (), "2019-01-01")
    edges = [(p.arxiv_id, hub.arxiv_id) for p in papers] + [(hub.arxiv_id, p.arxiv_id) for p in papers[:5]]
    build_database(tmp_path / "e.sqlite", [*reversed(papers), hub], edges)
    with PaperDB(tmp_path / "e.sqlite") as db:
        fast = [p.arxiv_id for p in db.citations(hub.arxiv_id, 100)]
        db._by_date = False  # the explicit sort, as for a database without the rowid order
        slow = [p.arxiv_id for p in db.citations(hub.arxiv_id, 100)]
        dates = {p.arxiv_id: p.date for p in papers}
        assert fast == slow == sorted(dates, key=lambda i: (tuple(-ord(c) for c in dates[i]), i))
        assert db.meta()["rowid_order"] == "date"
