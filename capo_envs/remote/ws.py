"""The WebSocket protocol (RFC 6455) in the standard library: the handshake and frames, for the env server and
its two clients (a blocking one, :class:`Connection`, and an asyncio one, :class:`AsyncConnection`).

Only what OpenEnv's sessions use: text messages (UTF-8 JSON), fragmentation, ping/pong and close. No
extension is negotiated (a client's offer of permessage-deflate is declined by not answering it), binary
messages are refused, and a message is at most ``max_bytes`` long. Client frames are masked, server frames
are not, as the RFC requires.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import struct
import time
from typing import Callable
from urllib.parse import urlsplit

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_PROTOCOL, CLOSE_UNSUPPORTED = 1000, 1001, 1002, 1003
CLOSE_BAD_DATA, CLOSE_TOO_BIG, CLOSE_TRY_LATER = 1007, 1009, 1013
DEFAULT_MAX_BYTES = 16 << 20


class WebSocketClosed(Exception):
    """The peer closed the connection (``code``, ``reason``), or it broke."""

    def __init__(self, code: int = CLOSE_GOING_AWAY, reason: str = ""):
        super().__init__(f"WebSocket closed ({code}{': ' + reason if reason else ''})")
        self.code, self.reason = code, reason


class ProtocolError(Exception):
    """The peer broke the WebSocket protocol: the connection is closed with ``code``."""

    def __init__(self, message: str, code: int = CLOSE_PROTOCOL):
        super().__init__(message)
        self.code = code


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` answering a client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode("ascii")).digest()).decode("ascii")


def encode_frame(opcode: int, payload: bytes, mask: bool) -> bytes:
    """One final frame (client frames are masked)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _xor(payload, key)


def _xor(data: bytes, key: bytes) -> bytes:
    if not data:
        return b""
    n = len(data)
    repeated = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:120]


class _Assembler:
    """Turns frames into messages: checks the RFC's rules, joins fragments, answers pings and closes."""

    def __init__(self, max_bytes: int, expect_masked: bool):
        self.max_bytes, self.expect_masked = max_bytes, expect_masked
        self.parts: list[bytes] = []
        self.size = 0

    def header(self, b0: int, b1: int) -> tuple[int, bool, int, bool]:
        fin, opcode, masked, length = bool(b0 & 0x80), b0 & 0x0F, bool(b1 & 0x80), b1 & 0x7F
        if b0 & 0x70:
            raise ProtocolError("reserved bits set (no extension was negotiated)")
        if masked != self.expect_masked:
            raise ProtocolError("client frames must be masked" if self.expect_masked else "server frames must not be masked")
        if opcode >= 0x8 and (not fin or length > 125):
            raise ProtocolError("a control frame must be final and at most 125 bytes")
        if opcode not in (OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG):
            raise ProtocolError(f"unknown opcode {opcode}")
        return opcode, fin, length, masked

    def check_length(self, length: int) -> None:
        if self.size + length > self.max_bytes:
            raise ProtocolError(f"message longer than {self.max_bytes} bytes", CLOSE_TOO_BIG)

    def data(self, opcode: int, fin: bool, payload: bytes) -> str | None:
        """A data frame's payload; the whole message's text once it is complete."""
        if opcode == OP_BINARY:
            raise ProtocolError("binary messages are not supported: send JSON as text", CLOSE_UNSUPPORTED)
        if (opcode == OP_CONT) != bool(self.parts):
            raise ProtocolError("unexpected continuation frame" if opcode == OP_CONT else "a new message began "
                                "before the last one ended")
        self.parts.append(payload)
        self.size += len(payload)
        if not fin:
            return None
        data, self.parts, self.size = b"".join(self.parts), [], 0
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("a text message is not valid UTF-8", CLOSE_BAD_DATA) from None


def parse_close(payload: bytes) -> tuple[int, str]:
    if len(payload) < 2:
        return CLOSE_NORMAL, ""
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode("utf-8", "replace")


class Connection:
    """A blocking WebSocket over a connected socket: :meth:`send_text`, :meth:`recv_text`, :meth:`close`.

    ``client``: this side masks its frames (and expects unmasked ones). ``recv_text(timeout)`` waits at most
    ``timeout`` seconds for a message to begin (None: forever; a ``TimeoutError`` after that), and once it
    began, at most ``frame_timeout`` seconds for the rest of it (a slow peer cannot hold a reader forever).
    """

    def __init__(self, sock: socket.socket, *, client: bool, max_bytes: int = DEFAULT_MAX_BYTES,
                 frame_timeout: float = 60.0, buffered: bytes = b""):
        self.sock, self.client, self.frame_timeout = sock, client, frame_timeout
        self._assembler = _Assembler(max_bytes, expect_masked=not client)
        self._buffer = bytearray(buffered)
        self.closed = False

    def _read(self, n: int, deadline: float | None) -> bytes:
        while len(self._buffer) < n:
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise TimeoutError("timed out waiting for the peer")
            self.sock.settimeout(timeout)
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            except socket.timeout:
                raise TimeoutError("timed out waiting for the peer") from None
            except OSError as e:
                self.closed = True
                raise WebSocketClosed(CLOSE_GOING_AWAY, f"connection lost: {e}") from None
            if not chunk:
                self.closed = True
                raise WebSocketClosed(CLOSE_GOING_AWAY, "connection closed without a close frame")
            self._buffer += chunk
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def recv_text(self, timeout: float | None = None) -> str:
        first = None if timeout is None else time.monotonic() + timeout
        while True:
            b0, b1 = self._read(2, first)
            deadline = time.monotonic() + self.frame_timeout
            opcode, fin, length, masked = self._assembler.header(b0, b1)
            if length == 126:
                length = struct.unpack("!H", self._read(2, deadline))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8, deadline))[0]
            if opcode < 0x8:
                self._assembler.check_length(length)
            key = self._read(4, deadline) if masked else b""
            payload = self._read(length, deadline)
            if masked:
                payload = _xor(payload, key)
            if opcode == OP_PING:
                self._send(OP_PONG, payload)
            elif opcode == OP_CLOSE:
                code, reason = parse_close(payload)
                self.close(code if code != 1005 else CLOSE_NORMAL)
                raise WebSocketClosed(code, reason)
            elif opcode != OP_PONG:
                text = self._assembler.data(opcode, fin, payload)
                if text is not None:
                    return text

    def _send(self, opcode: int, payload: bytes) -> None:
        try:
            self.sock.settimeout(self.frame_timeout)
            self.sock.sendall(encode_frame(opcode, payload, self.client))
        except OSError as e:
            self.closed = True
            raise WebSocketClosed(CLOSE_GOING_AWAY, f"connection lost: {e}") from None

    def send_text(self, text: str) -> None:
        self._send(OP_TEXT, text.encode("utf-8"))

    def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Send a close frame (once) and close the socket; never raises."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.settimeout(2.0)
            self.sock.sendall(encode_frame(OP_CLOSE, close_payload(code, reason), self.client))
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def split_url(url: str) -> tuple[str, int, str]:
    """``(host, port, path?query)`` of an ``http://``/``ws://`` URL (the path defaults to /ws)."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.scheme not in ("http", "ws"):
        raise ValueError(f"only http:// and ws:// URLs are supported, got {url!r}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path.rstrip("/")
    if not path.endswith("/ws"):
        path += "/ws"
    return host, port, path + (f"?{parts.query}" if parts.query else "")


def _handshake_request(host: str, port: int, path: str) -> tuple[bytes, str]:
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
    return request.encode("ascii"), key


def _check_handshake(head: bytes, key: str, url: str) -> None:
    lines = head.decode("iso-8859-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] != "101":
        body = head.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")[:300]
        raise ConnectionError(f"{url} refused the WebSocket: {lines[0]} {body}".strip())
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("sec-websocket-accept") != accept_key(key):
        raise ConnectionError(f"{url} answered the WebSocket handshake wrongly")


def _read_head(recv: Callable[[], bytes]) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = recv()
        if not chunk:
            raise ConnectionError("the server closed the connection during the WebSocket handshake")
        data += chunk
        if len(data) > 1 << 16:
            raise ConnectionError("the server's handshake answer is too long")
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.split(b" ", 2)[1:2] == [b"101"]:  # an HTTP error: keep its (short) JSON body for the message
        head += b"\r\n\r\n" + rest
        rest = b""
    return head, rest


def connect(url: str, *, timeout: float = 10.0, max_bytes: int = DEFAULT_MAX_BYTES,
            frame_timeout: float = 60.0) -> Connection:
    """A blocking client :class:`Connection` to ``url`` (``http://host:port`` means its ``/ws``)."""
    host, port, path = split_url(url)
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request, key = _handshake_request(host, port, path)
        sock.sendall(request)
        head, rest = _read_head(lambda: sock.recv(65536))
        _check_handshake(head, key, url)
    except BaseException:
        sock.close()
        raise
    return Connection(sock, client=True, max_bytes=max_bytes, frame_timeout=frame_timeout, buffered=rest)


class AsyncConnection:
    """The asyncio client side: ``await send_text``, ``await recv_text``, ``await close``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_bytes: int):
        self.reader, self.writer = reader, writer
        self._assembler = _Assembler(max_bytes, expect_masked=False)
        self.closed = False

    @classmethod
    async def connect(cls, url: str, *, timeout: float = 10.0, max_bytes: int = DEFAULT_MAX_BYTES) -> AsyncConnection:
        host, port, path = split_url(url)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 20), timeout)
        try:
            request, key = _handshake_request(host, port, path)
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            if head.split(b" ", 2)[1:2] != [b"101"]:
                head += await asyncio.wait_for(reader.read(4096), timeout)
            _check_handshake(head, key, url)
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, max_bytes)

    async def _read(self, n: int) -> bytes:
        try:
            return await self.reader.readexactly(n)
        except (asyncio.IncompleteReadError, OSError) as e:
            self.closed = True
            raise WebSocketClosed(CLOSE_GOING_AWAY, f"connection lost: {e}") from None

    async def recv_text(self) -> str:
        while True:
            b0, b1 = await self._read(2)
            opcode, fin, length, _ = self._assembler.header(b0, b1)
            if length == 126:
                length = struct.unpack("!H", await self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", await self._read(8))[0]
            if opcode < 0x8:
                self._assembler.check_length(length)
            payload = await self._read(length)
            if opcode == OP_PING:
                await self._send(OP_PONG, payload)
            elif opcode == OP_CLOSE:
                code, reason = parse_close(payload)
                await self.close(code if code != 1005 else CLOSE_NORMAL)
                raise WebSocketClosed(code, reason)
            elif opcode != OP_PONG:
                text = self._assembler.data(opcode, fin, payload)
                if text is not None:
                    return text

    async def _send(self, opcode: int, payload: bytes) -> None:
        try:
            self.writer.write(encode_frame(opcode, payload, True))
            await self.writer.drain()
        except OSError as e:
            self.closed = True
            raise WebSocketClosed(CLOSE_GOING_AWAY, f"connection lost: {e}") from None

    async def send_text(self, text: str) -> None:
        await self._send(OP_TEXT, text.encode("utf-8"))

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.writer.write(encode_frame(OP_CLOSE, close_payload(code, reason), True))
            await asyncio.wait_for(self.writer.drain(), 2.0)
        except (OSError, asyncio.TimeoutError):
            pass
        self.writer.close()
