"""``capo serve webshop``: the HTML pages over HTTP on 127.0.0.1, and in headless Chromium (Debian's package)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.error
import urllib.request
from urllib.parse import quote

import gymnasium as gym
import pytest

pytest.importorskip("thefuzz")

import capo_envs  # noqa: F401
from capo_envs.webshop.server import ShopSite, make_server, serve_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def oracle_actions(task_index: int = 0) -> list[str]:
    env = gym.make("capo/SynthShop-v0", split="test").unwrapped
    env.reset(options={"task_index": task_index})
    actions = []
    while True:
        action = env.expert_action()
        actions.append(action)
        *_, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return actions


@pytest.fixture(scope="module")
def server():
    site = ShopSite(lambda: gym.make("capo/SynthShop-v0", split="test"), {"task_index": 0, "actions": oracle_actions(0)})
    srv = make_server(site, port=0).start_in_thread()
    yield srv
    srv.shutdown()


def get(url: str) -> tuple[int, str, str]:
    """(status, final URL after redirects, body)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.url, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, url, e.read().decode()


def test_binds_loopback_and_lists_tasks(server):
    assert server.url.startswith("http://127.0.0.1:")
    status, _, body = get(server.url + "/")
    assert status == 200 and "synthshop-0-0" in body and "/replay/0" in body


def test_a_person_shops_through_the_env(server):
    status, url, body = get(server.url + "/new?task=0")
    assert status == 200 and "/s/" in url and 'id="search_input"' in body
    session = url.rsplit("/", 1)[1]
    for action in oracle_actions(0):
        status, _, body = get(f"{server.url}/s/{session}/act?a={quote(action)}")
        assert status == 200
    assert "Thank you for shopping with us!" in body and "<p id=score>1.0</p>" in body
    _, _, body = get(f"{server.url}/s/{session}/act?a={quote('click[buy now]')}")
    assert "This episode has ended" in body


def test_search_form_invalid_clicks_and_unknown_pages(server):
    _, url, _ = get(server.url + "/new?task=1")
    _, _, body = get(url + "/search?q=" + quote("green tea"))
    assert "Page 1 (Total results:" in body and 'class="product-link"' in body
    _, _, body = get(url + "/act?a=" + quote("click[nothing here]"))
    assert 'id="note">Invalid action:' in body
    assert get(server.url + "/new?task=99999")[0] == 404
    assert get(server.url + "/replay/999")[0] == 404
    assert get(server.url + "/s/nope")[0] == 404


def test_replay_pages_step_through_the_episode(server):
    actions = oracle_actions(0)
    _, _, first = get(server.url + "/replay/0")
    assert "step 0 of" in first and "id='next'" in first
    _, _, last = get(server.url + f"/replay/{len(actions)}")
    assert "Thank you for shopping with us!" in last and "id='next'" not in last
    assert f"Action: {actions[-1]}" in last


def test_serve_main_reports_a_bad_replay_file(tmp_path, capsys):
    bad = tmp_path / "episode.json"
    bad.write_text("[1, 2]")
    assert serve_main(["--replay", str(bad), "--port", "0"]) == 2
    assert "cannot read" in capsys.readouterr().err


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=90,
    )


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_pages_render_in_headless_chromium(server, tmp_path):
    image = pytest.importorskip("PIL.Image")
    _, url, _ = get(server.url + "/new?task=0")
    actions = oracle_actions(0)
    for action in actions[:2]:  # search, then open the product: the item page
        get(f"{url}/act?a={quote(action)}")
    dom = chromium("--dump-dom", url)
    assert dom.returncode == 0 and "Buy Now" in dom.stdout and "Rating: N.A." in dom.stdout
    shot = tmp_path / "item.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1000,700", url)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-500:]
    with image.open(shot) as picture:
        assert picture.size == (1000, 700)
        rgb = picture.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50  # text, buttons and the header, not a blank page
        assert rgb.getpixel((5, 5)) == (0x23, 0x2F, 0x3E)  # the dark header bar is drawn at the top
    done = tmp_path / "done.png"
    chromium(f"--screenshot={done}", "--window-size=1000,700", f"{server.url}/replay/{len(actions)}")
    with image.open(done) as picture:
        assert len(picture.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20


# --- bad numbers, sessions under load ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def make_shop():
    return lambda: gym.make("capo/SynthShop-v0", split="test")


def test_numbers_in_paths_and_queries_are_ascii_digits_with_a_bound(server):
    for path in ("/new?task=%C2%B2", "/new?task=" + "9" * 5000, "/new?task=-1", "/new?task=%2B1", "/new?task=1_0",
                 "/new?task=%EF%BC%91", "/new?task=%FF", "/replay/%C2%B2", "/replay/" + "9" * 5000, "/replay/-1",
                 "/replay/%FF"):
        status, _, body = get(server.url + path)
        assert status == 400 and "whole number of at most 9 digits" in body, (path, status, body[:200])
    status, _, body = get(server.url + "/new?task=999999999")
    assert status == 404 and "no task 999999999: this split has" in body
    assert get(server.url + "/new?task=0")[0] == 200  # still serving


def session_ids(site: ShopSite) -> list[str]:
    return list(site.sessions)


def test_sessions_are_evicted_least_recently_used_first_and_never_in_use(make_shop):
    site = ShopSite(make_shop, max_sessions=3, session_idle=0)
    a, b, c = (site.new_session(0) for _ in range(3))
    site.page(a)  # a is used again: b is now the least recently used
    d = site.new_session(1)
    assert session_ids(site) == [c, a, d]  # b evicted, not a (the oldest made)
    with site.session(c):  # a request on c right now: c is in use although the least recently used
        e = site.new_session(2)
        assert c in site.sessions and a not in site.sessions and session_ids(site) == [d, c, e]
        with site.session(d), site.session(e):
            with pytest.raises(Exception, match="server busy: all 3 sessions are in use"):
                site.new_session(0)
    assert session_ids(site) == [c, d, e]
    with pytest.raises(ValueError):
        ShopSite(make_shop, max_sessions=0)


def test_a_full_server_answers_503_instead_of_taking_an_active_session(make_shop):
    site = ShopSite(make_shop, max_sessions=2)  # the default: sessions used in the last 60 s are active
    with make_server(site, port=0).start_in_thread() as srv:
        first, second = (get(srv.url + "/new?task=0")[1] for _ in range(2))
        status, _, body = get(srv.url + "/new?task=1")
        assert status == 503 and "server busy: all 2 sessions are in use" in body
        for url in (first, second):
            assert get(url)[0] == 200  # nobody lost a session
        site.session_idle = 0  # now both are idle: the least recently used one makes room
        assert get(srv.url + "/new?task=1")[0] == 200
        status, _, body = get(first)
        assert status == 404 and "was closed to make room" in body
        assert get(second)[0] == 200


async def _shop(port: int, path: str) -> tuple[int, str]:
    """One GET on its own connection: (status, Location or "")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        head = (await reader.read()).partition(b"\r\n\r\n")[0].decode("latin-1")
    finally:
        writer.close()
    lines = head.split("\r\n")
    location = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("location:")), "")
    return int(head.split(" ", 2)[1]), location


def shoppers(port: int, n: int) -> tuple[list[tuple[int, str]], list[int]]:
    """``n`` shoppers open a session at once, then each clicks once: the /new answers and the clicks' statuses."""

    async def run():
        opened = await asyncio.gather(*(asyncio.wait_for(_shop(port, f"/new?task={i % 50}"), 60) for i in range(n)))
        clicks = [_shop(port, f"{loc}/search?q=tea") for status, loc in opened if status == 303]
        return opened, [status for status, _ in await asyncio.gather(*(asyncio.wait_for(c, 60) for c in clicks))]

    return asyncio.run(run())


def test_500_concurrent_shoppers_keep_their_sessions_or_are_told_the_server_is_busy(make_shop):
    with make_server(ShopSite(make_shop), port=0).start_in_thread() as srv:  # the default cap: 256
        opened, clicks = shoppers(srv.server_address[1], 500)
        statuses = sorted({status for status, _ in opened})
        assert statuses == [303, 503] and sum(status == 303 for status, _ in opened) == 256, statuses
        assert clicks == [303] * 256  # before: 244 of the 500 lost their session before their first click
    with make_server(ShopSite(make_shop, max_sessions=512), port=0).start_in_thread() as srv:
        opened, clicks = shoppers(srv.server_address[1], 500)
        assert [status for status, _ in opened] == [303] * 500 and clicks == [303] * 500


def test_serve_main_refuses_a_bad_session_cap(capsys):
    with pytest.raises(SystemExit):
        serve_main(["--max-sessions", "0", "--port", "0"])
    assert "--max-sessions must be at least 1" in capsys.readouterr().err
