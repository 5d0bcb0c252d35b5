"""Malformed, slow and concurrent HTTP traffic for any of capo's loopback servers (tests/test_servers_malformed.py).

A server is described by a :class:`Target`: how to reach it, one good request (and how to check its answer),
and, when it has one, an endpoint that takes a JSON body. :func:`protocol_cases` builds what every server
must refuse the same way (bad methods, request lines, headers, bodies, encodings, huge numbers, HTTP/0.9);
:func:`slow_cases` the clients that stall or trickle; :func:`burst` sends many requests at once. Every
exchange is on 127.0.0.1, bounded in bytes and time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

IO_TIMEOUT_S = 20.0  # no single exchange may take longer; the servers under test are given far smaller limits


@dataclass
class Case:
    """One bad request: its bytes, whether the client half-closes after sending (False: it waits for the
    answer with its side open, as a client whose body is short would), and the statuses that are right."""

    name: str
    raw: bytes
    half_close: bool = True
    ok: Callable[[int], bool] = lambda status: 400 <= status < 500 or status == 503


@dataclass
class Target:
    """A running server under test."""

    name: str
    port: int
    good: bytes  # a request (with Connection: close) that must succeed
    good_ok: Callable[[int, bytes], bool]  # (status, body) of the good request's answer
    json_errors: bool = True  # every error answer is a JSON object with an "error" key
    post_path: str | None = None  # an endpoint that reads a JSON body
    post_body: dict | None = None  # a valid body for it
    extra: list[Case] = field(default_factory=list)  # this server's own bad requests

    def still_serving(self) -> bool:
        status, _, body = exchange(self.port, self.good)
        return self.good_ok(status, body)


def raw_request(method: str, path: str, body: bytes = b"", headers: dict | None = None, length: bool = True,
                version: str = "HTTP/1.1") -> bytes:
    """A request as bytes (the path as latin-1: any byte can be put in it), with Content-Length unless
    ``length`` is false or ``headers`` set one."""
    fields = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    if length and "Content-Length" not in fields and (body or method in ("POST", "PUT", "PATCH")):
        fields["Content-Length"] = str(len(body))
    head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return f"{method} {path} {version}\r\n{head}\r\n".encode("latin-1") + body


def get(path: str) -> bytes:
    return raw_request("GET", path)


def parse_answer(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers lower-cased, body) of an HTTP answer; (0, {}, what came) when it is not one."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return 0, {}, answer[:200]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, body


def exchange(port: int, raw: bytes, half_close: bool = True, timeout: float = IO_TIMEOUT_S) -> tuple[int, dict, bytes]:
    """Send ``raw`` on a fresh connection and read to EOF; (status, headers, body), or (0, {}, b"why")."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            try:
                sock.sendall(raw)
            except OSError:
                pass  # the server answered and closed before reading it all: read what it said
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            chunks = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(1 << 16)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        answer = b"".join(chunks)
    except OSError as e:
        return 0, {}, f"{type(e).__name__}: {e}".encode()
    return parse_answer(answer)


def is_json_error(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(payload, dict) and bool(payload.get("error"))


def check_case(target: Target, case: Case) -> str | None:
    """Send one case; what is wrong with the answer (None when nothing is)."""
    status, headers, body = exchange(target.port, case.raw, case.half_close)
    if not case.ok(status):
        return f"{case.name}: status {status} {body[:160]!r}"
    if status >= 400 and target.json_errors and "json" in headers.get("content-type", "json") and not is_json_error(body):
        return f"{case.name}: {status} without a JSON error: {body[:160]!r}"
    if not body:
        return f"{case.name}: {status} with an empty body"
    return None


# ----------------------------------------------------------------------------------------------- the cases

BODY_LIMIT = 64 << 10  # the suite's servers are built with max_body_bytes=BODY_LIMIT
HUGE_DIGITS = "9" * 5000  # past int()'s 4,300-digit limit: a ValueError wherever a number is parsed unchecked
SLOW_LIMITS = {"request_timeout": 0.5, "header_timeout": 1.0, "body_timeout": 2.0}  # set on every server under test
# For a burst of 1,000 clients: on 2 cores a thread can wait seconds for the GIL between accepting its connection
# and reading the request that is already there, so the burst runs with the servers' default limits.
BURST_LIMITS = {"request_timeout": 30.0, "header_timeout": 10.0, "body_timeout": 60.0}
SLOW_BOUND_S = 6.0  # a stalled or trickling client is answered 408/400 or dropped within this


def tolerated(status: int) -> bool:
    """For what a server may accept (a 2xx) as well as refuse: what matters is that it answers."""
    return 200 <= status < 500 or status == 503


def protocol_cases(target: Target) -> list[Case]:
    """What every server refuses with a 4xx (505 for an HTTP version it does not speak), whatever its routes."""
    good_path = target.good.split(b" ", 2)[1].decode("latin-1")
    post = target.post_path or good_path  # a server without a body endpoint answers 405 or 404: still a 4xx
    body = json.dumps(target.post_body or {"x": 1}).encode()
    version_ok = lambda status: 400 <= status < 500 or status == 505  # noqa: E731
    cases = [
        # methods
        *(Case(f"method {m}", raw_request(m, good_path, body)) for m in
          ("PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "BREW", "get", "M" * 200)),
        Case("method with a NUL", raw_request("G\x00T", good_path)),
        # request lines
        Case("HTTP/0.9 GET, client waits", b"GET /\r\n", half_close=False),
        Case("HTTP/0.9 GET", b"GET " + good_path.encode("latin-1") + b"\r\n"),
        Case("HTTP/0.9 POST", f"POST {post}\r\n\r\n".encode()),
        Case("one word", b"GET\r\n\r\n"),
        Case("four words", b"GET / HTTP/1.1 extra\r\nHost: x\r\n\r\n"),
        Case("HTTP/9.9", raw_request("GET", good_path, version="HTTP/9.9"), ok=version_ok),
        Case("HTTP/2.0", raw_request("GET", good_path, version="HTTP/2.0"), ok=version_ok),
        Case("version HTTP/", raw_request("GET", good_path, version="HTTP/")),
        Case("version 1.1.1", raw_request("GET", good_path, version="HTTP/1.1.1")),
        Case("version with 5000 digits", raw_request("GET", good_path, version="HTTP/1." + HUGE_DIGITS)),
        Case("binary request line", b"\x00\xff\xfe garbage \x01\x02\r\n\r\n"),
        Case("request line too long", get("/" + "r" * 70000)),
        # headers
        Case("header too long", raw_request("GET", good_path, headers={"X-Long": "a" * 70000})),
        Case("too many headers", raw_request("GET", good_path, headers={f"X-{i}": "1" for i in range(120)})),
        Case("header without a colon", get(good_path).replace(b"\r\n\r\n", b"\r\nno colon here\r\n\r\n", 1),
             ok=tolerated),  # http.server's header parser skips such a line
        Case("header of invalid UTF-8", get(good_path).replace(b"\r\n\r\n", b"\r\nX-Bad: \xff\xfe\x00\r\n\r\n", 1),
             ok=lambda status: 200 <= status < 500),  # http.server reads headers as latin-1: any byte is a value
        # bodies
        Case("body over the limit", raw_request("POST", post, b" " * (BODY_LIMIT + 1))),
        Case("Content-Length over the limit", raw_request("POST", post, body, {"Content-Length": str(BODY_LIMIT + 1)})),
        Case("Content-Length of 5000 digits", raw_request("POST", post, body, {"Content-Length": HUGE_DIGITS})),
        Case("Content-Length 30 digits", raw_request("POST", post, body, {"Content-Length": "9" * 30})),
        Case("Content-Length -5", raw_request("POST", post, body, {"Content-Length": "-5"})),
        Case("Content-Length abc", raw_request("POST", post, body, {"Content-Length": "abc"})),
        Case("Content-Length \u00b2", raw_request("POST", post, body, {"Content-Length": "\u00b2"})),
        Case("two Content-Lengths", raw_request("POST", post, body, length=False).replace(
            b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\nContent-Length: 3\r\n\r\n".encode(), 1)),
        Case("chunked", raw_request("POST", post, b"5\r\nhello\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"},
                                    length=False)),
        Case("no Content-Length", raw_request("POST", post, body, length=False)),
        Case("body shorter than its Content-Length",
             raw_request("POST", post, body, {"Content-Length": str(len(body) + 50)})),
        Case("empty body", raw_request("POST", post, b"", {"Content-Length": "0"})),
        Case("body not JSON", raw_request("POST", post, b"this is not json")),
        Case("body truncated JSON", raw_request("POST", post, body[:-1])),
        Case("body of invalid UTF-8", raw_request("POST", post, body.replace(b'"', b'"\xff\xfe', 1))),
        Case("body UTF-16", raw_request("POST", post, json.dumps(target.post_body or {"x": 1}).encode("utf-16"))),
        Case("body nested 5000 deep", raw_request("POST", post, b"[" * 5000)),
        Case("body a 5000-digit number", raw_request("POST", post, HUGE_DIGITS.encode())),
        Case("body 1e999", raw_request("POST", post, b'{"x": 1e999}')),
        Case("body NaN", raw_request("POST", post, b'{"x": NaN}')),
        Case("body a list", raw_request("POST", post, b"[" + body + b"]")),
        Case("body a lone surrogate", raw_request("POST", post, b'{"x": "\\ud800"}')),
        # paths and queries: bad encodings, huge numbers
        Case("path of invalid UTF-8", get("/\xff\xfe\xfd")),
        Case("path percent-encoded invalid UTF-8", get("/%ff%fe%fd")),
        Case("path with a percent-encoded surrogate", get("/%ED%A0%80")),
        Case("path with a NUL", get("/%00")),
        Case("path with a bad percent escape", get("/%zz%")),
        Case("path traversal", get("/../../etc/passwd")),
        Case("path *", raw_request("OPTIONS", "*")),
        Case("path an absolute URL elsewhere", get("http://example.invalid/"), ok=tolerated),  # RFC 9112's absolute-form
        Case("path of 5000 digits", get("/" + HUGE_DIGITS)),
        Case("unknown path", get("/no/such/endpoint")),
    ]
    if target.post_path is not None:
        for key, value in (target.post_body or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                raw = json.dumps({**target.post_body, key: 0}).encode().replace(
                    f'"{key}": 0'.encode(), f'"{key}": {HUGE_DIGITS}'.encode())
                cases.append(Case(f"body {key}=5000 digits", raw_request("POST", post, raw)))
                cases.append(Case(f"body {key}=1e400", raw_request("POST", post, raw.replace(HUGE_DIGITS.encode(),
                                                                                             b"1e400"))))
    for name, query in (("invalid UTF-8", "q=\xff\xfe"), ("percent-encoded invalid UTF-8", "q=%ff%fe"),
                        ("a surrogate", "q=%ED%A0%80")):
        # a query the server ignores may be answered 200; a crash or a hang is what must not happen
        path = good_path + ("&" if "?" in good_path else "?") + query
        cases.append(Case(f"query of {name}", get(path), ok=tolerated))
    return cases + target.extra


def slow_cases(target: Target) -> list[Case]:
    """Clients that stall or trickle; each must be answered (408, 400) or dropped within :data:`SLOW_BOUND_S`."""
    good_path = target.good.split(b" ", 2)[1]
    post = (target.post_path or good_path.decode("latin-1")).encode("latin-1")
    body = json.dumps(target.post_body or {"x": 1}).encode()
    return [
        Case("nothing sent", b"", half_close=False),
        Case("half a request line", b"GET " + good_path[:3], half_close=False),
        Case("request line, no headers", b"GET " + good_path + b" HTTP/1.1\r\n", half_close=False),
        Case("headers never finished", b"GET " + good_path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b",
             half_close=False),
        Case("body never finished", b"POST " + post + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
             + str(len(body) + 100).encode() + b"\r\n\r\n" + body, half_close=False),
    ]


def run_slow_case(port: int, case: Case, trickle: bool = False) -> tuple[float, int, bytes]:
    """Send a stalled (or, with ``trickle``, one byte every 0.1 s) request and wait: (seconds until the
    server answered or closed, status, body)."""
    start = time.monotonic()
    status, body = 0, b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=SLOW_BOUND_S + 2) as sock:
            if trickle:
                sock.settimeout(0.1)
                data = case.raw + b"X-Slow: " + b"s" * 1000
                answer = b""
                for i in range(len(data)):
                    if time.monotonic() - start > SLOW_BOUND_S + 2:
                        break
                    try:
                        sock.send(data[i : i + 1])
                    except OSError:
                        break
                    try:
                        chunk = sock.recv(1 << 16)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if not chunk:
                        break
                    answer += chunk
                sock.settimeout(2)
                try:
                    while chunk := sock.recv(1 << 16):
                        answer += chunk
                except OSError:
                    pass
            else:
                sock.sendall(case.raw)
                answer = b""
                try:
                    while chunk := sock.recv(1 << 16):
                        answer += chunk
                except OSError:
                    pass
        status, _, body = parse_answer(answer) if answer else (0, {}, b"")
    except OSError as e:
        body = f"{type(e).__name__}: {e}".encode()
    return time.monotonic() - start, status, body


def run_concurrently(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Each job in its own thread, all at once; their results in order."""
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except Exception as e:  # noqa: BLE001 - reported as the result
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SLOW_BOUND_S * 4)
    return results


# ------------------------------------------------------------------------------------------ concurrency


async def _one(port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    status, _, body = parse_answer(answer)
    return status, body


def burst(port: int, raw: bytes, clients: int, timeout: float = 60.0) -> tuple[list[tuple[int, bytes]], float]:
    """``clients`` connections opened at once, each sending ``raw`` and reading to EOF: the answers, the seconds."""

    async def run():
        jobs = [asyncio.wait_for(_one(port, raw), timeout) for _ in range(clients)]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        return [(0, repr(r).encode()) if isinstance(r, BaseException) else r for r in results]

    start = time.perf_counter()
    results = asyncio.run(run())
    return results, time.perf_counter() - start
