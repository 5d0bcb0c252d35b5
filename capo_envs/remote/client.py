"""Clients of ``capo serve env`` (or of any OpenEnv server, for reset/step/state): a blocking
:class:`SyncSession` (what ``capo/Remote-v0`` plays through) and an asyncio :class:`AsyncSession`, so one
process can step many remote sessions at once::

    async def play(url):
        async with AsyncSession(url) as env:
            result = await env.reset(seed=0)
            while not result["done"]:
                result = await env.step(policy(result["observation"]["text"]))
            return result["reward"]

    rewards = asyncio.run(asyncio.gather(*(play("http://127.0.0.1:8010") for _ in range(64))))

Each session is one WebSocket (one env on the server). A message's answer is the ``data`` of the server's
``observation``/``state``/``result`` message; an ``error`` message raises :class:`RemoteEnvError`.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any
from urllib.parse import quote

from . import ws

ANSWER_TIMEOUT = 300.0  # seconds for the server's answer to one message (a slow env's step included)


class RemoteEnvError(RuntimeError):
    """The server answered an error: ``code`` is OpenEnv's (``CAPACITY_REACHED``, ``EXECUTION_ERROR``, ...)."""

    def __init__(self, code: str, message: str, url: str = ""):
        super().__init__(f"{url + ': ' if url else ''}{message} (code: {code})")
        self.code, self.message = code, message


def session_url(url: str, split: str | None = None) -> str:
    base = url.rstrip("/")
    return base + (f"/ws?split={quote(split)}" if split is not None else "")


def fetch_metadata(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The server's ``GET /metadata`` (what it serves, its protocol, which calls it answers)."""
    base = url.rstrip("/").replace("ws://", "http://", 1)
    if base.endswith("/ws"):
        base = base[:-3]
    try:
        with urllib.request.urlopen(base + "/metadata", timeout=timeout) as answer:
            return json.loads(answer.read().decode("utf-8"))
    except OSError as e:
        raise ConnectionError(f"cannot reach the env server at {url} ({e}); is `capo serve env ID` running "
                              "there?") from None


def encode(kind: str, data: Any) -> str:
    return json.dumps({"type": kind, "data": data}, ensure_ascii=True, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def decode(raw: str, url: str) -> dict[str, Any]:
    message = json.loads(raw)
    if not isinstance(message, dict):
        raise RemoteEnvError("PROTOCOL", f"the server sent {type(message).__name__}, not a message", url)
    data = message.get("data")
    if message.get("type") == "error":
        data = data if isinstance(data, dict) else {}
        raise RemoteEnvError(str(data.get("code", "UNKNOWN")), str(data.get("message", "unknown error")), url)
    return data if isinstance(data, dict) else {}


class SyncSession:
    """One session, blocking. Connects on first use and again after the server closed it (an idle timeout):
    a new connection is a new env on the server, so an episode does not survive it (reset again)."""

    def __init__(self, url: str, split: str | None = None, *, timeout: float = ANSWER_TIMEOUT,
                 connect_timeout: float = 10.0, max_bytes: int = 1 << 30):
        self.url, self.split, self.timeout = url, split, timeout
        self.connect_timeout, self.max_bytes = connect_timeout, max_bytes
        self._conn: ws.Connection | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def connect(self) -> SyncSession:
        if not self.connected:
            self._conn = ws.connect(session_url(self.url, self.split), timeout=self.connect_timeout,
                                    max_bytes=self.max_bytes, frame_timeout=self.timeout)
        return self

    def send(self, raw: str) -> dict[str, Any]:
        """Send one encoded message and return its answer's data."""
        self.connect()
        assert self._conn is not None
        try:
            self._conn.send_text(raw)
            return decode(self._conn.recv_text(self.timeout), self.url)
        except TimeoutError:
            self._conn.close()
            raise TimeoutError(f"{self.url}: no answer within {self.timeout:g} s") from None
        except ws.WebSocketClosed as e:
            raise ConnectionError(f"{self.url}: the session was closed ({e.code} {e.reason})".rstrip()) from None

    def reset(self, **data: Any) -> dict[str, Any]:
        return self.send(encode("reset", {k: v for k, v in data.items() if v is not None}))

    def step(self, action: Any) -> dict[str, Any]:
        return self.send(encode("step", action if isinstance(action, dict) else {"text": action}))

    def state(self) -> dict[str, Any]:
        return self.send(encode("state", {}))

    def call(self, name: str, args: list | None = None) -> Any:
        return self.send(encode("call", {"name": name, "args": args or []})).get("value")

    def close(self) -> None:
        if self.connected:
            assert self._conn is not None
            try:
                self._conn.send_text(encode("close", {}))
            except (ws.WebSocketClosed, OSError):
                pass
            self._conn.close()
        self._conn = None

    def __enter__(self) -> SyncSession:
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncSession:
    """One session for asyncio: ``await reset(...)``, ``await step(text)``, ``await call(name)``, ``await
    state()``, ``await close()`` (or ``async with``). Many of them share one event loop."""

    def __init__(self, url: str, split: str | None = None, *, timeout: float = ANSWER_TIMEOUT,
                 connect_timeout: float = 10.0, max_bytes: int = 1 << 30):
        self.url, self.split, self.timeout = url, split, timeout
        self.connect_timeout, self.max_bytes = connect_timeout, max_bytes
        self._conn: ws.AsyncConnection | None = None

    async def connect(self) -> AsyncSession:
        if self._conn is None or self._conn.closed:
            self._conn = await ws.AsyncConnection.connect(session_url(self.url, self.split),
                                                          timeout=self.connect_timeout, max_bytes=self.max_bytes)
        return self

    async def send(self, raw: str) -> dict[str, Any]:
        await self.connect()
        assert self._conn is not None
        try:
            await self._conn.send_text(raw)
            return decode(await asyncio.wait_for(self._conn.recv_text(), self.timeout), self.url)
        except asyncio.TimeoutError:
            await self._conn.close()
            raise TimeoutError(f"{self.url}: no answer within {self.timeout:g} s") from None
        except ws.WebSocketClosed as e:
            raise ConnectionError(f"{self.url}: the session was closed ({e.code} {e.reason})".rstrip()) from None

    async def reset(self, **data: Any) -> dict[str, Any]:
        return await self.send(encode("reset", {k: v for k, v in data.items() if v is not None}))

    async def step(self, action: Any) -> dict[str, Any]:
        return await self.send(encode("step", action if isinstance(action, dict) else {"text": action}))

    async def state(self) -> dict[str, Any]:
        return await self.send(encode("state", {}))

    async def call(self, name: str, args: list | None = None) -> Any:
        return (await self.send(encode("call", {"name": name, "args": args or []}))).get("value")

    async def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            try:
                await self._conn.send_text(encode("close", {}))
            except (ws.WebSocketClosed, OSError):
                pass
            await self._conn.close()
        self._conn = None

    async def __aenter__(self) -> AsyncSession:
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
