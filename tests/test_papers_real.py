"""capo/PaperSearch-v0: the prepared layout, PaSa's query files, and the env over a database built from them."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import gymnasium as gym
import pytest

import capo_envs
from capo_envs.core import DataNotPreparedError
from capo_envs.papers.db import Paper, build_database
from capo_envs.papers.env import QUERY_FILES, load_queries

from env_helpers import expert_metrics

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pasa"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/pasa is absent")


def test_without_data_the_error_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    assert not capo_envs.CATALOG["capo/PaperSearch-v0"].data_ready()
    with pytest.raises(DataNotPreparedError, match="capo data prepare papers"):
        gym.make("capo/PaperSearch-v0")
    with pytest.raises(ValueError, match="split"):
        gym.make("capo/PaperSearch-v0", split="nope")


def _row(qid, question, ids, titles, published="20230101"):
    return json.dumps({"question": question, "answer": titles, "answer_arxiv_id": ids,
                       "source_meta": {"published_time": published}, "qid": qid})


def test_load_queries_normalises_ids_and_reads_the_cutoff(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join([
        _row("a", "Which works?", ["1803.00316v1", "1803.00316", "ARXIV:2101.00001"], ["T1", "T1 again", "T2\n  x"]),
        _row("b", "Nothing usable?", ["not-an-id"], ["T"]),
        "",
        _row("c", "Old ones?", ["solv-int/9901001v2"], ["Old"], published="bad"),
    ]) + "\n")
    tasks = load_queries(path)
    assert [t.id for t in tasks] == ["a", "c"]
    assert tasks[0].gold == ("1803.00316", "2101.00001") and tasks[0].gold_titles == ("T1", "T2 x")
    assert tasks[0].cutoff == "2023-01-01" and tasks[1].cutoff is None
    assert tasks[1].gold == ("solv-int/9901001",)


@pytest.mark.shared
@needs_shared
@pytest.mark.parametrize("split, rows, gold_total", [("dev", 1000, 2539), ("test", 1000, 2403), ("realscholar", 50, 791)])
def test_real_query_files_load(split, rows, gold_total):
    tasks = load_queries(SHARED / QUERY_FILES[split])
    assert len(tasks) == rows  # every real query has at least one usable arXiv id
    # Repeats within a query collapse once versions are stripped; nothing else is lost.
    assert gold_total - 20 <= sum(len(t.gold) for t in tasks) <= gold_total
    assert all("v" not in g.split(".")[-1] for t in tasks for g in t.gold)
    assert all(t.cutoff and t.cutoff[:2] in ("20",) for t in tasks)


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """A prepared layout in a temporary $CAPO_DATA_DIR: PaSa's RealScholarQuery file, and a database
    holding its gold papers (their titles as abstracts: the real abstracts come with the arXiv snapshot)
    plus unrelated filler papers."""
    root = tmp_path / "papers"
    (root / "queries" / "RealScholarQuery").mkdir(parents=True)
    shutil.copy(SHARED / QUERY_FILES["realscholar"], root / "queries" / QUERY_FILES["realscholar"])
    tasks = load_queries(root / "queries" / QUERY_FILES["realscholar"])
    papers = {}
    for task in tasks:
        for arxiv_id, title in zip(task.gold, task.gold_titles):
            papers[arxiv_id] = Paper(arxiv_id, title, title, 2023, ("A. Author",), "2023-01-01")
    filler = [Paper(f"1901.{i:05d}", f"Filler paper {i} on cooking", "Pasta and sauces.", 2019, (), "2019-01-01")
              for i in range(200)]
    edges = [(a.arxiv_id, b.arxiv_id) for a, b in zip(list(papers.values())[1:], list(papers.values()))]
    build_database(root / "papers.sqlite", [*papers.values(), *filler], edges)
    (root / "manifest.json").write_text("{}")
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    return tasks


@pytest.mark.shared
@needs_shared
def test_papersearch_env_runs_the_real_queries(prepared):
    assert capo_envs.CATALOG["capo/PaperSearch-v0"].data_ready()
    env = gym.make("capo/PaperSearch-v0", split="realscholar")
    assert len(env.unwrapped.task_ids()) == 50
    obs, info = env.reset(options={"task_index": 0})
    assert obs.startswith("User Query: ") and info["question"] == prepared[0].question
    metrics = expert_metrics(env)
    assert len(metrics) == 50 and all(0.0 <= m["recall_all"] <= 1.0 for m in metrics)
    assert statistics.mean(m["recall_all"] for m in metrics) > 0.2  # the question's words find gold titles
    env.close()


@pytest.fixture
def prepared_fixture(tmp_path, monkeypatch):
    """A prepared layout from hand-made files in PaSa's format (no ../shared needed)."""
    root = tmp_path / "papers"
    (root / "queries" / "AutoScholarQuery").mkdir(parents=True)
    rows = [_row(f"AutoScholarQuery_dev_{i}", f"Which works study topic{i} methods?", [f"2001.{i:05d}v1"],
                 [f"Topic{i} methods"], published="20230101") for i in range(6)]
    (root / "queries" / QUERY_FILES["dev"]).write_text("\n".join(rows) + "\n")
    papers = [Paper(f"2001.{i:05d}", f"Topic{i} methods", f"We study topic{i} methods.", 2020, ("A. B",), "2020-01-01")
              for i in range(6)]
    papers += [Paper(f"2401.{i:05d}", f"Topic{i} later", f"topic{i} after the cut-off", 2024, (), "2024-01-01")
               for i in range(6)]
    build_database(root / "papers.sqlite", papers, [(f"2001.{i + 1:05d}", f"2001.{i:05d}") for i in range(5)])
    (root / "manifest.json").write_text("{}")
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))


def test_papersearch_cutoff_and_oracle(prepared_fixture):
    env = gym.make("capo/PaperSearch-v0", split="dev")
    env.reset(options={"task_index": 2})
    obs, reward, *_ = env.step("<search>topic2 methods</search>")
    assert "[2001.00002]" in obs and "2401.00002" not in obs and reward == 1.0  # later papers hidden
    metrics = expert_metrics(env)
    assert statistics.mean(m["recall_all"] for m in metrics) == 1.0


@pytest.mark.parametrize("kwargs", [{}, {"action_format": "tool_call"}])
def test_papersearch_takes_every_nasty_action(prepared_fixture, kwargs):
    """test_bad_input covers offline ids only; the same checks on the prepared env."""
    from test_bad_input import take_every_nasty_action

    take_every_nasty_action(("capo/PaperSearch-v0", {"split": "dev", **kwargs}))
