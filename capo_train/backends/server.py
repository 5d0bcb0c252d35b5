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

Standard library only, on the same plumbing as ``capo serve-retriever`` (:mod:`capo_envs.core.http`):
one generation at a time (a lock around the backend), every answer JSON, a client's mistake a 4xx
``{"error": {"message": ...}}``, a failing backend a 500, never a dead server. Binds 127.0.0.1 unless
told otherwise. Since generation is serialised, one huge prompt would make every other client wait: prompts
are limited to ``max_model_len`` tokens (the model's positions by default), and text prompts to
``CHARS_PER_POSITION`` characters per position before they are tokenised (tokenising is serialised too).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from capo_envs.core.http import JSONHandler, JSONServer, RequestError, brief, check_keys, is_unicode, json_object

from .base import Generation, GenerationBackend

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request gives none
# Options this server does not implement, with the values that mean "not used": any other value is refused.
NEUTRAL_OPTIONS = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "stream": (None, False), "suffix": (None, ""),
    "top_p": (None, 1), "top_k": (None, -1, 0), "min_p": (None, 0), "repetition_penalty": (None, 1),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}), "min_tokens": (None, 0),
}
SERVED_OPTIONS = {"model", "prompt", "max_tokens", "temperature", "stop", "seed", "logprobs", "user",
                  "return_tokens_as_token_ids", "include_stop_str_in_output"}  # "user" only names the caller
REQUEST_KEYS = frozenset(SERVED_OPTIONS | set(NEUTRAL_OPTIONS))
DEFAULT_MAX_MODEL_LEN = 8192  # when the model's config names no limit
# A text prompt longer than this many characters per position is refused before it is tokenised: it
# cannot fit (tokens average ~4 characters; even long whitespace or punctuation tokens stay far below 32).
CHARS_PER_POSITION = 32
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


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


class CompletionServer(JSONServer):
    """An HTTP server around one backend; generations are serialised (one model, one request at a time)."""

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
        """``max_model_len``: the most tokens (prompt + completion) a request may need; by default the
        positions in the backend model's config, else ``DEFAULT_MAX_MODEL_LEN``. ``max_tokens_limit`` caps
        ``max_tokens``: together they keep one request from holding the model for long."""
        self.backend, self.tokenizer, self.model_name = backend, tokenizer, model_name
        self.vocab_size = len(tokenizer)
        self.max_model_len = max_model_len or model_positions(backend) or DEFAULT_MAX_MODEL_LEN
        self.max_prompt_chars = CHARS_PER_POSITION * self.max_model_len
        self.max_tokens_limit = max_tokens_limit
        self.created = int(time.time())
        self.lock = threading.Lock()  # the backend (model, KV prefix cache) and tokenizer serve one call at a time
        limits = {"max_body_bytes": max_body_bytes, "request_timeout": request_timeout}
        super().__init__(host, port, CompletionHandler, **limits, verbose=verbose)

    @property
    def url(self) -> str:
        """The API root, e.g. ``http://127.0.0.1:8000/v1``: what ``OpenAIBackend`` takes as ``base_url``."""
        return super().url + "/v1"

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
        request = json_object(body)
        check_keys(request, REQUEST_KEYS)
        model = request.get("model")
        if model is not None and model != self.model_name:
            message = f"the model {brief(model)} does not exist; this server has {self.model_name!r}"
            raise RequestError(HTTPStatus.NOT_FOUND, message)
        for option, neutral in NEUTRAL_OPTIONS.items():
            if option in request and not any(_same(request[option], value) for value in neutral):
                raise _bad(f'"{option}"={brief(request[option])} is not supported by this server')
        max_tokens = _int(request, "max_tokens", DEFAULT_MAX_TOKENS, 1, self.max_tokens_limit)
        prompts = self._prompts(request.get("prompt"))
        longest = max(map(len, prompts))
        if longest + max_tokens > self.max_model_len:
            raise _bad(f"a prompt of {longest} tokens + max_tokens={max_tokens} exceeds {self._limit()}")
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

    def _limit(self) -> str:
        """The prompt-length limit, named the way it is changed."""
        return f"max_model_len={self.max_model_len} positions (start `capo serve` with a larger --max-model-len)"

    def _one_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            if len(prompt) > self.max_prompt_chars:  # refused before tokenising, which holds the lock
                raise _bad(f"a prompt of {len(prompt)} characters exceeds the limit of {self.max_prompt_chars} "
                           f"({CHARS_PER_POSITION} per position) for {self._limit()}")
            if not is_unicode(prompt):  # the tokenizer would raise a TypeError
                raise _bad("a prompt must be valid Unicode (a lone surrogate escape such as \\ud800?)")
            with self.lock:  # a fast tokenizer shared across threads can fail with "Already borrowed"
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
            ids = prompt
        else:
            raise _bad(f"a prompt must be a string or a list of token ids, got {brief(prompt)}")
        if not ids:
            raise _bad("every prompt needs at least one token")
        if len(ids) >= self.max_model_len:  # no room left for even one new token
            raise _bad(f"a prompt of {len(ids)} tokens exceeds {self._limit()}")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise _bad(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return list(ids)


class CompletionHandler(JSONHandler):
    """``POST /v1/completions`` and ``GET /v1/models``; every answer is JSON, an error OpenAI's
    ``{"error": {"message": ...}}``."""

    server: CompletionServer

    def error_payload(self, status: HTTPStatus, message: str) -> dict:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "code": int(status)}}

    def do_GET(self) -> None:
        path = self.route
        if path == "/v1/models":
            self._send_json(HTTPStatus.OK, self.server.models())
        elif path == "/v1/completions":
            self._method_not_allowed()
        else:
            message = f"no such endpoint {brief(path or '/')}; use POST /v1/completions or GET /v1/models"
            self.send_error(HTTPStatus.NOT_FOUND, message)

    def do_POST(self) -> None:
        path = self.route
        try:
            if path != "/v1/completions":
                message = f"no such endpoint {brief(path or '/')}; use POST /v1/completions"
                raise RequestError(HTTPStatus.NOT_FOUND, message)
            request = self.server.parse(self._read_body())
        except RequestError as e:
            self._reject(e)
            return
        try:
            answer = self.server.complete(request)
        except Exception as e:  # a failing generation becomes a 500, never a dead server
            logger.exception("generation failed for %d prompts", len(request.prompts))
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"generation failed: {type(e).__name__}: {e}")
            return
        self._send_json(HTTPStatus.OK, answer)


def serve(
    backend: GenerationBackend, tokenizer, model_name: str, host: str = "127.0.0.1", port: int = 0, **options: Any
) -> CompletionServer:
    """Bind (port 0 picks a free port: see ``.server_address`` or ``.url``) and serve from a daemon thread;
    ``close()`` stops it and releases the port. ``options`` go to :class:`CompletionServer`."""
    return CompletionServer(backend, tokenizer, model_name, host, port, **options).start_in_thread()


def model_positions(backend: GenerationBackend) -> int | None:
    """The most positions the backend's model takes, from its config (``max_position_embeddings`` or the
    like); None when it has no model or names no limit."""
    config = getattr(getattr(backend, "model", None), "config", None)
    for field in POSITION_FIELDS:
        value = getattr(config, field, None)
        if _is_int(value) and value > 0:
            return value
    return None


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
        raise _bad(f'"{key}" must be an integer in [{low}, {high}], got {brief(value)}')
    return value


def _bool(request: dict, key: str) -> bool:
    value = request.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f'"{key}" must be true or false, got {brief(value)}')
    return value


def _temperature(value: Any) -> float:
    if value is None:
        return 1.0
    if not _is_number(value) or not 0 <= value <= 100:  # also refuses NaN, which compares false
        raise _bad(f'"temperature" must be a number in [0, 100], got {brief(value)}')
    return float(value)


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s and is_unicode(s) for s in stops):
        raise _bad(f'"stop" must be a non-empty string or a list of them (valid Unicode), got {brief(value)}')
    return stops

