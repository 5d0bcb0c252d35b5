"""``capo serve env ID``: any Gymnasium text env (a capo id, or ``module:Id``) served on 127.0.0.1 in OpenEnv's
protocol, so that OpenEnv's own clients (``GenericEnvClient``) play it unchanged.

OpenEnv's clients hold one WebSocket per session at ``/ws`` and send JSON text messages
``{"type": "reset", "data": {...}}``, ``{"type": "step", "data": action}``, ``{"type": "state"}`` and
``{"type": "close"}``; the server answers ``{"type": "observation", "data": {"observation": {...}, "reward",
"done"}}``, ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data": {"message", "code"}}``.
Here:

* an action is ``{"text": str}`` (any other JSON value as ``text`` is stepped as that object: the env answers
  an invalid action); ``metadata`` is accepted and ignored;
* an observation is ``{"text": str, "info": {...}}``: the env's observation and its ``info`` as JSON, with
  ``info["terminated"]`` and ``info["truncated"]`` added; ``done`` is ``terminated or truncated``; ``reward`` is
  the step's reward (None on reset, as OpenEnv's servers send);
* reset takes ``seed``, ``task_id``, ``task_index``, ``options`` (passed to ``reset(options=)``) and OpenEnv's
  ``episode_id`` (kept in the state); anything else is a ``VALIDATION_ERROR``;
* capo's own message, ``{"type": "call", "data": {"name", "args"}}``, runs ``task_ids``, ``expert_action``,
  ``available_actions`` or ``parse`` (the protocol's parser) on the session's env: ``{"type": "result",
  "data": {"value"}}``. ``/ws?split=NAME`` gives the session the env on that split (when it has one).

One env per session, made for it (or reused from a closed session and reset: ``reuse_envs``); a session idle for
``idle_timeout`` seconds is closed; past ``max_sessions`` a new session's first message is answered with
OpenEnv's ``CAPACITY_REACHED`` error and the connection closed (1013, try again later). HTTP routes, as
OpenEnv's: ``GET /health``, ``/metadata``, ``/schema``, ``/state`` (the server's sessions), ``POST /reset`` (a
stateless reset, 503 when full); ``POST /step`` needs a session, so it is a 400 that points to ``/ws``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import sys
import threading
import time
import uuid
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

import gymnasium as gym

from ..core.http import JSONHandler, JSONServer, RequestError, brief, json_object, serve_until_interrupted
from . import ws
from .session import CALLS, SCHEMA, Session, SessionError, error, handle_message, to_json

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8010
FIRST_MESSAGE_TIMEOUT = 10.0  # a full server waits this long for a refused session's first message


def takes_split(env_id: str, kwargs: dict) -> bool:
    """Whether the env has a ``split``: its registration sets one, or its constructor names the parameter."""
    if "split" in kwargs:
        return True
    try:
        spec = gym.spec(env_id.rpartition(":")[2])  # its module was imported by the first gym.make
        if "split" in (spec.kwargs or {}):
            return True
        creator = spec.entry_point
        if isinstance(creator, str):
            creator = gym.envs.registration.load_env_creator(creator)
        return "split" in inspect.signature(creator).parameters
    except (gym.error.Error, ImportError, AttributeError, TypeError, ValueError):
        return False


class EnvServer(JSONServer):
    """Serves ``env_id`` (made with ``kwargs``) to up to ``max_sessions`` sessions at once."""

    def __init__(self, env_id: str, kwargs: dict | None = None, host: str = "127.0.0.1", port: int = 0, *,
                 max_sessions: int = 256, idle_timeout: float = 300.0, reuse_envs: bool = True,
                 max_message_bytes: int = ws.DEFAULT_MAX_BYTES, verbose: bool = False):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.env_id, self.kwargs = env_id, dict(kwargs or {})
        self.max_sessions, self.idle_timeout, self.reuse_envs = max_sessions, idle_timeout, reuse_envs
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._make_lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._reserved = 0
        self._pool: dict[str | None, list[gym.Env]] = {}
        self._served = 0
        first = self._make(None)  # a wrong id or kwargs fails here, before the port is taken
        self.splits = takes_split(env_id, self.kwargs)
        self.description = self._describe(first)
        self._release(first, None, healthy=True)
        try:
            super().__init__(host, port, EnvHandler, max_body_bytes=max_message_bytes, verbose=verbose)
        except BaseException:  # the port is taken: close the env made to check the id
            for env in self._pool.pop(None, []):
                _close_quietly(env)
            raise

    # --- envs ------------------------------------------------------------------------------------------
    def _make(self, split: str | None) -> gym.Env:
        kwargs = dict(self.kwargs) if split is None else {**self.kwargs, "split": split}
        # One at a time: under the GIL concurrent builds are no faster, and an env's constructor (an index
        # build, a lazily compiled scorer) need not be thread-safe.
        with self._make_lock:
            return gym.make(self.env_id, disable_env_checker=True, **kwargs)

    def _acquire_env(self, split: str | None) -> gym.Env:
        with self._lock:
            pool = self._pool.get(split)
            if pool:
                return pool.pop()
        return self._make(split)

    def _release(self, env: gym.Env, split: str | None, healthy: bool) -> None:
        if healthy and self.reuse_envs:
            with self._lock:
                pool = self._pool.setdefault(split, [])
                if len(pool) < self.max_sessions:
                    pool.append(env)
                    return
        _close_quietly(env)

    def _describe(self, env: gym.Env) -> dict[str, Any]:
        inner = env.unwrapped
        protocol = getattr(inner, "protocol", None)
        describe = getattr(protocol, "describe", None)
        space = getattr(inner, "observation_space", None)
        action_space = getattr(inner, "action_space", None)
        return {
            "name": self.env_id,
            "description": f"{self.env_id} served by capo serve env (OpenEnv protocol; one env per session)",
            "version": _version(),
            "env_id": self.env_id,
            "kwargs": self.kwargs,
            "protocol": describe() if callable(describe) else None,
            "calls": [name for name in CALLS[:3] if callable(getattr(inner, name, None))]
                     + (["parse"] if callable(getattr(protocol, "parse", None)) else []),
            "splits": self.splits,
            "max_steps": inner.max_steps if type(getattr(inner, "max_steps", None)) is int else None,
            "max_observation_chars": getattr(space, "max_length", None),
            "max_action_chars": getattr(action_space, "max_length", None),
            "max_message_bytes": self.max_message_bytes,
            "max_sessions": self.max_sessions,
            "idle_timeout": self.idle_timeout,
        }

    # --- sessions --------------------------------------------------------------------------------------
    def reserve(self) -> bool:
        """Take a session slot; False when the server is full."""
        with self._lock:
            if len(self._sessions) + self._reserved >= self.max_sessions:
                return False
            self._reserved += 1
            return True

    def open_session(self, split: str | None, connection: ws.Connection | None) -> Session:
        """A session on a reserved slot (the slot is given back if its env cannot be made)."""
        try:
            env = self._acquire_env(split)
        except BaseException:
            with self._lock:
                self._reserved -= 1
            raise
        session = Session(uuid.uuid4().hex, env, split, connection)
        with self._lock:
            self._reserved -= 1
            self._sessions[session.id] = session
            self._served += 1
        return session

    def close_session(self, session: Session) -> None:
        with self._lock:
            if self._sessions.pop(session.id, None) is None:
                return
        self._release(session.env, session.split, healthy=session.healthy)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"active_sessions": len(self._sessions), "max_sessions": self.max_sessions,
                    "sessions_served": self._served, "env_id": self.env_id}

    def shutdown(self) -> None:
        """Stop serving, end every session (their envs are closed) and close the pooled envs."""
        super().shutdown()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.interrupt()
        deadline = time.monotonic() + 5.0
        while self.status()["active_sessions"] and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            pooled = [env for envs in self._pool.values() for env in envs]
            self._pool.clear()
        for env in pooled:
            _close_quietly(env)


class EnvHandler(JSONHandler):
    server: EnvServer

    def error_payload(self, status: HTTPStatus, message: str) -> dict:
        return {"error": message, "detail": message}  # capo's key and FastAPI's (OpenEnv's servers)

    def do_GET(self) -> None:
        route = self.route
        if route == "/ws":
            return self._websocket()
        answers = {
            "/health": lambda: {"status": "healthy"},
            "/metadata": lambda: self.server.description,
            "/schema": lambda: SCHEMA,
            "/state": self.server.status,
            "": lambda: {**self.server.status(), "routes": ["/ws", "/health", "/metadata", "/schema", "/state",
                                                            "POST /reset"]},
        }
        if route not in answers:
            return self._reject(RequestError(HTTPStatus.NOT_FOUND, f"no route {brief(route)}; try /ws or /metadata"))
        self._send_json(HTTPStatus.OK, answers[route]())

    def do_POST(self) -> None:
        try:
            if self.route == "/step":
                raise RequestError(HTTPStatus.BAD_REQUEST, "HTTP /step has no session: open a WebSocket at /ws "
                                   "(OpenEnv's EnvClient and capo/Remote-v0 do) and send reset, then step")
            if self.route != "/reset":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no route {brief(self.route)}; POST /reset, or use /ws")
            body = json_object(self._read_body())
            if not self.server.reserve():
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "busy: every session is in use")
            session = self.server.open_session(None, None)
            try:
                answer = session.reset(body)
            except SessionError as e:
                raise RequestError(HTTPStatus.BAD_REQUEST, e.message) from None
            finally:
                self.server.close_session(session)
        except RequestError as e:
            return self._reject(e)
        self._send_json(HTTPStatus.OK, json.loads(to_json(answer)))

    # --- the WebSocket session ------------------------------------------------------------------------
    def _websocket(self) -> None:
        key = self.headers.get("Sec-WebSocket-Key", "")
        if "websocket" not in self.headers.get("Upgrade", "").lower() or not key:
            return self._reject(RequestError(HTTPStatus.BAD_REQUEST, "/ws is a WebSocket: send Upgrade: websocket"))
        if self.headers.get("Sec-WebSocket-Version", "").strip() != "13":
            return self._reject(RequestError(HTTPStatus.BAD_REQUEST, "only WebSocket version 13 is supported"))
        split = (parse_qs(self.path.partition("?")[2]).get("split") or [None])[0]
        if split is not None and not self.server.splits:
            return self._reject(RequestError(HTTPStatus.BAD_REQUEST, f"{self.server.env_id} has no split"))
        self.close_connection = True
        self.send_response(HTTPStatus.SWITCHING_PROTOCOLS)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", ws.accept_key(key.strip()))
        self.end_headers()
        self.wfile.flush()
        self._answered = True
        conn = ws.Connection(self.connection, client=False, max_bytes=self.server.max_message_bytes,
                             frame_timeout=self.server.body_timeout)
        try:
            if not self.server.reserve():
                return self._refuse(conn)
            try:
                session = self.server.open_session(split, conn)
            except Exception as e:  # noqa: BLE001 - the env could not be made: say why, then close
                conn.recv_text(FIRST_MESSAGE_TIMEOUT)
                conn.send_text(error("FACTORY_ERROR", f"cannot make {self.server.env_id}: {type(e).__name__}: {e}",
                                     factory_name=self.server.env_id))
                return conn.close(ws.CLOSE_TRY_LATER)
            try:
                self._serve_session(session, conn)
            finally:
                self.server.close_session(session)
        except (ws.WebSocketClosed, TimeoutError, OSError):
            pass
        except ws.ProtocolError as e:
            conn.close(e.code, str(e))
        finally:
            conn.close()

    def _refuse(self, conn: ws.Connection) -> None:
        conn.recv_text(FIRST_MESSAGE_TIMEOUT)
        status = self.server.status()
        conn.send_text(error("CAPACITY_REACHED", f"busy: all {status['max_sessions']} sessions are in use; "
                             "try again later", active_sessions=status["active_sessions"],
                             max_sessions=status["max_sessions"]))
        conn.close(ws.CLOSE_TRY_LATER, "server full")

    def _serve_session(self, session: Session, conn: ws.Connection) -> None:
        idle = self.server.idle_timeout
        while True:
            try:
                raw = conn.recv_text(idle)
            except TimeoutError:
                conn.close(ws.CLOSE_GOING_AWAY, f"idle for {idle:g} s")
                return
            answer, end = handle_message(session, raw)
            if end:
                return
            conn.send_text(answer)


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001
        logger.debug("closing an env failed", exc_info=True)


def _version() -> str:
    from .. import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capo serve env", description="Serve a Gymnasium text env on 127.0.0.1 "
                                     "in OpenEnv's protocol (WebSocket /ws; OpenEnv's GenericEnvClient works).")
    parser.add_argument("env_id", metavar="ID", help="a capo id (capo/SynthHop-v0) or Gymnasium's module:Id")
    parser.add_argument("--kwargs", default="{}", help='the env\'s kwargs as a JSON object, e.g. \'{"size": "tiny"}\'')
    parser.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 to accept other machines")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--max-sessions", type=int, default=256, help="sessions at once; more are refused (busy)")
    parser.add_argument("--idle-timeout", type=float, default=300.0, help="seconds before an idle session is closed")
    parser.add_argument("--fresh-envs", action="store_true", help="make a new env for every session instead of "
                        "reusing (after a reset) the env of a closed one")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request to stderr")
    return parser


def serve_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        kwargs = json.loads(args.kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        print(f"capo serve env: --kwargs must be a JSON object ({e})", file=sys.stderr)
        return 2
    import capo_envs  # noqa: F401  (registers the capo ids)

    try:
        server = EnvServer(args.env_id, kwargs, args.host, args.port, max_sessions=args.max_sessions,
                           idle_timeout=args.idle_timeout, reuse_envs=not args.fresh_envs, verbose=args.verbose)
    except OSError as e:
        print(f"capo serve env: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a wrong id or kwargs: say so in a line
        print(f"capo serve env: cannot make {args.env_id} with kwargs {kwargs}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    serve_until_interrupted(server, f"serving {args.env_id} at {server.url} (OpenEnv protocol: WebSocket /ws; "
                                    f"up to {args.max_sessions} sessions)")
    return 0
