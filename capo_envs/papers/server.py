"""``capo serve papers``: a paper database over the Semantic Scholar Graph API's shapes, on 127.0.0.1.

Routes (each also without the ``/graph/v1`` prefix, as the CAPO authors' client and Lewen call them):

* ``GET /graph/v1/paper/search?query=&offset=&limit=&fields=&year=&publicationDateOrYear=`` ->
  ``{"total", "offset", "next"?, "data": [paper]}`` (at most 1,000 results in all, as S2; ``limit`` <= 100);
* ``GET /graph/v1/paper/{id}?fields=`` -> a paper;
* ``GET /graph/v1/paper/{id}/citations`` and ``/references`` (``offset``, ``limit`` <= 1000, ``fields``) ->
  ``{"offset", "next"?, "total", "data": [{"citingPaper" | "citedPaper": paper}]}``;
* ``POST /graph/v1/paper/batch`` ``{"ids": [...]}`` -> a list of papers, ``null`` for an unknown id.

``{id}`` is an arXiv id in any form (bare, ``ARXIV:``-prefixed, versioned, old style ``cs/0112017``,
URL-encoded or not, or an arxiv.org link). ``paperId`` is the bare arXiv id, and ``externalIds`` holds
``ArXiv`` and arXiv's DOI, so S2 clients (which read ``externalIds.ArXiv``) and the CAPO client (which
reads ``paperId``) both get arXiv ids. ``fields`` works as in S2: without it a paper is ``paperId`` and
``title``; ``*``/``all`` give every field; an unknown field is a 400. ``next`` is absent on the last page,
as in S2. ``citationCount``/``referenceCount`` count the edges inside this database. Unknown ids answer 404
``{"error", "detail"}`` (S2's and FastAPI's keys); malformed parameters 400.
"""

from __future__ import annotations

import argparse
import re
import sys
from http import HTTPStatus
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

from ..core.http import JSONHandler, JSONServer, RequestError, brief, json_object, serve_until_interrupted
from .db import SEARCH_WINDOW, Paper, PaperDB
from .ids import normalize_arxiv_id

DEFAULT_PORT = 4000  # Lewen's port, the CAPO client's default base URL
MAX_SEARCH_LIMIT, MAX_LINK_LIMIT, MAX_BATCH = 100, 1000, 500
PAPER_FIELDS = (
    "paperId", "corpusId", "externalIds", "url", "title", "abstract", "venue", "year", "referenceCount",
    "citationCount", "influentialCitationCount", "isOpenAccess", "openAccessPdf", "fieldsOfStudy",
    "publicationTypes", "publicationDate", "journal", "authors",
)  # fmt: skip
LINK_FIELDS = ("contexts", "intents", "contextsWithIntent", "isInfluential")
DEFAULT_FIELDS = ("paperId", "title")
_YEAR = re.compile(r"^(\d{4})?(-)?(\d{4})?$")
_DATE_OR_YEAR = re.compile(r"^(\d{4}(?:-\d{2}(?:-\d{2})?)?)?(:)?(\d{4}(?:-\d{2}(?:-\d{2})?)?)?$")


def parse_fields(raw: str | None, allow_link_fields: bool = False) -> tuple[str, ...]:
    """S2's ``fields``: comma-separated names; ``authors.name`` counts as ``authors``; ``*``/``all`` is all."""
    if raw is None or not raw.strip():
        return DEFAULT_FIELDS
    known = PAPER_FIELDS + (LINK_FIELDS if allow_link_fields else ())
    out: list[str] = []
    for item in raw.split(","):
        name = item.strip().split(".")[0]
        if name in ("*", "all"):
            return PAPER_FIELDS + (LINK_FIELDS if allow_link_fields else ())
        if name not in known:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"Unrecognized or unsupported fields: {brief(item.strip())}")
        if name not in out:
            out.append(name)
    return tuple(out)


def _int_param(params: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{name} must be a whole number, got {brief(raw)}")
    value = int(raw)
    if not low <= value <= high:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{name} must be between {low} and {high}, got {value}")
    return value


def _pad(date: str, filler: str) -> str:
    """``2019`` / ``2019-03`` -> a bound comparable with ISO dates: ``filler`` "-00-00" (low) or "-99-99"."""
    return date + filler[len(date) - 4 :]


def _date_bounds(params: dict[str, str]) -> tuple[str | None, str | None]:
    """``year`` (2019, 2016-2020, 2010-, -2015) and ``publicationDateOrYear`` (2019-03-05, :2015-01,
    2016-03-05:2020-06-06) as inclusive bounds comparable with ISO dates; the tighter of the two wins."""
    lows: list[str] = []
    highs: list[str] = []
    year = params.get("year")
    if year is not None:
        match = _YEAR.match(year.strip())
        if not match or not (match.group(1) or match.group(3)) or (match.group(3) and not match.group(2)):
            raise RequestError(HTTPStatus.BAD_REQUEST,
                               f"year must look like 2019, 2016-2020, 2010- or -2015, got {brief(year)}")
        first, dash, last = match.groups()
        if first:
            lows.append(_pad(first, "-00-00"))
        end = last if dash else first
        if end:
            highs.append(_pad(end, "-99-99"))
    span = params.get("publicationDateOrYear")
    if span is not None:
        match = _DATE_OR_YEAR.match(span.strip())
        if not match or not (match.group(1) or match.group(3)) or (match.group(3) and not match.group(2)):
            raise RequestError(HTTPStatus.BAD_REQUEST, "publicationDateOrYear must look like 2019-03-05, "
                                                       f"2016-03-05:2020-06-06 or :2015-01, got {brief(span)}")
        first, colon, last = match.groups()
        if first:
            lows.append(_pad(first, "-00-00"))
        end = last if colon else first
        if end:
            highs.append(_pad(end, "-99-99"))
    return (max(lows) if lows else None), (min(highs) if highs else None)


class PaperHandler(JSONHandler):
    server: "PaperServer"

    def error_payload(self, status: HTTPStatus, message: str) -> dict:
        return {"error": message, "detail": message}

    def do_GET(self) -> None:
        try:
            payload = self._route_get()
        except RequestError as e:
            self._reject(e)
            return
        self._send_json(HTTPStatus.OK, payload)

    def do_POST(self) -> None:
        try:
            path = self._api_path()
            if path != "/paper/batch":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {brief(path)}")
            request = json_object(self._read_body())
            ids = request.get("ids")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > MAX_BATCH:
                raise RequestError(HTTPStatus.BAD_REQUEST, f'"ids" must be a list of at most {MAX_BATCH} strings')
            fields = parse_fields(self._params().get("fields"))
            papers = [self.server.db.get(i) for i in ids]
            payload = [self._paper(p, fields) if p else None for p in papers]
        except RequestError as e:
            self._reject(e)
            return
        self._send_json(HTTPStatus.OK, payload)

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
            return {"status": "ok", "papers": len(self.server.db)}
        if path == "/paper/search":
            return self._search(params)
        if not path.startswith("/paper/"):
            raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: {brief(path)}")
        rest = path[len("/paper/") :]
        for direction, key in (("citations", "citingPaper"), ("references", "citedPaper")):
            if rest.endswith("/" + direction):
                return self._links(unquote(rest[: -len(direction) - 1]), direction, key, params)
        return self._paper(self._lookup(unquote(rest)), parse_fields(params.get("fields")))

    def _lookup(self, raw_id: str) -> Paper:
        paper = self.server.db.get(raw_id) if normalize_arxiv_id(raw_id) else None
        if paper is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Paper with id {brief(raw_id)} not found")
        return paper

    # --- endpoints -----------------------------------------------------------------------------------------
    def _search(self, params: dict[str, str]) -> dict:
        query = params.get("query", "").strip()
        if not query:
            raise RequestError(HTTPStatus.BAD_REQUEST, "query is required")
        offset = _int_param(params, "offset", 0, 0, SEARCH_WINDOW - 1)
        limit = _int_param(params, "limit", 10, 1, MAX_SEARCH_LIMIT)
        if offset + limit > SEARCH_WINDOW:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"offset + limit must be at most {SEARCH_WINDOW}")
        fields = parse_fields(params.get("fields"))
        low, high = _date_bounds(params)
        db = self.server.db
        if low is None:
            hits = db.search(query, limit + 1, offset, max_date=high)
            total = db.search_total(query, max_date=high)
        else:  # a lower bound is rare: filter the ranked window
            window = [p for p in db.search(query, SEARCH_WINDOW, 0, max_date=high) if p.date >= low]
            hits, total = window[offset : offset + limit + 1], len(window)
        payload: dict[str, Any] = {"total": total, "offset": offset}
        if len(hits) > limit:
            payload["next"] = offset + limit
        payload["data"] = [self._paper(p, fields) for p in hits[:limit]]
        return payload

    def _links(self, raw_id: str, direction: str, key: str, params: dict[str, str]) -> dict:
        paper = self._lookup(raw_id)
        offset = _int_param(params, "offset", 0, 0, 10**7)
        limit = _int_param(params, "limit", 100, 1, MAX_LINK_LIMIT)
        fields = parse_fields(params.get("fields"), allow_link_fields=True)
        _, high = _date_bounds(params)
        db = self.server.db
        fetch: Callable[..., list[Paper]] = db.citations if direction == "citations" else db.references
        linked = fetch(paper.arxiv_id, limit + 1, offset, max_date=high)
        payload: dict[str, Any] = {"offset": offset}
        if len(linked) > limit:
            payload["next"] = offset + limit
        payload["total"] = db.count_links(paper.arxiv_id, direction, max_date=high)
        paper_fields = tuple(f for f in fields if f not in LINK_FIELDS)
        items = []
        for other in linked[:limit]:
            item: dict[str, Any] = {}
            if "contexts" in fields:
                item["contexts"] = []
            if "intents" in fields:
                item["intents"] = []
            if "contextsWithIntent" in fields:
                item["contextsWithIntent"] = []
            if "isInfluential" in fields:
                item["isInfluential"] = False
            item[key] = self._paper(other, paper_fields or DEFAULT_FIELDS)
            items.append(item)
        payload["data"] = items
        return payload

    def _paper(self, paper: Paper, fields: tuple[str, ...]) -> dict:
        db = self.server.db
        values: dict[str, Callable[[], Any]] = {
            "paperId": lambda: paper.arxiv_id,
            "corpusId": lambda: None,
            "externalIds": lambda: {"ArXiv": paper.arxiv_id, "DOI": f"10.48550/arXiv.{paper.arxiv_id}"},
            "url": lambda: f"https://arxiv.org/abs/{paper.arxiv_id}",
            "title": lambda: paper.title,
            "abstract": lambda: paper.abstract or None,
            "venue": lambda: "arXiv.org",
            "year": lambda: paper.year,
            "referenceCount": lambda: db.count_links(paper.arxiv_id, "references"),
            "citationCount": lambda: db.count_links(paper.arxiv_id, "citations"),
            "influentialCitationCount": lambda: 0,
            "isOpenAccess": lambda: True,
            "openAccessPdf": lambda: {"url": f"https://arxiv.org/pdf/{paper.arxiv_id}", "status": "GREEN"},
            "fieldsOfStudy": lambda: ["Computer Science"] if paper.categories.startswith("cs") else None,
            "publicationTypes": lambda: None,
            "publicationDate": lambda: paper.date or None,
            "journal": lambda: None,
            "authors": lambda: [{"authorId": None, "name": name} for name in paper.authors],
        }
        out = {"paperId": paper.arxiv_id}  # S2 always returns paperId
        for name in fields:
            out[name] = values[name]()
        return out


class PaperServer(JSONServer):
    def __init__(self, db: PaperDB, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **kwargs: Any):
        self.db = db
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
    from .real import DATASET, DB_FILE, PREPARE

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
    serve_until_interrupted(server, f"serving {len(db)} papers at {server.url}/graph/v1 "
                                    "(paper/search, paper/{id}, paper/{id}/citations, paper/{id}/references)",
                            on_close=db.close)
    return 0
