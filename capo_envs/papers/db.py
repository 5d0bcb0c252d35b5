"""The local paper database: SQLite with an FTS5 full-text index over papers and a citation-edge table.

Layout (one file):

* ``papers(rowid, arxiv_id UNIQUE, title, abstract, year, date, authors JSON, categories)``;
* ``papers_fts``: FTS5 over ``title`` and ``abstract`` (external content, so the text is stored once;
  porter stemming), ranked by BM25 with the title weighted twice, the way Lewen's ``paper_fts_combined``
  searches ``title || abstract``;
* ``edges(citing, cited)`` on rowids, a ``WITHOUT ROWID`` table keyed both ways (citations and references
  are each one index range scan);
* ``meta(key, value)``: what built it.

Ordering of citations and references: newest first, then by id. Lewen orders by the S2 dataset's citation
id (stable but arbitrary); the order matters because an expand shows at most 30 citations (the CAPO
client's cap), so it is fixed and documented here.

Search: the query's words (stop words dropped) are OR-ed, so that a natural-language query ranks papers by
how many of its rarer words they hold, as a web search engine would; an AND query of a whole question
would match nothing.

Search rankers (``PaperDB(ranker=...)``): ``"fts5"`` ranks inside SQLite (the ``papers_fts``
table); ``"bm25"`` ranks with the project's BM25 over title and abstract (``search.py``: about 1-2 ms a
search at 1M papers where FTS5 takes 80-100 ms), SQLite keeping metadata, dates and edges;
``"auto"`` (the default) uses FTS5 below ``search.BM25_MIN_PAPERS`` papers for a file (20k; fast there,
and nothing to build; the BM25 index is saved beside the file) or ``BM25_MIN_PAPERS_IN_MEMORY`` for an
in-memory database (200k: its index is built in each process, shared by equal databases), BM25 from there on. Both OR the same query words, return only papers holding one of them, break
ties by rowid (publication order) and apply a date cut-off exactly. ``papers_fts`` stays in every
database: the server's bulk search matches with it.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .ids import normalize_arxiv_id
from .search import BM25_MIN_PAPERS, BM25_MIN_PAPERS_IN_MEMORY, RANKERS, LazyIndex

SCHEMA_VERSION = 1
TITLE_WEIGHT, ABSTRACT_WEIGHT = 2.0, 1.0
MAX_QUERY_TERMS = 32  # a query longer than this is cut: FTS5 cost grows with every OR-ed term
# A search ranks every paper that holds any of its words, so a common word ("study", "image") would make
# each search rank a large share of the index. Words are taken rarest first until their document
# frequencies add up to this many postings (the rarest word is always kept): the common words dropped
# carry the least BM25 weight. In a small database (under about 100k papers) nothing is dropped
# (benchmarks/bench_papers.py).
MAX_POSTINGS = 100_000
DF_CACHE_SIZE = 100_000
DATE_WINDOW = 5  # a search with a date cut-off first ranks 5x the page and filters it by date
SEARCH_WINDOW = 1_000  # Semantic Scholar's relevance search returns at most 1,000 results in all

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers how i if in into is it its itself just me more most my no nor not now of off on
    once only or other our out over own same she should so some such than that the their them then there
    these they this those through to too under until up very was we were what when where which while who
    whom why will with would you your""".split()
)
_WORD = re.compile(r"\w+")

_SCHEMA = """
CREATE TABLE papers (
    rowid INTEGER PRIMARY KEY,
    arxiv_id TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    abstract TEXT NOT NULL DEFAULT '',
    year INTEGER,
    date TEXT NOT NULL DEFAULT '',
    authors TEXT NOT NULL DEFAULT '[]',
    categories TEXT NOT NULL DEFAULT ''
);
CREATE TABLE edges (citing INTEGER NOT NULL, cited INTEGER NOT NULL, PRIMARY KEY (citing, cited)) WITHOUT ROWID;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_INDEXES = """
CREATE INDEX edges_by_cited ON edges (cited, citing);
CREATE VIRTUAL TABLE papers_fts USING fts5(
    title, abstract, content='papers', content_rowid='rowid', tokenize='porter unicode61'
);
INSERT INTO papers_fts (papers_fts) VALUES ('rebuild');
CREATE VIRTUAL TABLE papers_vocab USING fts5vocab(papers_fts, 'row');
"""
_COLUMNS = "p.arxiv_id, p.title, p.abstract, p.year, p.date, p.authors, p.categories"


@dataclass(frozen=True)
class Paper:
    """One paper. ``date`` is ISO ``YYYY-MM-DD`` (or "" when unknown); ``abstract`` may be ""."""

    arxiv_id: str
    title: str
    abstract: str = ""
    year: int | None = None
    authors: tuple[str, ...] = ()
    date: str = ""
    categories: str = ""


@dataclass
class BuildReport:
    papers: int = 0
    duplicate_papers: int = 0
    bad_ids: int = 0
    edges: int = 0
    edges_dropped: int = 0  # an end not in the database, or a self-citation
    meta: dict[str, str] = field(default_factory=dict)


def query_words(text: str) -> list[str]:
    """The distinct words of ``text`` in order, lower-cased, stop words dropped, at most MAX_QUERY_TERMS."""
    words: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word not in STOP_WORDS and word not in words and word.strip("_"):
            words.append(word)
        if len(words) >= MAX_QUERY_TERMS:
            break
    return words


def fts_query(text: str) -> str | None:
    """An FTS5 query OR-ing the words of ``text`` (stop words dropped, each word quoted so that no FTS5
    syntax can be injected); None when no word is left."""
    return _or_expression(query_words(text))


def _or_expression(words: list[str]) -> str | None:
    return " OR ".join(f'"{w}"' for w in words) if words else None


@lru_cache(maxsize=1)
def _stemmer():
    """The Porter stemmer FTS5's ``porter`` tokenizer applies (PyStemmer's "porter" is the same algorithm)."""
    import Stemmer

    return Stemmer.Stemmer("porter")


def _row_to_paper(row: Sequence) -> Paper:
    arxiv_id, title, abstract, year, date, authors, categories = row
    return Paper(arxiv_id, title, abstract or "", year, tuple(json.loads(authors or "[]")), date or "", categories or "")


def build_database(
    path: str | Path,
    papers: Iterable[Paper],
    edges: Iterable[tuple[str, str]] = (),
    *,
    meta: dict[str, str] | None = None,
) -> BuildReport:
    """Write a database at ``path`` from paper records and ``(citing, cited)`` arXiv-id pairs.

    Ids are normalised (a version suffix or an ``ARXIV:`` prefix is dropped); a repeated id keeps its
    first record; an edge whose ends are not both in the database is dropped (and counted), as Lewen keeps
    only edges inside its corpus. The file is written under a temporary name and renamed when complete,
    so an interrupted build leaves no half-built database. ``":memory:"`` builds nothing on disk; use
    :meth:`PaperDB.from_records` for that.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".building")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    try:
        report = _fill(conn, papers, edges, meta)
        conn.commit()
    finally:
        conn.close()
    os.replace(tmp, path)
    return report


def _fill(conn: sqlite3.Connection, papers: Iterable[Paper], edges: Iterable[tuple[str, str]], meta) -> BuildReport:
    conn.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-262144;")
    conn.executescript(_SCHEMA)
    report = BuildReport()
    rowids: dict[str, int] = {}

    # Rowids follow publication order (date, then arXiv id descending among equal dates), so that "newest
    # first, then by id" is a backward scan of an edge index: an expand of a paper cited 27,000 times reads
    # 30 index entries instead of sorting 27,000 joined rows.
    kept: dict[str, Paper] = {}
    for paper in papers:
        arxiv_id = normalize_arxiv_id(paper.arxiv_id)
        if arxiv_id is None:
            report.bad_ids += 1
        elif arxiv_id in kept:
            report.duplicate_papers += 1
        else:
            kept[arxiv_id] = paper
    order = sorted(kept, reverse=True)
    order.sort(key=lambda i: kept[i].date or "")  # stable: equal dates keep the id-descending order
    for arxiv_id in order:
        rowids[arxiv_id] = len(rowids) + 1

    def paper_rows() -> Iterator[tuple]:
        for arxiv_id in order:
            paper = kept[arxiv_id]
            yield (rowids[arxiv_id], arxiv_id, paper.title, paper.abstract or "", paper.year, paper.date or "",
                   json.dumps(list(paper.authors), ensure_ascii=False), paper.categories or "")

    conn.executemany("INSERT INTO papers VALUES (?, ?, ?, ?, ?, ?, ?, ?)", paper_rows())
    report.papers = len(rowids)
    del kept, order

    def edge_rows() -> Iterator[tuple[int, int]]:
        for citing, cited in edges:
            a = rowids.get(normalize_arxiv_id(citing) or "")
            b = rowids.get(normalize_arxiv_id(cited) or "")
            if a is None or b is None or a == b:
                report.edges_dropped += 1
                continue
            yield a, b

    conn.executemany("INSERT OR IGNORE INTO edges VALUES (?, ?)", edge_rows())
    report.edges = conn.execute("SELECT count(*) FROM edges").fetchone()[0]
    conn.executescript(_INDEXES)
    report.meta = {"schema_version": str(SCHEMA_VERSION), "papers": str(report.papers), "edges": str(report.edges),
                   "rowid_order": "date", **{k: str(v) for k, v in (meta or {}).items()}}
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", report.meta.items())
    return report


class PaperDB:
    """Read access to a paper database: lookup by any arXiv id spelling, search, citations, references.

    Safe to share between threads (the ``capo serve papers`` server): a file database gets one read-only
    connection per thread; an in-memory one (:meth:`from_records`) one connection behind a lock.
    """

    def __init__(self, path: str | Path, *, ranker: str = "auto", index_dir: str | Path | None = None):
        """``ranker``: ``"auto"``, ``"fts5"`` or ``"bm25"`` (module docstring); ``index_dir``: where the
        BM25 index is kept (default ``<path>.bm25`` beside the file; built there on the first BM25 search)."""
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no paper database at {self.path}")
        self._init_state(ranker)
        self.index_dir = Path(index_dir) if index_dir is not None else self.path.with_name(self.path.name + ".bm25")

    def _init_state(self, ranker: str) -> None:
        self._memory: sqlite3.Connection | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._size: int | None = None
        self._df: dict[str, int] = {}
        self._by_date: bool | None = None
        self.ranker = ranker
        self._bm25 = LazyIndex()

    @property
    def ranker(self) -> str:
        """What was asked for: ``"auto"``, ``"fts5"`` or ``"bm25"`` (settable); ``ranking`` is what ranks."""
        return self._ranker

    @ranker.setter
    def ranker(self, value: str) -> None:
        if value not in RANKERS:
            raise ValueError(f"ranker must be one of {RANKERS}, got {value!r}")
        self._ranker = value

    @property
    def ranking(self) -> str:
        """The ranker searches use: ``"fts5"`` or ``"bm25"`` (``"auto"`` decided by size)."""
        if self._ranker != "auto":
            return self._ranker
        threshold = BM25_MIN_PAPERS if self._memory is None else BM25_MIN_PAPERS_IN_MEMORY
        return "bm25" if len(self) >= threshold else "fts5"

    def bm25_index(self):
        """The BM25 index (``search.BM25PaperIndex``), loaded or built on first call."""
        return self._bm25.get(self, self.index_dir)

    @classmethod
    def from_records(cls, papers: Iterable[Paper], edges: Iterable[tuple[str, str]] = (), *,
                     ranker: str = "auto", **meta: str) -> PaperDB:
        """An in-memory database (nothing on disk), e.g. for a generated world; a BM25 index lives in memory."""
        db = cls.__new__(cls)
        db.path = Path(":memory:")
        db._init_state(ranker)
        db.index_dir = None
        db._memory = sqlite3.connect(":memory:", check_same_thread=False)
        _fill(db._memory, papers, edges, meta)
        db._memory.commit()
        return db

    # --- connections ---------------------------------------------------------------------------------
    def _rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        if self._memory is not None:
            with self._lock:
                return self._memory.execute(sql, params).fetchall()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            conn.execute("PRAGMA query_only=1")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn.execute(sql, params).fetchall()

    def close(self) -> None:
        self._bm25.close()
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
            if self._memory is not None:
                self._memory.close()
                self._memory = None
        self._local = threading.local()

    def __enter__(self) -> PaperDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- reads ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._size is None:
            self._size = self._rows("SELECT count(*) FROM papers")[0][0]
        return self._size

    def meta(self) -> dict[str, str]:
        return dict(self._rows("SELECT key, value FROM meta"))

    def _rowid_by_date(self) -> bool:
        """Whether rowids follow (date, id) order (every database this module builds; see ``_fill``)."""
        if self._by_date is None:
            self._by_date = self.meta().get("rowid_order") == "date"
        return self._by_date

    def _rowid(self, paper_id: str) -> int | None:
        arxiv_id = normalize_arxiv_id(paper_id)
        if arxiv_id is None:
            return None
        rows = self._rows("SELECT rowid FROM papers WHERE arxiv_id = ?", (arxiv_id,))
        return rows[0][0] if rows else None

    def get(self, paper_id: str) -> Paper | None:
        """The paper with this arXiv id in any accepted spelling (``ids.normalize_arxiv_id``), or None."""
        arxiv_id = normalize_arxiv_id(paper_id)
        if arxiv_id is None:
            return None
        rows = self._rows(f"SELECT {_COLUMNS} FROM papers p WHERE p.arxiv_id = ?", (arxiv_id,))
        return _row_to_paper(rows[0]) if rows else None

    def iter_papers(self, batch: int = 10_000) -> Iterator[Paper]:
        """Every paper in rowid order (for building another index over the database)."""
        last = 0
        while True:
            rows = self._rows(f"SELECT p.rowid, {_COLUMNS} FROM papers p WHERE p.rowid > ? ORDER BY p.rowid LIMIT ?",
                              (last, batch))
            if not rows:
                return
            for row in rows:
                yield _row_to_paper(row[1:])
            last = rows[-1][0]

    def _document_frequency(self, word: str) -> int:
        """How many papers hold ``word`` (after FTS5's porter stemming), from the fts5vocab table."""
        value = self._df.get(word)
        if value is None:
            stem = _stemmer().stemWord(word)
            try:
                rows = self._rows("SELECT doc FROM papers_vocab WHERE term = ?", (stem,))
            except sqlite3.OperationalError:  # a database built without the vocabulary table
                rows = []
            value = rows[0][0] if rows else 0
            if len(self._df) >= DF_CACHE_SIZE:
                self._df.clear()
            self._df[word] = value
        return value

    def match_expression(self, query: str) -> str | None:
        """The FTS5 expression a search runs: the query's words, rarest first up to MAX_POSTINGS."""
        words = query_words(query)
        if len(words) <= 1:
            return _or_expression(words)
        frequencies = {w: self._document_frequency(w) for w in words}
        kept, total = set(), 0
        for word in sorted(words, key=lambda w: frequencies[w]):
            if kept and total + frequencies[word] > MAX_POSTINGS:
                break
            kept.add(word)
            total += frequencies[word]
        return _or_expression([w for w in words if w in kept])

    def search(self, query: str, limit: int = 10, offset: int = 0, max_date: str | None = None) -> list[Paper]:
        """Papers ranked by BM25 for the words of ``query``; ``max_date`` (ISO) hides later papers.

        Ranking runs inside FTS5 alone and only the winners are joined with ``papers``: much faster than
        ranking the join (docs/envs/papers.md, "Measured"). With ``max_date``, a window DATE_WINDOW times larger
        is ranked and filtered by date; only when too few survive is the whole join ranked. With the BM25
        ranker (``ranking``), ``search.BM25PaperIndex.ranked`` ranks and SQLite reads the winners."""
        if self.ranking == "bm25":
            return self._search_bm25(query, limit, offset, max_date)
        match = self.match_expression(query)
        if match is None or limit <= 0:
            return []
        ranked = (f"SELECT rowid, bm25(papers_fts, {TITLE_WEIGHT}, {ABSTRACT_WEIGHT}) AS score FROM papers_fts "
                  f"WHERE papers_fts MATCH ? ORDER BY score, rowid LIMIT ?")
        if not max_date:
            sql = (f"SELECT {_COLUMNS} FROM ({ranked}) r JOIN papers p ON p.rowid = r.rowid "
                   f"ORDER BY r.score, r.rowid LIMIT ? OFFSET ?")
            return [_row_to_paper(r) for r in self._rows(sql, [match, offset + limit, limit, offset])]
        window = (offset + limit) * DATE_WINDOW
        sql = (f"SELECT {_COLUMNS} FROM ({ranked}) r JOIN papers p ON p.rowid = r.rowid "
               f"WHERE p.date <= ? ORDER BY r.score, r.rowid LIMIT ? OFFSET ?")
        rows = self._rows(sql, [match, window, max_date, limit, offset])
        if len(rows) < limit and self._rows("SELECT count(*) FROM (SELECT 1 FROM papers_fts WHERE papers_fts "
                                            "MATCH ? LIMIT ?)", [match, window + 1])[0][0] > window:
            sql = (f"SELECT {_COLUMNS} FROM papers_fts JOIN papers p ON p.rowid = papers_fts.rowid "
                   f"WHERE papers_fts MATCH ? AND p.date <= ? "
                   f"ORDER BY bm25(papers_fts, {TITLE_WEIGHT}, {ABSTRACT_WEIGHT}), p.rowid LIMIT ? OFFSET ?")
            rows = self._rows(sql, [match, max_date, limit, offset])
        return [_row_to_paper(r) for r in rows]

    def _search_bm25(self, query: str, limit: int, offset: int, max_date: str | None) -> list[Paper]:
        words = query_words(query)
        if not words or limit <= 0:
            return []
        rowids = self.bm25_index().ranked(words, offset + limit, max_date)[offset:]
        if not rowids:
            return []
        rows = self._rows(f"SELECT p.rowid, {_COLUMNS} FROM papers p WHERE p.rowid IN ({','.join('?' * len(rowids))})",
                          rowids)
        by_rowid = {r[0]: r[1:] for r in rows}
        return [_row_to_paper(by_rowid[r]) for r in rowids if r in by_rowid]

    def search_total(self, query: str, max_date: str | None = None, cap: int = SEARCH_WINDOW) -> int:
        """How many papers ``search`` can return, counted up to ``cap``."""
        if self.ranking == "bm25":
            words = query_words(query)
            return len(self.bm25_index().ranked(words, cap, max_date)) if words and cap > 0 else 0
        match = self.match_expression(query)
        if match is None:
            return 0
        if not max_date:
            return self._rows("SELECT count(*) FROM (SELECT 1 FROM papers_fts WHERE papers_fts MATCH ? LIMIT ?)",
                              [match, cap])[0][0]
        sql = ("SELECT count(*) FROM (SELECT 1 FROM papers_fts JOIN papers p ON p.rowid = papers_fts.rowid "
               "WHERE papers_fts MATCH ? AND p.date <= ? LIMIT ?)")
        return self._rows(sql, [match, max_date, cap])[0][0]

    def _linked(self, paper_id: str, direction: str, limit: int, offset: int, max_date: str | None) -> list[Paper]:
        rowid = self._rowid(paper_id)
        if rowid is None or limit <= 0:
            return []
        # citations: papers whose edge cites this one; references: papers this one cites
        this, other = ("cited", "citing") if direction == "citations" else ("citing", "cited")
        date_filter, params = ("AND p.date <= ?", [max_date]) if max_date else ("", [])
        order = f"e.{other} DESC" if self._rowid_by_date() else "p.date DESC, p.arxiv_id"
        sql = (f"SELECT {_COLUMNS} FROM edges e JOIN papers p ON p.rowid = e.{other} "
               f"WHERE e.{this} = ? {date_filter} ORDER BY {order} LIMIT ? OFFSET ?")
        return [_row_to_paper(r) for r in self._rows(sql, [rowid, *params, limit, offset])]

    def citations(self, paper_id: str, limit: int = 30, offset: int = 0, max_date: str | None = None) -> list[Paper]:
        """Papers that cite ``paper_id``, newest first."""
        return self._linked(paper_id, "citations", limit, offset, max_date)

    def references(self, paper_id: str, limit: int = 99, offset: int = 0, max_date: str | None = None) -> list[Paper]:
        """Papers that ``paper_id`` cites, newest first."""
        return self._linked(paper_id, "references", limit, offset, max_date)

    def count_links(self, paper_id: str, direction: str, max_date: str | None = None) -> int:
        rowid = self._rowid(paper_id)
        if rowid is None:
            return 0
        this, other = ("cited", "citing") if direction == "citations" else ("citing", "cited")
        if not max_date:
            return self._rows(f"SELECT count(*) FROM edges WHERE {this} = ?", (rowid,))[0][0]
        sql = f"SELECT count(*) FROM edges e JOIN papers p ON p.rowid = e.{other} WHERE e.{this} = ? AND p.date <= ?"
        return self._rows(sql, (rowid, max_date))[0][0]

    def expand(
        self, paper_id: str, citations_limit: int = 30, references_limit: int = 99, max_date: str | None = None
    ) -> list[Paper]:
        """What an expand shows (the CAPO flow): citations then references, at most ``citations_limit`` and
        ``references_limit`` of each, without the paper itself, repeats, or papers without an abstract."""
        seen = {normalize_arxiv_id(paper_id)}
        out = []
        linked = self.citations(paper_id, citations_limit, max_date=max_date)
        linked += self.references(paper_id, references_limit, max_date=max_date)
        for paper in linked:
            if paper.arxiv_id in seen or not paper.abstract.strip():
                continue
            seen.add(paper.arxiv_id)
            out.append(paper)
        return out
