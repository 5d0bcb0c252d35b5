"""The Search-R1-compatible HTTP server and client, against a real server on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import pytest

from capo_envs.retrieval.base import Hit, Passage, Retriever, check_search_args, write_corpus
from capo_envs.retrieval.http import HTTPRetriever, RetrieverHTTPError, _hit_from_item
from capo_envs.retrieval.server import make_server

CORPUS = [
    Passage("p0", "Paris", "Paris is the capital and largest city of France."),
    Passage("p1", "Berlin", "Berlin is the capital of Germany."),
    Passage("p2", "France", "France is a country in Western Europe; its capital is Paris."),
    Passage("p3", "Danube", "The Danube flows through Vienna and Budapest."),
    Passage("p4", "Ünïcode", "Zürich and Malmö have names with umlauts ☃."),
]


class OverlapRetriever(Retriever):
    """Scores a passage by how many distinct query words it contains; ties by corpus position."""

    def __init__(self, passages: Sequence[Passage]):
        self.passages = list(passages)
        self.words = [set(re.findall(r"\w+", f"{p.title} {p.text}".lower())) for p in self.passages]
        self.calls = 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        self.calls += 1
        results = []
        for q in queries:
            terms = set(re.findall(r"\w+", q.lower()))
            scored = [(len(terms & w), i) for i, w in enumerate(self.words)]
            ranked = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:k]
            results.append([Hit(self.passages[i].id, self.passages[i].title, self.passages[i].text, float(s)) for s, i in ranked])
        return results


class FailingRetriever(OverlapRetriever):
    """Raises on the query "boom", to check a backend failure becomes a 500 and nothing worse."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if "boom" in queries:
            self.calls += 1
            raise RuntimeError("the index exploded")
        return super().search(queries, k)


@pytest.fixture
def retriever() -> OverlapRetriever:
    return OverlapRetriever(CORPUS)


@pytest.fixture
def server(retriever):
    with make_server(retriever, port=0, max_queries=8, max_topk=10, max_body_bytes=4096).start_in_thread() as srv:
        srv.request_timeout = 1.0  # bodies shorter than their Content-Length fail fast
        yield srv


def post(url: str, payload, path: str = "/retrieve") -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return request(url, "POST", path, body)


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else {}
    finally:
        conn.close()


def raw_exchange(url: str, data: bytes) -> bytes:
    """Send raw bytes and read whatever comes back until the server closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def assert_still_serving(url: str) -> None:
    status, answer = post(url, {"queries": ["capital of France"], "topk": 1})
    assert status == 200
    assert answer["result"][0][0]["id"] == "p0"


def test_round_trip_equals_direct_search(server, retriever):
    queries = ["capital of France", "Danube Vienna", "nothing matches this", "", "zürich malmö ☃."]
    client = HTTPRetriever(server.url)
    for k in (1, 3, 5):
        assert client.search(queries, k) == retriever.search(queries, k)
    assert HTTPRetriever(server.url + "/retrieve/").search(queries, 2) == retriever.search(queries, 2)
    assert client.search([], 3) == []


def test_client_batches_under_the_server_limit(server, retriever):
    queries = [f"capital {word}" for word in "france germany paris berlin europe vienna".split()] * 3  # 18 > 8
    client = HTTPRetriever(server.url, batch_size=5)
    before = retriever.calls
    assert client.search(queries, 2) == retriever.search(queries, 2)
    assert retriever.calls - before == 4 + 1  # ceil(18 / 5) batches, plus the direct call


def test_response_shapes(server, retriever):
    status, answer = post(server.url, {"queries": ["capital of France", "Berlin"], "topk": 2, "return_scores": True})
    assert status == 200
    assert [len(r) for r in answer["result"]] == [2, 1]
    item = answer["result"][0][0]
    assert set(item) == {"document", "score"}
    assert item["document"] == {"id": "p0", "title": "Paris", "text": CORPUS[0].text, "contents": f'"Paris"\n{CORPUS[0].text}'}
    assert item["score"] == retriever.search(["capital of France"], 1)[0][0].score

    status, answer = post(server.url, {"queries": ["capital of France"], "topk": 2})  # return_scores defaults to false
    assert status == 200
    assert [doc["id"] for doc in answer["result"][0]] == [h.id for h in retriever.search(["capital of France"], 2)[0]]
    assert all(set(doc) == {"id", "title", "text", "contents"} for doc in answer["result"][0])

    for payload in ({"queries": ["capital of France is"]}, {"queries": ["capital of France is"], "topk": None}):
        status, answer = post(server.url, payload)  # Search-R1's default topk is 3
        assert status == 200 and len(answer["result"][0]) == 3


def test_health(server):
    status, answer = request(server.url, "GET", "/health")
    assert status == 200
    assert answer["status"] == "ok" and answer["retriever"] == "OverlapRetriever" and answer["max_topk"] == 10


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"this is not json", 400, "not valid JSON"),
        (b'{"queries": ["caf\xe9"]}', 400, "UTF-8"),
        (b'["capital"]', 400, "JSON object"),
        (b"{}", 400, "missing"),
        (b'{"queries": "capital of France"}', 400, "list of strings"),
        (b'{"queries": ["ok", 3]}', 400, "list of strings"),
        (b'{"queries": null}', 400, "missing"),
        (json.dumps({"queries": ["q"] * 9}).encode(), 413, "limit of 8"),
        (b'{"queries": ["a"], "topk": 0}', 400, "topk"),
        (b'{"queries": ["a"], "topk": -2}', 400, "topk"),
        (b'{"queries": ["a"], "topk": 11}', 400, "topk"),
        (b'{"queries": ["a"], "topk": "3"}', 400, "topk"),
        (b'{"queries": ["a"], "topk": 2.5}', 400, "topk"),
        (b'{"queries": ["a"], "topk": true}', 400, "topk"),
        (b'{"queries": ["a"], "return_scores": "yes"}', 400, "return_scores"),
        (b"x" * 5000, 413, "exceeds the limit"),
    ],
)
def test_bad_bodies_get_4xx_and_the_server_goes_on(server, body, status, message):
    got_status, answer = post(server.url, body)
    assert got_status == status
    assert message in answer["error"]
    assert_still_serving(server.url)


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("POST", "/search", 404),
        ("GET", "/", 404),
        ("GET", "/retrieve", 405),
        ("PUT", "/retrieve", 405),
        ("DELETE", "/retrieve", 405),
        ("BREW", "/retrieve", 405),
        ("POST", "/health", 405),
    ],
)
def test_wrong_path_or_method(server, method, path, status):
    got_status, answer = request(server.url, method, path, body=b'{"queries": ["a"]}')
    assert got_status == status and answer["error"]
    assert_still_serving(server.url)


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"POST /retrieve HTTP/1.1\r\nHost: x\r\n\r\n", 411),  # no Content-Length
        (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411),
        (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", 400),
        (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}", 400),
        (b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"queries": ["a"]}', 400),  # claims more
        (b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{"queries": ["a"]}', 400),  # claims less
        (b"POST /" + b"r" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
)
def test_lying_or_missing_content_length(server, raw, status):
    answer = raw_exchange(server.url, raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode()
    assert json.loads(body)["error"]
    assert_still_serving(server.url)


@pytest.mark.parametrize(
    "garbage",
    [b"\x00\xff\xfe garbage \x01\x02\r\n\r\n", b"GET\r\n\r\n", b"HELLO WORLD FOO BAR\r\n\r\n", os.urandom(4096), b""],
)
def test_raw_garbage_does_not_hurt(server, garbage):
    raw_exchange(server.url, garbage)
    assert_still_serving(server.url)


def test_retriever_exception_is_a_500_and_serving_continues():
    with make_server(FailingRetriever(CORPUS), port=0).start_in_thread() as srv:
        status, answer = post(srv.url, {"queries": ["boom"]})
        assert status == 500 and "the index exploded" in answer["error"]
        assert_still_serving(srv.url)


def test_client_errors(server, monkeypatch):
    client = HTTPRetriever(server.url)
    with pytest.raises(RetrieverHTTPError, match=r"HTTP 400.*topk"):
        client.search(["capital"], 50)  # over the server's max_topk of 10

    monkeypatch.setattr("capo_envs.retrieval.http.time.sleep", lambda seconds: None)
    failing = FailingRetriever(CORPUS)
    with make_server(failing, port=0).start_in_thread() as srv:
        with pytest.raises(RetrieverHTTPError, match=r"3 attempts.*HTTP 500.*the index exploded"):
            HTTPRetriever(srv.url, retries=2).search(["boom"], 3)
        assert failing.calls == 3
        port = srv.server_address[1]
    with pytest.raises(RetrieverHTTPError, match="2 attempts"):
        HTTPRetriever(f"http://127.0.0.1:{port}", retries=1, timeout=2).search(["x"], 1)


def test_client_reads_search_r1_layouts():
    search_r1_doc = {"id": "2", "contents": '"Paris"\nParis is the capital of France.'}
    assert _hit_from_item({"document": search_r1_doc, "score": 0.5}) == Hit("2", "Paris", "Paris is the capital of France.", 0.5)
    assert _hit_from_item(search_r1_doc) == Hit("2", "Paris", "Paris is the capital of France.", 0.0)
    assert _hit_from_item({"document": {"content": "just text"}, "score": 1}) == Hit("", "", "just text", 1.0)
    assert _hit_from_item('"T"\nbody') == Hit("", "T", "body", 0.0)
    assert _hit_from_item({"document": {"id": 7, "title": None, "text": "t"}, "score": None}) == Hit("7", "", "t", 0.0)
    client = HTTPRetriever("http://127.0.0.1:1")
    assert client._parse_answer([[search_r1_doc, search_r1_doc]], 1, 1) == [[Hit("2", "Paris", "Paris is the capital of France.", 0.0)]]
    with pytest.raises(RetrieverHTTPError, match="expected a result list"):
        client._parse_answer({"result": [[]]}, 2, 3)


def test_concurrent_clients_get_their_own_answers(server, retriever):
    words = "paris berlin capital france germany danube vienna budapest europe country zürich".split()
    queries = [f"{a} {b}" for a in words for b in words]
    expected = dict(zip(queries, retriever.search(queries, 3)))
    errors: list[str] = []

    def worker(offset: int) -> None:
        client = HTTPRetriever(server.url, batch_size=3)
        mine = queries[offset::8]
        for start in range(0, len(mine), 7):
            chunk = mine[start : start + 7]
            for q, hits in zip(chunk, client.search(chunk, 3)):
                if hits != expected[q]:
                    errors.append(q)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_shutdown_releases_the_port(retriever):
    srv = make_server(retriever, port=0).start_in_thread()
    port = srv.server_address[1]
    assert_still_serving(srv.url)
    srv.shutdown()
    srv.shutdown()  # twice is fine
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with make_server(retriever, port=port).start_in_thread() as again:
        assert_still_serving(again.url)
    make_server(retriever, port=0).shutdown()  # never served: must not hang


def test_serve_main_cli(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(CORPUS, corpus)
    code = "import sys; from capo_envs.retrieval.server import serve_main; sys.exit(serve_main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--corpus", str(corpus), "--retriever", "bm25", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, proc.stderr.read() if proc.poll() is not None else line
        url = match.group()
        status, answer = request(url, "GET", "/health")
        assert status == 200 and answer["status"] == "ok"
        assert HTTPRetriever(url).search(["Danube Vienna"], 1)[0][0].id == "p3"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
