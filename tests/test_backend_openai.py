"""OpenAIBackend against a real HTTP server on 127.0.0.1: ``capo serve``'s completions server over an
HFBackend with a tiny random Llama. Through the API, generations must be the in-process backend's, token
for token (ids, finish reasons, log-probs), and a rollout must run end to end. The server must answer bad
requests with JSON errors and keep serving; the client must fail clearly on servers it cannot use."""

from __future__ import annotations

import http.client
import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

import capo_envs  # noqa: F401  (registers capo/*)
from capo_train.backends.hf import HFBackend
from capo_train.backends.openai import OpenAIBackend, OpenAIBackendError
from capo_train.backends.server import DEFAULT_MAX_MODEL_LEN, CompletionServer, serve
from capo_train.models import make_tiny_llama
from capo_train.rollout import RolloutSettings, collect

MODEL = "tiny"
TEXTS = ["Question: where is the capital?", "<search>Paris</search>", "The answer is", "Hello there, friend"]


@pytest.fixture(scope="module")
def tiny():
    """The model, tokenizer, prompts, and a stop string and an extra EOS token that end prompts 1 and 2.

    A random tiny Llama greedily repeats its prompt's last token, so both are read off its free
    continuations: the first two characters of prompt 1's, prompt 2's first token.
    """
    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    model.eval()
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    free = HFBackend(model, tokenizer).generate(prompts, stop=[], max_new_tokens=8, greedy=True)
    stop = free[1].text[:2]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, free[2].token_ids[0]]
    return model, tokenizer, prompts, [stop, "never seen"]


@pytest.fixture(scope="module")
def server(tiny):
    model, tokenizer, _, _ = tiny
    server = serve(HFBackend(model, tokenizer), tokenizer, MODEL, max_body_bytes=64 << 10, max_model_len=3000)
    yield server
    server.close()


@pytest.fixture()
def client(server):
    return OpenAIBackend(server.url, MODEL, timeout=30.0, max_concurrency=3)


def assert_same_generations(got, want):
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    assert [g.text for g in got] == [w.text for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=0)


def request(server, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    """One raw HTTP request; the status and the parsed JSON body (every answer must be JSON)."""
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


# ----------------------------------------------------------------------------- same generations as in-process


def test_greedy_generations_equal_the_in_process_backend(tiny, client):
    model, tokenizer, prompts, stop = tiny
    want = HFBackend(model, tokenizer).generate(prompts, stop=stop, max_new_tokens=6, greedy=True)
    assert [w.finish_reason for w in want] == ["length", "stop", "eos", "length"]  # every mapping is exercised
    assert_same_generations(client.generate(prompts, stop=stop, max_new_tokens=6, greedy=True), want)


def test_sampled_generations_follow_the_seed(tiny, client):
    """Prompt i is sampled with seed + i: the in-process backend given that seed and prompt alone gives the
    same tokens and tempered log-probs; the same seed again gives the same output, another seed another."""
    model, tokenizer, prompts, stop = tiny
    kwargs = {"stop": stop, "max_new_tokens": 8, "temperature": 0.7}
    got = client.generate(prompts, seed=5, **kwargs)
    want = [HFBackend(model, tokenizer).generate([p], seed=5 + i, **kwargs)[0] for i, p in enumerate(prompts)]
    assert_same_generations(got, want)
    assert_same_generations(client.generate(prompts, seed=5, **kwargs), got)
    assert [g.token_ids for g in client.generate(prompts, seed=6, **kwargs)] != [g.token_ids for g in got]


def test_rollout_through_the_server(tiny, client):
    """A greedy SynthHop rollout over HTTP records the in-process rollout's actions and log-probs."""
    model, tokenizer, _, _ = tiny

    def run(backend):
        envs = [gym.make("capo/SynthHop-v0", size="tiny", k=1, max_passage_chars=40, max_steps=2) for _ in range(3)]
        settings = RolloutSettings(max_action_tokens=6, max_prompt_tokens=4000, greedy=True)
        return collect(envs, backend, tokenizer, settings, tasks_per_batch=3, group_size=1, seed=11)

    remote, local = run(client), run(HFBackend(model, tokenizer, batch_size=3))
    assert sum(len(t.actions) for t in remote) >= 3 and all(t.terminated or t.truncated for t in remote)
    for r, loc in zip(remote, local):
        assert [a.prompt_ids for a in r.actions] == [a.prompt_ids for a in loc.actions]
        assert [a.action_ids for a in r.actions] == [a.action_ids for a in loc.actions]
        for a, b in zip(r.actions, loc.actions):
            torch.testing.assert_close(torch.tensor(a.old_logprobs), torch.tensor(b.old_logprobs), atol=1e-4, rtol=0)


def test_text_prompts_batches_and_token_strings(tiny, server):
    """Any OpenAI client: text prompts, a batch in one request, decoded token strings, and the stop string
    cut from the text unless include_stop_str_in_output."""
    model, tokenizer, prompts, stop = tiny
    want = HFBackend(model, tokenizer).generate(prompts[:2], stop=stop, max_new_tokens=4, greedy=True)
    body = {"model": MODEL, "prompt": [TEXTS[0], prompts[1]], "max_tokens": 4, "temperature": 0, "stop": stop,
            "logprobs": 0}
    status, answer = request(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 200, answer
    first, second = answer["choices"]
    assert (first["index"], second["index"]) == (0, 1)
    assert first["logprobs"]["tokens"] == [tokenizer.decode([t]) for t in want[0].token_ids]
    assert (first["finish_reason"], first["stop_reason"]) == ("length", None)
    assert (second["finish_reason"], second["stop_reason"]) == ("stop", stop[0])
    assert second["text"] == want[1].text.split(stop[0])[0]
    assert answer["usage"]["completion_tokens"] == sum(len(w.token_ids) for w in want)


def test_cli_serves_a_checkpoint(tiny, tmp_path):
    from capo_train.cli import build_parser, completion_server
    from capo_train.models import ActorCritic, save_checkpoint

    model, tokenizer, prompts, stop = tiny
    save_checkpoint(tmp_path / "checkpoint", ActorCritic(model, meta={"lora": None, "critic": None}), tokenizer)
    args = build_parser().parse_args(["serve", "--checkpoint", str(tmp_path), "--port", "0", "--device", "cpu",
                                      "--served-model-name", "ckpt"])
    server = completion_server(args).start_in_thread()
    try:
        assert request(server, "GET", "/v1/models")[1]["data"][0]["id"] == "ckpt"
        got = OpenAIBackend(server.url, "ckpt").generate(prompts, stop=stop, max_new_tokens=5, greedy=True)
    finally:
        server.close()
    want = HFBackend(model, tokenizer).generate(prompts, stop=stop, max_new_tokens=5, greedy=True)
    assert_same_generations(got, want)


def test_cli_eval_through_a_server_matches_in_process_eval(tiny, tmp_path, capsys):
    """``capo eval --server`` (tokenizer from the checkpoint, generation over HTTP) and plain ``capo eval``
    print the same metrics for the same checkpoint."""
    from capo_train.cli import build_parser, completion_server, main
    from capo_train.models import ActorCritic, save_checkpoint

    model, tokenizer, _, _ = tiny
    save_checkpoint(tmp_path / "checkpoint", ActorCritic(model, meta={"lora": None, "critic": None}), tokenizer)
    common = ["eval", "--checkpoint", str(tmp_path), "--split", "dev", "--episodes", "3", "size=small", "k=1"]
    assert main(common) == 0
    in_process = json.loads(capsys.readouterr().out)
    # the tiny Llama's config says 512 positions, the default limit; in process its prompts run past that
    args = build_parser().parse_args(["serve", "--checkpoint", str(tmp_path), "--port", "0", "--device", "cpu",
                                      "--max-model-len", "4096"])
    server = completion_server(args).start_in_thread()
    try:
        assert main([*common, "--server", server.url, "--served-model", str(tmp_path)]) == 0
    finally:
        server.close()
    served = json.loads(capsys.readouterr().out)
    assert served["eval/episodes"] == 3 and served["eval/tokens_generated"] > 0
    assert served == pytest.approx(in_process, nan_ok=True)


# ----------------------------------------------------------------------------- the server's errors


def completion(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, **fields}).encode()


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/v1/completions", b"{not json", 400, "not valid JSON"),
        ("POST", "/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("POST", "/v1/completions", completion(prompt=3), 400, '"prompt"'),
        ("POST", "/v1/completions", completion(prompt=[1.5, 2]), 400, "a prompt must be"),
        ("POST", "/v1/completions", completion(prompt=[]), 400, '"prompt"'),
        ("POST", "/v1/completions", completion(prompt=""), 400, "at least one token"),
        ("POST", "/v1/completions", completion(prompt=[10**9]), 400, "outside the vocabulary"),
        ("POST", "/v1/completions", completion(max_tokens=0), 400, '"max_tokens"'),
        ("POST", "/v1/completions", completion(prompt=[5] * 2990, max_tokens=20), 400, "exceeds max_model_len=3000"),
        ("POST", "/v1/completions", completion(temperature=-1), 400, '"temperature"'),
        ("POST", "/v1/completions", completion(stop=[3]), 400, '"stop"'),
        ("POST", "/v1/completions", completion(logprobs=5), 400, '"logprobs"'),
        ("POST", "/v1/completions", completion(top_p=0.5), 400, '"top_p"'),
        ("POST", "/v1/completions", completion(n=True), 400, '"n"'),
        ("POST", "/v1/completions", completion(model="other"), 404, "does not exist"),
        ("POST", "/v1/completions", completion(prompt=[5] * 30000), 413, "exceeds the limit"),
        ("POST", "/v1/chat/completions", completion(), 404, "no such endpoint"),
        ("GET", "/nowhere", None, 404, "no such endpoint"),
        ("DELETE", "/v1/completions", None, 405, "not allowed"),
    ],
)
def test_bad_requests_get_json_errors_and_the_server_keeps_serving(server, method, path, body, status, message):
    got_status, answer = request(server, method, path, body)
    assert got_status == status and message in answer["error"]["message"], answer
    ok_status, ok = request(server, "POST", "/v1/completions", completion())
    assert ok_status == 200 and ok["choices"][0]["finish_reason"] in ("stop", "length")


def test_models_endpoint(server):
    status, answer = request(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in answer["data"]] == [MODEL]


def test_prompts_are_limited_to_the_model_positions_by_default(tiny):
    """Without --max-model-len the limit is the positions in the model's config (512 for the tiny Llama),
    else 8192: a longer prompt is a 400 that names the limit and how to raise it."""
    model, tokenizer, _, _ = tiny
    assert model.config.max_position_embeddings == 512
    with CompletionServer(HFBackend(model, tokenizer), tokenizer, MODEL).start_in_thread() as server:
        assert server.max_model_len == 512
        status, answer = request(server, "POST", "/v1/completions", completion(prompt=[5] * 600))
        message = answer["error"]["message"]
        assert status == 400 and "600 tokens" in message and "max_model_len=512" in message, answer
        assert "--max-model-len" in message
        status, answer = request(server, "POST", "/v1/completions", completion(prompt=[5] * 510, max_tokens=2))
        assert status == 200, answer  # 510 + 2 positions fit exactly
    with CompletionServer(SimpleNamespace(), tokenizer, MODEL) as no_config:  # a backend naming no limit
        assert no_config.max_model_len == DEFAULT_MAX_MODEL_LEN == 8192


def test_a_huge_text_prompt_is_refused_before_it_is_tokenised(tiny):
    """6 MB of text is refused at once, naming the limit: not tokenised and generated from for minutes
    while every other client waits for the generation lock."""
    model, tokenizer, _, _ = tiny
    with CompletionServer(HFBackend(model, tokenizer), tokenizer, MODEL).start_in_thread() as server:
        start = time.perf_counter()
        status, answer = request(server, "POST", "/v1/completions", completion(prompt="a" * (6 << 20)))
        assert time.perf_counter() - start < 5
        message = answer["error"]["message"]
        assert status == 400 and f"{6 << 20} characters exceeds the limit of {32 * 512}" in message, answer
        assert "--max-model-len" in message
        assert request(server, "POST", "/v1/completions", completion(prompt="a" * 100))[0] == 200


# ----------------------------------------------------------------------------- the client's errors


class FakeServer(ThreadingHTTPServer):
    """Answers every POST with ``status`` and ``body`` after ``delay`` seconds."""

    daemon_threads = True

    def __init__(self, status: int, body: bytes, delay: float = 0.0):
        self.status, self.body, self.delay = status, body, delay
        super().__init__(("127.0.0.1", 0), FakeHandler)
        Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()  # a short poll: fast shutdown

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request, client_address) -> None:
        pass  # the client that timed out has gone: writing to it fails, as expected


class FakeHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.server.delay)
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args) -> None:
        pass


def answer(tokens: list[str], text: str = "ab", **choice) -> bytes:
    logprobs = {"tokens": tokens, "token_logprobs": [-1.0] * len(tokens)}
    return json.dumps({"choices": [{"text": text, "logprobs": logprobs, "finish_reason": "stop", **choice}]}).encode()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (200, answer(["a", "b"]), "must support return_tokens_as_token_ids"),
        (200, b"<html>busy</html>", "not JSON"),
        (200, b'{"choices": []}', "expected an OpenAI completions response"),
        (200, answer(["token_id:1"], finish_reason="abort"), "finish_reason 'abort'"),
        (500, b'{"error": {"message": "out of memory"}}', "HTTP 500: out of memory"),
        (400, b'{"object": "error", "message": "too long"}', "HTTP 400: too long"),
    ],
)
def test_client_fails_clearly_on_answers_it_cannot_use(status, body, message):
    fake = FakeServer(status, body)
    try:
        with pytest.raises(OpenAIBackendError, match=message) as error:
            OpenAIBackend(fake.url, MODEL).generate([[1, 2]], stop=[], max_new_tokens=2)
        assert fake.url in str(error.value)
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("choice", "reason"),
    [({"stop_reason": None}, "eos"), ({"stop_reason": 7}, "eos"), ({"stop_reason": "</a>"}, "stop"),
     ({"text": "x</a>"}, "stop"), ({"text": "x"}, "eos"), ({"finish_reason": "length"}, "length")],
)
def test_finish_reasons_from_vllm_and_other_servers(choice, reason):
    """vLLM's stop_reason when given (null or a token id: EOS; a string: a stop string), else the text."""
    fake = FakeServer(200, answer(["token_id:4", "token_id:2"], **choice))
    try:
        gen = OpenAIBackend(fake.url, MODEL).generate([[1]], stop=["</a>"], max_new_tokens=2)[0]
    finally:
        fake.close()
    assert (gen.token_ids, gen.logprobs, gen.finish_reason) == ([4, 2], [-1.0, -1.0], reason)


def test_client_fails_clearly_on_timeouts_and_unreachable_servers():
    slow = FakeServer(200, answer(["token_id:1"]), delay=1.0)
    try:
        with pytest.raises(OpenAIBackendError, match="did not answer within 0.2 s"):
            OpenAIBackend(slow.url, MODEL, timeout=0.2).generate([[1]], stop=[], max_new_tokens=1)
    finally:
        slow.close()
    with socket.socket() as probe:  # a port that was free a moment ago, with nothing listening now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(OpenAIBackendError, match=f"cannot reach {url}/completions"):
        OpenAIBackend(url, MODEL).generate([[1]], stop=[], max_new_tokens=1)


def test_client_refuses_what_it_cannot_ask_for():
    backend = OpenAIBackend("http://127.0.0.1:9/v1", MODEL)  # never contacted: refused before any request
    with pytest.raises(ValueError, match="temperature 1 or 0"):
        backend.generate([[1]], stop=[], max_new_tokens=1, greedy=True, temperature=0.7)
    with pytest.raises(ValueError, match="max_new_tokens"):
        backend.generate([[1]], stop=[], max_new_tokens=0)
    assert backend.generate([], stop=[], max_new_tokens=1) == []
