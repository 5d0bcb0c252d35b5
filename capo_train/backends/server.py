"""A minimal OpenAI-compatible completions server over any :class:`GenerationBackend`.

``capo serve`` puts a checkpoint behind ``POST /v1/completions`` and ``GET /v1/models``, so that
:class:`~capo_train.backends.openai.OpenAIBackend` (and any OpenAI client) can use it, and so that the
client is tested against a real server without vLLM. The subset served is the one the rollout needs:
prompts as text or token ids (one or a batch), ``max_tokens``, ``temperature`` (0 = greedy), ``stop``,
``seed``, ``logprobs`` (the sampled token's only) and vLLM's ``return_tokens_as_token_ids`` and
``include_stop_str_in_output``. Answers carry vLLM's ``stop_reason`` (the stop string, or null for EOS).
Sampling options it does not implement (``top_p`` < 1, penalties, ``n`` > 1, streaming, ...) are refused
rather than ignored: a client that got plain samples where it asked for nucleus ones would record the
wrong log-probs.

Standard library only, in the style of ``capo serve-retriever``: one generation at a time (a lock
around the backend), every answer JSON, a client's mistake a 4xx ``{"error": {"message": ...}}``, a
failing backend a 500, never a dead server. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .base import Generation, GenerationBackend

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request gives none
# Options this server does not implement, with the values that mean "not used": any other value is refused.
NEUTRAL_OPTIONS = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "stream": (None, False), "suffix": (None, ""),
    "top_p": (None, 1), "top_k": (None, -1, 0), "min_p": (None, 0), "repetition_penalty": (None, 1),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}), "min_tokens": (None, 0),
}


class RequestError(Exception):
    """A client mistake, answered with ``status`` and ``{"error": {"message": message, ...}}``."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _bad(message: str) -> RequestError:
    return RequestError(HTTPStatus.BAD_REQUEST, message)


@dataclass
class CompletionRequest:
    """A validated ``/v1/completions`` request. ``prompts``: token ids per prompt; ``temperature`` 0 = greedy."""

    prompts: list[list[int]]
    max_tokens: int
    temperature: float
    stop: list[str]
    seed: int | None
    logprobs: bool
    tokens_as_ids: bool
    include_stop_str: bool


class CompletionServer(ThreadingHTTPServer):
    """An HTTP server around one backend; generations are serialised (one model, one request at a time)."""

    daemon_threads = True  # a stuck client must not keep the process alive at exit

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_model_len: int | None = None,
        max_tokens_limit: int = 4096,
        max_body_bytes: int = 8 << 20,
        request_timeout: float = 30.0,
        verbose: bool = False,
    ):
        """``max_model_len``: the most tokens (prompt + completion) a request may need, when the model has a
        limit; ``max_tokens_limit`` caps ``max_tokens`` so that one request cannot hold the model for long."""
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.backend, self.tokenizer, self.model_name = backend, tokenizer, model_name
        self.vocab_size = len(tokenizer)
        self.max_model_len = max_model_len
        self.max_tokens_limit = max_tokens_limit
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.verbose = verbose
        self.created = int(time.time())
        self.lock = threading.Lock()  # the backend (model, KV prefix cache) and tokenizer serve one call at a time
        self._serving = False
        self._thread: threading.Thread | None = None
        super().__init__((host, port), CompletionHandler)

    @property
    def url(self) -> str:
        """The API root, e.g. ``http://127.0.0.1:8000/v1``: what ``OpenAIBackend`` takes as ``base_url``."""
        host, port = self.server_address[:2]
        return (f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}") + "/v1"

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        self._serving = True
        try:
            super().serve_forever(poll_interval)
        finally:
            self._serving = False

    def start_in_thread(self) -> CompletionServer:
        """Serve from a daemon thread (tests, notebooks); returns self."""
        self._serving = True  # so that a shutdown() racing the thread's start still stops it
        self._thread = threading.Thread(target=self.serve_forever, name=f"completion-server:{self.url}", daemon=True)
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

    close = shutdown

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-answer is routine; socketserver would print a traceback."""
        logger.debug("error while answering %s: %r", client_address, sys.exc_info()[1])

    def models(self) -> dict:
        model = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "capo"}
        return {"object": "list", "data": [model]}

    def complete(self, request: CompletionRequest) -> dict:
        """Generate for every prompt of ``request`` in one backend call; the OpenAI completions answer."""
        greedy = request.temperature == 0
        with self.lock:
            generations = self.backend.generate(
                request.prompts,
                stop=request.stop,
                max_new_tokens=request.max_tokens,
                temperature=1.0 if greedy else request.temperature,
                greedy=greedy,
                seed=request.seed,
            )
            choices = [self._choice(i, g, request) for i, g in enumerate(generations)]  # decodes: under the lock
        completion_tokens = sum(len(g.token_ids) for g in generations)
        prompt_tokens = sum(len(p) for p in request.prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _choice(self, index: int, generation: Generation, request: CompletionRequest) -> dict:
        stop_reason = _fired_stop(generation.text, request.stop) if generation.finish_reason == "stop" else None
        text = generation.text
        if stop_reason is not None and not request.include_stop_str:  # the API's default: cut the stop string off
            text = text[: text.find(stop_reason)] if stop_reason in text else text
        logprobs = None
        if request.logprobs:
            if request.tokens_as_ids:
                tokens = [f"token_id:{t}" for t in generation.token_ids]
            else:
                tokens = [self.tokenizer.decode([t]) for t in generation.token_ids]
            logprobs = {"tokens": tokens, "token_logprobs": generation.logprobs, "top_logprobs": None}
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": "length" if generation.finish_reason == "length" else "stop",
            "stop_reason": stop_reason,
        }

    def parse(self, body: bytes) -> CompletionRequest:
        """Validate a request body; :class:`RequestError` on anything this server cannot serve as asked."""
        try:
            request = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise _bad(f"body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise _bad(f"body is not valid JSON ({e.msg} at char {e.pos})") from None
        if not isinstance(request, dict):
            raise _bad(f"body must be a JSON object, got {type(request).__name__}")
        model = request.get("model")
        if model is not None and model != self.model_name:
            message = f"the model {model!r} does not exist; this server has {self.model_name!r}"
            raise RequestError(HTTPStatus.NOT_FOUND, message)
        for option, neutral in NEUTRAL_OPTIONS.items():
            if option in request and not any(_same(request[option], value) for value in neutral):
                raise _bad(f'"{option}"={request[option]!r} is not supported by this server')
        prompts = self._prompts(request.get("prompt"))
        max_tokens = _int(request, "max_tokens", DEFAULT_MAX_TOKENS, 1, self.max_tokens_limit)
        longest = max(map(len, prompts))
        if self.max_model_len is not None and longest + max_tokens > self.max_model_len:
            raise _bad(f"a prompt of {longest} tokens + max_tokens={max_tokens} exceeds {self.max_model_len} positions")
        return CompletionRequest(
            prompts=prompts,
            max_tokens=max_tokens,
            temperature=_temperature(request.get("temperature")),
            stop=_stop(request.get("stop")),
            seed=_int(request, "seed", None, -(2**63), 2**63 - 1),
            logprobs=_int(request, "logprobs", None, 0, 1) is not None,
            tokens_as_ids=_bool(request, "return_tokens_as_token_ids"),
            include_stop_str=_bool(request, "include_stop_str_in_output"),
        )

    def _prompts(self, prompt: Any) -> list[list[int]]:
        """``prompt`` as token ids per prompt: a string, a list of ids, or a list of either (a batch)."""
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise _bad('"prompt" must be a non-empty string, a list of token ids, or a list of either')
        return [self._one_prompt(p) for p in prompt]

    def _one_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            with self.lock:  # a fast tokenizer shared across threads can fail with "Already borrowed"
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
            ids = prompt
        else:
            raise _bad(f"a prompt must be a string or a list of token ids, got {prompt!r:.100}")
        if not ids:
            raise _bad("every prompt needs at least one token")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise _bad(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return list(ids)


class CompletionHandler(BaseHTTPRequestHandler):
    """``POST /v1/completions`` and ``GET /v1/models``; every answer, errors included, is JSON."""

    server: CompletionServer
    protocol_version = "HTTP/1.1"  # keep-alive for clients that reuse connections
    error_content_type = "application/json"

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # a body shorter than its Content-Length must not hang a thread
        super().setup()

    def do_GET(self) -> None:
        path = self.path.partition("?")[0].rstrip("/")
        if path == "/v1/models":
            self._send_json(HTTPStatus.OK, self.server.models())
        elif path == "/v1/completions":
            self._method_not_allowed()
        else:
            message = f"no such endpoint {path or '/'!r}; use POST /v1/completions or GET /v1/models"
            self.send_error(HTTPStatus.NOT_FOUND, message)

    def do_POST(self) -> None:
        path = self.path.partition("?")[0].rstrip("/")
        try:
            if path != "/v1/completions":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint {path or '/'!r}; use POST /v1/completions")
            request = self.server.parse(self._read_body())
        except RequestError as e:
            self.close_connection = True  # the rest of the stream (unread body, bytes past a short one) is suspect
            self._send_error_json(e.status, e.message)
            return
        try:
            answer = self.server.complete(request)
        except Exception as e:  # a failing generation becomes a 500, never a dead server
            logger.exception("generation failed for %d prompts", len(request.prompts))
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"generation failed: {type(e).__name__}: {e}")
            return
        self._send_json(HTTPStatus.OK, answer)

    def __getattr__(self, name: str) -> Any:
        """Any other method (PUT, DELETE, HEAD, made-up ones) is a 405, not http.server's 501."""
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self.close_connection = True  # a body, if any, was not read
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed here")

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
            raise _bad(f"bad Content-Length {length_header!r}") from None
        if length > self.server.max_body_bytes:
            message = f"body of {length} bytes exceeds the limit of {self.server.max_body_bytes}"
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, message)
        try:
            body = self.rfile.read(length)
        except (TimeoutError, OSError):
            body = b""
        if len(body) < length:
            raise _bad(f"body ended after {len(body)} of {length} bytes")
        return body

    def _send_error_json(self, status: HTTPStatus, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send_json(status, {"error": {"message": message, "type": kind, "code": int(status)}})

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
            self._send_error_json(status, message or status.phrase)
        except OSError:
            self.close_connection = True  # the client has gone; nothing to answer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


def serve(
    backend: GenerationBackend, tokenizer, model_name: str, host: str = "127.0.0.1", port: int = 0, **options: Any
) -> CompletionServer:
    """Bind (port 0 picks a free port: see ``.server_address`` or ``.url``) and serve from a daemon thread;
    ``close()`` stops it and releases the port. ``options`` go to :class:`CompletionServer`."""
    return CompletionServer(backend, tokenizer, model_name, host, port, **options).start_in_thread()


def _fired_stop(text: str, stop: list[str]) -> str:
    """The stop string that ended ``text``: of those in it, the one completed first (generation halts at
    the first completion, so that is the earliest end). Falls back to the first stop string when none is
    found in the full decode (the backend matched it in a decoded tail)."""
    found = [s for s in stop if s in text]
    return min(found, key=lambda s: text.find(s) + len(s)) if found else stop[0]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality without Python's ``True == 1``: ``"n": true`` is not ``"n": 1``."""
    comparable = type(value) is type(neutral) or (_is_number(value) and _is_number(neutral))
    return comparable and value == neutral


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(request: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = request.get(key)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise _bad(f'"{key}" must be an integer in [{low}, {high}], got {value!r:.100}')
    return value


def _bool(request: dict, key: str) -> bool:
    value = request.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f'"{key}" must be true or false, got {value!r:.100}')
    return value


def _temperature(value: Any) -> float:
    if value is None:
        return 1.0
    if not _is_number(value) or not 0 <= value <= 100:  # also refuses NaN, which compares false
        raise _bad(f'"temperature" must be a number in [0, 100], got {value!r:.100}')
    return float(value)


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad(f'"stop" must be a non-empty string or a list of them, got {value!r:.100}')
    return stops

