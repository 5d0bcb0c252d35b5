"""The public benchmark ids on real data: ../shared/data's official-format samples, prepared by
``data_prep`` from a local mirror, then loaded through ``gym.make`` exactly as a user would."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import capo_envs
from data_prep import prepare

from env_helpers import expert_metrics
from fixtures_official import SHARED, FileServer, serve, shared_files

pytestmark = [pytest.mark.shared, pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")]

PUBLIC = {"capo/HotpotQA-v0": "hotpotqa", "capo/2WikiMultihopQA-v0": "2wiki", "capo/MuSiQue-v0": "musique"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    data = tmp_path_factory.mktemp("capo-data")
    with pytest.MonkeyPatch.context() as mp, FileServer() as server:
        serve(server, shared_files(tmp_path_factory.mktemp("mirror")), mp)
        for name in ("hotpotqa", "2wiki", "musique", "wiki18"):
            prepare(name, data_dir=data, base_url=server.url, progress=False)
    return data


@pytest.fixture
def prepared(data_dir, monkeypatch):
    monkeypatch.setenv("CAPO_DATA_DIR", str(data_dir))
    return data_dir


@pytest.mark.parametrize("env_id", sorted(PUBLIC))
def test_public_env_passes_check_env_once_prepared(prepared, env_id):
    assert capo_envs.CATALOG[env_id].data_ready()
    env = gym.make(env_id, disable_env_checker=True)
    check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert obs.startswith("Question: ") and info["task_id"] in env.unwrapped.task_ids()
    env.close()


@pytest.mark.parametrize("env_id, minimum", [("capo/HotpotQA-v0", 0.9), ("capo/MuSiQue-v0", 0.8)])
def test_expert_finds_the_gold_paragraphs_with_bm25(prepared, env_id, minimum):
    """The gold-title oracle answers right only when BM25 top-5 surfaced every supporting paragraph."""
    em = [m["em"] for m in expert_metrics(gym.make(env_id, split="dev"))]
    assert sum(em) / len(em) >= minimum


def test_a_real_question_end_to_end(prepared):
    env = gym.make("capo/HotpotQA-v0", split="dev")
    obs, _ = env.reset(options={"task_id": "5a8b57f25542995d1e6f1371"})
    assert obs == "Question: Were Scott Derrickson and Ed Wood of the same nationality?"
    obs, reward, terminated, truncated, info = env.step("<search>Scott Derrickson</search>")
    assert "Scott Derrickson" in obs and info["action"] == {"name": "search", "args": {"query": "Scott Derrickson"}}
    obs, reward, terminated, truncated, info = env.step("They are both American. <answer>Yes</answer>")
    assert terminated and not truncated and reward == 1.0
    assert info["metrics"]["em"] == 1.0 and info["metrics"]["f1"] == 1.0


def test_wiki18_corpus_is_an_env_kwarg(prepared):
    env = gym.make("capo/HotpotQA-v0", split="dev", corpus="wiki18")
    env.reset(seed=0)
    obs, *_ = env.step("<search>Evan Morris lobbyist</search>")
    assert "Doc 1 (Title: Evan Morris)" in obs


def test_user_corpus_builds_its_index_beside_it(prepared, tmp_path):
    corpus = tmp_path / "mine.jsonl"
    corpus.write_text('{"id": "a", "title": "Zanzibar", "text": "Zanzibar is an archipelago."}\n')
    env = gym.make("capo/MuSiQue-v0", split="dev", corpus=str(corpus))
    env.reset(seed=0)
    obs, *_ = env.step("<search>archipelago</search>")
    assert "Zanzibar" in obs
    assert (tmp_path / "mine.jsonl.index" / "bm25" / "meta.json").is_file()
