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
import json
import logging
import signal
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .base import Hit, Retriever

logger = logging.getLogger(__name__)

DEFAULT_TOPK = 3  # Search-R1's default ``retrieval_topk``


class RequestError(Exception):
    """A client mistake, answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class RetrieverServer(ThreadingHTTPServer):
    """A threading HTTP server around one retriever; calls into the retriever are serialised."""

    daemon_threads = True  # a stuck client must not keep the process alive at exit

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
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.retriever = retriever
        self.max_queries = max_queries
        self.max_topk = max_topk
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.verbose = verbose
        self.lock = threading.Lock()  # backends (Lucene, faiss, bm25s caches) are not all thread-safe
        self._serving = False
        self._thread: threading.Thread | None = None
        super().__init__((host, port), RetrieveHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        self._serving = True
        try:
            super().serve_forever(poll_interval)
        finally:
            self._serving = False

    def start_in_thread(self) -> "RetrieverServer":
        """Serve from a daemon thread (tests, notebooks, embedding in a trainer); returns self."""
        self._serving = True  # so that a shutdown() racing the thread's start still stops it
        self._thread = threading.Thread(target=self.serve_forever, name=f"retriever-server:{self.url}", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close the listening socket, releasing the port. Safe to call twice."""
        if self._serving:
            super().shutdown()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.server_close()

    def __enter__(self) -> "RetrieverServer":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-answer is routine; socketserver would print a traceback."""
        logger.debug("error while answering %s", client_address, exc_info=True)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        with self.lock:
            return self.retriever.search(queries, topk)


class RetrieveHandler(BaseHTTPRequestHandler):
    """``POST /retrieve`` and ``GET /health``; every answer, errors included, is JSON."""

    server: RetrieverServer
    protocol_version = "HTTP/1.1"  # keep-alive for clients that reuse connections
    error_content_type = "application/json"

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # a body shorter than its Content-Length must not hang a thread
        super().setup()

    def do_GET(self) -> None:
        path = self.path.partition("?")[0].rstrip("/")
        if path == "/health":
            self._send_json(HTTPStatus.OK, self._health())
        elif path == "/retrieve":
            self._method_not_allowed()
        else:
            self.send_error(HTTPStatus.NOT_FOUND, f"no such endpoint {path or '/'!r}; use POST /retrieve or GET /health")

    def do_POST(self) -> None:
        path = self.path.partition("?")[0].rstrip("/")
        try:
            if path == "/health":
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, "use GET /health")
            if path != "/retrieve":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {path or '/'!r}; use POST /retrieve")
            queries, topk, return_scores = self._parse_request(self._read_body())
        except RequestError as e:
            self.close_connection = True  # the rest of the stream (unread body, bytes past a short one) is suspect
            self._send_json(e.status, {"error": e.message})
            return
        try:
            results = self.server.retrieve(queries, topk)
        except Exception as e:  # noqa: BLE001 - any backend failure becomes a 500, never a dead server
            logger.exception("retriever failed on %d queries", len(queries))
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"retriever failed: {type(e).__name__}: {e}"})
            return
        if return_scores:
            body = [[{"document": h.to_document(), "score": h.score} for h in hits] for hits in results]
        else:
            body = [[h.to_document() for h in hits] for hits in results]
        self._send_json(HTTPStatus.OK, {"result": body})

    def __getattr__(self, name: str) -> Any:
        """Any other method (PUT, DELETE, HEAD, made-up ones) is a 405, not http.server's 501."""
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self.close_connection = True  # a body, if any, was not read
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed; use POST /retrieve or GET /health")

    def _health(self) -> dict:
        return {
            "status": "ok",
            "retriever": type(self.server.retriever).__name__,
            "max_queries": self.server.max_queries,
            "max_topk": self.server.max_topk,
        }

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not supported; send Content-Length")
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {length_header!r}") from None
        if length > self.server.max_body_bytes:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {length} bytes exceeds the limit of {self.server.max_body_bytes}",
            )
        try:
            body = self.rfile.read(length)
        except (TimeoutError, OSError):
            body = b""
        if len(body) < length:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
        return body

    def _parse_request(self, body: bytes) -> tuple[list[str], int, bool]:
        try:
            request = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not valid JSON ({e.msg} at char {e.pos})") from None
        if not isinstance(request, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body must be a JSON object, got {type(request).__name__}")

        queries = request.get("queries")
        if queries is None:
            raise RequestError(HTTPStatus.BAD_REQUEST, 'missing "queries" (a list of strings)')
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise RequestError(HTTPStatus.BAD_REQUEST, '"queries" must be a list of strings')
        if len(queries) > self.server.max_queries:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{len(queries)} queries exceed the limit of {self.server.max_queries} per request",
            )

        topk = request.get("topk")
        if topk is None:  # Search-R1 sends null to mean "the server's default"
            topk = DEFAULT_TOPK
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= self.server.max_topk:
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"topk" must be an int in [1, {self.server.max_topk}], got {topk!r}')

        return_scores = request.get("return_scores", False)
        if not isinstance(return_scores, bool):
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"return_scores" must be true or false, got {return_scores!r}')
        return queries, topk, return_scores

    def _send_json(self, status: HTTPStatus, payload: dict) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """JSON instead of http.server's HTML page, for malformed request lines and headers too."""
        status = HTTPStatus(code)
        if code >= 400:
            self.close_connection = True  # after a protocol error the stream cannot be trusted
        try:
            self._send_json(status, {"error": message or status.phrase})
        except OSError:
            self.close_connection = True  # the client has gone; nothing to answer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


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
    if threading.current_thread() is threading.main_thread():
        # Installed after the retriever is opened: an in-process JVM (lucene) replaces Python's
        # SIGINT handler with one that exits without our cleanup.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.default_int_handler)
    print(f"serving {args.retriever} retriever at {server.url} (POST /retrieve, GET /health)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("shutting down", file=sys.stderr)
    finally:
        server.shutdown()
        retriever.close()
    return 0
