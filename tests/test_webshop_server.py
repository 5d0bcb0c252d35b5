"""``capo serve webshop``: the HTML pages over HTTP on 127.0.0.1, and in headless Chromium (Debian's package)."""

from __future__ import annotations

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
