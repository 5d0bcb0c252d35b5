"""capo/SynthScholar-v0: the generated world, the search/expand env, its rewards, metrics and oracle."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from collections import Counter

import gymnasium as gym
import pytest

import capo_envs  # noqa: F401  (registers the ids)
from capo_envs.papers import vocab
from capo_envs.papers.db import STOP_WORDS, Paper, PaperDB
from capo_envs.papers.env import PaperSearchEnv
from capo_envs.papers.ids import normalize_arxiv_id
from capo_envs.papers.metrics import average_metrics, retrieval_metrics
from capo_envs.papers.protocol import PaperTagProtocol, PaperToolCallProtocol
from capo_envs.papers.selector import LexicalSelector, make_selector
from capo_envs.papers.world import PaperTask, cached_world, generate_world

from env_helpers import expert_metrics


def make(**kwargs):
    return gym.make("capo/SynthScholar-v0", **{"size": "tiny", **kwargs})


# --- the world ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world():
    return cached_world(0, "small")


def test_world_is_deterministic_and_seeded():
    a, b, c = generate_world(3, "tiny"), generate_world(3, "tiny"), generate_world(4, "tiny")
    assert a.papers == b.papers and list(a.citing) == list(b.citing) and a.splits == b.splits
    assert a.papers != c.papers


def test_ids_cover_every_arxiv_form(world):
    ids = [p.arxiv_id for p in world.papers]
    assert len(set(ids)) == len(ids) and all(normalize_arxiv_id(i) == i for i in ids)
    assert any("/" in i for i in ids)  # old style before 2008
    assert any(re.fullmatch(r"1[0-4]\d\d\.\d{4}", i) for i in ids)  # 4-digit numbers to 2014
    assert any(re.fullmatch(r"2\d{3}\.\d{5}", i) for i in ids)  # 5-digit numbers after
    years = Counter(p.year for p in world.papers)
    assert years[2024] > 10 * years[2000]  # arXiv-like growth


def test_citations_point_to_older_papers_with_a_heavy_tail_and_topical_clusters(world):
    papers = world.papers
    assert all(a > b and papers[a].date >= papers[b].date for a, b in zip(world.citing, world.cited))
    in_degree = Counter(world.cited)
    counts = sorted((in_degree.get(i, 0) for i in range(len(papers))), reverse=True)
    mean = sum(counts) / len(counts)
    assert counts[0] > 30 * mean  # heavy tail: the most cited paper gets dozens of times the mean
    top_share = sum(counts[: len(counts) // 100]) / sum(counts)
    assert top_share > 0.1  # the top 1 % of papers receive over a tenth of all citations
    assert counts[len(counts) // 2] <= mean  # ... while the median paper is cited less than average
    same_task = sum(world.cells[world.cell_of[a]][0] == world.cells[world.cell_of[b]][0]
                    for a, b in zip(world.citing, world.cited))
    assert same_task / len(world.citing) > 0.4  # topical clusters (a random pair shares a task ~1 % of the time)


def test_filler_words_never_name_a_method_or_task():
    topic_words = {w for phrase in (*vocab.METHODS, *(t for ts in vocab.FIELDS.values() for t in ts))
                   for w in re.findall(r"\w+", phrase)}
    filler = " ".join((*vocab.FILLER_ADJECTIVES, *vocab.FILLER_NOUNS, *vocab.CHALLENGES, *vocab.VERBS,
                       *vocab.GENERIC_SENTENCES)).replace("{adj}", "").replace("{noun}", "").replace("{challenge}", "")
    assert not topic_words & set(re.findall(r"\w+", filler.lower())) - STOP_WORDS


def test_queries_need_search_and_expansion(world):
    tasks = [t for split in world.splits.values() for t in split]
    assert len(tasks) >= 200 and len({t.id for t in tasks}) == len(tasks)
    by_id = {p.arxiv_id: i for i, p in enumerate(world.papers)}
    for task in tasks:
        members = [by_id[g] for g in task.gold]
        method = world.methods[world.cells[world.cell_of[members[0]]][1]]
        assert 2 <= len(task.gold) <= 12 and len({world.cell_of[i] for i in members}) == 1
        aliased = [i for i in members if world.alias_named[i]]
        assert aliased and len(aliased) < len(members)
        for i in aliased:  # alias-named gold papers never use the method's canonical words
            text = (world.papers[i].title + " " + world.papers[i].abstract).lower()
            assert method not in text


# --- the oracle: recall >= 0.9, and what expansion adds -------------------------------------------------
@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_oracle_reaches_recall_090(action_format):
    env = make(size="small", split="dev", action_format=action_format)
    metrics = expert_metrics(env)
    recall = statistics.mean(m["recall_all"] for m in metrics)
    assert recall >= 0.9
    assert statistics.mean(m["success"] for m in metrics) == recall


def test_search_alone_finds_less_than_search_and_expand():
    full = statistics.mean(m["recall_all"] for m in expert_metrics(make(size="small", split="dev")))
    search = statistics.mean(m["recall_all"] for m in expert_metrics(make(size="small", split="dev",
                                                                          expert_mode="search")))
    assert search < full - 0.2, (search, full)


# --- the env on a hand-made database -------------------------------------------------------------------
def _paper(i: int, title: str, abstract: str = "x", year: int = 2020) -> Paper:
    return Paper(f"2001.{i:05d}", title, abstract, year, (f"A. Author{i}",), f"{year}-01-{i % 28 + 1:02d}")


HAND_PAPERS = [
    _paper(1, "Sparse attention for summarization", "sparse attention summarization of long documents"),
    _paper(2, "Varnex summarization", "we use varnex for summarization"),  # reachable only by expand
    _paper(3, "Sparse attention for translation", "sparse attention translation"),
    _paper(4, "Unrelated cooking robots", "robots cook pasta"),
    _paper(5, "Abstractless summarization", ""),
    *[_paper(10 + i, f"Summarization survey {i}", "summarization") for i in range(12)],
]
HAND_EDGES = [("2001.00002", "2001.00001"), ("2001.00001", "2001.00004"), ("2001.00003", "2001.00001"),
              ("2001.00005", "2001.00001")]
HAND_TASK = PaperTask("q1", "Which papers use sparse attention for summarization?", ("2001.00001", "2001.00002"),
                      search_phrases=("sparse attention summarization",))


def hand_env(**kwargs) -> PaperSearchEnv:
    return PaperSearchEnv(PaperDB.from_records(HAND_PAPERS, HAND_EDGES), [HAND_TASK], **kwargs)


def test_search_then_expand_finds_the_hidden_gold_paper():
    env = hand_env()
    obs, info = env.reset(seed=0)
    assert obs.startswith("User Query: Which papers use sparse attention") and "Paper pool: empty." in obs
    obs, reward, terminated, truncated, info = env.step("<search>sparse attention summarization</search>")
    assert "[2001.00001]" in obs and "Sparse attention for summarization" in obs and "A. Author1" in obs
    assert "(2020;" in obs and reward == 0.5 and info["gold_new"] == 1
    assert "2001.00002" not in env._pool  # alias-named: the search cannot find it
    obs, reward, *_ , info = env.step("<expand>ARXIV:2001.00001v2</expand>")
    assert reward == 0.5 and "[2001.00002]" in obs and "Expanded: 2001.00001" in obs
    assert "[2001.00004]" not in obs.split("Paper pool")[0]  # scored 0 by the lexical selector: dropped
    assert "2001.00005" not in obs.split("Paper pool")[0]  # no abstract: dropped by the expand
    obs, reward, terminated, truncated, info = env.step("<stop></stop>")
    assert terminated and not truncated and reward == 0.0
    m = info["metrics"]
    assert m["success"] == m["recall_all"] == 1.0 and m["searches"] == 1 and m["expands"] == 1
    assert m["precision_all"] == pytest.approx(2 / m["pool_size"])
    assert {"precision_25", "recall_50", "f1_100", "f1_all", "refused_calls", "steps"} <= set(m)


def test_pool_handles_name_papers_in_pool_order_and_expand_takes_them():
    env = hand_env(paper_handles="pool")
    assert "<expand>handle</expand>" in env.protocol.instructions and "such as P1" in env.protocol.instructions
    env.reset(seed=0)
    obs, reward, *_ = env.step("<search>sparse attention summarization</search>")
    # handles follow the order papers joined the pool (the search's), the pool view its scores
    assert "[P1] (0.67) Sparse attention for translation" in obs and "[P2] (1.00) Sparse attention for summ" in obs
    assert "2001.000" not in obs and reward == 0.5
    obs, reward, *_, info = env.step("<expand>p2</expand>")  # case-insensitive
    assert info["action_valid"] and reward == 0.5 and "[Expand] P2:" in obs and "Expanded: P2" in obs
    assert "[P11] (0.33) Varnex summarization" in obs  # the hidden gold paper, next handle
    assert env.step("<expand>P2</expand>")[1] == -0.5  # already expanded


@pytest.mark.parametrize("paper_id", ["P0", "P99", "P", "P-1", "P\u00b2", "P 1x", "2001.00099", ""])
def test_pool_handles_refuse_what_names_no_pool_paper(paper_id):
    env = hand_env(paper_handles="pool")
    env.reset(seed=0)
    env.step("<search>sparse attention summarization</search>")
    obs, reward, terminated, truncated, info = env.step(f"<expand>{paper_id}</expand>")
    assert not terminated and not truncated
    assert reward == -0.5 or not info["action_valid"]  # refused call, or (empty) a malformed action
    assert env._counts["expands"] == 0


def test_pool_handles_still_take_an_arxiv_id_and_the_oracle_names_handles():
    env = hand_env(paper_handles="pool")
    env.reset(seed=0)
    env.step("<search>sparse attention summarization</search>")
    assert env.step("<expand>2001.00001</expand>")[1] == 0.5  # a pool paper's arXiv id still works
    oracle = make(size="small", split="dev", paper_handles="pool")
    arxiv = make(size="small", split="dev")
    with_handles = expert_metrics(oracle)
    assert [m["recall_all"] for m in with_handles] == [m["recall_all"] for m in expert_metrics(arxiv)]
    with pytest.raises(ValueError, match="paper_handles"):
        hand_env(paper_handles="short")


def test_refused_calls_cost_the_penalty_and_the_rest_still_runs():
    env = hand_env(invalid_call_penalty=0.5)
    env.reset(seed=0)
    _, reward, *_ = env.step("<search>sparse attention summarization</search>")
    assert reward == 0.5
    obs, reward, *_, info = env.step("<search>Sparse  Attention summarization</search>"  # repeated (case, spaces)
                                     "<expand>2001.00004</expand>"  # not in the pool
                                     "<expand>2001.00001</expand>")  # fine: finds the hidden gold paper
    assert reward == pytest.approx(-0.5 - 0.5 + 0.5)
    assert obs.count("refused") == 2 and info["action_valid"]
    _, reward, *_ = env.step("<expand>2001.00001</expand>")  # already expanded
    assert reward == -0.5
    _, reward, *_ = env.step("<expand>not an id</expand>")
    assert reward == -0.5
    env2 = hand_env(invalid_call_penalty=0.0)
    env2.reset(seed=0)
    assert env2.step("<expand>2001.00001</expand>")[1] == 0.0


def test_five_calls_per_action_and_the_rest_dropped():
    env = hand_env()
    env.reset(seed=0)
    action = "".join(f"<search>summarization {i}</search>" for i in range(7))
    obs, _, _, _, info = env.step(action)
    assert info["action_valid"] and obs.count("[Search]") == 5 and "2 calls past the limit of 5" in obs
    assert info["action"]["name"] == "+".join(["search"] * 5) and info["action"]["args"]["5.query"] == "summarization 4"
    assert env._counts["searches"] == 5


def test_step_budget_truncates_after_five_steps():
    env = hand_env()
    env.reset(seed=0)
    results = [env.step(f"<search>survey {i}</search>") for i in range(5)]
    assert [r[3] for r in results] == [False] * 4 + [True] and not any(r[2] for r in results)
    assert results[-1][4]["ended_by"] == "step_budget"


def test_malformed_action_runs_nothing():
    env = hand_env(invalid_penalty=0.1)
    env.reset(seed=0)
    obs, reward, _, _, info = env.step("<search>summarization</search><expand></expand>")
    assert not info["action_valid"] and reward == -0.1 and obs.startswith("Invalid action: call 2:")
    assert env._counts["searches"] == 0
    obs, _, _, _, info = env.step("<search>a</search><stop></stop>")
    assert not info["action_valid"] and "only tag" in info["invalid_reason"]


def test_reward_modes():
    sel = hand_env(reward="selector")
    sel.reset(seed=0)
    _, reward, *_ = sel.step("<search>sparse attention summarization</search>")
    scores = sorted((e.score for e in sel._pool.values()), reverse=True)
    assert reward == pytest.approx(sum(scores[:3])) and reward > 1.0
    mix = hand_env(reward="mix", selector_weight=0.25)
    mix.reset(seed=0)
    _, reward, *_ = mix.step("<search>sparse attention summarization</search>")
    assert reward == pytest.approx(0.75 * 0.5 + 0.25 * sum(scores[:3]))
    with pytest.raises(ValueError, match="reward"):
        hand_env(reward="nope")


def test_tool_call_format_and_stop_without_call():
    env = hand_env(action_format="tool_call")
    env.reset(seed=0)
    call = '<tool_call>{"name": "search", "arguments": {"query": "sparse attention summarization"}}</tool_call>'
    _, reward, _, _, info = env.step(call + '<tool_call>{"name": "expand", "arguments": {"paper_id": "2001.00001"}}'
                                     "</tool_call>")
    assert info["action_valid"] and reward == 1.0 and info["action"]["name"] == "search+expand"
    _, _, terminated, _, _ = env.step("<stop></stop>")
    assert terminated
    capo = hand_env(action_format="tool_call", stop_without_call=True)
    capo.reset(seed=0)
    assert capo.step("I am done.")[2]  # the CAPO flow: no tool call ends the episode
    assert not hand_env().protocol.parse("I am done.").valid  # by default, a turn without a call is invalid


def test_stop_strings_allow_several_calls():
    assert PaperTagProtocol().stop_strings == ("</stop>",)
    assert PaperTagProtocol(max_calls=1).stop_strings == ("</search>", "</expand>", "</stop>")
    assert PaperToolCallProtocol().stop_strings == ("</stop>",)
    assert PaperToolCallProtocol(max_calls=1).stop_strings == ("</tool_call>", "</stop>")


def test_date_cutoff_hides_later_papers():
    task = PaperTask("q", "sparse attention", ("2001.00001",), cutoff="2019-12-31")
    env = PaperSearchEnv(PaperDB.from_records(HAND_PAPERS, HAND_EDGES), [task])
    env.reset(seed=0)
    obs, *_ = env.step("<search>sparse attention</search>")
    assert "0 results" in obs
    off = PaperSearchEnv(PaperDB.from_records(HAND_PAPERS, HAND_EDGES), [task], use_cutoff=False)
    off.reset(seed=0)
    assert "[2001.00001]" in off.step("<search>sparse attention</search>")[0]


# --- selector and metrics ------------------------------------------------------------------------------
def test_lexical_selector():
    sel = make_selector("lexical")
    assert isinstance(sel, LexicalSelector)
    q = "Could you provide me some works that use sparse attention for summarization?"
    full, half, none = sel.score(q, [HAND_PAPERS[0], HAND_PAPERS[1], HAND_PAPERS[3]])
    assert full == 1.0 and 0.2 < half < 0.5 and none == 0.0
    with pytest.raises(ValueError):
        make_selector(42)


def test_retrieval_metrics_at_every_cutoff():
    ranked = ["g1", "x1", "g2"] + [f"x{i}" for i in range(2, 60)] + ["g3"]
    m = retrieval_metrics(ranked, ["g1", "g2", "g3", "g4"])
    assert m["recall_all"] == 0.75 and m["precision_all"] == pytest.approx(3 / 62)
    assert m["recall_25"] == 0.5 and m["precision_25"] == pytest.approx(2 / 25)
    assert m["recall_50"] == 0.5 and m["recall_100"] == 0.75
    assert m["f1_25"] == pytest.approx(2 * (2 / 25) * 0.5 / (2 / 25 + 0.5))
    assert retrieval_metrics([], ["g"])["f1_all"] == 0.0
    avg = average_metrics([m, None])  # a query with no output counts as zero
    assert avg["recall_all"] == 0.375


# --- contract odds and ends ----------------------------------------------------------------------------
def test_import_does_not_load_torch_or_build_worlds():
    code = ("import sys, gymnasium as gym, capo_envs\n"
            "env = gym.make('capo/SynthScholar-v0', size='tiny'); env.reset(seed=0)\n"
            "env.step(env.unwrapped.expert_action())\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_splits_and_task_selection():
    env = make(split="test")
    ids = env.unwrapped.task_ids()
    assert ids and not set(ids) & set(make(split="train").unwrapped.task_ids())
    _, info = env.reset(options={"task_id": ids[1]})
    assert info["task_id"] == ids[1]
    with pytest.raises(ValueError, match="split"):
        make(split="nope")
    with pytest.raises(ValueError, match="size"):
        make(size="huge")


def test_gymnasium_env_checker_and_vector_envs():
    from gymnasium.utils.env_checker import check_env

    check_env(make(disable_env_checker=True).unwrapped, skip_render_check=True)
    envs = gym.vector.SyncVectorEnv([lambda: make(max_steps=3) for _ in range(2)])
    envs.reset(seed=[0, 1])
    ended = 0
    for _ in range(8):
        actions = [a or "" for a in envs.call("expert_action")]
        _, rewards, terminated, truncated, infos = envs.step(actions)
        ended += int(terminated.sum() + truncated.sum())
    assert ended >= 2
    envs.close()


def test_capo_retrievers_over_the_same_papers():
    env = hand_env(retriever="bm25")
    env.reset(seed=0)
    obs, reward, *_ = env.step("<search>sparse attention summarization</search>")
    assert reward == 0.5 and "[2001.00001]" in obs
    recall = statistics.mean(m["recall_all"] for m in expert_metrics(make(split="dev", retriever="bm25")))
    assert recall >= 0.9


def test_synthscholar_envs_share_one_database_and_closing_one_keeps_it_for_the_others():
    """A trainer makes an env per episode slot; filling the medium world's database took seconds per env.
    Envs of one (seed, size) read one database, and one env's close() does not close it for the rest."""
    first, second = gym.make("capo/SynthScholar-v0", size="tiny"), gym.make("capo/SynthScholar-v0", size="tiny", split="dev")
    other_seed = gym.make("capo/SynthScholar-v0", size="tiny", seed=1)
    assert first.unwrapped.db._db is second.unwrapped.db._db
    assert other_seed.unwrapped.db._db is not first.unwrapped.db._db
    first.close()
    second.reset(seed=0)
    _, reward, *_ , info = second.step(second.unwrapped.expert_action())
    assert info["action_valid"] and info["new_papers"] > 0
