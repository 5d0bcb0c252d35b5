"""`capo view` end to end: tiny training runs on SynthChain record episodes (capo_train/episodes.py), the
recorded numbers are checked against the algorithms' definitions, and the pages built from the run folders
are served, exported and, where Debian's chromium is installed, rendered in headless Chromium (DOM checked,
screenshots saved)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from capo_train.episodes import clip_text, episode_file, records_iteration
from capo_train.viewer.chromium import Chromium, find_chromium
from capo_train.viewer.data import discover, run_payload
from capo_train.viewer.server import make_server
from capo_train.viewer.site import Site

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")

RUN = [
    "iterations=2",
    "env.id=capo/SynthChain-v0",
    "env.kwargs={k: 2}",
    "rollout.episodes_per_batch=4",
    "rollout.max_action_tokens=16",
    "optim.minibatch_rows=2",  # several mini-batches: later ones see ratios away from 1, so some actions clip
    "model.lora=false",
    "sft.episodes=4",
    "eval_every=2",
    "eval_episodes=2",
    "log_tensorboard=false",
    "record_every=1",
    "record_episodes=16",  # more than the batch: every episode is recorded, so batch statistics can be redone
]


def train_run(model_dir: Path, out: Path, algo: str, *extra: str) -> Path:
    from capo_train.config import load_config
    from capo_train.trainer import train

    config = load_config(None, [f"model.path={model_dir}", f"out_dir={out}", f"algo={algo}", *RUN, *extra])
    train(config, progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """A capo run and a grpo run, each its own folder, and a bench-like grid folder holding copies of both."""
    root = tmp_path_factory.mktemp("viewer-runs")
    made = {
        "capo": train_run(tiny_model_dir, root / "capo", "capo"),
        "grpo": train_run(tiny_model_dir, root / "grpo", "grpo", "rollout.group_size=2"),
    }
    grid = root / "grid"
    for algo, path in made.items():
        shutil.copytree(path, grid / "runs" / "capo_SynthChain-v0" / algo / "seed-0")
    (grid / "grid.json").write_text(json.dumps({"algos": ["capo", "grpo"], "seeds": [0]}))
    (grid / "results.csv").write_text(
        "env,algo,group_size,seeds_done,success_mean,success_std\n"
        "capo/SynthChain-v0,capo,1,1,0.5,\ncapo/SynthChain-v0,grpo,2,1,0.25,\n")
    made["grid"] = grid
    return made


def episodes(run: Path, iteration: int, held_out: bool = False) -> list[dict]:
    path = run / "episodes" / f"eval-{iteration:06d}.jsonl" if held_out else episode_file(run, iteration)
    return [json.loads(line) for line in path.read_text().splitlines()]


def every_episode(run: Path) -> list[tuple[int, int, str]]:
    """(iteration, episode, split) of every recorded episode, training and held-out."""
    return [(e["iteration"], e["episode"], e["split"]) for p in sorted((run / "episodes").glob("*.jsonl"))
            for e in map(json.loads, p.read_text().splitlines())]


# ----------------------------------------------------------------------------- recording


def test_records_the_first_every_nth_and_last_iteration():
    assert [i for i in range(1, 26) if records_iteration(i, 10, 25)] == [1, 10, 20, 25]
    assert not any(records_iteration(i, 0, 25) for i in range(1, 26))


def test_long_texts_keep_head_and_tail():
    text = "a" * 3000 + "END"
    cut = clip_text(text, 100)
    assert cut.startswith("a" * 50) and cut.endswith("END") and "2903 characters cut" in cut


def test_every_recorded_iteration_has_every_episode_and_field(runs):
    run = runs["capo"]
    meta = json.loads((run / "episodes" / "meta.json").read_text())
    assert meta["algo"] == "capo" and meta["ratio"] == "capo" and meta["critic"] == "boundary"
    for iteration in (1, 2):
        eps = episodes(run, iteration)
        assert len(eps) == 4 and [e["episode"] for e in eps] == [0, 1, 2, 3]
        for e in eps:
            assert e["iteration"] == iteration and e["task_id"].startswith("synthchain-")
            assert e["num_actions"] == len(e["actions"]) == 2  # k=2: one decision per action
            assert e["invalid_actions"] == sum(not a["valid"] for a in e["actions"])
            assert e["metrics"]["success"] == e["success"]
            for a in e["actions"]:
                assert a["tokens"] >= 1 and isinstance(a["action"], str) and a["observation"].startswith(
                    ("Step", "Invalid action"))
                assert a["valid"] == (a["reason"] == "")
                for key in ("value", "return", "advantage_raw", "advantage", "ratio", "clip_frac", "clipped"):
                    assert a[key] is not None, key
    assert not (run / "episodes" / "iter-000003.jsonl").exists()


def test_held_out_evaluations_are_recorded_without_credit(runs):
    """eval_every=2 with a warm start: the held-out episodes before RL (iteration 0) and after iteration 2."""
    run = runs["capo"]
    assert sorted(p.name for p in (run / "episodes").glob("eval-*")) == ["eval-000000.jsonl", "eval-000002.jsonl"]
    log = {r["iteration"]: r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())}
    for iteration in (0, 2):
        eps = episodes(run, iteration, held_out=True)
        assert [e["split"] for e in eps] == ["held-out"] * 2 and eps[0]["task_id"].startswith("synthchain-0-dev")
        assert statistics.fmean(e["success"] for e in eps) == pytest.approx(log[iteration]["eval/success"])
        for a in (a for e in eps for a in e["actions"]):
            assert "advantage" not in a and "ratio" not in a and a["tokens"] >= 1


def test_capo_numbers_are_the_estimator_and_the_loss(runs):
    """return = discounted reward sum (gamma 0.99, terminated episodes), raw advantage = return - V(s_t),
    the advantage = the batch's raw advantages whitened (std floor 0.1, the CPU default), and an action is
    clipped exactly when its ratio left the clip range on the side its advantage pushes."""
    clip = json.loads((runs["capo"] / "episodes" / "meta.json").read_text())["clip_high"]
    clipped_seen = 0
    for iteration in (1, 2):
        actions = [a for e in episodes(runs["capo"], iteration) for a in e["actions"]]
        for e in episodes(runs["capo"], iteration):
            assert e["terminated"]
            rewards = [a["reward"] for a in e["actions"]]
            for t, a in enumerate(e["actions"]):
                assert a["return"] == pytest.approx(sum(r * 0.99**k for k, r in enumerate(rewards[t:])), abs=1e-5)
                assert a["advantage_raw"] == pytest.approx(a["return"] - a["value"], abs=1e-6)
        raw = [a["advantage_raw"] for a in actions]
        mean, std = statistics.fmean(raw), statistics.stdev(raw)
        for a in actions:
            assert a["advantage"] == pytest.approx((a["advantage_raw"] - mean) / (max(std, 0.1) + 1e-8), abs=1e-5)
            w, adv = a["ratio"], a["advantage"]
            if abs(w - (1 + clip)) < 1e-6 or abs(w - (1 - clip)) < 1e-6:
                continue  # float32 rounding at the boundary
            expected = (adv > 0 and w > 1 + clip) or (adv < 0 and w < 1 - clip)
            assert a["clipped"] == expected, a
            assert a["clip_frac"] == float(expected)
            clipped_seen += expected
    assert clipped_seen > 0  # the check above was not vacuous


def test_grpo_records_token_ratios_and_group_advantages(runs):
    meta = json.loads((runs["grpo"] / "episodes" / "meta.json").read_text())
    assert meta["ratio"] == "token" and meta["critic"] is None
    eps = episodes(runs["grpo"], 2)
    for e in eps:
        advantages = {a["advantage"] for a in e["actions"]}
        assert len(advantages) == 1  # one advantage per episode, broadcast to its actions
        for a in e["actions"]:
            assert a["value"] is None and a["advantage_raw"] is None
            assert a["return"] == pytest.approx(e["return"])  # GRPO's return is the episode's reward sum
            assert a["ratio_min"] - 1e-6 <= a["ratio"] <= a["ratio_max"] + 1e-6
            assert 0 <= a["clip_frac"] <= 1 and a["clipped"] == (a["clip_frac"] > 0.5)
    for group in {e["group_id"] for e in eps}:
        returns = [e["return"] for e in eps if e["group_id"] == group]
        scores = [e["actions"][0]["advantage"] for e in eps if e["group_id"] == group]
        if len(set(returns)) == 1:
            assert scores == pytest.approx([0.0] * len(scores), abs=1e-6)
        else:
            assert sum(scores) == pytest.approx(0.0, abs=1e-4)


def test_recording_off_writes_no_episodes(tiny_model_dir, tmp_path):
    run = train_run(tiny_model_dir, tmp_path / "off", "capo", "record_every=0", "iterations=1", "sft.episodes=0",
                    "eval_every=0")
    assert (run / "log.jsonl").exists() and not (run / "episodes").exists()


# ----------------------------------------------------------------------------- pages without a browser


def test_discover_runs_and_grids(runs, tmp_path):
    found, grids = discover([runs["capo"], runs["grid"]])
    assert [r.name for r in found][0] == "capo"
    assert len(found) == 3 and len(grids) == 1 and grids[0].runs == [1, 2]
    nested, _ = discover([runs["capo"].parent])  # a folder of runs
    assert {r.path.name for r in nested} >= {"capo", "grpo"}
    with pytest.raises(FileNotFoundError):
        discover([tmp_path / "missing"])


def test_run_payload_holds_curves_config_and_the_episode_index(runs):
    (ref,), _ = discover([runs["capo"]])
    payload = run_payload(ref)
    assert payload["config"]["algo"] == "capo" and payload["iterations"] == [1, 2]
    assert [p[0] for p in payload["series"]["rollout/success"]] == [1, 2]
    assert "eval/success" in payload["series"] and "actor/clip_frac" in payload["series"]
    index = payload["episodes"]
    assert index["it"] == [1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 2, 2] and index["eval"] == [0] * 8 + [1] * 4
    assert payload["eval_iterations"] == [0, 2]
    first = episodes(runs["capo"], 1)[0]
    assert index["adv"][0] == [round(a["advantage"], 4) for a in first["actions"]]


def test_server_binds_loopback_serves_pages_and_404s(runs):
    site = Site(*discover([runs["capo"], runs["grpo"]]))
    with make_server(site).start_in_thread() as server:
        assert server.url.startswith("http://127.0.0.1:") and not server.url.endswith(":0")
        page = urllib.request.urlopen(server.url + "/").read().decode()
        assert "<script src=\"app.js\">" in page
        data = urllib.request.urlopen(server.url + "/data/run-0-iter-2.js").read().decode()
        assert data.startswith('CAPO.put("run-0-iter-2",') and "synthchain-" in data
        for missing in ("/data/run-9.js", "/nope", "/../pyproject.toml"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(server.url + missing)
            assert e.value.code == 404


def test_run_text_cannot_close_the_data_script(tmp_path):
    from capo_train.viewer.site import script

    body = script("k", {"text": "</script><script>alert(1)</script>\u2028"}).decode()
    assert "</script>" not in body and "\u2028" not in body


def test_cli_html_export_writes_every_file(runs, tmp_path, capsys):
    from capo_train.cli import main

    out = tmp_path / "site"
    assert main(["view", str(runs["capo"]), str(runs["grid"]), "--html", str(out)]) == 0
    assert "3 run(s) written" in capsys.readouterr().out
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"index.html", "app.js", "app.css", "data/site.js", "data/run-0.js", "data/run-0-iter-1.js",
            "data/run-0-eval-0.js", "data/run-2-iter-2.js"} <= names
    assert main(["view", str(runs["capo"]), "--html", str(out)]) == 0  # a second export replaces the first
    assert not (out / "data" / "run-2.js").exists()
    with pytest.raises(SystemExit, match="no run found"):
        main(["view", str(tmp_path / "site" / "data"), "--html", str(tmp_path / "x")])


# ----------------------------------------------------------------------------- in headless Chromium


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed")
    with Chromium(width=1280, height=900) as b:
        yield b


def each(browser: Chromium, css: str, expression: str) -> list:
    """``expression`` (of ``e``) for every element matching ``css`` on the page."""
    return browser.evaluate(f"[...document.querySelectorAll({json.dumps(css)})].map(e => {expression})")


@needs_chromium
def test_pages_render_the_recorded_episodes_in_chromium(runs, browser, tmp_path):
    site = Site(*discover([runs["capo"], runs["grpo"], runs["grid"]]))
    with make_server(site).start_in_thread() as server:
        browser.open(server.url + "/#/", ready="home")
        assert browser.evaluate("document.querySelectorAll('table.runs tr[data-run]').length") == 4

        browser.open(server.url + "/#/run/0", ready="run")
        charts = each(browser, ".chart", "e.dataset.chart")
        assert {"success", "invalid-action rate", "KL", "clip fraction", "entropy"} <= set(charts)
        logged = run_payload(discover([runs["capo"]])[0][0])["series"]
        assert ("explained variance" in charts) == ("critic/explained_variance" in logged)  # NaN (no spread): not drawn
        assert "\"algo\": \"capo\"" in browser.evaluate("document.querySelector('details.config pre').textContent")
        rows = each(browser, "tr.episode", "[+e.dataset.it, +e.dataset.ep, e.dataset.split]")
        assert sorted(map(tuple, rows)) == sorted(every_episode(runs["capo"]))
        browser.screenshot(tmp_path / "run.png", full_height=True)

        failed = [(e["iteration"], e["episode"]) for it in (1, 2) for e in episodes(runs["capo"], it)
                  if not e["success"]]
        browser.go("#/run/0?split=train&it=2&succ=0", ready="run")  # the filters live in the URL
        shown = each(browser, "tr.episode", "[+e.dataset.it, +e.dataset.ep]")
        assert sorted(map(tuple, shown)) == sorted(p for p in failed if p[0] == 2)

        episode = episodes(runs["capo"], 2)[1]
        browser.go("#/run/0/ep/2/1", ready="run")
        assert browser.evaluate("document.querySelector('h1').textContent").startswith("iteration 2 · episode 1")
        steps = each(browser, ".timeline .step", "[+e.dataset.adv, e.matches('.clipped'), e.matches('.invalid')]")
        assert steps == [[pytest.approx(a["advantage"], rel=1e-9), a["clipped"], not a["valid"]]
                         for a in episode["actions"]]
        texts = each(browser, "pre.action-text", "e.textContent")
        assert texts == [a["action"] for a in episode["actions"]]  # model text shown as text, never as HTML
        values = each(browser, "td[data-key=value]", "+e.dataset.value")
        assert values == [pytest.approx(a["value"]) for a in episode["actions"]]
        browser.screenshot(tmp_path / "episode.png", full_height=True)

        browser.go("#/compare/0/1", ready="compare")
        columns = each(browser, ".cols > div[data-run]", "[+e.dataset.run, e.querySelectorAll('tr.episode').length]")
        assert columns == [[0, 12], [1, 12]]  # 8 training and 4 held-out episodes each
        browser.screenshot(tmp_path / "compare.png", full_height=True)

        held_out = episodes(runs["capo"], 0, held_out=True)[1]
        browser.go("#/run/0/eval/0/1", ready="run")
        assert "held-out" in browser.evaluate("document.querySelector('h1').textContent")
        assert each(browser, "pre.observation", "e.textContent") == [
            a["observation"] for a in held_out["actions"]]

        browser.go("#/grid/0", ready="grid")
        links = each(browser, "table.grid tr[data-algo]", "[e.dataset.algo, e.querySelector('a').hash]")
        assert links == [["capo", "#/run/2"], ["grpo", "#/run/3"]]
    for name in ("run", "episode", "compare"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_chromium
def test_static_export_opens_from_disk(runs, browser, tmp_path):
    out = Site(*discover([runs["capo"]])).export(tmp_path / "site")
    browser.open((out / "index.html").as_uri() + "#/run/0/ep/1/0", ready="run")
    assert browser.evaluate("document.querySelectorAll('.timeline .step').length") == 2
    assert not math.isnan(browser.evaluate("+document.querySelector('.timeline .step').dataset.adv"))


def test_run_payload_holds_each_iterations_time_phases(runs):
    from capo_train.report import ITERATION_PHASES

    payload = run_payload(discover([runs["capo"]])[0][0])
    assert payload["time_phases"] == list(ITERATION_PHASES) and payload["notes"] == []
    series = payload["series"]
    assert [p[0] for p in series["time/iteration_s"]] == [1, 2]
    for it, total in series["time/iteration_s"]:
        phases = sum(v for k in ITERATION_PHASES for i, v in series.get(k, []) if i == it)
        assert phases == pytest.approx(total, rel=0.03, abs=0.01)


@needs_chromium
def test_run_page_shows_where_each_iterations_time_goes(runs, browser):
    site = Site(*discover([runs["capo"]]))
    with make_server(site).start_in_thread() as server:
        browser.open(server.url + "/#/run/0", ready="run")
        rows = each(browser, "table.timing tr[data-it]", "[+e.dataset.it, e.dataset.total, +e.dataset.sum]")
        assert [r[0] for r in rows] == [0, 1, 2]  # record 0: the warm start's phases, no iteration total
        assert rows[0][1] == ""
        for _, total, summed in rows[1:]:
            assert summed == pytest.approx(float(total), rel=0.03, abs=0.01)
        headers = set(each(browser, "table.timing th[title]", "e.title"))
        assert {"time/sft_s", "time/rollout_s", "time/update_s", "time/eval_s", "time/checkpoint_s",
                "time/iteration_s"} <= headers
        assert browser.evaluate("document.querySelectorAll('table.timing tr[data-it] .stack span').length") > 6
