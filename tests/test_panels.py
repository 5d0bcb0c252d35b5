"""Evaluation panels (capo_envs/core/panels.py): pinned task ids and a content hash of what decides a score.

The generated panels' pins are recomputed here, so a change to a generator, a reward, the retrieval ranking
along the expert's path or a pinned package version fails this file until the pins are changed on purpose."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from capo_envs.core.panels import (
    COMPONENTS,
    PANELS,
    Panel,
    PanelError,
    check_panel,
    fingerprint,
    get_panel,
    make_panel_env,
    panel_hash,
    panel_task_ids,
)
from capo_envs.core.panel_list import LARGE_PINS

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
GENERATED = [name for name, p in PANELS.items() if p.pinned is not None]
# SynthHouse's panel plays 20 games on ALFWorld's engine (~40 s on 2 CPU cores) and needs the [alfworld] extra.
ENGINE_PANELS = {name for name in GENERATED if PANELS[name].env_id == "capo/SynthHouse-v0"}


def _param(name):
    marks = []
    if name in ENGINE_PANELS:
        marks += [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("alfworld") is None,
                                                       reason="needs the [alfworld] extra")]
    if name in LARGE_PINS:  # minutes each (capo_envs/core/panel_list.py)
        marks += [pytest.mark.slow, pytest.mark.skipif(os.environ.get("CAPO_TEST_LARGE_PANELS") != "1",
                                                       reason="a medium or large world: CAPO_TEST_LARGE_PANELS=1")]
    return pytest.param(name, marks=marks)


def test_the_generated_envs_and_the_public_benchmarks_have_panels():
    assert {"synthchain-k4-dev-200", "synthhop-test-100", "synthlength-test-100", "synthtrap-test-100"} <= set(GENERATED)
    assert {"hotpotqa-dev-500", "alfworld-seen-140", "alfworld-unseen-134", "webshop-test-500"} <= set(PANELS)
    for panel in PANELS.values():
        assert panel.size >= 1 and panel.about, panel.name


@pytest.mark.parametrize("name", [_param(name) for name in GENERATED])
def test_generated_panels_match_their_pins(name):
    panel = PANELS[name]
    env = make_panel_env(panel)
    try:
        check = check_panel(panel, env)
    finally:
        env.close()
    assert check.differences == [], check.describe()
    assert check.matches and check.hash == panel.pinned_hash
    assert set(check.components) == set(COMPONENTS)
    if name not in ENGINE_PANELS:  # the handcoded house expert needs more than the preset's 20 steps on some games
        assert check.components["expert"].startswith("success 1.000")  # the oracle solves every task


def test_the_hash_covers_env_kwargs_and_says_which_component_differs():
    panel = PANELS["synthchain-k4-test-64"]
    env = gym.make(panel.env_id, split=panel.split, k=5)  # made outside the panel, with another k
    try:
        check = check_panel(panel, env)
    finally:
        env.close()
    assert not check.matches and check.hash != panel.pinned_hash
    changed = {d.split(":")[0] for d in check.differences}
    assert {"env", "tasks", "expert"} <= changed and "task_ids" not in changed
    assert "does not match the pinned panel" in check.describe() and '"k": 5' in check.describe()


def test_a_changed_reward_changes_the_hash(monkeypatch):
    """The expert's transcript carries every reward, so a reward change shows even when tasks are the same."""
    from capo_envs.diagnostics.env import SynthChainEnv

    panel = PANELS["synthchain-k4-test-64"]
    monkeypatch.setattr(SynthChainEnv, "_final_reward", lambda self: 0.5)
    env = make_panel_env(panel)
    try:
        check = check_panel(panel, env)
    finally:
        env.close()
    assert [d.split(":")[0] for d in check.differences] == ["expert"]


def test_a_changed_question_changes_the_tasks_component():
    panel = PANELS["synthhop-test-100"]
    env = make_panel_env(panel)
    try:
        base = env.unwrapped
        first = panel_task_ids(panel, env)[0]
        base.tasks[first] = dataclasses.replace(base.tasks[first], answers=("somebody else",))
        check = check_panel(panel, env)
    finally:
        env.close()
    assert "tasks" in {d.split(":")[0] for d in check.differences}


def test_hash_is_canonical():
    a = {"env": "x", "tasks": "y"}
    assert panel_hash(a) == panel_hash(dict(reversed(a.items()))) and panel_hash(a).startswith("sha256:")
    assert len(panel_hash(a)) == len("sha256:") + 16


def test_unknown_panel_suggests_the_near_names():
    with pytest.raises(PanelError, match=r"unknown panel 'synthchain-test-64'; did you mean .*synthchain-k4-test-64"):
        get_panel("synthchain-test-64")


def test_a_split_with_too_few_tasks_is_refused():
    panel = dataclasses.replace(PANELS["synthhop-preset-dev-50"], size=51, pinned=None)
    env = make_panel_env(panel)
    try:
        with pytest.raises(PanelError, match="needs 51 tasks of split 'dev'; the data here holds 50"):
            panel_task_ids(panel, env)
    finally:
        env.close()


def test_score_deciding_kwargs_cannot_be_overridden_and_a_bad_env_is_a_panel_error():
    with pytest.raises(PanelError, match=r"fixes \['k'\]"):
        make_panel_env(PANELS["synthchain-k4-test-64"], k=8)
    broken = Panel("broken", "capo/SynthChain-v0", "test", 4, {"k": 99})
    with pytest.raises(PanelError, match="cannot make capo/SynthChain-v0"):
        make_panel_env(broken)


def test_unpinned_panels_say_so():
    panel = dataclasses.replace(PANELS["synthtrap-test-100"], pinned=None)
    env = make_panel_env(panel)
    try:
        check = check_panel(panel, env)
    finally:
        env.close()
    assert not check.pinned and not check.matches and "not pinned yet" in check.describe()


def test_panels_never_import_torch_or_capo_train():
    code = ("import sys, capo_envs.core.panels as p; env = p.make_panel_env(p.PANELS['synthchain-k4-test-64']); "
            "p.check_panel(p.PANELS['synthchain-k4-test-64'], env); "
            "bad = [m for m in ('torch', 'capo_train') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(not (SHARED / "hotpotqa").is_dir(), reason="needs ../shared/data (real public samples)")
def test_real_hotpotqa_dev_records_hash_their_questions_answers_and_corpus():
    """On the first 53 official HotpotQA dev records: the fingerprint sees the answers and the corpus."""
    from capo_envs.qa.datasets import dedup_passages, hotpotqa_passages, load_hotpotqa
    from capo_envs.qa.env import MultiHopQAEnv
    from capo_envs.retrieval import open_retriever

    path = SHARED / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"
    tasks, passages = load_hotpotqa(path), list(dedup_passages(hotpotqa_passages(path)))
    panel = Panel("hotpotqa-sample-50", "capo/HotpotQA-v0", "dev", 50, {"retriever": "bm25", "k": 5})

    def components(tasks, passages):
        env = MultiHopQAEnv(tasks, open_retriever("bm25", passages=passages), k=5)
        try:
            return fingerprint(panel, env)
        finally:
            env.close()

    here = components(tasks, passages)
    assert here["task_ids"].startswith("50 ids") and "passages" in here["corpus"]
    assert json.loads(here["env"])["kwargs"] == {"split": "dev", "retriever": "bm25", "k": 5}
    edited = [dataclasses.replace(t, answers=("a changed answer",)) if i == 3 else t for i, t in enumerate(tasks)]
    assert components(edited, passages)["tasks"] != here["tasks"]
    assert components(tasks, passages[:-1])["corpus"] != here["corpus"]


def test_the_default_runs_held_out_tasks_are_the_synthchain_dev_panel():
    """`capo train`'s default held-out figure (the CPU preset, eval_split dev, 200 episodes) is played on exactly
    this panel's tasks: expert_skill, the one kwarg the preset adds, changes only the demonstrator."""
    from capo_envs.core.registry import cpu_preset

    panel = PANELS["synthchain-k4-dev-200"]
    env = gym.make(panel.env_id, split="dev", **cpu_preset(panel.env_id))
    try:
        here = fingerprint(panel, env)
    finally:
        env.close()
    assert cpu_preset(panel.env_id) == {**panel.kwargs, "expert_skill": 0.0}
    assert (here["task_ids"], here["tasks"]) == (panel.pinned["task_ids"], panel.pinned["tasks"])


def test_the_main_commands_held_out_tasks_are_the_synthhop_recipe_panel():
    """The README's main command (`capo train --config configs/synthhop.yaml`) evaluates on exactly this
    panel's tasks, whatever the demonstrator's guess (not scored)."""
    from capo_envs.core.panels import matching_panel
    from capo_train.config import load_config

    config = load_config(Path(__file__).parents[1] / "configs" / "synthhop.yaml")
    panel = matching_panel(config.env.id, config.env.kwargs, config.env.eval_split, config.eval_episodes)
    assert panel is not None and panel.name == "synthhop-recipe-dev-100"
    assert config.env.kwargs["guess"] == "early"
    env = gym.make(panel.env_id, split="dev", **config.env.kwargs)
    try:
        here = fingerprint(panel, env)
    finally:
        env.close()
    assert (here["task_ids"], here["tasks"]) == (panel.pinned["task_ids"], panel.pinned["tasks"])


def test_a_trainers_held_out_set_finds_its_panel():
    from capo_envs.core.panels import matching_panel
    from capo_envs.core.registry import cpu_preset

    assert matching_panel("capo/SynthChain-v0", cpu_preset("capo/SynthChain-v0"), "dev", 200).name == \
        "synthchain-k4-dev-200"
    table1 = {"size": "small", "k": 1, "max_passage_chars": 200, "question_kinds": ["bridge-2", "comparison"]}
    assert matching_panel("capo/SynthHop-v0", table1, "dev", 100).name == "synthhop-table1-dev-100"
    assert matching_panel("capo/SynthChain-v0", {"k": 4}, "dev", 199) is None  # another task count
    assert matching_panel("capo/SynthChain-v0", {"k": 4, "reward": "all"}, "dev", 200) is None  # another reward


# ----------------------------------------------------------------------------- what the corpus component covers


def _corpus(panel, env):
    try:
        return fingerprint(panel, env)["corpus"]
    finally:
        env.close()


TINY_HOP = Panel("tiny-hop", "capo/SynthHop-v0", "test", 20, {"size": "tiny", "k": 3}, ("bm25s", "PyStemmer"))


def test_a_retriever_that_ranks_differently_changes_the_corpus_component():
    """bm25s with Lucene's analysis vs its own snowball analysis: the same passages, another ranking (the
    analysis default changed once already, docs/results/table1/README.md); ``library="auto"`` may also pick
    another library on another machine."""
    from capo_envs.retrieval import open_retriever

    default = _corpus(TINY_HOP, make_panel_env(TINY_HOP))
    env = make_panel_env(TINY_HOP)
    env.unwrapped.retriever = open_retriever("bm25", passages=env.unwrapped.world.passages, analyzer="snowball")
    snowball = _corpus(TINY_HOP, env)
    assert '"analyzer": "lucene"' in default and '"analyzer": "snowball"' in snowball
    assert default.split(" top-")[1] != snowball.split(" top-")[1]  # the ranking digest itself differs
    assert default.split("}")[1].split(" top-")[0] == snowball.split("}")[1].split(" top-")[0]  # same passages


def test_an_http_retrievers_ranking_is_checked_though_its_corpus_is_not_visible():
    """Search-R1-style setups search a server: the panel cannot read its corpus, but it probes its ranking."""
    from capo_envs.core.panels import make_panel_env as make
    from capo_envs.qa.world import build_world
    from capo_envs.retrieval import open_retriever
    from capo_envs.retrieval.server import make_server

    passages = build_world(0, "tiny").passages
    found = []
    for analyzer in ("lucene", "lucene", "snowball"):
        index = open_retriever("bm25", passages=passages, analyzer=analyzer, cache_size=0)
        with make_server(index, port=0).start_in_thread() as server:
            panel = Panel("tiny-hop-http", "capo/SynthHop-v0", "test", 20, {"size": "tiny", "k": 3,
                                                                           "retriever": server.url})
            found.append(_corpus(panel, make(panel)))
    assert all("corpus not visible" in c for c in found)
    assert found[0] == found[1] != found[2]  # another server with the same index: the same component


def test_webshops_catalogue_is_in_the_hash():
    """The reward compares the bought product's attributes, options and price with the goal's, so a product
    the expert never opens still decides scores."""
    pytest.importorskip("thefuzz")
    panel = Panel("tiny-shop", "capo/SynthShop-v0", "test", 3, {"num_products": 60})
    here = _corpus(panel, make_panel_env(panel))
    env = make_panel_env(panel)
    store = env.unwrapped.store._inner
    asin = sorted(store._prices)[-1]
    store._prices[asin] += 1.0
    assert "catalogue 60 products" in here and _corpus(panel, env) != here


def test_package_versions_cover_sqlite_and_missing_packages():
    import sqlite3

    from capo_envs.core.panels import package_versions

    assert package_versions(("sqlite3", "no-such-distribution")) == \
        f"sqlite3={sqlite3.sqlite_version} no-such-distribution=absent"
    assert "thefuzz" in PANELS["webshop-test-500"].packages and "spacy" in PANELS["webshop-test-500"].packages
    assert "sqlite3" in PANELS["pasa-autoscholar-test-1000"].packages


def test_every_env_id_and_every_generated_size_has_a_panel():
    from capo_envs.core.registry import CATALOG

    with_panels = {p.env_id for p in PANELS.values()}
    assert set(CATALOG) - with_panels == {"capo/Remote-v0"}  # a proxy to another env id's panel
    sizes = {"capo/SynthHop-v0": "capo_envs.qa.world", "capo/SynthScholar-v0": "capo_envs.papers.world",
             "capo/SynthHouse-v0": "capo_envs.alfworld.world"}
    for env_id, module in sizes.items():
        known = set(__import__(module, fromlist=["SIZES"]).SIZES) - {"1m"}  # 1m: a latency benchmark's world
        panelled = {p.kwargs.get("size", "small") for p in PANELS.values() if p.env_id == env_id}
        assert known <= panelled, (env_id, known - panelled)
    for panel in PANELS.values():  # a generated panel left unpinned says why
        assert panel.pinned or "Synth" not in panel.env_id or "not pinned" in panel.about, panel.name
