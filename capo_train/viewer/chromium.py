"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages
ending in a NUL byte, the browser reading fd 3 and writing fd 4), standard library only. For the viewer's
tests, its benchmark and the screenshots in docs/: load a page, wait until it says it is rendered, read the
DOM, time it, take a PNG.

The flags keep the browser off the network and away from any profile: Debian's ``chromium`` package
(``apt-get install chromium``); :func:`find_chromium` returns None where it is absent.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars")


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevToolsError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page. ``with Chromium() as browser: browser.open(url); ...``."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 900, timeout: float = 60.0):
        binary = binary or find_chromium()
        if binary is None:
            raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="capo-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes answers
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)  # out of the way of 3 and 4 first
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(a, 3)  # dup2's copies are inheritable: these two survive exec, nothing else of ours does
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # close_fds would close 3 and 4 again (pass_fds needs them open in this process): Python's own
            # descriptors are not inheritable (PEP 446), so nothing else leaks into the browser.
            preexec_fn=wire_pipes, close_fds=False,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        self.resize(width, height)

    # ------------------------------------------------------------------ protocol

    def call(self, method: str, session: bool = False, **params: Any) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise DevToolsError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    # ------------------------------------------------------------------ page

    def resize(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def open(self, url: str, ready: str | None = None, timeout: float | None = None) -> float:
        """Navigate to ``url`` and wait until the page's ``body[data-ready]`` is set (equal to ``ready`` when
        given); returns the seconds that took, measured here."""
        start = time.perf_counter()
        self.call("Page.navigate", session=True, url=url)
        self.wait_ready(ready, timeout, fresh=True)
        return time.perf_counter() - start

    def wait_ready(self, ready: str | None = None, timeout: float | None = None, fresh: bool = False) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        check = "document.body ? document.body.getAttribute('data-ready') : null"
        time.sleep(0.01 if fresh else 0)
        while time.monotonic() < deadline:
            try:
                state = self.evaluate(check)
            except DevToolsError:  # the old page's context went away mid-navigation
                state = None
            if state is not None and (ready is None or state == ready):
                return
            time.sleep(0.01)
        raise TimeoutError(f"the page did not become ready ({ready or 'any'}) in time")

    def go(self, hash_route: str, ready: str | None = None) -> float:
        """Change the page's ``location.hash`` (an in-page navigation) and wait for the new view."""
        start = time.perf_counter()
        self.evaluate(f"document.body.removeAttribute('data-ready'); location.hash = {json.dumps(hash_route)}")
        self.wait_ready(ready)
        return time.perf_counter() - start

    def screenshot(self, path: str | Path, full_height: bool = False, max_height: int = 2400) -> Path:
        """A PNG of the viewport (``full_height``: of the page, up to ``max_height`` pixels)."""
        params: dict[str, Any] = {"format": "png"}
        if full_height:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": min(size[1], max_height), "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", session=True, **params)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close")
                except (DevToolsError, TimeoutError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
