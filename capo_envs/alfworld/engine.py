"""``Engine``: the client side of one engine process (``worker.py``), with a timeout on every call.

Each env owns one engine process. It is started lazily, answers one JSON line per request, and is killed
when a call runs past its timeout, when it dies, and on ``close()`` (also when the env is garbage-collected
without ``close()``, through ``weakref.finalize``). A process whose parent dies reads end-of-input and exits.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds capo_envs/


class EngineError(RuntimeError):
    """The engine process failed, died, or did not answer in time."""


class EngineTimeout(EngineError):
    pass


class EngineDied(EngineError):
    """The engine process had exited (crashed, killed, out of memory) before a call that needed its game."""


# The requests that start from nothing (they load a game); any other needs the game a live process holds.
FRESH_OPS = frozenset({"load", "load_synth", "close"})


def describe_exit(code: int | None) -> str:
    """``-9`` -> "killed by SIGKILL", ``1`` -> "exit code 1"."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            import signal

            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def engine_available() -> bool:
    """Whether the optional ``alfworld`` extra (alfworld, TextWorld, its Fast Downward) is installed."""
    from importlib.util import find_spec

    return all(find_spec(name) is not None for name in ("alfworld", "textworld", "fast_downward"))


def require_engine() -> None:
    if not engine_available():
        raise ImportError(
            "the ALFWorld engine is not installed. Run: pip install 'capo-gym[alfworld]' "
            "(alfworld 0.4.2 with TextWorld and its Fast Downward planner, built with gcc/cmake)"
        )


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for stream in (process.stdin, process.stdout):
        try:
            if stream:
                stream.close()
        except OSError:
            pass


class Engine:
    """One engine process. ``call(request, timeout)`` returns the reply dict or raises ``EngineError``."""

    def __init__(self, start_timeout: float = 120.0, call_timeout: float = 60.0):
        self.start_timeout = float(start_timeout)
        self.call_timeout = float(call_timeout)
        self._process: subprocess.Popen | None = None
        self._buffer = b""
        self._finalizer: weakref.finalize | None = None
        self.death: str | None = None  # how the last process died unasked, until ``take_death()`` reads it

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def check_alive(self) -> bool:
        """Whether the process is running; a process that exited unasked is reaped and its death recorded
        in ``death`` (so that the caller can say the engine died, not that it has no game)."""
        if self._process is None:
            return False
        code = self._process.poll()
        if code is None:
            return True
        self.death = f"the engine process died ({describe_exit(code)})"
        self.close()
        return False

    def take_death(self) -> str | None:
        """How the previous process died unasked (None if it did not), once: reading clears it."""
        death, self.death = self.death, None
        return death

    def _start(self) -> None:
        require_engine()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", "1")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "capo_envs.alfworld.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _kill, self._process)

    def call(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send ``request``; a process is started when none runs. A request that needs the game of a process
        that has died (``step``, ``reset``) raises :class:`EngineDied` instead of going to a fresh process,
        which would only answer "no game loaded"."""
        first = not self.check_alive()
        op = request.get("op", "?")
        if first and self.death is not None and op not in FRESH_OPS:
            raise EngineDied(f"{self.take_death()} before {op!r}; the game it held is lost")
        if first:
            self.close()
            self._start()
        # The first call also pays for starting Python and importing TextWorld.
        limit = (timeout or self.call_timeout) + (self.start_timeout if first else 0.0)
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
            self._process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            code = self._process.poll()
            self.close()
            raise EngineDied(f"the engine process died ({describe_exit(code) if code is not None else error}) "
                             f"before {op!r}") from None
        line = self._read_line(time.monotonic() + limit, op, limit)
        reply = json.loads(line)
        if "error" in reply:
            raise EngineError(f"the engine failed on {request.get('op')!r}: {reply['error']}")
        return reply

    def _read_line(self, deadline: float, op: str, limit: float) -> bytes:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise EngineTimeout(f"the engine did not answer {op!r} within {limit:.0f} s; its process was killed")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                try:
                    code = self._process.wait(timeout=2)  # end-of-output: it is exiting, or has
                except subprocess.TimeoutExpired:
                    code = None
                self.close()
                raise EngineDied(f"the engine process died ({describe_exit(code)}) during {op!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        """End the process: ask it to exit, then kill it if it has not within 2 s."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                assert process.stdin is not None
                process.stdin.write(b'{"op": "close"}\n')
                process.stdin.flush()
                process.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired, AssertionError):
                pass
        _kill(process)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
