"""``capo/Remote-v0``: an env served by ``capo serve env`` (or any process's :class:`EnvServer`), played as a
local Gymnasium env: same observations, rewards, ``terminated``/``truncated`` and ``info``, and, where the
served env has them, ``task_ids()``, ``expert_action()``, ``available_actions()`` and its protocol.

``gym.make("capo/Remote-v0", url="http://127.0.0.1:8010")`` plays what that server serves; ``env_id`` and
``kwargs``, when given, must be what the server serves (a run cannot train on another env by mistake). Without
``url`` the env serves ``env_id`` (default ``capo/SynthChain-v0``) from a loopback server in this process,
shared by the remote envs of the same id and kwargs: the whole protocol, with nothing to start.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from typing import Any, Sequence

import gymnasium as gym

from ..core.env import TextEnv, _print_text
from ..core.protocol import as_text, safe_repr
from ..core.spaces import UnicodeText
from .client import ANSWER_TIMEOUT, RemoteEnvError, SyncSession, encode, fetch_metadata
from .protocol import RemoteProtocol

DEFAULT_ENV = "capo/SynthChain-v0"
_ERRORS = {"ValueError": ValueError, "KeyError": KeyError, "TypeError": TypeError, "RuntimeError": RuntimeError}
_LOOPBACK: dict[tuple, list] = {}  # (pid, env_id, kwargs) -> [server, users]
_LOOPBACK_LOCK = threading.Lock()


def _loopback(env_id: str, kwargs: dict) -> tuple[tuple, str]:
    from .server import EnvServer

    key = (os.getpid(), env_id, json.dumps(kwargs, sort_keys=True, default=repr))  # a forked worker starts its own
    with _LOOPBACK_LOCK:
        entry = _LOOPBACK.get(key)
        if entry is None:
            server = EnvServer(env_id, kwargs, max_sessions=4096, idle_timeout=None).start_in_thread()
            entry = _LOOPBACK[key] = [server, 0]
        entry[1] += 1
        return key, entry[0].url


def _release_loopback(key: tuple) -> None:
    with _LOOPBACK_LOCK:
        entry = _LOOPBACK.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _LOOPBACK[key]
    entry[0].shutdown()


class RemoteEnv(TextEnv):
    """A served env, one session (one env on the server) per instance.

    ``url``: the server (``http://host:port``); None serves ``env_id`` from this process. ``split``: the served
    env's split for this session (ignored, with a warning, when the served env has none). ``timeout``: seconds
    for each answer. Non-string actions are sent as JSON when they are JSON (else as ``null``): the served env
    answers them as invalid actions, as it would locally. ``step`` after the episode ended raises, as a local
    env does; a session closed by the server (idle timeout) is reopened by the next ``reset``.
    """

    def __init__(self, url: str | None = None, env_id: str | None = None, kwargs: dict | None = None,
                 split: str | None = None, *, timeout: float = ANSWER_TIMEOUT, render_mode: str | None = None):
        self._loopback_key = None
        if url is None:
            self._loopback_key, url = _loopback(env_id or DEFAULT_ENV, dict(kwargs or {}))
        try:
            meta = fetch_metadata(url)
            _check_served(url, meta, env_id, kwargs)
            if split is not None and not meta.get("splits"):
                warnings.warn(f"{meta.get('env_id')} at {url} has no split; split={split!r} is ignored", stacklevel=2)
                split = None
            self.url, self.split, self.meta = url, split, meta
            self.session = SyncSession(url, split, timeout=timeout)
            self.calls = frozenset(meta.get("calls") or ())
            super().__init__(RemoteProtocol(meta.get("protocol"), url, self._call),
                             max_steps=int(meta.get("max_steps") or 1 << 62),  # the served env's budget
                             max_observation_chars=int(meta.get("max_observation_chars") or 1 << 20),
                             render_mode=render_mode)
            self.action_space = UnicodeText(int(meta.get("max_action_chars") or self.protocol.max_action_chars))
            self._task_ids: list | None = None
        except BaseException:
            self._release()
            raise

    # --- what the served env has, and only that (the trainer checks which methods exist) ----------------
    def __getattribute__(self, name: str) -> Any:
        if name in ("task_ids", "expert_action", "available_actions") and name not in object.__getattribute__(
                self, "calls"):
            if name == "available_actions":
                return lambda: None
            raise AttributeError(f"the served env has no {name}()")
        return object.__getattribute__(self, name)

    def task_ids(self) -> Sequence[str]:
        if self._task_ids is None:  # fixed for the env's life
            self._task_ids = list(self._call("task_ids", []))
        return self._task_ids

    def expert_action(self) -> str | None:
        return self._call("expert_action", [])

    def available_actions(self) -> list[str] | None:
        return self._call("available_actions", [])

    def _call(self, name: str, args: list) -> Any:
        return self._send(encode("call", {"name": name, "args": args})).get("value")

    # --- the contract -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)
        if not self.session.connected:
            self.session.connect()
        data = {"seed": seed, "options": dict(options) if options else None}
        answer = self._send(encode("reset", {k: v for k, v in data.items() if v is not None}))
        observation, _, _, _, info = _unpack(answer)
        self._task_id = info.get("task_id") if isinstance(info.get("task_id"), str) else None
        self._steps = self._invalid_actions = 0
        self._done = False
        self._transcript = [observation if isinstance(observation, str) else safe_repr(observation)]
        return observation, info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() was called on a finished episode; call reset() first")
        text = as_text(action)
        raw = self._step_message(text, action)
        observation, reward, terminated, truncated, info = _unpack(self._send(raw))
        self._steps = info["step"] if type(info.get("step")) is int else self._steps + 1
        self._invalid_actions += info.get("action_valid") is False
        self._done = terminated or truncated
        self._transcript += [text if text is not None else safe_repr(action),
                             observation if isinstance(observation, str) else safe_repr(observation)]
        if self.render_mode == "human":
            _print_text(self._transcript[-2] + "\n" + self._transcript[-1])
        return observation, reward, terminated, truncated, info

    def _step_message(self, text: str | None, action: Any) -> str:
        if text is None:
            try:  # plain JSON values travel as themselves; anything else as null (both invalid actions)
                value = json.dumps(action, ensure_ascii=True) if type(action) in (type(None), bool, int, float, list,
                                                                                  dict) else "null"
            except Exception:  # noqa: BLE001 - circular, too deep, a huge int, a hostile object inside
                value = "null"
            return '{"type": "step", "data": {"text": ' + value + "}}"
        raw = encode("step", {"text": text})
        limit = int(self.meta.get("max_message_bytes") or 1 << 24) - 1024
        if len(raw) > limit:  # longer than the server takes: still too long for the env, and one step
            raw = encode("step", {"text": text[: self.protocol.max_action_chars + 1]})
        return raw

    def _send(self, raw: str) -> dict[str, Any]:
        try:
            return self.session.send(raw)
        except RemoteEnvError as e:
            kind, sep, message = e.message.partition(": ")
            if e.code == "EXECUTION_ERROR" and sep and kind in _ERRORS:
                raise _ERRORS[kind](f"{message} (remote env at {self.url})") from None
            raise

    def close(self) -> None:
        session = self.__dict__.get("session")
        if session is not None:
            session.close()
        self._release()

    def _release(self) -> None:
        key, self._loopback_key = self.__dict__.get("_loopback_key"), None
        if key is not None:
            _release_loopback(key)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _unpack(answer: dict[str, Any]) -> tuple[Any, float, bool, bool, dict]:
    """An OpenEnv observation message's data as Gymnasium's step tuple (``info`` without the two flags)."""
    obs = answer.get("observation") or {}
    info = obs.get("info") if isinstance(obs.get("info"), dict) else {}
    terminated, truncated = bool(info.pop("terminated", False)), bool(info.pop("truncated", False))
    if not (terminated or truncated) and answer.get("done"):  # a plain OpenEnv server: done is all we know
        terminated = True
    reward = answer.get("reward")
    return obs.get("text", ""), float(reward) if isinstance(reward, (int, float)) else 0.0, terminated, truncated, info


def _check_served(url: str, meta: dict, env_id: str | None, kwargs: dict | None) -> None:
    served = str(meta.get("env_id", ""))
    if env_id is not None and env_id.rpartition(":")[2] != served.rpartition(":")[2]:
        raise ValueError(f"the server at {url} serves {served}, not {env_id}")
    if kwargs is not None and json.loads(json.dumps(kwargs, default=repr)) != meta.get("kwargs"):
        raise ValueError(f"the server at {url} serves {served} with kwargs {meta.get('kwargs')}, not {kwargs}: "
                         "start it with those kwargs (capo serve env ID --kwargs JSON), or leave kwargs out")
