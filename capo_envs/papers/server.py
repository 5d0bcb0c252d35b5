"""``capo serve papers``: a paper database behind the Semantic Scholar Graph API's routes, on 127.0.0.1.

Routes (each also without the ``/graph/v1`` prefix, as the CAPO authors' client and Lewen call them):

* ``GET /paper/search`` (relevance: ``query``, ``offset``, ``limit`` <= 100, at most 1,000 results) ->
  ``{"total", "offset", "next"?, "data": [paper]}``;
* ``GET /paper/search/bulk`` (``query`` in S2's boolean syntax, optional; ``sort``; ``token``) ->
  ``{"total", "token"?, "data"}``, 1,000 papers a page;
* ``GET /paper/search/match`` -> ``{"data": [paper + matchScore]}`` or 404 "Title match not found";
* ``GET /paper/autocomplete?query=`` -> ``{"matches": [{"id", "title", "authorsYear"}]}``;
* ``GET /paper/{id}``, ``POST /paper/batch`` (``{"ids": [...]}``, <= 500; ``null`` for an unknown id);
* ``GET /paper/{id}/citations``, ``/references`` (``{"offset", "next"?, "total", "data": [{"citingPaper" |
  "citedPaper": paper, "contexts", ...}]}``) and ``/authors``;
* ``GET /author/{id}``, ``/author/{id}/papers``, ``/author/search``, ``POST /author/batch`` (<= 1000).

Search filters (relevance, bulk, match): ``year`` (2019, 2016-2020, 2016-, -2015), ``publicationDateOrYear``,
``minCitationCount``, ``fieldsOfStudy``, ``venue``, ``openAccessPdf``, ``publicationTypes``.

``{id}``: an arXiv id in any form (bare, versioned, old style ``cs/0112017``, ``ARXIV:``, an arxiv.org link
with or without ``URL:``), ``CorpusId:<n>`` (the database's row id) or ``DOI:10.48550/arXiv.<id>``.
``paperId`` is the bare arXiv id; ``externalIds`` holds ``ArXiv``, arXiv's ``DOI`` and ``CorpusId``.
``fields`` takes every field the Graph API documents (s2fields.py), nested ones included; what the
database has no data for comes back empty as S2 answers it (null, [] or {}). Counts (citationCount,
referenceCount, an author's paperCount, citationCount, hIndex) count what is inside this database.
Errors: ``{"error", "detail"}`` (S2's key and FastAPI's); 404 for an unknown id, 400 for a bad parameter.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sqlite3
import sys
import threading
from http import HTTPStatus
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

from ..core.http import JSONHandler, JSONServer, RequestError, brief, json_object, serve_until_interrupted
from .authors import AuthorIndex, clean_name
from .db import _COLUMNS, SEARCH_WINDOW, Paper, PaperDB, _row_to_paper
from .ids import normalize_arxiv_id
from .s2objects import author_object, by_rowid, paper_object
from .s2params import WORD, Filters, authors_year, bulk_offset, bulk_token, date_bounds, int_param, title_key
from .s2fields import DEFAULT_PAPER, LINK_FIELDS, Fields, bulk_match, parse_fields

DEFAULT_PORT = 4000  # Lewen's port, the CAPO client's default base URL
MAX_SEARCH_LIMIT, MAX_LINK_LIMIT, MAX_BATCH, MAX_AUTHOR_BATCH = 100, 1000, 500, 1000
BULK_PAGE = 1000  # S2: "Up to 1,000 papers will be returned in each call"
BULK_MAX = 10_000_000
AUTOCOMPLETE_LIMIT, AUTOCOMPLETE_CHARS = 10, 100
MATCH_CANDIDATES, MATCH_THRESHOLD = 50, 0.6
_ARXIV_DOI = re.compile(r"^(?:(?:https?://)?(?:dx\.)?doi\.org/)?10\.48550/arxiv\.(.+)$", re.IGNORECASE)
BULK_SORTS = {"paperId": "p.arxiv_id", "publicationDate": "p.date",
              "citationCount": "(SELECT count(*) FROM edges e WHERE e.cited = p.rowid)"}


class PaperHandler(JSONHandler):
    server: "PaperServer"

    def error_payload(self, status: HTTPStatus, message: str) -> dict:
        return {"error": message, "detail": message}

    def do_GET(self) -> None:
        self._answer(self._route_get)

    def do_POST(self) -> None:
        self._answer(self._route_post)

    def _answer(self, route: Callable[[], Any]) -> None:
        try:
            payload = route()
        except RequestError as e:
            self._reject(e)
            return
        except sqlite3.OperationalError as e:  # a query FTS5 refuses (it should not get one): the client's
            self._reject(RequestError(HTTPStatus.BAD_REQUEST, f"cannot run this query: {brief(str(e))}"))
            return
        self._send_json(HTTPStatus.OK, payload)

    @property
    def db(self) -> PaperDB:
        return self.server.db

    @property
    def authors(self) -> AuthorIndex:
        return self.server.authors

    # --- routing ------------------------------------------------------------------------------------------
    def _api_path(self) -> str:
        path = urlsplit(self.path).path
        if path.startswith("/graph/v1/"):
            path = path[len("/graph/v1") :]
        return path.rstrip("/") or "/"

    def _params(self) -> dict[str, str]:
        try:
            query = parse_qs(urlsplit(self.path).query, keep_blank_values=True, strict_parsing=False,
                             errors="strict", max_num_fields=64)
        except (ValueError, UnicodeDecodeError):
            raise RequestError(HTTPStatus.BAD_REQUEST, "malformed query string") from None
        return {k: v[-1] for k, v in query.items()}

    def _route_get(self) -> Any:
        path, params = self._api_path(), self._params()
        if path in ("/", "/healthz"):
            return {"status": "ok", "papers": len(self.db)}
        searches = {"/paper/search": self._search, "/paper/search/bulk": self._bulk,
                    "/paper/search/match": self._match, "/paper/autocomplete": self._autocomplete,
                    "/author/search": self._author_search}
        if path in searches:
            return searches[path](params)
        if path.startswith("/paper/"):
            rest = path[len("/paper/") :]
            for direction, key in (("citations", "citingPaper"), ("references", "citedPaper")):
                if rest.endswith("/" + direction):
                    return self._links(unquote(rest[: -len(direction) - 1]), direction, key, params)
            if rest.endswith("/authors"):
                return self._paper_authors(self._lookup(unquote(rest[: -len("/authors")])), params)
            return paper_object(self.db, self.authors, self._lookup(unquote(rest)), parse_fields(params.get("fields")))
        if path.startswith("/author/"):
            rest = unquote(path[len("/author/") :])
            if rest.endswith("/papers"):
                return self._author_papers(self._author(rest[: -len("/papers")]), params)
            return author_object(self.db, self.authors, self._author(rest), parse_fields(params.get("fields"), "author"))
        raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: {brief(path)}")

    def _route_post(self) -> Any:
        path = self._api_path()
        if path not in ("/paper/batch", "/author/batch"):
            raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {brief(path)}")
        papers = path == "/paper/batch"
        limit = MAX_BATCH if papers else MAX_AUTHOR_BATCH
        kind = "paper" if papers else "author"
        fields = parse_fields(self._params().get("fields"), kind)
        request = json_object(self._read_body())
        ids = request.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > limit:
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"ids" must be a list of at most {limit} strings')
        if papers:
            found = [self._resolve(i) for i in ids]
            return [paper_object(self.db, self.authors, p, fields) if p else None for p in found]
        found_authors = [self.authors.lookup(i) if i.strip().isdigit() else None for i in ids]
        return [author_object(self.db, self.authors, k, fields) if k is not None else None for k in found_authors]

    # --- ids ----------------------------------------------------------------------------------------------
    def _resolve(self, raw_id: str) -> Paper | None:
        text = raw_id.strip()
        lower = text.lower()
        if lower.startswith("corpusid:"):
            number = text[len("corpusid:") :].strip()
            if not (number.isascii() and number.isdigit() and len(number) <= 18):
                return None
            found = by_rowid(self.db, [int(number)])
            return found[0] if found else None
        if lower.startswith("doi:") or (lower.startswith("url:") and "doi.org/" in lower):
            match = _ARXIV_DOI.match(text.split(":", 1)[1].strip())
            return self.db.get(match.group(1)) if match else None
        return self.db.get(text) if normalize_arxiv_id(text) else None

    def _lookup(self, raw_id: str) -> Paper:
        paper = self._resolve(raw_id)
        if paper is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Paper with id {brief(raw_id)} not found")
        return paper

    def _author(self, raw_id: str) -> int:
        text = raw_id.strip()
        k = self.authors.lookup(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None
        if k is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Author with id {brief(raw_id)} not found")
        return k

    # --- paper searches -----------------------------------------------------------------------------------
    def _query(self, params: dict[str, str], required: bool = True) -> str:
        query = params.get("query", "").strip()
        if required and not query:
            raise RequestError(HTTPStatus.BAD_REQUEST, "query is required")
        return query

    def _search(self, params: dict[str, str]) -> dict:
        query = self._query(params)
        offset = int_param(params, "offset", 0, 0, SEARCH_WINDOW - 1)
        limit = int_param(params, "limit", 100, 1, MAX_SEARCH_LIMIT)
        if offset + limit > SEARCH_WINDOW:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"offset + limit must be at most {SEARCH_WINDOW}")
        fields = parse_fields(params.get("fields"))
        filters = Filters.from_params(params)
        db = self.db
        if filters.drops_all:
            hits, total = [], 0
        elif not filters.needs_post_filter:
            hits = db.search(query, limit + 1, offset, max_date=filters.high)
            total = db.search_total(query, max_date=filters.high)
        else:  # rarer filters: filter the ranked window
            window = [p for p in db.search(query, SEARCH_WINDOW, 0, max_date=filters.high) if filters.accepts(p, db)]
            hits, total = window[offset : offset + limit + 1], len(window)
        payload: dict[str, Any] = {"total": total, "offset": offset}
        if len(hits) > limit:
            payload["next"] = offset + limit
        payload["data"] = [paper_object(self.db, self.authors, p, fields) for p in hits[:limit]]
        return payload

    def _bulk(self, params: dict[str, str]) -> dict:
        """S2's bulk retrieval: every matching paper (no relevance ranking), sorted, 1,000 a page. ``limit``
        and ``offset`` are ignored, as S2 does (the semanticscholar client sends them)."""
        fields = parse_fields(params.get("fields"))
        filters = Filters.from_params(params)
        positive, negative = bulk_match(self._query(params, required=False))
        raw_sort = params.get("sort", "").strip() or "paperId:asc"
        name, _, order = raw_sort.partition(":")
        order = order.strip().lower() or "asc"
        if name.strip() not in BULK_SORTS or order not in ("asc", "desc"):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"sort must be paperId, publicationDate or citationCount, "
                                                       f"optionally :asc or :desc, got {brief(raw_sort)}")
        offset = bulk_offset(params["token"]) if params.get("token", "").strip() else 0
        where, args = filters.sql()
        if positive:
            where.insert(0, "p.rowid IN (SELECT rowid FROM papers_fts WHERE papers_fts MATCH ?)")
            args.insert(0, positive)
        if negative:
            where.append("p.rowid NOT IN (SELECT rowid FROM papers_fts WHERE papers_fts MATCH ?)")
            args.append(negative)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        total = self.db._rows(f"SELECT count(*) FROM papers p{clause}", args)[0][0]
        direction = order.upper()
        order_by = f"{BULK_SORTS[name.strip()]} {direction}, p.arxiv_id {direction}"
        rows = self.db._rows(f"SELECT {_COLUMNS} FROM papers p{clause} ORDER BY {order_by} LIMIT ? OFFSET ?",
                             [*args, BULK_PAGE, offset])
        payload: dict[str, Any] = {"total": total}
        if offset + len(rows) < min(total, BULK_MAX):
            payload["token"] = bulk_token(offset + len(rows))
        payload["data"] = [paper_object(self.db, self.authors, _row_to_paper(r), fields) for r in rows]
        return payload

    def _match(self, params: dict[str, str]) -> dict:
        query = self._query(params)
        fields = parse_fields(params.get("fields"))
        filters = Filters.from_params(params)
        if filters.drops_all:
            candidates = []
        else:
            candidates = [p for p in self.db.search(query, MATCH_CANDIDATES, max_date=filters.high)
                          if filters.accepts(p, self.db)]
        wanted = title_key(query)
        best, best_score = None, 0.0
        for paper in candidates:
            score = difflib.SequenceMatcher(None, wanted, title_key(paper.title), autojunk=False).ratio()
            if score > best_score:
                best, best_score = paper, score
        if best is None or best_score < MATCH_THRESHOLD:
            raise RequestError(HTTPStatus.NOT_FOUND, "Title match not found")
        out = paper_object(self.db, self.authors, best, fields)
        out["matchScore"] = round(best_score * 100, 4)
        return {"data": [out]}

    def _autocomplete(self, params: dict[str, str]) -> dict:
        """Titles holding the query's words, the last one as the start of a word (S2: "return minimal
        information about papers matching a partial query")."""
        query = self._query(params)[:AUTOCOMPLETE_CHARS]
        words = WORD.findall(query.lower())
        if not words:
            return {"matches": []}
        *complete, last = words[-16:]
        if query[-1:].isspace():  # "attention " : the last word is complete too
            complete, last = complete + [last], ""
        found: list[Paper] = []
        # The index holds Porter stems ("semantic" -> "semant"): a prefix query for "semanti" would miss it,
        # so FTS5 gets a shorter prefix and the titles are checked for the real one.
        for cut in ([max(3, len(last) - 3)] if len(last) > 3 else []) + [min(3, len(last))]:
            terms = [f'"{w}"' for w in complete] + ([f'"{last[:cut]}"*'] if last else [])
            if not terms:
                break
            expr = "{title} : (" + " AND ".join(terms) + ")"
            rows = self.db._rows(
                f"SELECT {_COLUMNS} FROM (SELECT rowid, rank FROM papers_fts WHERE papers_fts MATCH ? "
                "ORDER BY rank LIMIT 200) r JOIN papers p ON p.rowid = r.rowid ORDER BY r.rank", [expr])
            for row in rows:
                paper = _row_to_paper(row)
                title_words = WORD.findall(paper.title.lower())
                if not last or any(w.startswith(last) for w in title_words):
                    found.append(paper)
                if len(found) >= AUTOCOMPLETE_LIMIT:
                    break
            if found:
                break
        return {"matches": [{"id": p.arxiv_id, "title": p.title, "authorsYear": authors_year(p)} for p in found]}

    # --- links ---------------------------------------------------------------------------------------------
    def _links(self, raw_id: str, direction: str, key: str, params: dict[str, str]) -> dict:
        paper = self._lookup(raw_id)
        offset = int_param(params, "offset", 0, 0, 10**7)
        limit = int_param(params, "limit", 100, 1, MAX_LINK_LIMIT)
        fields = parse_fields(params.get("fields"), "link")
        _, high = date_bounds(params)
        db = self.db
        fetch: Callable[..., list[Paper]] = db.citations if direction == "citations" else db.references
        linked = fetch(paper.arxiv_id, limit + 1, offset, max_date=high)
        payload: dict[str, Any] = {"offset": offset}
        if len(linked) > limit:
            payload["next"] = offset + limit
        payload["total"] = db.count_links(paper.arxiv_id, direction, max_date=high)
        paper_fields = fields.without(LINK_FIELDS)
        if not paper_fields.names:
            paper_fields = Fields(list(DEFAULT_PAPER))
        items = []
        for other in linked[:limit]:
            item: dict[str, Any] = {}
            for name in fields.names:
                if name in LINK_FIELDS:
                    item[name] = False if name == "isInfluential" else []  # no citation contexts here
            item[key] = paper_object(self.db, self.authors, other, paper_fields)
            items.append(item)
        payload["data"] = items
        return payload

    # --- authors -------------------------------------------------------------------------------------------
    def _paper_authors(self, paper: Paper, params: dict[str, str]) -> dict:
        offset = int_param(params, "offset", 0, 0, 10**7)
        limit = int_param(params, "limit", 100, 1, MAX_LINK_LIMIT)
        fields = parse_fields(params.get("fields"), "author")
        names = [n for n in (clean_name(a) for a in paper.authors) if n]
        page = names[offset : offset + limit]
        payload: dict[str, Any] = {"offset": offset}
        if offset + limit < len(names):
            payload["next"] = offset + limit
        payload["data"] = [author_object(self.db, self.authors, name, fields) for name in page]
        return payload

    def _author_papers(self, k: int, params: dict[str, str]) -> dict:
        offset = int_param(params, "offset", 0, 0, 10**7)
        limit = int_param(params, "limit", 100, 1, MAX_LINK_LIMIT)
        fields = parse_fields(params.get("fields"))
        low, high = date_bounds(params)
        rowids = [int(r) for r in self.authors.paper_rowids(k)]  # newest first
        if low or high:
            dated = [p for p in by_rowid(self.db, rowids) if (not low or p.date >= low) and (not high or p.date <= high)]
            page = dated[offset : offset + limit + 1]
        else:
            page = by_rowid(self.db, rowids[offset : offset + limit + 1])
        payload: dict[str, Any] = {"offset": offset}
        if len(page) > limit:
            payload["next"] = offset + limit
        payload["data"] = [paper_object(self.db, self.authors, p, fields) for p in page[:limit]]
        return payload

    def _author_search(self, params: dict[str, str]) -> dict:
        query = self._query(params)
        offset = int_param(params, "offset", 0, 0, 10**7)
        limit = int_param(params, "limit", 100, 1, MAX_LINK_LIMIT)
        fields = parse_fields(params.get("fields"), "author")
        hits = self.authors.search(query)
        payload: dict[str, Any] = {"total": len(hits), "offset": offset}
        if offset + limit < len(hits):
            payload["next"] = offset + limit
        payload["data"] = [author_object(self.db, self.authors, k, fields) for k in hits[offset : offset + limit]]
        return payload

class PaperServer(JSONServer):
    def __init__(self, db: PaperDB, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **kwargs: Any):
        self.db = db
        self.authors = AuthorIndex(db)  # built on the first request that needs it
        super().__init__(host, port, PaperHandler, **kwargs)


def make_server(db: PaperDB, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> PaperServer:
    return PaperServer(db, host, port, **kwargs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capo serve papers", description="Serve a paper database in the "
                                     "Semantic Scholar Graph API's shapes (on 127.0.0.1 unless --host says otherwise).")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--db", help="a paper database (default: the prepared $CAPO_DATA_DIR/papers/papers.sqlite)")
    source.add_argument("--synth", metavar="SIZE", help="serve the SynthScholar world of this size "
                                                        "(tiny, small, medium, large, 1m) without any download")
    parser.add_argument("--seed", type=int, default=0, help="the SynthScholar seed (with --synth)")
    parser.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 to accept other machines")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def open_database(args: argparse.Namespace) -> PaperDB:
    if args.synth:
        from .synth import synth_database
        from .world import SIZES

        if args.synth not in SIZES:
            raise SystemExit(f"capo serve papers: unknown size {args.synth!r}; choose one of {sorted(SIZES)}")
        return synth_database(args.seed, args.synth, with_queries=False)
    if args.db:
        return PaperDB(args.db)
    from ..core.paths import dataset_dir, require
    from .env import DATASET, DB_FILE, PREPARE

    return PaperDB(require(dataset_dir(DATASET) / DB_FILE, "the paper database", PREPARE))


def serve_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        db = open_database(args)
    except FileNotFoundError as e:
        print(f"capo serve papers: {e}", file=sys.stderr)
        return 2
    try:
        server = PaperServer(db, args.host, args.port, verbose=args.verbose)
    except OSError as e:
        db.close()
        print(f"capo serve papers: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    # The author index (the /author/* routes) takes one scan of the papers: built now, in the background,
    # so that the first author request does not wait for it (0.4 s on 50,000 papers; linear in the papers).
    threading.Thread(target=server.authors.warm, name="author-index", daemon=True).start()
    serve_until_interrupted(server, f"serving {len(db)} papers at {server.url}/graph/v1 "
                                    "(paper/search[/bulk|/match], paper/autocomplete, paper/batch, "
                                    "paper/{id}[/citations|/references|/authors], author/search, author/batch, "
                                    "author/{id}[/papers])",
                            on_close=db.close)
    return 0
