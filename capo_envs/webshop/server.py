"""``capo serve webshop``: WebShop's pages as HTML on 127.0.0.1, for a person to shop in or to watch an episode.

    capo serve webshop                                  # SynthShop, test split, http://127.0.0.1:3000
    capo serve webshop --env capo/WebShop-v0 --size small
    capo serve webshop --replay episode.json            # {"task_index": 0, "actions": ["search[...]", ...]}

Every click is an env step (``/s/<sid>/act?a=click[...]``), so a person meets the same pages, rules, step
budget and reward as an agent. A replayed episode is shown step by step at ``/replay/<k>``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
from collections import OrderedDict
from html import escape
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, quote, urlsplit

from ..core.http import JSONHandler, JSONServer
from .html import render_page

MAX_SESSIONS = 256


class ShopSite:
    """Sessions (one env each) and a recorded episode's pages."""

    def __init__(self, make_env: Callable[[], Any], replay: dict | None = None):
        self.make_env = make_env
        self.sessions: OrderedDict[str, dict] = OrderedDict()
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.tasks = list(make_env().unwrapped.task_ids())
        self.replay_pages = self._record(replay) if replay else []

    def new_session(self, task_index: int) -> str:
        env = self.make_env()
        env.reset(options={"task_index": task_index})
        with self.lock:
            sid = str(next(self._ids))
            self.sessions[sid] = {"env": env, "note": "", "lock": threading.Lock(), "ended": False}
            while len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)[1]["env"].close()
        return sid

    def act(self, sid: str, action: str) -> None:
        state = self.sessions[sid]
        with state["lock"]:
            if state["ended"]:
                state["note"] = "This episode has ended; start a new one from the home page."
                return
            _, reward, terminated, truncated, info = state["env"].step(action)
            state["note"] = "" if info["action_valid"] else f"Invalid action: {info['invalid_reason']}"
            if truncated:
                state["note"] = f"The step budget ({state['env'].unwrapped.max_steps} actions) ran out."
            state["ended"] = terminated or truncated

    def page(self, sid: str) -> str:
        state = self.sessions[sid]
        with state["lock"]:
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
            if not task.isdigit() or not int(task) < len(site.tasks):
                return self._html(f"<p>no task {escape(task)}</p>", HTTPStatus.NOT_FOUND)
            return self._redirect(f"/s/{site.new_session(int(task))}")
        if parts[0] == "replay" and len(parts) == 2:
            k = parts[1]
            if not k.isdigit() or int(k) >= len(site.replay_pages):
                return self._html("<p>no such replay step</p>", HTTPStatus.NOT_FOUND)
            return self._html(site.replay_pages[int(k)])
        if parts[0] == "s" and len(parts) >= 2 and parts[1] in site.sessions:
            sid = parts[1]
            if len(parts) == 2:
                return self._html(site.page(sid))
            if parts[2:] == ["act"] and "a" in query:
                site.act(sid, query["a"])
                return self._redirect(f"/s/{sid}")
            if parts[2:] == ["search"]:
                site.act(sid, f"search[{query.get('q', '')}]")
                return self._redirect(f"/s/{sid}")
        self._html("<p>not found</p>", HTTPStatus.NOT_FOUND)

    def _html(self, html: str, status: HTTPStatus = HTTPStatus.OK) -> None:
        body = html.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self._answered = True

    def _redirect(self, location: str) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", quote(location, safe="/?=&"))
        self.send_header("Content-Length", "0")
        self.end_headers()
        self._answered = True


def make_server(site: ShopSite, host: str = "127.0.0.1", port: int = 3000) -> JSONServer:
    server = JSONServer(host, port, ShopHandler)
    server.site = site  # type: ignore[attr-defined]
    return server


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capo serve webshop", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="capo/SynthShop-v0", choices=["capo/SynthShop-v0", "capo/WebShop-v0"])
    p.add_argument("--split", default="test", choices=["train", "dev", "test"])
    p.add_argument("--size", default="small", choices=["small", "full"], help="WebShop-v0's prepared size")
    p.add_argument("--seed", type=int, default=0, help="SynthShop's catalogue seed")
    p.add_argument("--replay", type=Path, help='a JSON file {"task_index": i, "actions": [...]} to show step by step')
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    return p


def serve_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
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
        site = ShopSite(lambda: gym.make(args.env, **kwargs), replay)
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
