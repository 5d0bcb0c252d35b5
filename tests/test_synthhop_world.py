"""SynthHop world generator: determinism, split hygiene, answerability, prose, name rules and retrievability."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections import Counter

import pytest

from capo_envs.qa.entities import kind_counts
from capo_envs.qa.metrics import normalize_answer
from capo_envs.qa.world import SIZES, _build, answer_is_supported, build_world, world_digest

KINDS = ("bridge-2", "bridge-3", "bridge-4", "comparison")
TASK_ID = re.compile(r"synthhop-(\d+)-(train|dev|test)-(\d+)")


@pytest.fixture(scope="module")
def tiny():
    return build_world(0, "tiny")


@pytest.fixture(scope="module")
def small():
    return build_world(0, "small")


def all_tasks(world):
    return [task for split in ("train", "dev", "test") for task in world.splits[split]]


def chain_key(task):
    """Comparisons are about an unordered pair; bridges about an ordered chain."""
    return tuple(sorted(task.supporting_titles)) if task.kind == "comparison" else task.supporting_titles


def test_build_is_cached_and_deterministic(tiny):
    assert build_world(0, "tiny") is tiny
    rebuilt = _build.__wrapped__(0, "tiny").world  # bypass the cache
    assert rebuilt is not tiny and world_digest(rebuilt) == world_digest(tiny)
    assert rebuilt.passages == tiny.passages and rebuilt.splits == tiny.splits


def test_pythonhashseed_does_not_matter():
    code = "from capo_envs.qa.world import build_world, world_digest; print(world_digest(build_world(7, 'tiny')))"
    digests = set()
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert digests == {world_digest(build_world(7, "tiny"))}


def test_different_seeds_differ(tiny):
    other = build_world(1, "tiny")
    assert world_digest(other) != world_digest(tiny)
    assert {p.title for p in other.passages} != {p.title for p in tiny.passages}


def test_unknown_size_is_an_error():
    with pytest.raises(ValueError, match="unknown SynthHop size"):
        build_world(0, "huge")


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_split_sizes_and_ids(size):
    world, preset = build_world(0, size), SIZES[size]
    assert {split: len(tasks) for split, tasks in world.splits.items()} == {
        "train": preset.train, "dev": preset.dev, "test": preset.test
    }  # fmt: skip
    for split, tasks in world.splits.items():
        for n, task in enumerate(tasks):
            assert TASK_ID.fullmatch(task.id).groups() == ("0", split, str(n))


def test_splits_are_disjoint(small):
    questions = {split: {t.question for t in tasks} for split, tasks in small.splits.items()}
    chains = {split: {chain_key(t) for t in tasks} for split, tasks in small.splits.items()}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not questions[a] & questions[b]
        assert not chains[a] & chains[b]
    assert len({chain_key(t) for t in all_tasks(small)}) == len(all_tasks(small))


def test_passages_ids_and_unique_titles(small):
    assert [p.id for p in small.passages] == [str(i) for i in range(len(small.passages))]
    assert len({p.title for p in small.passages}) == len(small.passages)


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_no_name_contains_another(size):
    titles = [p.title.lower() for p in build_world(0, size).passages]
    joined = "\n".join(titles)
    assert [t for t in titles if joined.count(t) != 1] == []


def test_passages_read_as_prose(small):
    for p in small.passages:
        assert p.text.startswith(p.title) and p.text.endswith(".")
        assert 2 <= p.text.count(". ") + 1 <= 5, p.text
        assert "  " not in p.text and "{" not in p.text and "None" not in p.text


def test_every_answer_is_supported(small):
    titles = {p.title for p in small.passages}
    unsupported = [t for t in all_tasks(small) if not answer_is_supported(small, t)]
    assert unsupported == []
    for task in all_tasks(small):
        assert set(task.supporting_titles) <= titles
        assert task.expert_queries == task.supporting_titles
        assert normalize_answer(task.answers[0]) and task.question.endswith("?")


def test_answer_is_supported_rejects_a_wrong_answer(tiny):
    task = tiny.splits["train"][0]
    wrong = dataclasses.replace(task, answers=("Nowhere at all",))
    assert answer_is_supported(tiny, task) and not answer_is_supported(tiny, wrong)


def test_kinds_hops_and_balance(small):
    for split, tasks in small.splits.items():
        counts = Counter(t.kind for t in tasks)
        assert set(counts) == set(KINDS), split
        assert max(counts.values()) - min(counts.values()) <= 1, counts
    for task in all_tasks(small):
        hops = 2 if task.kind == "comparison" else int(task.kind[-1])
        assert len(task.supporting_titles) == hops == len(set(task.supporting_titles))


def test_bridges_name_only_their_first_entity(small):
    for task in all_tasks(small):
        if task.kind == "comparison":
            assert all(title in task.question for title in task.supporting_titles)
            continue
        first, *rest = task.supporting_titles
        assert first in task.question
        assert not any(title in task.question for title in rest)
        assert f" {normalize_answer(task.answers[0])} " not in f" {normalize_answer(task.question)} "


def test_comparisons_are_balanced(small):
    answers = Counter(t.answers[0] for t in all_tasks(small) if t.kind == "comparison")
    yes, no = answers.pop("yes"), answers.pop("no")
    assert abs(yes - no) <= 0.1 * (yes + no)
    assert sum(answers.values()) >= yes + no - 10  # about half ask "which came first", half yes/no


def test_tiny_builds_fast():
    start = time.process_time()
    _build.__wrapped__(3, "tiny")
    assert time.process_time() - start < 1.0


def test_presets_scale_as_declared():
    for size in ("tiny", "small", "medium"):
        assert abs(len(build_world(0, size).passages) - SIZES[size].passages) <= 0.02 * SIZES[size].passages
    # large takes seconds to build: check its arithmetic only
    assert abs(sum(kind_counts(SIZES["large"].passages).values()) - SIZES["large"].passages) <= 1_000
    assert [SIZES[s].passages for s in ("tiny", "small", "medium", "large")] == sorted(
        SIZES[s].passages for s in SIZES
    )


def test_bm25_finds_every_hop_in_the_top_5(tiny):
    bm25s = pytest.importorskip("bm25s")
    Stemmer = pytest.importorskip("Stemmer")
    stemmer = Stemmer.Stemmer("english")
    corpus = [f"{p.title}\n{p.text}" for p in tiny.passages]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    queries = sorted({q for t in all_tasks(tiny) for q in t.expert_queries})
    tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
    results, _ = retriever.retrieve(tokens, k=5, show_progress=False)
    found = {q: q in {tiny.passages[int(i)].title for i in row} for q, row in zip(queries, results)}
    tasks = all_tasks(tiny)
    assert sum(all(found[q] for q in t.expert_queries) for t in tasks) >= 0.95 * len(tasks)


def test_question_kinds_filter_the_tasks():
    import gymnasium as gym

    import capo_envs  # noqa: F401

    env = gym.make("capo/SynthHop-v0", size="tiny", question_kinds=["bridge-2"])
    tasks = env.unwrapped.tasks.values()
    assert tasks and {t.kind for t in tasks} == {"bridge-2"}
    _, info = env.reset(seed=3)
    assert env.unwrapped.tasks[info["task_id"]].kind == "bridge-2"
    with pytest.raises(ValueError, match="bridge-9"):
        gym.make("capo/SynthHop-v0", size="tiny", question_kinds=["bridge-9"])
