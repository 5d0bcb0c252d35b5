"""``capo serve webshop``: WebShop's pages as HTML on 127.0.0.1, for a person to shop in or to watch an episode.

    capo serve webshop                                  # SynthShop, test split, http://127.0.0.1:3000
    capo serve webshop --env capo/WebShop-v0 --size small
    capo serve webshop --replay episode.json            # {"task_index": 0, "actions": ["search[...]", ...]}

Every click is an env step (``/s/<sid>/act?a=click[...]``), so a person meets the same pages, rules, step
budget and reward as an agent. A replayed episode is shown step by step at ``/replay/<k>``.

Sessions are kept up to ``--max-sessions`` (default 256). A new one takes the place of the least recently
used session that is idle (no request on it now, none for ``--session-idle`` seconds, default 60); when every
session is in use, ``/new`` answers 503 "server busy" rather than take anyone's. Numbers in paths and queries
(``/new?task=``, ``/replay/<k>``) are ASCII digits, at most 9 of them: anything else is a 400, a number past
the end a 404.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from html import escape
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, quote, urlsplit

from ..core.http import JSONHandler, JSONServer, brief
from .html import render_page

MAX_SESSIONS = 256  # the default of --max-sessions
SESSION_IDLE_SECONDS = 60.0  # a session used more recently than this is in use: never evicted for a new one
MAX_DIGITS = 9  # a task index or replay step: more digits than any split has tasks


class ServerBusy(Exception):
    """Every session is in use: a new one would have to take someone's."""


class NoSession(KeyError):
    """The session id is unknown: never made, or ended and evicted."""


def parse_index(text: str) -> int | None:
    """``text`` as a non-negative integer: ASCII digits only (``str.isdigit`` also takes "²", which ``int``
    refuses), at most ``MAX_DIGITS`` of them; None otherwise."""
    if not text or len(text) > MAX_DIGITS or not text.isascii() or not text.isdigit():
        return None
    return int(text)


class ShopSite:
    """Sessions (one env each, least recently used evicted first, never one in use) and a recorded episode's pages."""

    def __init__(
        self,
        make_env: Callable[[], Any],
        replay: dict | None = None,
        *,
        max_sessions: int = MAX_SESSIONS,
        session_idle: float = SESSION_IDLE_SECONDS,
    ):
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        if not session_idle >= 0:
            raise ValueError(f"session_idle must be >= 0 seconds, got {session_idle!r}")
        self.make_env = make_env
        self.max_sessions = max_sessions
        self.session_idle = float(session_idle)
        self.sessions: OrderedDict[str, dict] = OrderedDict()  # least recently used first
        self.lock = threading.Lock()
        self._pending = 0  # sessions being made (their env resets outside the lock)
        self._ids = itertools.count(1)
        self.tasks = list(make_env().unwrapped.task_ids())
        self.replay_pages = self._record(replay) if replay else []

    def _idle(self, state: dict, now: float) -> bool:
        return state["users"] == 0 and now - state["used"] >= self.session_idle

    def new_session(self, task_index: int) -> str:
        """A new session on task ``task_index``; :class:`ServerBusy` when all ``max_sessions`` are in use."""
        evicted = []
        with self.lock:
            now = time.monotonic()
            while len(self.sessions) + self._pending >= self.max_sessions:
                victim = next((sid for sid, state in self.sessions.items() if self._idle(state, now)), None)
                if victim is None:
                    raise ServerBusy(f"server busy: all {self.max_sessions} sessions are in use (each used in the "
                                     f"last {self.session_idle:g} s); try again shortly")
                evicted.append(self.sessions.pop(victim)["env"])
            self._pending += 1
        try:
            for env in evicted:
                env.close()
            env = self.make_env()
            env.reset(options={"task_index": task_index})
        finally:
            with self.lock:
                self._pending -= 1
        with self.lock:
            sid = str(next(self._ids))
            self.sessions[sid] = {"env": env, "note": "", "lock": threading.Lock(), "ended": False,
                                  "users": 0, "used": time.monotonic()}
        return sid

    @contextmanager
    def session(self, sid: str) -> Iterator[dict]:
        """The session ``sid``, marked in use (not evictable) and most recently used; :class:`NoSession`."""
        with self.lock:
            state = self.sessions.get(sid)
            if state is None:
                raise NoSession(sid)
            self.sessions.move_to_end(sid)
            state["users"] += 1
        try:
            yield state
        finally:
            with self.lock:
                state["users"] -= 1
                state["used"] = time.monotonic()

    def act(self, sid: str, action: str) -> None:
        with self.session(sid) as state, state["lock"]:
            if state["ended"]:
                state["note"] = "This episode has ended; start a new one from the home page."
                return
            _, reward, terminated, truncated, info = state["env"].step(action)
            state["note"] = "" if info["action_valid"] else f"Invalid action: {info['invalid_reason']}"
            if truncated:
                state["note"] = f"The step budget ({state['env'].unwrapped.max_steps} actions) ran out."
            state["ended"] = terminated or truncated

    def page(self, sid: str) -> str:
        with self.session(sid) as state, state["lock"]:
            env = state["env"].unwrapped
            footer = f"<p class='note'>Step {env._steps} of {env.max_steps}. <a href='/'>Home</a></p>"
            return render_page(env._session, f"/s/{sid}", state["note"], footer)

    def _record(self, replay: dict) -> list[str]:
        env = self.make_env()
        options = {"task_id": replay["task_id"]} if "task_id" in replay else {"task_index": int(replay.get("task_index", 0))}
        env.reset(options=options)
        pages = [("(start)", render_page(env.unwrapped._session, "/replay/0"))]
        for action in replay["actions"]:
            _, _, terminated, truncated, info = env.step(action)
            note = f"Action: {action}" + ("" if info["action_valid"] else f" (invalid: {info['invalid_reason']})")
            pages.append((note, render_page(env.unwrapped._session, "/replay/-", note)))
            if terminated or truncated:
                break
        total = len(pages)
        out = []
        for k, (_, html) in enumerate(pages):
            nav = (f"<p class='note'>Recorded episode, step {k} of {total - 1}. "
                   + (f"<a id='prev' href='/replay/{k - 1}'>&lt; previous</a> " if k > 0 else "")
                   + (f"<a id='next' href='/replay/{k + 1}'>next &gt;</a>" if k < total - 1 else "") + "</p>")  # fmt: skip
            out.append(html.replace("<main>", "<main>" + nav, 1))
        return out

    def index(self) -> str:
        rows = "".join(
            f"<li><a href='/new?task={i}'>{escape(task)}</a></li>" for i, task in enumerate(self.tasks[:50])
        )
        replay = "<p><a href='/replay/0'>Watch the recorded episode</a></p>" if self.replay_pages else ""
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'><title>WebShop</title></head><body>"
            f"<h1>WebShop</h1>{replay}<p>Pick a task ({len(self.tasks)} in this split):</p><ol start=0>{rows}</ol>"
            "</body></html>"
        )


class ShopHandler(JSONHandler):
    site: ShopSite

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        site = self.server.site  # type: ignore[attr-defined]
        if not parts:
            return self._html(site.index())
        if parts == ["new"]:
            task = query.get("task", "0")
            index = parse_index(task)
            if index is None:
                return self._html(f"<p>task must be a whole number of at most {MAX_DIGITS} digits, got "
                                  f"{escape(brief(task))}</p>", HTTPStatus.BAD_REQUEST)
            if index >= len(site.tasks):
                return self._html(f"<p>no task {index}: this split has {len(site.tasks)} (0 to "
                                  f"{len(site.tasks) - 1})</p>", HTTPStatus.NOT_FOUND)
            try:
                sid = site.new_session(index)
            except ServerBusy as e:
                return self._html(f"<p>{escape(str(e))}</p>", HTTPStatus.SERVICE_UNAVAILABLE, {"Retry-After": "5"})
            return self._redirect(f"/s/{sid}")
        if parts[0] == "replay" and len(parts) == 2:
            k = parse_index(parts[1])
            if k is None:
                return self._html(f"<p>a replay step is a whole number of at most {MAX_DIGITS} digits, got "
                                  f"{escape(brief(parts[1]))}</p>", HTTPStatus.BAD_REQUEST)
            if k >= len(site.replay_pages):
                return self._html(f"<p>no replay step {k}: the recorded episode has {len(site.replay_pages)} "
                                  "pages</p>", HTTPStatus.NOT_FOUND)
            return self._html(site.replay_pages[k])
        if parts[0] == "s" and len(parts) >= 2:
            sid = parts[1]
            try:
                if len(parts) == 2:
                    return self._html(site.page(sid))
                if parts[2:] == ["act"] and "a" in query:
                    site.act(sid, query["a"])
                    return self._redirect(f"/s/{sid}")
                if parts[2:] == ["search"]:
                    site.act(sid, f"search[{query.get('q', '')}]")
                    return self._redirect(f"/s/{sid}")
            except NoSession:
                return self._html(f"<p>no session {escape(brief(sid))}: it never existed or was closed to make room "
                                  "for others. <a href='/'>Start a new one</a></p>", HTTPStatus.NOT_FOUND)
        self._html("<p>not found</p>", HTTPStatus.NOT_FOUND)

    def _html(self, html: str, status: HTTPStatus = HTTPStatus.OK, headers: dict[str, str] | None = None) -> None:
        body = html.encode("utf-8", "replace")  # "replace": a lone surrogate a request put on the page
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self._answered = True

    def _redirect(self, location: str) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", quote(location, safe="/?=&"))
        self.send_header("Content-Length", "0")
        self.end_headers()
        self._answered = True


def make_server(site: ShopSite, host: str = "127.0.0.1", port: int = 3000, **kwargs: Any) -> JSONServer:
    """Bound, not serving yet; ``kwargs`` go to :class:`JSONServer` (``request_timeout``, ``header_timeout``...)."""
    server = JSONServer(host, port, ShopHandler, **kwargs)
    server.site = site  # type: ignore[attr-defined]
    return server


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capo serve webshop", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="capo/SynthShop-v0", choices=["capo/SynthShop-v0", "capo/WebShop-v0"])
    p.add_argument("--split", default="test", choices=["train", "dev", "test"])
    p.add_argument("--size", default="small", choices=["small", "full"], help="WebShop-v0's prepared size")
    p.add_argument("--seed", type=int, default=0, help="SynthShop's catalogue seed")
    p.add_argument("--replay", type=Path, help='a JSON file {"task_index": i, "actions": [...]} to show step by step')
    p.add_argument("--max-sessions", type=int, default=MAX_SESSIONS,
                   help="shoppers at once; the least recently used idle session makes room for a new one")
    p.add_argument("--session-idle", type=float, default=SESSION_IDLE_SECONDS, metavar="SECONDS",
                   help="a session used in the last SECONDS is never closed for a new one (/new answers 503 instead)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    return p


def serve_main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.max_sessions < 1 or not args.session_idle >= 0:
        parser.error("--max-sessions must be at least 1 and --session-idle at least 0")
    import gymnasium as gym

    import capo_envs  # noqa: F401

    kwargs: dict[str, Any] = {"split": args.split}
    kwargs.update({"seed": args.seed} if args.env == "capo/SynthShop-v0" else {"size": args.size})
    replay = None
    if args.replay is not None:
        try:
            replay = json.loads(args.replay.read_text())
            if not isinstance(replay, dict) or not isinstance(replay.get("actions"), list):
                raise ValueError('expected {"task_index": i, "actions": [...]}')
        except (OSError, ValueError) as e:
            print(f"capo serve webshop: cannot read {args.replay}: {e}", file=sys.stderr)
            return 2
    try:
        site = ShopSite(lambda: gym.make(args.env, **kwargs), replay, max_sessions=args.max_sessions,
                        session_idle=args.session_idle)
    except Exception as e:  # noqa: BLE001 - a missing dataset or extra: say which, do not trace back
        print(f"capo serve webshop: {e}", file=sys.stderr)
        return 1
    server = make_server(site, args.host, args.port)
    print(f"WebShop pages on {server.url} ({args.env}, {args.split} split, {len(site.tasks)} tasks)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0
