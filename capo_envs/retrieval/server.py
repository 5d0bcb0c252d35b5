"""Serve any ``Retriever`` over HTTP in Search-R1's ``/retrieve`` format.

Search-R1 (and the training code built on it) talks to its retriever through a tiny HTTP API:
``POST /retrieve`` with ``{"queries": [...], "topk": 3, "return_scores": false}``. Speaking that
format exactly lets their rollout code use our indexes and lets our ``HTTPRetriever`` use theirs.
The server is standard library only, so serving an index never needs a web framework installed.
Bad requests are answered with a 4xx ``{"error": ...}`` and a failing retriever with a 500: one
client's mistake must never take down a server that a whole training run depends on.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from http import HTTPStatus

from ..core.http import (
    JSONHandler,
    JSONServer,
    RequestError,
    brief,
    check_keys,
    is_unicode,
    json_object,
    serve_until_interrupted,
)
from .base import Hit, Retriever

logger = logging.getLogger(__name__)

DEFAULT_TOPK = 3  # Search-R1's default ``retrieval_topk``
REQUEST_KEYS = frozenset({"queries", "topk", "return_scores"})  # all that Search-R1's client sends


class RetrieverServer(JSONServer):
    """An HTTP server around one retriever; calls into the retriever are serialised."""

    def __init__(
        self,
        retriever: Retriever,
        host: str,
        port: int,
        *,
        max_queries: int,
        max_topk: int,
        max_body_bytes: int,
        request_timeout: float = 30.0,
        verbose: bool = False,
    ):
        self.retriever = retriever
        self.max_queries = max_queries
        self.max_topk = max_topk
        self.lock = threading.Lock()  # backends (Lucene, faiss, bm25s caches) are not all thread-safe
        super().__init__(
            host, port, RetrieveHandler, max_body_bytes=max_body_bytes, request_timeout=request_timeout, verbose=verbose
        )

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        with self.lock:
            return self.retriever.search(queries, topk)


class RetrieveHandler(JSONHandler):
    """``POST /retrieve`` and ``GET /health``; every answer is JSON, an error ``{"error": message}``."""

    server: RetrieverServer
    not_allowed_message = "{method} is not allowed; use POST /retrieve or GET /health"

    def do_GET(self) -> None:
        path = self.route
        if path == "/health":
            self._send_json(HTTPStatus.OK, self._health())
        elif path == "/retrieve":
            self._method_not_allowed()
        else:
            message = f"no such endpoint {brief(path or '/')}; use POST /retrieve or GET /health"
            self.send_error(HTTPStatus.NOT_FOUND, message)

    def do_POST(self) -> None:
        path = self.route
        try:
            if path == "/health":
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, "use GET /health")
            if path != "/retrieve":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {brief(path or '/')}; use POST /retrieve")
            queries, topk, return_scores = self._parse_request(self._read_body())
        except RequestError as e:
            self._reject(e)
            return
        try:
            results = self.server.retrieve(queries, topk)
        except Exception as e:  # noqa: BLE001 - any backend failure becomes a 500, never a dead server
            logger.exception("retriever failed on %d queries", len(queries))
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"retriever failed: {type(e).__name__}: {e}")
            return
        if return_scores:
            body = [[{"document": h.to_document(), "score": h.score} for h in hits] for hits in results]
        else:
            body = [[h.to_document() for h in hits] for hits in results]
        self._send_json(HTTPStatus.OK, {"result": body})

    def _health(self) -> dict:
        return {
            "status": "ok",
            "retriever": type(self.server.retriever).__name__,
            "max_queries": self.server.max_queries,
            "max_topk": self.server.max_topk,
        }

    def _parse_request(self, body: bytes) -> tuple[list[str], int, bool]:
        request = json_object(body)
        check_keys(request, REQUEST_KEYS)

        queries = request.get("queries")
        if queries is None:
            raise RequestError(HTTPStatus.BAD_REQUEST, 'missing "queries" (a list of strings)')
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise RequestError(HTTPStatus.BAD_REQUEST, '"queries" must be a list of strings')
        if not all(map(is_unicode, queries)):
            raise RequestError(HTTPStatus.BAD_REQUEST, '"queries" must be valid Unicode (a lone surrogate escape?)')
        if len(queries) > self.server.max_queries:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{len(queries)} queries exceed the limit of {self.server.max_queries} per request",
            )

        topk = request.get("topk")
        if topk is None:  # Search-R1 sends null to mean "the server's default"
            topk = DEFAULT_TOPK
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= self.server.max_topk:
            message = f'"topk" must be an int in [1, {self.server.max_topk}], got {brief(topk)}'
            raise RequestError(HTTPStatus.BAD_REQUEST, message)

        return_scores = request.get("return_scores", False)
        if not isinstance(return_scores, bool):
            message = f'"return_scores" must be true or false, got {brief(return_scores)}'
            raise RequestError(HTTPStatus.BAD_REQUEST, message)
        return queries, topk, return_scores


def make_server(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    max_queries: int = 1024,
    max_topk: int = 100,
    max_body_bytes: int = 8 << 20,
    verbose: bool = False,
) -> RetrieverServer:
    """Bind (port 0 picks a free port; see ``.url``) without serving yet: call ``serve_forever``
    or ``start_in_thread``, and ``shutdown`` (or use ``with``) to release the port."""
    return RetrieverServer(
        retriever,
        host,
        port,
        max_queries=max_queries,
        max_topk=max_topk,
        max_body_bytes=max_body_bytes,
        verbose=verbose,
    )


def serve_main(argv: list[str] | None = None) -> int:
    """``capo serve-retriever``: load or build an index and serve it until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(prog="capo serve-retriever", description=serve_main.__doc__)
    parser.add_argument("--corpus", help="JSONL corpus to index ({id, title, text} or {id, contents})")
    parser.add_argument("--index-dir", help="a saved index (built from --corpus when it does not exist yet)")
    parser.add_argument("--retriever", default="bm25", choices=["bm25", "dense", "hybrid", "lucene"])
    parser.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 to accept other machines")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk-max", type=int, default=100, help="largest topk a request may ask for")
    parser.add_argument("--max-queries", type=int, default=1024, help="most queries in one request")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    if not args.corpus and not args.index_dir:
        parser.error("give --corpus, --index-dir, or both")

    from . import open_retriever  # lazy: backends import heavy libraries

    try:
        retriever = open_retriever(args.retriever, corpus=args.corpus, index_dir=args.index_dir)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"capo serve-retriever: {e}", file=sys.stderr)
        return 2
    try:
        server = make_server(
            retriever, args.host, args.port, max_queries=args.max_queries, max_topk=args.topk_max, verbose=args.verbose
        )
    except OSError as e:
        retriever.close()
        print(f"capo serve-retriever: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    banner = f"serving {args.retriever} retriever at {server.url} (POST /retrieve, GET /health)"
    serve_until_interrupted(server, banner, on_close=retriever.close)
    return 0
