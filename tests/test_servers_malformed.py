"""Every capo server under bad input and faults, with one suite (tests/malformed_http.py): bad methods, request
lines, headers, huge and malformed bodies, invalid UTF-8 in path, query and body, huge numbers, HTTP/0.9,
clients that stall or trickle (slowloris), and 1,000 concurrent clients. Each bad request is answered with a
4xx (503 when busy; 505 for an HTTP version the server does not speak) or, for a stalled client, a 408 or a
closed connection within a bounded time, and the server answers a good request afterwards.

The servers: ``capo serve-retriever``, ``capo serve`` (completions, over a stub backend: the HTTP layer is what
is tested, not the model), ``capo serve webshop``, ``capo serve papers`` and ``capo view``. Each is built with
small timeouts (malformed_http.SLOW_LIMITS) so that the slow cases take about a second. Traffic: 127.0.0.1 only.

A new server joins by a factory in ``SERVERS``: it returns the bound server,
a :class:`~malformed_http.Target` (a good request, its check, a JSON-body endpoint if any, its own bad cases)
and how to close it.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import pytest

from malformed_http import (
    BODY_LIMIT,
    BURST_LIMITS,
    HUGE_DIGITS,
    SLOW_BOUND_S,
    SLOW_LIMITS,
    Case,
    Target,
    tolerated,
    burst,
    check_case,
    get,
    protocol_cases,
    raw_request,
    run_concurrently,
    run_slow_case,
    slow_cases,
)

CLIENTS = 1000
COUNTS: dict[str, dict[str, int]] = {}  # server -> kind -> cases, printed at the end of the module


SERVER_OF: dict[str, object] = {}


def _limit(server, limits: dict[str, float] = SLOW_LIMITS) -> None:
    for name, value in limits.items():
        setattr(server, name, value)


def _ok_json(key: str) -> Callable[[int, bytes], bool]:
    return lambda status, body: status == 200 and key in json.loads(body)


# ------------------------------------------------------------------------------------------------- servers


def retriever_server(tmp_path_factory):
    from capo_envs.retrieval import BM25Retriever, Passage
    from capo_envs.retrieval.server import make_server

    passages = [Passage("p0", "Paris", "Paris is the capital of France."), Passage("p1", "Berlin", "In Germany.")]
    server = make_server(BM25Retriever.build(passages), port=0, max_queries=8, max_topk=10, max_body_bytes=BODY_LIMIT)
    good_body = {"queries": ["capital of France"], "topk": 2, "return_scores": False}
    target = Target("retriever", 0, raw_request("POST", "/retrieve", json.dumps(good_body).encode()), _ok_json("result"),
                    post_path="/retrieve", post_body=good_body,
                    extra=[Case("GET /retrieve", get("/retrieve")),
                           Case("POST /health", raw_request("POST", "/health", b"{}"))])
    return server, target, server.shutdown


class _EchoBackend:
    """A stand-in model: one token per prompt, at once (what is under test is the server, not generation)."""

    def generate(self, prompts, *, stop, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        from capo_train.backends.base import Generation

        return [Generation(token_ids=[65], logprobs=[0.0], text="A", finish_reason="length") for _ in prompts]


class _ByteTokenizer:
    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))[:4096]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", "replace")


def completions_server(tmp_path_factory):
    from capo_train.backends.server import CompletionServer

    server = CompletionServer(_EchoBackend(), _ByteTokenizer(), "tiny", max_model_len=512, max_body_bytes=BODY_LIMIT)
    good_body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
    target = Target("completions", 0, get("/v1/models"), _ok_json("data"), post_path="/v1/completions",
                    post_body=good_body,
                    extra=[Case("prompt id of 5000 digits", raw_request("POST", "/v1/completions",
                                                                        b'{"prompt": [' + HUGE_DIGITS.encode() + b"]}")),
                           Case("prompt of invalid UTF-8", raw_request("POST", "/v1/completions", b'{"prompt": "\xff"}'))])
    return server, target, server.close


def webshop_server(tmp_path_factory):
    pytest.importorskip("thefuzz")
    import gymnasium as gym

    import capo_envs  # noqa: F401
    from capo_envs.webshop.server import ShopSite, make_server

    site = ShopSite(lambda: gym.make("capo/SynthShop-v0", split="test"), max_sessions=4096)
    server = make_server(site, port=0)
    extra = [Case(f"GET {path[:40]}", get(path)) for path in (
        "/new?task=%C2%B2", "/new?task=" + HUGE_DIGITS, "/new?task=-1", "/new?task=%FF", "/new?task=99999999",
        "/replay/%C2%B2", "/replay/" + HUGE_DIGITS, "/replay/0", "/s/" + HUGE_DIGITS, "/s/%FF/act?a=x",
        "/s/1/" + "x" * 1000)]
    target = Target("webshop", 0, get("/"), lambda status, body: status == 200 and b"WebShop" in body,
                    json_errors=False, extra=extra)
    return server, target, server.shutdown


def papers_server(tmp_path_factory):
    from capo_envs.papers.db import Paper, PaperDB
    from capo_envs.papers.server import make_server

    papers = [Paper("1706.03762", "Attention Is All You Need", "The Transformer.", 2017, ("A. Vaswani",),
                    "2017-06-12", "cs.CL"),
              Paper("1810.04805", "BERT", "Pretraining of transformers.", 2018, ("J. Devlin",), "2018-10-11", "cs.CL")]
    db = PaperDB.from_records(papers, [("1810.04805", "1706.03762")])
    server = make_server(db, max_body_bytes=BODY_LIMIT)
    search = "/graph/v1/paper/search?query=transformers"
    extra = [Case(f"GET {path[:50]}", get(path)) for path in (
        search + "&limit=" + HUGE_DIGITS, search + "&offset=%C2%B2", search + "&limit=-1", search + "&year=" + HUGE_DIGITS,
        search + "&fields=%FF", "/graph/v1/paper/" + HUGE_DIGITS, "/graph/v1/paper/%FF%FE",
        "/graph/v1/paper/1706.03762/citations?limit=" + HUGE_DIGITS, "/graph/v1/paper/search")]
    extra.append(Case("batch of 5000-digit ids", raw_request("POST", "/graph/v1/paper/batch",
                                                             b'{"ids": [' + HUGE_DIGITS.encode() + b"]}")))

    def close():
        server.shutdown()
        db.close()

    target = Target("papers", 0, get(search), _ok_json("data"), post_path="/graph/v1/paper/batch",
                    post_body={"ids": ["1706.03762"]}, extra=extra)
    return server, target, close


def viewer_server(tmp_path_factory):
    from capo_train.viewer.data import discover
    from capo_train.viewer.server import make_server
    from capo_train.viewer.site import Site
    from capo_train.viewer.synthetic import synthetic_run

    run = synthetic_run(tmp_path_factory.mktemp("viewer") / "run", iterations=2, episodes=2, seed=0)
    server = make_server(Site(*discover([run])))
    extra = [Case(f"GET {path[:40]}", get(path)) for path in (
        "/data/run-9.js", "/data/run-%C2%B2.js", "/data/run-\xd9\xa1.js")]  # the last: ١'s UTF-8
    extra.append(Case("GET an iteration not recorded", get("/data/run-0-iter-99999.js"), ok=tolerated))  # empty: 200
    target = Target("viewer", 0, get("/"), lambda status, body: status == 200 and b"<html" in body.lower(), extra=extra)
    return server, target, server.shutdown


def env_server(tmp_path_factory):
    """``capo serve env``: its HTTP routes (a session itself is a WebSocket: tests/test_env_server.py)."""
    import capo_envs  # noqa: F401
    from capo_envs.remote.server import EnvServer

    server = EnvServer("capo/SynthChain-v0", {"k": 2}, max_sessions=8)
    extra = [Case(f"GET {path[:40]}", get(path)) for path in (
        "/ws?split=" + HUGE_DIGITS, "/ws?split=%FF", "/schema/%FF")]
    extra.append(Case("GET /state with an unknown query", get("/state?session=" + HUGE_DIGITS), ok=tolerated))
    extra.append(Case("reset with a 5000-digit seed", raw_request("POST", "/reset",
                                                                  b'{"seed": ' + HUGE_DIGITS.encode() + b"}")))
    target = Target("env", 0, get("/health"), lambda status, body: status == 200, post_path="/reset",
                    post_body={"seed": 0}, extra=extra)
    return server, target, server.shutdown


# 5,000 digits where the viewer's run-file routes take a number (it once answered 500: Python's int-digit limit).
VIEWER_HUGE = "/data/run-" + HUGE_DIGITS + ".js"

SERVERS = {
    "retriever": retriever_server,
    "completions": completions_server,
    "webshop": webshop_server,
    "papers": papers_server,
    "viewer": viewer_server,
    "env": env_server,
}


@pytest.fixture(scope="module", params=list(SERVERS))
def target(request, tmp_path_factory):
    try:
        server, target, close = SERVERS[request.param](tmp_path_factory)
    except ImportError as e:  # the completions server and the viewer are included only where they import
        pytest.skip(f"{request.param} server does not import: {e}")
    _limit(server)
    SERVER_OF[target.name] = server
    server.start_in_thread()
    target.port = server.server_address[1]
    assert server.server_address[0] == "127.0.0.1"
    assert target.still_serving(), f"{target.name}: the good request fails on a fresh server"
    yield target
    close()


def _count(target: Target, kind: str, n: int) -> None:
    COUNTS.setdefault(target.name, {})[kind] = n


# --------------------------------------------------------------------------------------------------- tests


def test_every_bad_request_is_a_4xx_and_the_server_keeps_serving(target):
    cases = protocol_cases(target)
    wrong = []
    for case in cases:
        problem = check_case(target, case)
        if problem:
            wrong.append(problem)
        if not target.still_serving():
            wrong.append(f"{case.name}: the server stopped answering good requests")
    _count(target, "malformed", len(cases))
    assert wrong == [], f"{target.name}: {len(wrong)} of {len(cases)} cases wrong:\n" + "\n".join(wrong)


@pytest.mark.parametrize("target", ["viewer"], indirect=True)
def test_viewer_huge_run_number_is_a_4xx(target):
    try:
        assert check_case(target, Case("run number of 5000 digits", get(VIEWER_HUGE))) is None
    finally:
        assert target.still_serving()


def test_stalled_and_trickling_clients_are_answered_or_dropped_in_bounded_time(target):
    cases = slow_cases(target)
    jobs = [lambda c=c: run_slow_case(target.port, c) for c in cases]
    jobs += [lambda c=c: run_slow_case(target.port, c, trickle=True) for c in cases[1:4]]  # slowloris: a byte a time
    names = [c.name for c in cases] + [f"{c.name}, trickled" for c in cases[1:4]]
    wrong = []
    for name, result in zip(names, run_concurrently(jobs)):
        if isinstance(result, Exception):
            wrong.append(f"{name}: {result!r}")
            continue
        seconds, status, body = result
        if seconds > SLOW_BOUND_S:
            wrong.append(f"{name}: held for {seconds:.1f} s")
        if status != 0 and not 400 <= status < 500:  # 0: dropped; 408 for a cut-off head, 400/405 for a short body
            wrong.append(f"{name}: status {status} {body[:120]!r}")
    assert target.still_serving()
    _count(target, "slow", len(jobs))
    assert wrong == [], f"{target.name}:\n" + "\n".join(wrong)


def test_1000_concurrent_clients_are_all_answered(target):
    server = SERVER_OF[target.name]
    _limit(server, BURST_LIMITS)
    try:
        results, seconds = burst(target.port, target.good, CLIENTS)
    finally:
        _limit(server)
    answered = sum(target.good_ok(status, body) for status, body in results)
    _count(target, "concurrent", CLIENTS)
    print(f"\n{target.name}: {answered}/{CLIENTS} concurrent clients answered in {seconds:.2f} s")
    failures = sorted({f"{status} {body[:80]!r}" for status, body in results if not target.good_ok(status, body)})
    assert answered == CLIENTS, f"{target.name}: {CLIENTS - answered} failed: {failures[:5]}"
    assert target.still_serving()


def test_zz_report_case_counts():
    """Not a check: the cases each server ran, for the record (pytest -s shows it)."""
    for name, counts in COUNTS.items():
        print(f"\n{name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + f" = {sum(counts.values())} cases")
