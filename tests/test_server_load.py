"""Both loopback JSON servers (``capo serve-retriever``, ``capo serve``) under load and abuse.

Load: 1,000 clients at once, each on its own connection opened at the same moment (asyncio raw sockets,
no keep-alive), sending one request and reading to EOF. Every one must get a valid answer (with
http.server's default listen backlog of 5, about half of such a burst never was), and afterwards the
per-connection threads must be gone. Abuse: a table of malformed requests per server (protocol, headers,
bodies, each field with each wrong value), each answered with a JSON 4xx, the server serving on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from capo_envs.core.http import JSONServer
from capo_envs.retrieval import BM25Retriever, Passage
from capo_envs.retrieval.server import make_server

CLIENTS = 1000
CLIENT_TIMEOUT_S = 30.0  # per client; the whole burst takes seconds, but the 2 cores may be shared


async def _exchange(port: int, raw: bytes) -> tuple[int, object]:
    """One connection: send ``raw``, read to EOF; (status, parsed JSON body), or (0, the error's name)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(raw)
            await writer.drain()
            answer = await reader.read()  # the request says Connection: close
        finally:
            writer.close()
        return parse_answer(answer)
    except (OSError, ValueError, IndexError) as e:
        return 0, type(e).__name__


def parse_answer(answer: bytes) -> tuple[int, object]:
    """An HTTP answer's status and JSON body; ValueError or IndexError when it is not one."""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def burst(port: int, requests: list[bytes]) -> tuple[list[tuple[int, object]], float]:
    """Send every request on its own connection, all at once; the answers in order and the wall time."""

    async def run() -> list[tuple[int, object]]:
        bounded = [asyncio.wait_for(_exchange(port, raw), CLIENT_TIMEOUT_S) for raw in requests]
        results = await asyncio.gather(*bounded, return_exceptions=True)
        return [(0, type(r).__name__) if isinstance(r, BaseException) else r for r in results]

    start = time.perf_counter()
    results = asyncio.run(run())
    return results, time.perf_counter() - start


def http_request(method: str, path: str, payload: dict | None = None) -> bytes:
    body = b"" if payload is None else json.dumps(payload).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def assert_no_threads_left(server: JSONServer, before: int) -> None:
    """The handler threads end with their connections; the server keeps no list of them."""
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before
    assert len(getattr(server, "_threads", ())) == 0


def report(name: str, answered: int, seconds: float) -> None:
    print(f"\n{name}: {answered}/{CLIENTS} answered in {seconds:.2f} s")


def test_retriever_server_answers_1000_concurrent_clients():
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()
    passages = [Passage(f"p{i}", f"{words[i % 15]} {i}", f"{words[i % 15]} {words[(i * 7) % 15]} passage {i}")
                for i in range(200)]
    retriever = BM25Retriever.build(passages)
    queries = [f"{words[i % 15]} {words[(i * 3) % 15]}" for i in range(CLIENTS)]
    expected = [[h.id for h in hits] for hits in retriever.search(queries, 2)]
    requests = [http_request("POST", "/retrieve", {"queries": [q], "topk": 2}) for q in queries]

    with make_server(retriever, port=0).start_in_thread() as server:
        threads_before = threading.active_count()
        results, seconds = burst(server.server_address[1], requests)
        answered = sum(status == 200 and [d["id"] for d in body["result"][0]] == want
                       for (status, body), want in zip(results, expected))
        report("capo serve-retriever", answered, seconds)
        failures = sorted({str(r) for r in results if r[0] != 200})
        assert answered == CLIENTS, f"{CLIENTS - answered} failed: {failures[:5]}"
        assert_no_threads_left(server, threads_before)


@pytest.mark.slow  # the tiny model takes seconds to build
def test_completion_server_answers_1000_concurrent_clients():
    from capo_train.backends.hf import HFBackend
    from capo_train.backends.server import serve
    from capo_train.models import make_tiny_llama

    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    completions = 10  # real generations, spread through the burst; the rest ask for the model list
    completion = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
    requests = [http_request("POST", "/v1/completions", completion) if i % (CLIENTS // completions) == 0
                else http_request("GET", "/v1/models") for i in range(CLIENTS)]

    server = serve(HFBackend(model.eval(), tokenizer), tokenizer, "tiny")
    try:
        threads_before = threading.active_count()
        results, seconds = burst(server.server_address[1], requests)

        def valid(status: int, body) -> bool:
            if status != 200 or not isinstance(body, dict):
                return False
            if body.get("object") == "list":
                return [m["id"] for m in body["data"]] == ["tiny"]
            return len(body["choices"]) == 1 and body["usage"]["completion_tokens"] >= 1

        answered = sum(valid(*r) for r in results)
        report("capo serve", answered, seconds)
        assert sum(r[0] == 200 and "choices" in r[1] for r in results) == completions
        failures = sorted({str(r) for r in results if r[0] != 200})
        assert answered == CLIENTS, f"{CLIENTS - answered} failed: {failures[:5]}"
        assert_no_threads_left(server, threads_before)
    finally:
        server.close()


# ----------------------------------------------------------------------------- malformed requests


def raw_request(method: str, path: str, body: bytes = b"", headers: dict | None = None, length: bool = True) -> bytes:
    """A request as bytes, with ``Content-Length`` unless ``length`` is false or ``headers`` set one."""
    fields = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    if length and "Content-Length" not in fields:
        fields["Content-Length"] = str(len(body))
    head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body


def exchange(port: int, raw: bytes, half_close: bool = True) -> tuple[int, object]:
    """Send ``raw`` on a fresh connection, read to EOF; (status, JSON body), or (0, what went wrong)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)  # a body shorter than its Content-Length ends here
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
        return parse_answer(b"".join(chunks))
    except (OSError, ValueError, IndexError) as e:
        return 0, f"no JSON answer: {type(e).__name__}: {e}"


DEEP = b"[" * 5000  # Python's parser: RecursionError
HUGE_INT = b"9" * 5000  # past sys.get_int_max_str_digits(): ValueError
NESTED = b"[" * 900 + b"]" * 900  # parses, but a plain repr in an error message could recurse too deep
HUGE_STRING = json.dumps("x" * (1 << 20)).encode()
BAD_VALUES = {  # a wrong value of any type, for any field
    "null": b"null", "true": b"true", "string": b'"3"', "float": b"2.5", "negative": b"-1", "zero": b"0",
    "huge": b"1" + b"0" * 30, "huge-int": HUGE_INT, "NaN": b"NaN", "Infinity": b"Infinity", "-Infinity": b"-Infinity",
    "1e999": b"1e999", "list": b"[1]", "object": b'{"a": 1}', "nested": NESTED, "deep": DEEP, "surrogate": b'"\\ud800"',
    "huge-string": HUGE_STRING,
}


def malformed(path: str, good: dict, fields: dict[str, set[str]], body_limit: int) -> list[tuple[str, bytes, bool]]:
    """(name, raw request, half-close) for a server whose endpoint is ``POST path`` and takes ``good``:
    protocol-level mistakes, bodies that are not a JSON object, and each field given each value of
    ``BAD_VALUES`` except the ones named as valid for it in ``fields``."""
    good_body = json.dumps(good).encode()
    cases = [
        ("empty body", raw_request("POST", path), True),
        ("deep nesting", raw_request("POST", path, DEEP), True),
        ("deep objects", raw_request("POST", path, b'{"a":' * 5000), True),
        ("huge int", raw_request("POST", path, HUGE_INT), True),
        ("non-UTF-8", raw_request("POST", path, good_body.replace(b'"', b'"\xff', 1)), True),
        ("UTF-16", raw_request("POST", path, json.dumps(good).encode("utf-16")), True),
        ("latin-1", raw_request("POST", path, json.dumps(good).replace("}", ', "x": "\xe9"}').encode("latin-1")), True),
        ("truncated JSON", raw_request("POST", path, good_body[:-1]), True),
        ("trailing garbage", raw_request("POST", path, good_body + b" x"), True),
        ("two objects", raw_request("POST", path, good_body * 2), True),
        ("unknown key", raw_request("POST", path, json.dumps({**good, "bogus": 1}).encode()), True),
        ("misspelt key", raw_request("POST", path, json.dumps({**good, "top_k_": 1}).encode()), True),
        ("huge key", raw_request("POST", path, json.dumps({**good, "k" * (1 << 20): 1}).encode()), True),
        ("over the body limit", raw_request("POST", path, b" " * (body_limit + 1)), True),
        ("no Content-Length", raw_request("POST", path, good_body, length=False), True),
        ("chunked", raw_request("POST", path, b"5\r\nhello\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"},
                                length=False), True),
        ("chunked and a length", raw_request("POST", path, good_body, {"Transfer-Encoding": "chunked"}), True),
        ("gzip encoding", raw_request("POST", path, good_body, {"Transfer-Encoding": "gzip"}), True),
        ("Content-Length abc", raw_request("POST", path, good_body, {"Content-Length": "abc"}), True),
        ("Content-Length -5", raw_request("POST", path, good_body, {"Content-Length": "-5"}), True),
        ("Content-Length +5", raw_request("POST", path, good_body, {"Content-Length": f"+{len(good_body)}"}), True),
        ("Content-Length 1_0", raw_request("POST", path, good_body, {"Content-Length": "1_0"}), True),
        ("Content-Length 2.0", raw_request("POST", path, good_body, {"Content-Length": "2.0"}), True),
        ("Content-Length empty", raw_request("POST", path, good_body, {"Content-Length": ""}), True),
        ("Content-Length huge", raw_request("POST", path, good_body, {"Content-Length": "9" * 30}), True),
        ("Content-Length 5000 digits", raw_request("POST", path, good_body, {"Content-Length": "9" * 5000}), True),
        ("Content-Length over the limit", raw_request("POST", path, good_body, {"Content-Length": str(body_limit + 1)}),
         True),
        ("Content-Length too long", raw_request("POST", path, good_body, {"Content-Length": str(len(good_body) + 50)}),
         True),
        ("Content-Length too long, client waits", raw_request("POST", path, good_body,
                                                              {"Content-Length": str(len(good_body) + 50)}), False),
        ("Content-Length too short", raw_request("POST", path, good_body, {"Content-Length": "5"}), True),
        ("Content-Length zero", raw_request("POST", path, good_body, {"Content-Length": "0"}), True),
        ("two Content-Lengths", raw_request("POST", path, good_body, length=False).replace(
            b"\r\n\r\n", f"\r\nContent-Length: {len(good_body)}\r\nContent-Length: 3\r\n\r\n".encode(), 1), True),
        ("header too long", raw_request("POST", path, good_body, {"X-Long": "a" * 70000}), True),
        ("too many headers", raw_request("POST", path, good_body, {f"X-{i}": "1" for i in range(120)}), True),
        ("line too long", raw_request("POST", "/" + "r" * 70000, good_body), True),
        ("HTTP/0.9 POST", f"POST {path}\r\n\r\n".encode(), True),
        ("HTTP/9.9", raw_request("POST", path, good_body).replace(b"HTTP/1.1", b"HTTP/9.9", 1), True),
        ("no version", raw_request("POST", path, good_body).replace(b" HTTP/1.1", b" HTTP/", 1), True),
        ("binary request line", b"\x00\xff\xfe garbage \x01\x02\r\n\r\n", True),
        ("bad path /", raw_request("POST", "/", good_body), True),
        ("bad path deeper", raw_request("POST", path + "/x", good_body), True),
        ("bad path traversal", raw_request("POST", "/../.." + path, good_body), True),
        ("bad path non-ASCII", raw_request("POST", "/r\xe9trieve", good_body), True),
        ("bad path *", raw_request("OPTIONS", "*", b""), True),
        ("bad path other", raw_request("GET", "/nowhere"), True),
    ]
    for method in ("GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW", "post"):
        cases.append((f"method {method}", raw_request(method, path, good_body), True))
    for value in (b"[]", b'"text"', b"1", b"null", b"true", b"[" + good_body + b"]"):
        cases.append((f"non-object {value[:10]!r}", raw_request("POST", path, value), True))
    for field, valid in fields.items():
        for name, value in BAD_VALUES.items():
            if name not in valid:
                body = json.dumps({**good, field: None}).encode()
                body = body.replace(f'"{field}": null'.encode(), f'"{field}": '.encode() + value)
                cases.append((f"{field}={name}", raw_request("POST", path, body), True))
    return cases


def assert_every_bad_request_gets_a_json_4xx(port: int, cases: list[tuple[str, bytes, bool]], still_serving) -> int:
    """Each case answered with a JSON 4xx (or HTTP's 505 for a version it does not speak) and an error
    message, the server answering a good request after each; returns how many bad requests were tried."""
    crashes = []
    for name, raw, half_close in cases:
        status, answer = exchange(port, raw, half_close)
        if not ((400 <= status < 500 or status == 505) and isinstance(answer, dict) and answer.get("error")):
            crashes.append(f"{name}: {status} {answer!r:.200}")
        if not still_serving():
            crashes.append(f"{name}: the server stopped answering good requests")
    assert crashes == [], f"{len(crashes)} of {len(cases)} not answered with a JSON 4xx:\n" + "\n".join(crashes)
    return len(cases)


def test_retriever_server_answers_every_bad_request_with_a_json_4xx():
    passages = [Passage("p0", "Paris", "Paris is the capital of France."), Passage("p1", "Berlin", "In Germany.")]
    retriever = BM25Retriever.build(passages)
    fields = {"queries": set(), "topk": {"null"}, "return_scores": {"true"}}  # the values of BAD_VALUES that are valid
    with make_server(retriever, port=0, max_queries=8, max_topk=10, max_body_bytes=4 << 20).start_in_thread() as server:
        server.request_timeout = 0.5  # the client that never sends its promised bytes is given up on fast
        port = server.server_address[1]

        def still_serving() -> bool:
            status, answer = exchange(port, raw_request("POST", "/retrieve", b'{"queries": ["capital of France"]}'))
            return status == 200 and answer["result"][0][0]["id"] == "p0"

        good = {"queries": ["capital of France"], "topk": 2, "return_scores": False}
        cases = malformed("/retrieve", good, fields, 4 << 20)
        cases += [
            ("queries: list with an int", raw_request("POST", "/retrieve", b'{"queries": ["a", 3]}'), True),
            ("queries: list of lists", raw_request("POST", "/retrieve", b'{"queries": [["a"]]}'), True),
            ("queries: list with a surrogate", raw_request("POST", "/retrieve", b'{"queries": ["a\\udc80"]}'), True),
            ("too many queries", raw_request("POST", "/retrieve", json.dumps({"queries": ["q"] * 9}).encode()), True),
            ("topk over the limit", raw_request("POST", "/retrieve", b'{"queries": ["a"], "topk": 11}'), True),
            ("topk 2.0", raw_request("POST", "/retrieve", b'{"queries": ["a"], "topk": 2.0}'), True),
            ("missing queries", raw_request("POST", "/retrieve", b'{"topk": 2}'), True),
            ("POST /health", raw_request("POST", "/health", b"{}"), True),
        ]
        tried = assert_every_bad_request_gets_a_json_4xx(port, cases, still_serving)
    print(f"\ncapo serve-retriever: {tried} bad requests, each a JSON 4xx, 0 crashes")


@pytest.mark.slow  # the tiny model takes seconds to build
def test_completion_server_answers_every_bad_request_with_a_json_4xx():
    from capo_train.backends.hf import HFBackend
    from capo_train.backends.server import CompletionServer
    from capo_train.models import make_tiny_llama

    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    backend = HFBackend(model.eval(), tokenizer)
    server = CompletionServer(backend, tokenizer, "tiny", max_body_bytes=4 << 20).start_in_thread()
    try:
        server.request_timeout = 0.5
        port = server.server_address[1]
        good = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}

        def still_serving() -> bool:  # the cheap endpoint after each case; generations at the end
            status, answer = exchange(port, raw_request("GET", "/v1/models"))
            return status == 200 and answer["data"][0]["id"] == "tiny"

        def still_generating() -> bool:
            status, answer = exchange(port, raw_request("POST", "/v1/completions", json.dumps(good).encode()))
            return status == 200 and answer["usage"]["completion_tokens"] >= 1

        fields = {  # the values of BAD_VALUES that are valid for each field
            "model": {"null"}, "prompt": {"string", "list"}, "max_tokens": {"null"},
            "temperature": {"null", "zero", "float"}, "stop": {"null", "string", "huge-string"},
            "seed": {"null", "zero", "negative"}, "logprobs": {"null", "zero"},
            "return_tokens_as_token_ids": {"null", "true"}, "include_stop_str_in_output": {"null", "true"},
            "n": {"null"}, "top_p": {"null"}, "stream": {"null"}, "logit_bias": {"null"},
        }
        cases = malformed("/v1/completions", good, fields, 4 << 20)
        bad_bodies = {
            "prompt: empty list": {"prompt": []}, "prompt: empty string": {"prompt": ""},
            "prompt: empty batch item": {"prompt": [[5], []]}, "prompt: batch of batches": {"prompt": [[[5]]]},
            "prompt: bools": {"prompt": [True, False]}, "prompt: floats": {"prompt": [1.0, 2.0]},
            "prompt: negative id": {"prompt": [5, -1]}, "prompt: id past the vocabulary": {"prompt": [10**9]},
            "prompt: surrogate in a batch": {"prompt": ["ok", "a\udc80"]},
            "prompt: over the positions": {"prompt": [5] * 600},
            "prompt: too many characters": {"prompt": "x" * 20000},
            "max_tokens: over the limit": {"max_tokens": 4097}, "max_tokens: past the positions": {"max_tokens": 600},
            "temperature: over 100": {"temperature": 101}, "stop: empty string": {"stop": [""]},
            "stop: list with an int": {"stop": ["a", 3]}, "logprobs: 5": {"logprobs": 5},
            "seed: past int64": {"seed": 2**64}, "model: another": {"model": "gpt-4"}, "n: 2": {"n": 2},
            "best_of: 2": {"best_of": 2}, "echo": {"echo": True}, "suffix": {"suffix": "x"},
            "top_k: 5": {"top_k": 5}, "min_p": {"min_p": 0.1}, "repetition_penalty": {"repetition_penalty": 1.2},
            "logit_bias": {"logit_bias": {"5": 100}}, "vLLM's max_new_tokens": {"max_new_tokens": 3},
        }
        for name, fields_ in bad_bodies.items():
            body = json.dumps({**good, **fields_}).encode()  # ensure_ascii: the surrogate goes as "\\udc80"
            cases.append((name, raw_request("POST", "/v1/completions", body), True))
        cases.append(("POST /v1/chat/completions", raw_request("POST", "/v1/chat/completions", b"{}"), True))
        cases.append(("POST /v1/models", raw_request("POST", "/v1/models", b"{}"), True))
        tried = assert_every_bad_request_gets_a_json_4xx(port, cases, still_serving)
        assert still_generating()
    finally:
        server.close()
    print(f"\ncapo serve: {tried} bad requests, each a JSON 4xx, 0 crashes")


def test_http09_is_refused_at_once_and_kept_alive_connections_are_bounded():
    """With the default limits: ``GET /`` without a version is a 400 straight away (it used to wait for headers
    that an HTTP/0.9 client never sends); a kept-alive connection serves several requests, and one left idle
    is closed after ``header_timeout``."""
    retriever = BM25Retriever.build([Passage("p0", "Paris", "Paris is the capital of France.")])
    with make_server(retriever, port=0).start_in_thread() as server:
        assert (server.header_timeout, server.body_timeout) == (10.0, 60.0)
        port = server.server_address[1]
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /health\r\n")  # and the client waits, as an HTTP/0.9 client does
            answer = b""
            while chunk := sock.recv(1 << 16):
                answer += chunk
        status, body = parse_answer(answer)
        assert status == 400 and "HTTP/0.9 is not supported" in body["error"] and time.monotonic() - start < 3
        server.header_timeout = 1.0
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            reader = sock.makefile("rb")
            for _ in range(2):
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert reader.readline().startswith(b"HTTP/1.1 200 ")
                head = [line for line in iter(reader.readline, b"\r\n")]
                length = next(int(line.split(b":")[1]) for line in head if line.lower().startswith(b"content-length"))
                assert json.loads(reader.read(length))["status"] == "ok"
            idle = time.monotonic()
            assert reader.read() == b""  # closed by the server, quietly: nothing of a request had come
            assert 0.5 < time.monotonic() - idle < 4
