"""`capo view` with 10,000 recorded episodes in headless Chromium: the run page, its filters, an episode and
the side-by-side view all render (how fast is measured by benchmarks/bench_viewer.py, not asserted here)."""

from __future__ import annotations

import pytest

from capo_train.viewer.chromium import Chromium, find_chromium
from capo_train.viewer.data import discover
from capo_train.viewer.server import make_server
from capo_train.viewer.site import Site
from capo_train.viewer.synthetic import synthetic_run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed")]


def test_ten_thousand_episodes_stay_browsable(tmp_path):
    runs = [synthetic_run(tmp_path / "a", iterations=200, episodes=50, seed=0),
            synthetic_run(tmp_path / "b", iterations=200, episodes=50, seed=1)]
    with make_server(Site(*discover(runs))).start_in_thread() as server, Chromium() as browser:
        browser.open(server.url + "/#/run/0", ready="run", timeout=60)
        count = browser.evaluate("document.querySelector('.pager .count').textContent")
        assert count == "10000 of 10000 recorded episodes"
        assert browser.evaluate("document.querySelectorAll('tr.episode').length") == 50  # one page of the table
        browser.go("#/run/0?it=100&succ=1", ready="run")
        rows = "[...document.querySelectorAll('tr.episode')]"
        shown = browser.evaluate(rows + ".map(r => [+r.dataset.it, +r.dataset.success])")
        assert shown and all(it == 100 and success == 1 for it, success in shown)
        browser.go("#/run/0/ep/150/7", ready="run")
        assert browser.evaluate("document.querySelectorAll('.timeline .step').length") == 4
        browser.go("#/compare/0/1?it=3", ready="compare")
        counts = browser.evaluate("[...document.querySelectorAll('table.episodes')].map(t => +t.dataset.count)")
        assert counts == [50, 50]
