"""Progress of the long commands: tqdm bars on a terminal, flushed plain lines everywhere else.

``capo train > run.log 2>&1`` must show where a run is: tqdm's ``\\r`` redraws turn a file into one endless
line, so off a terminal the same calls print one line per step, or one every ``every_s`` seconds, each
flushed at once. Only tqdm and the standard library: the data steps run without torch, and the trainer uses the same bars.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, TextIO

from tqdm import tqdm


def on_terminal(file: TextIO | None = None) -> bool:
    file = file or sys.stdout
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def say(message: str, file: TextIO | None = None) -> None:
    print(message, file=file or sys.stdout, flush=True)


def duration(seconds: float) -> str:
    """``46 s``, ``12 min 03 s``, ``2 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _amount(n: float, unit: str) -> str:
    if unit != "B":
        return f"{n:g}"
    for name in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or name == "GiB":
            return f"{n:.0f} {name}" if name == "B" else f"{n:.1f} {name}"
        n /= 1024
    raise AssertionError("unreachable")


class LineProgress:
    """The part of tqdm's interface used here (iterate, ``update``, ``set_postfix``, ``close``, ``with``),
    printing ``[tag] desc n/total postfix (elapsed)`` lines instead of redrawing a bar."""

    def __init__(self, iterable: Iterable | None = None, desc: str = "", total: float | None = None, *,
                 tag: str = "capo", unit: str = "it", initial: float = 0, every_s: float = 30.0,
                 file: TextIO | None = None):
        self.iterable, self.desc, self.total, self.tag, self.unit = iterable, desc, total, tag, unit
        self.n = self._printed = initial
        self.every_s, self.file = every_s, file
        self.postfix = ""
        self.start = self._last = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **values: Any) -> None:
        self.postfix = " ".join(f"{k} {v}" for k, v in {**(ordered_dict or {}), **values}.items())

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.every_s or (self.total is not None and self.n >= self.total):
            self._print(now)

    def close(self) -> None:
        if self.n != self._printed:
            self._print(time.monotonic())

    def _print(self, now: float) -> None:
        self._printed, self._last = self.n, now
        done = _amount(self.n, self.unit) + (f"/{_amount(self.total, self.unit)}" if self.total is not None else "")
        if self.unit not in ("it", "B"):
            done += f" {self.unit.strip()}"
        parts = [f"[{self.tag}]", self.desc, done, self.postfix, f"({duration(now - self.start)})"]
        say(" ".join(p for p in parts if p), self.file)


def progress_bar(iterable: Iterable | None = None, desc: str = "", total: float | None = None, *,
                 tag: str = "capo", unit: str = "it", initial: float = 0, every_s: float = 30.0,
                 file: TextIO | None = None, disable: bool = False):
    """A tqdm bar on a terminal, else a :class:`LineProgress` (a line per ``every_s`` seconds and at the end;
    ``every_s=0``: a line per step); ``disable`` gives a silent tqdm. Iterate over it, or call ``update``."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if disable or on_terminal(file):
        return tqdm(iterable, desc=desc or tag, total=total, initial=initial, unit=unit,
                    unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000, file=file,
                    disable=disable, dynamic_ncols=True)
    return LineProgress(iterable, desc, total, tag=tag, unit=unit, initial=initial, every_s=every_s, file=file)


class Progress:
    """How one command reports: ``say`` a phase or a result, ``bar`` over its steps; all silent when not
    ``enabled`` (tests, or the processes other than the main one)."""

    def __init__(self, tag: str, enabled: bool = True, file: TextIO | None = None):
        self.tag, self.enabled, self.file = tag, enabled, file

    def say(self, message: str) -> None:
        if self.enabled:
            say(f"[{self.tag}] {message}", self.file)

    def bar(self, iterable: Iterable | None = None, desc: str = "", total: float | None = None, **options):
        return progress_bar(iterable, desc, total, tag=self.tag, file=self.file, disable=not self.enabled, **options)


SILENT = Progress("", enabled=False)
