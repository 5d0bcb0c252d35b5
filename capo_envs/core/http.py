"""The plumbing shared by capo's small loopback servers (``capo serve-retriever``, ``capo serve``, ``capo serve
papers``, ``capo serve webshop``, ``capo view``).

Standard library only, so that serving never needs a web framework. A :class:`JSONServer` binds on
construction and serves on :meth:`~JSONServer.serve_forever` or :meth:`~JSONServer.start_in_thread`;
a :class:`JSONHandler` answers everything in JSON, protocol errors included, and reads bodies with a
size limit and a timeout. A client's mistake is a :class:`RequestError` (a 4xx), never a dead server;
a bug is a JSON 500, never a connection dropped without an answer.

Slow clients are bounded too, so that a few sockets cannot hold every thread (slowloris): a request's line and
headers must arrive within ``header_timeout`` seconds (counted from the connection's opening, or from the
previous answer on a kept-alive connection), its body within ``body_timeout``, and no read waits more than
``request_timeout`` for the next bytes. A request whose head is cut short by a deadline is answered 408; a
connection that sent nothing is closed. HTTP/0.9's request line without a version (``GET /``) is a 400, not a
wait for headers that such a client never sends.
"""

from __future__ import annotations

import io
import json
import logging
import math
import reprlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

# The listen backlog: connections the kernel completes and queues while the accept loop catches up.
# http.server's default of 5 reset most of a burst of 1,000 clients (a training run's rollout workers all
# asking at once); 4096 absorbs such bursts with room to spare and is also Linux's default cap
# (net.core.somaxconn since kernel 5.4), beyond which a larger value gains nothing.
LISTEN_BACKLOG = 4096
SOMAXCONN = "/proc/sys/net/core/somaxconn"
# After an error answer the connection is closed, often with part of the request unread; closing a socket
# with unread data sends a reset that can destroy the answer before the client reads it. So the server
# first stops writing, then reads and drops what is still coming, up to these limits ("lingering close").
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 << 20
HEADER_TIMEOUT = 10.0  # seconds for a request's line and headers, idle time on a kept-alive connection included
BODY_TIMEOUT = 60.0  # seconds for a body: the 8 MiB limit at 140 kB/s; loopback takes milliseconds

_Server = TypeVar("_Server", bound="JSONServer")


class RequestError(Exception):
    """A client mistake, answered with ``status`` and the handler's :meth:`~JSONHandler.error_payload`."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class JSONServer(ThreadingHTTPServer):
    """A threading HTTP server for a :class:`JSONHandler`; ``shutdown``, ``close`` or ``with`` releases the port."""

    daemon_threads = True  # a stuck client must not keep the process alive at exit (nor be kept in a list)
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[JSONHandler],
        *,
        max_body_bytes: int = 8 << 20,
        request_timeout: float = 30.0,
        header_timeout: float = HEADER_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
        verbose: bool = False,
    ):
        """Bind ``host:port`` (port 0 picks a free one) without serving yet. ``verbose`` logs every request.
        ``request_timeout``: the longest wait for a client's next bytes; ``header_timeout``: for a request's
        line and headers in all; ``body_timeout``: for its body in all (see the module's docstring)."""
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.verbose = verbose
        self._serving = False
        self._thread: threading.Thread | None = None
        super().__init__((host, port), handler)
        _warn_if_backlog_capped(self.request_queue_size)

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

    def start_in_thread(self: _Server) -> _Server:
        """Serve from a daemon thread (tests, notebooks, embedding in a trainer); returns self."""
        self._serving = True  # so that a shutdown() racing the thread's start still stops it
        name = f"{type(self).__name__}:{self.url}"
        self._thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop serving and close the listening socket, releasing the port. Safe to call twice."""
        if self._serving:
            super().shutdown()  # socketserver's would wait forever on a server that never served
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.server_close()

    def close(self) -> None:
        self.shutdown()

    def __enter__(self: _Server) -> _Server:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-answer is routine; socketserver would print a traceback."""
        logger.debug("error while answering %s: %r", client_address, sys.exc_info()[1])


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler whose every answer, errors included, is JSON; subclasses add ``do_GET``/``do_POST``."""

    server: JSONServer
    protocol_version = "HTTP/1.1"  # keep-alive for clients that reuse connections
    default_request_version = "HTTP/1.0"  # answer an unparsable request line with a status line, not HTTP/0.9's none
    error_content_type = "application/json"
    not_allowed_message = "{method} is not allowed here"  # the 405's message; ``{method}`` is the request's

    def handle_one_request(self) -> None:
        """http.server's, with a safety net: an unexpected error in a handler is answered with a JSON 500
        (when nothing was sent yet) instead of a connection closed without an answer; and with a deadline on
        the request's line and headers, answered 408 when it cuts a request short."""
        self._answered = False
        self.requestline, self.request_version, self.command = "", self.default_request_version, None
        self._reader.start(self.server.header_timeout)
        try:
            super().handle_one_request()  # a timeout (TimeoutError) ends it quietly, with close_connection set
        except OSError:
            raise  # the client went away or timed out; socketserver closes the connection quietly
        except Exception as e:  # noqa: BLE001 - one bad request must not cost its client an answer
            logger.exception("unexpected error answering %r", self.requestline)
            self._close_after_answer()
            if not self._answered:
                self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}")
            return
        if self._reader.timed_out and self._reader.in_head and self._reader.received and not self._answered:
            self._close_after_answer()
            message = f"the request's line and headers did not arrive within {self.server.header_timeout:g} s"
            try:
                self._send_error_json(HTTPStatus.REQUEST_TIMEOUT, message)
            except OSError:
                pass

    def parse_request(self) -> bool:
        """http.server's, refusing HTTP/0.9 (a request line without a version: its client sends no headers,
        so reading them would wait for the timeout), and starting the body's deadline once the head is in."""
        words = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n").split()
        if len(words) == 2:
            self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
            self.close_connection = True
            self.send_error(HTTPStatus.BAD_REQUEST, f"HTTP/0.9 is not supported: {brief(self.requestline)} has no "
                                                    "HTTP version (send e.g. 'GET / HTTP/1.1' and headers)")
            return False
        parsed = super().parse_request()
        self._reader.body(self.server.body_timeout)
        return parsed

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # a body shorter than its Content-Length must not hang a thread
        self._linger = False
        super().setup()
        self._reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader, io.DEFAULT_BUFFER_SIZE)

    def finish(self) -> None:
        if self._linger:
            self._lingering_close()
        super().finish()

    def _close_after_answer(self) -> None:
        self.close_connection = True
        self._linger = True

    def _lingering_close(self) -> None:
        """Stop writing, then drop what the client still sends (an unread body) until it closes or a limit."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_SECONDS)
            deadline, dropped = time.monotonic() + LINGER_SECONDS, 0
            while dropped < LINGER_BYTES and time.monotonic() < deadline:
                chunk = self.connection.recv(1 << 16)
                if not chunk:
                    break
                dropped += len(chunk)
        except OSError:
            pass  # the client has gone, or will get a reset: nothing more to do

    @property
    def route(self) -> str:
        """The request's path without its query string or a trailing slash."""
        return self.path.partition("?")[0].rstrip("/")

    def error_payload(self, status: HTTPStatus, message: str) -> dict:
        """The JSON body of an error answer."""
        return {"error": message}

    def __getattr__(self, name: str) -> Any:
        """Any other method (PUT, DELETE, HEAD, made-up ones) is a 405, not http.server's 501."""
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self._close_after_answer()  # a body, if any, was not read
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, self.not_allowed_message.format(method=self.command))

    def _read_body(self) -> bytes:
        """The request body, at most the server's ``max_body_bytes``; :class:`RequestError` otherwise."""
        if "Transfer-Encoding" in self.headers:  # chunked or not: what follows would not be the body as sent
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not supported; send Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        length_header = lengths[0].strip()
        # Digits only: int() would also take "+5", "5_0" and " 5"; two differing lengths are ambiguous.
        digits = length_header.isascii() and length_header.isdigit() and len(length_header) <= 18
        if len(set(lengths)) > 1 or not digits:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {brief(', '.join(lengths))}")
        length = int(length_header)
        if length > self.server.max_body_bytes:
            message = f"body of {length} bytes exceeds the limit of {self.server.max_body_bytes}"
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, message)
        chunks, received, why = [], 0, "ended"
        while received < length:
            try:
                chunk = self.rfile.read1(min(length - received, 1 << 20))
            except TimeoutError:
                chunk, why = b"", "timed out"
            except OSError:
                chunk = b""
            if not chunk:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"body {why} after {received} of {length} bytes")
            chunks.append(chunk)
            received += len(chunk)
        return b"".join(chunks)

    def _reject(self, error: RequestError) -> None:
        """Answer a client's mistake and close the connection."""
        self._close_after_answer()  # the rest of the stream (unread body, bytes past a short one) is suspect
        self._send_error_json(error.status, error.message)

    def _send_error_json(self, status: HTTPStatus, message: str) -> None:
        self._send_json(status, self.error_payload(status, message))

    def _send_json(self, status: HTTPStatus, payload: Any) -> None:
        try:
            data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a request's "\ud800") echoed back: escape it instead
            data = json.dumps(payload).encode("ascii")
        self._answered = True
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
            self._close_after_answer()  # after a protocol error the stream cannot be trusted
        try:
            self._send_error_json(status, message or status.phrase)
        except OSError:
            self.close_connection = True  # the client has gone; nothing to answer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes for the handler's ``rfile``: no read waits longer than ``idle`` seconds for the next
    bytes, nor past the current phase's deadline (the head's or the body's), so that a client trickling a byte
    at a time holds a thread for a bounded time only. Closing it leaves the socket to socketserver."""

    def __init__(self, sock: socket.socket, idle: float | None):
        super().__init__()
        self.sock, self.idle = sock, idle
        self.deadline: float | None = None
        self.in_head, self.received, self.timed_out = True, 0, False

    def start(self, header_timeout: float | None) -> None:
        """A new request: its line and headers are due within ``header_timeout`` seconds."""
        self.in_head, self.received, self.timed_out = True, 0, False
        self.deadline = None if header_timeout is None else time.monotonic() + header_timeout

    def body(self, body_timeout: float | None) -> None:
        """The head is in: what is read from now on (the body) is due within ``body_timeout`` seconds."""
        self.in_head = False
        self.deadline = None if body_timeout is None else time.monotonic() + body_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        timeout = self.idle
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                raise TimeoutError("the request's deadline passed")
            timeout = left if timeout is None else min(timeout, left)
        self.sock.settimeout(timeout)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        finally:
            self.sock.settimeout(self.idle)  # writes keep the plain timeout
        self.received += n
        return n


def json_object(body: bytes) -> dict:
    """A request body parsed as a JSON object; :class:`RequestError` (400) otherwise, also for what Python's
    parser accepts or chokes on but a request never needs: NaN and Infinity (not JSON), numbers too large
    for a float, integers of more than 4,300 digits (ValueError) and nesting too deep (RecursionError)."""
    try:
        request = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
    except UnicodeDecodeError as e:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not valid JSON ({e.msg} at char {e.pos})") from None
    except ValueError as e:  # an int past sys.get_int_max_str_digits(), or a non-finite number
        reason = str(e).partition(";")[0]  # not Python's advice on raising the limit
        raise RequestError(HTTPStatus.BAD_REQUEST, f"body has an unusable number: {reason}") from None
    except RecursionError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "body is nested too deeply") from None
    if not isinstance(request, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, f"body must be a JSON object, got {type(request).__name__}")
    return request


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode: JSON's ``"\\ud800"`` escapes decode to lone surrogates that
    tokenizers and UTF-8 encoders refuse."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} does not fit in a float")
    return value


def check_keys(request: dict, known: set[str] | frozenset[str]) -> None:
    """Refuse keys this server does not know: ignoring a misspelt option ("top_k" for "topk") would
    silently serve something other than what was asked for."""
    unknown = sorted(set(request) - set(known))
    if unknown:
        message = f"unknown field {brief(unknown[0])}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{message}; this server accepts {', '.join(sorted(known))}")


_brief = reprlib.Repr()
_brief.maxlevel, _brief.maxstring, _brief.maxother, _brief.maxlong = 3, 80, 80, 40


def brief(value: Any) -> str:
    """A short repr for error messages, safe on what a request can hold: deep nesting, huge strings."""
    return _brief.repr(value)


def _warn_if_backlog_capped(backlog: int) -> None:
    """The kernel silently caps the listen backlog at net.core.somaxconn; say so when that cuts it."""
    try:
        cap = int(Path(SOMAXCONN).read_text())
    except (OSError, ValueError):
        return  # not Linux, or not readable: nothing to say
    if cap < backlog:
        logger.warning("listen backlog capped at %d by %s (asked for %d): a burst of more clients than that "
                       "may see connections reset; raise it with sysctl net.core.somaxconn", cap, SOMAXCONN, backlog)


def serve_until_interrupted(server: JSONServer, banner: str, on_close: Callable[[], Any] | None = None) -> None:
    """A CLI's serving loop: print ``banner``, serve until Ctrl-C or SIGTERM, then release the port
    and call ``on_close``."""
    if threading.current_thread() is threading.main_thread():
        # Both signals end serve_forever with a KeyboardInterrupt, so that the port is released. Set here,
        # after the caller opened what it serves: an in-process JVM (lucene) replaces Python's SIGINT
        # handler with one that exits without our cleanup.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.default_int_handler)
    print(banner, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("shutting down", file=sys.stderr)
    finally:
        server.shutdown()
        if on_close is not None:
            on_close()
