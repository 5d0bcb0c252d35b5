"""``OpenAIBackend``: generation through an OpenAI-compatible completions server (vLLM, or ``capo serve``).

Token ids in, token ids out, as every backend (see :mod:`.base`): each prompt is sent as its token ids
to ``POST {base_url}/completions``, and vLLM's ``return_tokens_as_token_ids`` makes the server name each
sampled token ``"token_id:123"``, so the ids the rollout records are exactly the sampled ones, never a
re-tokenisation of the text. ``logprobs.token_logprobs`` are the old log-probs.

What the server must do for those log-probs to be the ones the losses need (the sampling distribution):

- sample from plain ``softmax(logits / T)``: the request pins ``top_p``, ``top_k``, ``min_p`` and
  ``repetition_penalty`` to their neutral values, overriding defaults a vLLM server takes from the model's
  ``generation_config.json``;
- report log-probs of that tempered distribution: ``capo serve`` does; vLLM reports the model's own
  (T=1) log-probs unless started with ``--logprobs-mode processed_logprobs``, so at T != 1 start it so.

Greedy decoding is sent as ``temperature=0`` and records T=1 log-probs, as :class:`HFBackend` does for
``greedy=True`` with temperature 0 or 1; other temperatures with ``greedy=True`` cannot be expressed in
the API and are refused.

Standard library only. Each prompt is one request; up to ``max_concurrency`` are in flight at once, so
a server that batches concurrent requests (vLLM) batches them.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import Generation, check_generate_args

TOKEN_ID = re.compile(r"token_id:(\d+)")  # vLLM's form of a token under return_tokens_as_token_ids

# Sampling knobs (vLLM extensions included) set to "off", so that nothing but the temperature shapes
# the distribution the log-probs are taken from.
NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


class OpenAIBackendError(RuntimeError):
    """The server could not be reached, refused a request, or answered in a form this backend cannot use."""


class OpenAIBackend:
    """Generate through the completions endpoint of an OpenAI-compatible server.

    base_url:        the API root, e.g. ``http://127.0.0.1:8000/v1`` (requests go to ``{base_url}/completions``).
    model:           the served model's name (vLLM's ``--served-model-name``, ``capo serve --served-model-name``).
    api_key:         sent as ``Authorization: Bearer ...`` when given.
    timeout:         seconds allowed for connecting and for each read of a response (not the whole request).
    max_concurrency: requests in flight at once.
    """

    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 60.0, max_concurrency: int = 8
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        stop: Sequence[str],
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[Generation]:
        """One :class:`Generation` per prompt, in order; prompt ``i`` is sampled with seed ``seed + i``, so
        a prompt's output does not depend on which other prompts share the call."""
        check_generate_args(prompts, max_new_tokens, temperature, greedy)
        if greedy and temperature not in (0, 1):
            raise ValueError(
                f"greedy decoding over the OpenAI API records T=1 log-probs; pass temperature 1 or 0, not {temperature}"
            )
        payloads = self._payloads(prompts, stop, max_new_tokens, 0.0 if greedy else float(temperature), seed)
        if not payloads:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(payloads))) as pool:
            futures = [pool.submit(self._complete, payload, stop) for payload in payloads]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:  # one failure fails the call: do not send what has not gone yet
                    future.cancel()
                raise

    def _payloads(
        self, prompts: Sequence[Sequence[int]], stop: Sequence[str], max_tokens: int, temperature: float, seed: int | None
    ) -> list[dict]:
        """One request body per prompt; ``temperature`` 0 asks for greedy decoding."""
        common = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stop": list(stop),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,  # the ids keep the stop string's tokens; so must the text
            **NEUTRAL_SAMPLING,
        }
        return [
            {**common, "prompt": [int(t) for t in prompt], **({} if seed is None else {"seed": seed + i})}
            for i, prompt in enumerate(prompts)
        ]

    def _complete(self, payload: dict, stop: Sequence[str]) -> Generation:
        answer = self._post(payload)
        try:
            choice = answer["choices"][0]
            text, logprobs = choice["text"], choice["logprobs"]
            tokens, token_logprobs = logprobs["tokens"], logprobs["token_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise OpenAIBackendError(
                f"{self.url} answered {answer!r:.300}; expected an OpenAI completions response with "
                "choices[0].text and choices[0].logprobs.tokens/token_logprobs"
            ) from None
        if not isinstance(text, str) or not isinstance(tokens, list) or not isinstance(token_logprobs, list):
            raise OpenAIBackendError(f"{self.url} answered a malformed choice: {choice!r:.300}")
        if len(tokens) != len(token_logprobs):
            raise OpenAIBackendError(f"{self.url} answered {len(tokens)} tokens but {len(token_logprobs)} log-probs")
        return Generation(
            [self._token_id(token) for token in tokens],
            [self._logprob(value) for value in token_logprobs],
            text,
            self._finish_reason(choice, stop),
        )

    def _token_id(self, token: Any) -> int:
        match = TOKEN_ID.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            raise OpenAIBackendError(
                f"{self.url} returned the token {token!r:.300} instead of the form 'token_id:<id>'; the server "
                "must support return_tokens_as_token_ids (vLLM does, as does `capo serve`), because the rollout "
                "never re-tokenises generated text"
            )
        return int(match.group(1))

    def _logprob(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OpenAIBackendError(f"{self.url} returned the log-prob {value!r:.300}; expected a number")
        return float(value)

    def _finish_reason(self, choice: dict, stop: Sequence[str]) -> str:
        """``"length"``, or ``"stop"`` split into a stop string (``"stop"``) and EOS (``"eos"``).

        vLLM tells them apart by ``stop_reason``: the stop string, or null for EOS (an int for a stop
        token id, which is an EOS too). A server without ``stop_reason`` is read from the text, which
        keeps a stop string that ended it (``include_stop_str_in_output``).
        """
        reason = choice.get("finish_reason")
        if reason == "length":
            return "length"
        if reason != "stop":
            raise OpenAIBackendError(f"{self.url} gave finish_reason {reason!r}; expected 'stop' or 'length'")
        if "stop_reason" in choice:
            return "stop" if isinstance(choice["stop_reason"], str) else "eos"
        return "stop" if any(s in choice["text"] for s in stop) else "eos"

    def _post(self, payload: dict) -> Any:
        """POST ``payload`` as JSON; the parsed JSON answer, or an :class:`OpenAIBackendError` naming the URL."""
        request = urllib.request.Request(self.url, data=json.dumps(payload).encode("utf-8"), headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            raise OpenAIBackendError(f"{self.url} refused the request: HTTP {e.code}: {_server_message(e)}") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise OpenAIBackendError(f"{self.url} did not answer within {self.timeout} s") from None
            raise OpenAIBackendError(f"cannot reach {self.url}: {e.reason}") from None
        except TimeoutError:
            raise OpenAIBackendError(f"{self.url} did not answer within {self.timeout} s") from None
        except (http.client.HTTPException, OSError) as e:
            raise OpenAIBackendError(f"{self.url} failed: {type(e).__name__}: {e}") from None
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise OpenAIBackendError(f"{self.url} answered with something that is not JSON: {body[:200]!r}") from None


def _server_message(error: urllib.error.HTTPError) -> str:
    """The message of an error answer: OpenAI's and new vLLM's ``{"error": {"message": ...}}``, older
    vLLM's ``{"message": ...}``, FastAPI's ``{"detail": ...}``, else the raw body."""
    try:
        raw = error.read()
    except OSError:
        return str(error.reason)
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw[:500].decode("utf-8", "replace") or str(error.reason)
    if isinstance(payload, dict):
        inner = payload.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        return str(inner or payload.get("message") or payload.get("detail") or payload)
    return f"{payload!r:.500}"

