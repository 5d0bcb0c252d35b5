"""``capo view`` over a run folder holding a file it cannot read: the viewer leaves out what it cannot read,
with a note per run, file, line or episode; it never answers 500 for a readable run, and ``--html`` never
ends in a traceback. Numbers in data paths are ASCII digits, bounded: anything else is a 404."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from capo_train.viewer.chromium import find_chromium
from capo_train.viewer.data import discover
from capo_train.viewer.server import make_server
from capo_train.viewer.site import Site
from capo_train.viewer.synthetic import synthetic_run


def make_run(path: Path) -> Path:
    return synthetic_run(path, iterations=3, episodes=2, steps=2)


def episode_file(run: Path, iteration: int = 1) -> Path:
    return run / "episodes" / f"iter-{iteration:06d}.jsonl"


def payload(body: bytes) -> dict:
    """The JSON of a ``CAPO.put("key",{...});`` data file."""
    text = body.decode("utf-8")
    start = text.index(",") + 1
    return json.loads(text[start : text.rindex(");")])


def get(site: Site, path: str) -> dict:
    found = site.get(path)
    assert found is not None, path
    return payload(found[0])


def corrupt(run: Path, case: str) -> str:
    """Break one file of ``run`` as ``case`` says; returns a word the note about it mentions."""
    if case == "config-not-utf8":
        (run / "checkpoint" / "config.json").write_bytes(b'{"algo": "capo\xff\xfe"}')
        return "config.json"
    if case == "config-a-list":
        (run / "checkpoint" / "config.json").write_text('["capo", 1]')
        return "config.json"
    if case == "log-not-utf8":
        with open(run / "log.jsonl", "ab") as f:
            f.write(b'{"iteration": 4, "rollout/success": 0.5, "x": "\xc3"}\n')
        return "log.jsonl line 4"
    if case == "log-bad-iteration":
        with open(run / "log.jsonl", "a") as f:
            f.write('{"iteration": "four"}\n{"iteration": 1e400}\n{"iteration": 12' + "3" * 5000 + "}\n")
        return "log.jsonl line 4"
    if case == "episode-torn-in-a-character":
        line = json.dumps({"iteration": 1, "episode": 9, "task_id": "caf\u00e9", "actions": []}, ensure_ascii=False)
        raw = line.encode("utf-8")
        with open(episode_file(run), "ab") as f:
            f.write(raw[: raw.index(b"\xc3") + 1])  # cut inside the two bytes of the é
        return "iter-000001.jsonl line 3"
    if case == "actions-not-objects":
        with open(episode_file(run), "a") as f:
            f.write(json.dumps({"iteration": 1, "episode": 9, "actions": ["go north", 3]}) + "\n")
            f.write(json.dumps({"iteration": 1, "episode": 10, "actions": "go north"}) + "\n")
        return "iter-000001.jsonl line 3"
    raise ValueError(case)


CASES = ["config-not-utf8", "config-a-list", "log-not-utf8", "log-bad-iteration", "episode-torn-in-a-character",
         "actions-not-objects"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_file_leaves_a_note_and_the_rest_of_the_run(tmp_path, case):
    good, bad = make_run(tmp_path / "good"), make_run(tmp_path / "bad")
    mentioned = corrupt(bad, case)
    site = Site(*discover([good, bad]))
    runs = get(site, "data/site.js")["runs"]  # the runs table: both runs, the bad one with its note
    assert [r["name"] for r in runs] == ["good", "bad"] and runs[0]["notes"] == []
    run = get(site, "data/run-1.js")
    notes = run["notes"] + get(site, "data/run-1-iter-1.js")["notes"]
    assert any(mentioned in n for n in notes), notes
    assert runs[1]["iterations"] == 3 and [p[0] for p in run["series"]["rollout/success"]] == [1, 2, 3]
    assert len(run["episodes"]["it"]) == 6  # the run's good episodes, every one
    assert len(get(site, "data/run-1-iter-1.js")["episodes"]) == 2
    if case.startswith("config"):
        assert run["config"] is None and runs[1]["algo"] == "capo"  # from summary.json
    assert get(site, "data/run-0.js")["notes"] == []


def test_a_lone_surrogate_escape_is_shown_not_an_error(tmp_path):
    run = make_run(tmp_path / "run")
    with open(episode_file(run), "a") as f:
        f.write('{"iteration": 1, "episode": 9, "task_id": "x\\ud800y", "actions": [{"action": "\\udfff"}]}\n')
    with open(run / "log.jsonl", "a") as f:
        f.write('{"iteration": 4, "note\\ud83d": 1.0, "rollout/success": 1.0}\n')
    site = Site(*discover([run]))
    for path in ("data/site.js", "data/run-0.js", "data/run-0-iter-1.js"):
        body, _ = site.get(path)
        body.decode("utf-8")  # valid UTF-8; the surrogate travels as its JSON escape
    episodes = get(site, "data/run-0-iter-1.js")["episodes"]
    assert episodes[-1]["task_id"] == "x\ud800y" and episodes[-1]["actions"][0]["action"] == "\udfff"
    assert "x\ud800y" in get(site, "data/run-0.js")["episodes"]["task"]


def test_no_bad_file_answers_500_or_breaks_the_export(tmp_path, capsys):
    from capo_train.cli import main

    runs = []
    for case in CASES:
        runs.append(make_run(tmp_path / case))
        corrupt(runs[-1], case)
    site = Site(*discover(runs))
    with make_server(site).start_in_thread() as server:
        for path in site.paths():
            with urllib.request.urlopen(f"{server.url}/{path}") as answer:
                assert answer.status == 200, path
    out = tmp_path / "site"
    assert main(["view", *map(str, runs), "--html", str(out)]) == 0
    assert f"{len(CASES)} run(s) written" in capsys.readouterr().out
    assert (out / "data" / "run-0.js").is_file()


@pytest.mark.parametrize("path", [
    "/data/run-" + "1" * 5000 + ".js",  # over Python's int digit limit
    "/data/run-0-iter-" + "1" * 5000 + ".js",
    "/data/run-0-eval-" + "9" * 10 + ".js",
    "/data/run-\u0660.js",  # an Arabic-Indic zero: a digit to \d and int(), not an ASCII one
    "/data/run-0.js%0A",  # a trailing newline: $ would take it
])
def test_numbers_in_data_paths_are_bounded_ascii_digits(tmp_path, path):
    site = Site(*discover([make_run(tmp_path / "run")]))
    assert site.get(urllib.request.unquote(path)) is None
    with make_server(site).start_in_thread() as server:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + urllib.request.quote(urllib.request.unquote(path)))
        assert e.value.code == 404


def test_episode_files_with_odd_numbers_are_not_listed(tmp_path):
    run = make_run(tmp_path / "run")
    (run / "episodes" / ("iter-" + "1" * 20 + ".jsonl")).write_text("")  # no data path could name it
    (run / "episodes" / "iter-\u0661.jsonl").write_text("")
    site = Site(*discover([run]))
    assert get(site, "data/run-0.js")["iterations"] == [1, 2, 3]
    assert all(site.get(path) is not None for path in site.paths())  # what the export writes


@pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed")
def test_the_notes_are_on_the_pages(tmp_path):
    from capo_train.viewer.chromium import Chromium

    good, bad = make_run(tmp_path / "good"), make_run(tmp_path / "bad")
    corrupt(bad, "config-a-list")
    corrupt(bad, "actions-not-objects")
    site = Site(*discover([good, bad]))
    with make_server(site).start_in_thread() as server, Chromium() as browser:
        browser.open(server.url + "/#/", ready="home")
        assert browser.evaluate("document.querySelectorAll('tr[data-run] .note-count').length") == 1
        browser.open(server.url + "/#/run/1", ready="run")
        notes = browser.evaluate("[...document.querySelectorAll('.notes li')].map(e => e.textContent)")
        assert any("config.json" in n for n in notes) and any("line 3" in n for n in notes)
        assert browser.evaluate("document.querySelectorAll('tr.episode').length") == 6
        browser.open(server.url + "/#/run/1/ep/1/0", ready="run")
        assert browser.evaluate("document.querySelectorAll('.notes li').length") == 2
        assert browser.evaluate("document.querySelectorAll('.timeline .step').length") == 2
