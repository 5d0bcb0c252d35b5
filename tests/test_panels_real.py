"""The public benchmarks' panels (capo_envs/core/panel_list.py) on real data in the official formats: the
samples in ../shared/data (skipped when it is absent), prepared by ``data_prep`` from a local mirror or read
in their release layout, and made exactly as ``capo eval --panel`` makes them. No full release is here, so
each panel is checked to refuse the sample for holding too few tasks, then fingerprinted on the tasks the
sample holds: its ids are the official ids, and what decides a score (answers, the corpus and its ranking, a
game file, the product catalogue) moves the hash."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from capo_envs.core.panels import PANELS, PanelError, check_panel, fingerprint, make_panel_env, panel_task_ids
from data_prep import prepare

from fixtures_official import SHARED, FileServer, serve, shared_files

pytestmark = [pytest.mark.shared, pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")]


def _fingerprint(panel, **extra):
    env = make_panel_env(panel, **extra)
    try:
        return fingerprint(panel, env)
    finally:
        env.close()


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("capo-data")
    with pytest.MonkeyPatch.context() as mp, FileServer() as server:
        serve(server, shared_files(tmp_path_factory.mktemp("mirror")), mp)
        for name in ("hotpotqa", "2wiki", "musique"):
            prepare(name, data_dir=data, base_url=server.url, progress=False)
    return data


def _first_dev_id(name: str) -> str:
    files = {"hotpotqa-dev-500": ("hotpotqa/hotpot_dev_distractor_v1.first53.json", "_id"),
             "2wiki-dev-500": ("2wikimultihopqa/qa_sub.json", "_id"),
             "musique-dev-500": ("musique/musique_qa_100.json", "id")}
    path, key = files[name]
    return json.loads((SHARED / path).read_text())[0][key]


@pytest.mark.parametrize(("name", "held"), [("hotpotqa-dev-500", 53), ("2wiki-dev-500", 2), ("musique-dev-500", 100)])
def test_public_qa_panels_on_the_official_files(qa_data, monkeypatch, name, held):
    monkeypatch.setenv("CAPO_DATA_DIR", str(qa_data))
    panel = PANELS[name]
    env = make_panel_env(panel)
    try:
        with pytest.raises(PanelError, match=f"needs 500 tasks of split 'dev'; the data here holds {held}"):
            panel_task_ids(panel, env)
        cut = dataclasses.replace(panel, size=min(held, 10))
        assert panel_task_ids(cut, env)[0] == _first_dev_id(name)  # the official order and ids
        here = check_panel(cut, env)
        assert not here.pinned and "not pinned yet" in here.describe()
        made = json.loads(here.components["env"])["kwargs"]
        assert {k: made[k] for k in panel.kwargs} == dict(panel.kwargs) and made["split"] == "dev"
        corpus = here.components["corpus"]
        assert corpus.startswith("BM25Retriever") and " passages " in corpus and "top-5 ranking" in corpus
        assert here.components["packages"].startswith("bm25s=")
        # the same files give the same hash; an edited answer does not
        again = fingerprint(cut, env)
        assert again == here.components
        first = panel_task_ids(cut, env)[0]
        env.unwrapped.tasks[first] = dataclasses.replace(env.unwrapped.tasks[first], answers=("edited",))
        assert fingerprint(cut, env)["tasks"] != here.components["tasks"]
    finally:
        env.close()


def test_alfworld_panel_hashes_the_released_game_file(tmp_path):
    """The one released game (json_2.1.1 layout, train split): its game file's bytes are in the hash."""
    from capo_envs.alfworld.engine import engine_available

    if not engine_available():
        pytest.skip("needs the alfworld extra")
    data = tmp_path / "alfworld"
    shutil.copytree(SHARED / "alfworld", data)
    seen = PANELS["alfworld-seen-140"]
    with pytest.raises(PanelError, match="cannot make capo/ALFWorld-v0"):  # the sample has no valid_seen game
        make_panel_env(seen, data_dir=str(data))
    panel = dataclasses.replace(seen, split="train", size=1)
    here = _fingerprint(panel, data_dir=str(data))
    assert here["expert"].startswith("success 1.000")  # the game's own walkthrough wins
    assert here["packages"].startswith("alfworld=") and "textworld=" in here["packages"]
    game = next((data / "json_2.1.1").rglob("game.tw-pddl"))
    record = json.loads(game.read_text())
    game.write_text(json.dumps(record, indent=1))  # the same game, other bytes: a different file is a different panel
    changed = _fingerprint(panel, data_dir=str(data))
    assert changed["tasks"] != here["tasks"] and changed["task_ids"] == here["task_ids"]


def test_webshop_panel_hashes_the_catalogue_file(tmp_path, monkeypatch):
    """The real sample products prepared as WebShop's small size (synthetic goals: the human ones need the
    items file the sample lacks); a price edited in the product database moves the hash."""
    pytest.importorskip("thefuzz")
    from data_prep import webshop as prep
    from test_webshop_prepare import official_files, serve_release

    docs = [json.loads(line) for line in (SHARED / "webshop" / "resources_100" / "documents.jsonl").open()]
    keys = ("name", "full_description", "images", "product_category", "average_rating", "small_description",
            "customization_options", "asin", "category", "query", "page")
    raw = []
    for d in docs:
        record = {k: d["product"][k] for k in keys}
        listed = d["product"]["Price"] != "$100.0"  # raw records rebuilt as tests/test_webshop_prepare.py does
        record["pricing"] = " - ".join(f"${x}" for x in d["product"]["pricing"]) if listed else ""
        raw.append(record)
    files = official_files(raw, json.loads((SHARED / "webshop" / "items_ins_v2_1000.json").read_text()))
    files["attributes"] = (SHARED / "webshop" / "items_ins_v2_1000.json").read_bytes()
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        root = prep.prepare("webshop", size="small", data_dir=tmp_path, base_url=server.url, progress=False)
    panel = dataclasses.replace(PANELS["webshop-test-500"], kwargs={"size": "small", "goals": "synthetic",
                                                                    "noun_tagger": "heuristic"}, size=5)
    here = _fingerprint(panel, data_dir=str(tmp_path))
    assert "catalogue file" in here["corpus"] and "thefuzz=" in here["packages"]
    with sqlite3.connect(root / "products.sqlite") as db:  # one product a cent dearer
        db.execute("UPDATE products SET price = price + 0.01 WHERE rowid = (SELECT MAX(rowid) FROM products)")
    assert _fingerprint(panel, data_dir=str(tmp_path))["corpus"] != here["corpus"]


def test_pasa_panels_hold_the_official_query_sets(tmp_path, monkeypatch):
    """PaSa's AutoScholarQuery test (1,000) and RealScholarQuery (50) are the panels' full sizes; over a
    database of their gold papers, the panel is made and fingerprinted as `capo eval` would."""
    from capo_envs.papers.db import Paper, build_database
    from capo_envs.papers.env import QUERY_FILES, load_queries

    root = tmp_path / "papers"
    papers = {}
    for split in ("test", "realscholar"):
        target = root / "queries" / QUERY_FILES[split]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHARED / "pasa" / QUERY_FILES[split], target)
        for task in load_queries(target):
            for arxiv_id, title in zip(task.gold, task.gold_titles):
                papers[arxiv_id] = Paper(arxiv_id, title, title, 2023, ("A. Author",), "2023-01-01")
    build_database(root / "papers.sqlite", list(papers.values()), [])
    (root / "manifest.json").write_text("{}")
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    for name, size in (("pasa-autoscholar-test-1000", 1000), ("pasa-realscholar-50", 50)):
        panel = PANELS[name]
        env = make_panel_env(panel)
        try:
            assert len(panel_task_ids(panel, env)) == size == panel.size  # every official query, none refused
        finally:
            env.close()
    cut = dataclasses.replace(PANELS["pasa-realscholar-50"], size=5)
    here = _fingerprint(cut)
    assert here["corpus"].startswith("PaperDB(ranking ") and "sqlite3=" in here["packages"]
    with sqlite3.connect(root / "papers.sqlite") as db:
        db.execute("DELETE FROM papers WHERE rowid = (SELECT MAX(rowid) FROM papers)")
    assert _fingerprint(cut)["corpus"] != here["corpus"]
