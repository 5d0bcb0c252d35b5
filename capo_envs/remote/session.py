"""One client's session on ``capo serve env``: its env and episode, and the answer to each OpenEnv message
(``reset``, ``step``, ``state``, ``close``, and capo's ``call``), as the server module's docstring describes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import gymnasium as gym

from ..core.http import brief
from . import ws

RESET_KEYS = frozenset({"seed", "task_id", "task_index", "options", "episode_id"})
ACTION_KEYS = frozenset({"text", "metadata"})
CALLS = ("task_ids", "expert_action", "available_actions", "parse")


class SessionError(Exception):
    """A message the session cannot act on: answered as an OpenEnv error with ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def to_json(value: Any) -> str:
    """JSON for the wire: ASCII (lone surrogates survive as escapes), numpy values as Python ones."""
    return json.dumps(value, ensure_ascii=True, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


class Session:
    """One client's env and episode."""

    def __init__(self, session_id: str, env: gym.Env, split: str | None, connection: ws.Connection | None):
        self.id, self.env, self.split, self.connection = session_id, env, split, connection
        self.episode_id: str | None = None
        self.step_count = 0
        self.started = False  # reset() was called: a reused env holds no previous session's episode
        self.done = False
        self.healthy = True  # an env that raised is closed, not reused

    def interrupt(self) -> None:
        if self.connection is not None:
            try:
                self.connection.sock.shutdown(2)
            except OSError:
                pass

    def reset(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise SessionError("VALIDATION_ERROR", f"reset data must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - RESET_KEYS)
        if unknown:
            raise SessionError("VALIDATION_ERROR", f"unknown reset field {brief(unknown[0])}; reset accepts "
                                                   f"{', '.join(sorted(RESET_KEYS))}")
        seed, options = data.get("seed"), data.get("options") or {}
        if seed is not None and (type(seed) is not int or seed < 0):
            raise SessionError("VALIDATION_ERROR", f"seed must be a non-negative integer or null, got {brief(seed)}")
        if not isinstance(options, dict):
            raise SessionError("VALIDATION_ERROR", f"options must be a JSON object, got {brief(options)}")
        options = dict(options)
        for key in ("task_id", "task_index"):
            if data.get(key) is not None:
                options[key] = data[key]
        obs, info = self._run(lambda: self.env.reset(seed=seed, options=options or None))
        self.started, self.done, self.step_count = True, False, 0
        self.episode_id = str(data["episode_id"]) if data.get("episode_id") is not None else uuid.uuid4().hex
        return observation(obs, None, False, False, info)

    def step(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or "text" not in data:
            raise SessionError("VALIDATION_ERROR", 'an action is a JSON object {"text": "..."}, got ' + brief(data))
        unknown = sorted(set(data) - ACTION_KEYS)
        if unknown:
            raise SessionError("VALIDATION_ERROR", f"unknown action field {brief(unknown[0])}; an action has "
                                                   '"text" (and an optional "metadata")')
        if not self.started:
            raise SessionError("EXECUTION_ERROR", "step before reset: send a reset message first")
        if self.done:
            raise SessionError("EXECUTION_ERROR", "the episode has ended: send a reset message before stepping")
        obs, reward, terminated, truncated, info = self._run(lambda: self.env.step(data["text"]))
        self.step_count += 1
        self.done = bool(terminated or truncated)
        return observation(obs, float(reward), bool(terminated), bool(truncated), info)

    def state(self) -> dict[str, Any]:
        task_id = getattr(self.env.unwrapped, "task_id", None)
        return {"episode_id": self.episode_id, "step_count": self.step_count, "session_id": self.id,
                "done": self.done, "task_id": task_id if isinstance(task_id, (str, int)) else None,
                "split": self.split}

    def call(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or data.get("name") not in CALLS:
            raise SessionError("VALIDATION_ERROR", f"call needs a name among {', '.join(CALLS)}, got {brief(data)}")
        name, args = data["name"], data.get("args") or []
        inner = self.env.unwrapped
        if name == "parse":
            parse = getattr(getattr(inner, "protocol", None), "parse", None)
            if not callable(parse) or not isinstance(args, list) or len(args) != 1:
                raise SessionError("VALIDATION_ERROR", "parse needs a protocol and one argument, the text")
            result = self._run(lambda: parse(args[0]))
            action = result.action.to_dict() if result.action is not None else None
            return {"value": {"action": action, "error": result.error}}
        method = getattr(inner, name, None)
        if not callable(method) or args:
            raise SessionError("VALIDATION_ERROR", f"the served env has no {name}() taking no arguments")
        if name != "task_ids" and not self.started:
            raise SessionError("EXECUTION_ERROR", f"{name}() before reset: send a reset message first")
        value = self._run(method)
        return {"value": list(value) if name == "task_ids" and value is not None else value}

    def _run(self, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the env's error is the client's answer, never the server's end
            self.healthy = False  # not reused by another session: who knows what state it is in
            raise SessionError("EXECUTION_ERROR", f"{type(e).__name__}: {e}") from None


def observation(text: Any, reward: float | None, terminated: bool, truncated: bool, info: dict) -> dict[str, Any]:
    info = {**(info if isinstance(info, dict) else {}), "terminated": terminated, "truncated": truncated}
    return {"observation": {"text": text, "info": info}, "reward": reward, "done": terminated or truncated}


def error(code: str, message: str, **extra: Any) -> str:
    return to_json({"type": "error", "data": {"message": message, "code": code, **extra}})


def handle_message(session: Session, raw: str) -> tuple[str, bool]:
    """The answer to one message, and whether the session ends."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return error("INVALID_JSON", f"Invalid JSON: {e}"), False
    if not isinstance(message, dict):
        return error("VALIDATION_ERROR", f"a message is a JSON object with a type, got {brief(message)}"), False
    kind, data = message.get("type", ""), message.get("data", {})
    try:
        if kind == "reset":
            return to_json({"type": "observation", "data": session.reset(data)}), False
        if kind == "step":
            return to_json({"type": "observation", "data": session.step(data)}), False
        if kind == "state":
            return to_json({"type": "state", "data": session.state()}), False
        if kind == "call":
            return to_json({"type": "result", "data": session.call(data)}), False
        if kind == "close":
            return "", True
        return error("UNKNOWN_TYPE", f"Unknown message type: {brief(kind)} (reset, step, state, close, call)"), False
    except SessionError as e:
        return error(e.code, e.message), False
    except RecursionError:
        return error("VALIDATION_ERROR", "the message is nested too deeply"), False
    except ValueError as e:  # a JSON answer the encoder refused (a circular info)
        return error("EXECUTION_ERROR", f"the env's answer is not JSON: {e}"), False


SCHEMA = {
    "action": {"title": "TextAction", "type": "object", "required": ["text"], "additionalProperties": False,
               "properties": {"text": {"type": "string", "description": "the agent's action, as the env's "
                                       "protocol expects it (any other value is an invalid action)"},
                              "metadata": {"type": "object"}}},
    "observation": {"title": "TextObservation", "type": "object", "properties": {
        "text": {"type": "string"},
        "info": {"type": "object", "description": "the env's info, plus terminated and truncated (bool)"}}},
    "state": {"title": "State", "type": "object", "properties": {
        "episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer"},
        "session_id": {"type": "string"}, "done": {"type": "boolean"}, "task_id": {}, "split": {}}},
}
