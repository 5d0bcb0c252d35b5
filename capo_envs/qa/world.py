"""SynthHop: an offline multi-hop QA world, generated from a seed.

An encyclopedia of fictional people, cities, countries, companies, universities, bands, films and albums
(so no answer can come from a language model's memory), and HotpotQA-style questions over it: bridge
chains of 2, 3 and 4 hops and two-entity comparisons, in equal shares. Everything derives from
``random.Random(seed)`` and list order only (never ``hash()`` or set order), so a world is the same in
every process whatever ``PYTHONHASHSEED`` is. See ``entities.py`` for the entities and passages and
``questions.py`` for the questions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass, field

from .task import QATask
from ..retrieval.base import Passage
from .questions import QUESTION_KINDS, Question, QuestionGenerator
from .entities import PassageWriter, WorldGenerator

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class SizePreset:
    passages: int  # about this many (one per entity)
    train: int
    dev: int
    test: int


SIZES: dict[str, SizePreset] = {
    "tiny": SizePreset(300, 200, 50, 50),  # unit tests
    "small": SizePreset(3_000, 2_000, 200, 200),  # the default: CPU training and benchmarks
    "medium": SizePreset(20_000, 8_000, 500, 500),
    "large": SizePreset(100_000, 20_000, 1_000, 1_000),  # retrieval benchmarks
}


@dataclass(frozen=True)
class SynthWorld:
    seed: int
    size: str
    passages: tuple[Passage, ...]  # ids "0", "1", ...; title = entity name
    splits: dict[str, tuple[QATask, ...]] = field(hash=False)  # "train", "dev", "test"


@dataclass(frozen=True)
class _Built:
    """A world plus what ``answer_is_supported`` needs to check it: passage texts and comparison facts."""

    world: SynthWorld
    texts: dict[str, str]  # title -> text
    questions: dict[str, Question]  # task id -> the question it was made from


def build_world(seed: int = 0, size: str = "small") -> SynthWorld:
    """The SynthHop world of ``(seed, size)``; built once per process and cached."""
    return _build(seed, size).world


@functools.lru_cache(maxsize=8)
def _build(seed: int, size: str) -> _Built:
    if size not in SIZES:
        raise ValueError(f"unknown SynthHop size {size!r}; choose one of {sorted(SIZES)}")
    preset = SIZES[size]
    rng = random.Random(seed)
    generator = WorldGenerator(rng, preset.passages)
    entities = generator.generate()
    writer = PassageWriter(rng, entities, generator.by_kind)
    order = list(range(len(entities)))
    rng.shuffle(order)  # passage ids carry no hint of an entity's kind or age
    passages = tuple(Passage(str(i), entities[e].name, writer.write(e)) for i, e in enumerate(order))

    sizes = {"train": preset.train, "dev": preset.dev, "test": preset.test}
    total = sum(sizes.values())
    asker = QuestionGenerator(rng, entities, generator.by_kind)
    per_kind = [asker.generate(kind, -(-total // len(QUESTION_KINDS))) for kind in QUESTION_KINDS]
    # deal the kinds round-robin, so every split gets each kind in equal measure
    dealt = [kind_questions[i] for i in range(len(per_kind[0])) for kind_questions in per_kind][:total]
    splits: dict[str, tuple[QATask, ...]] = {}
    by_id: dict[str, Question] = {}
    start = 0
    for split in SPLITS:
        chunk = dealt[start : start + sizes[split]]
        start += sizes[split]
        rng.shuffle(chunk)
        tasks = []
        for n, q in enumerate(chunk):
            task = QATask(f"synthhop-{seed}-{split}-{n}", q.text, q.answers, q.kind, q.titles, q.titles)
            by_id[task.id] = q
            tasks.append(task)
        splits[split] = tuple(tasks)
    world = SynthWorld(seed, size, passages, splits)
    return _Built(world, {p.title: p.text for p in passages}, by_id)


def world_digest(world: SynthWorld) -> str:
    """sha256 of every passage and question: equal digests, equal worlds (for tests and caches)."""
    payload = {
        "seed": world.seed,
        "size": world.size,
        "passages": [[p.id, p.title, p.text] for p in world.passages],
        "splits": {
            split: [[t.id, t.question, list(t.answers), t.kind, list(t.supporting_titles), list(t.expert_queries)]
                    for t in world.splits[split]]
            for split in sorted(world.splits)
        },
    }  # fmt: skip
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode("utf-8")).hexdigest()


def answer_is_supported(world: SynthWorld, task: QATask) -> bool:
    """Whether the world's passages back the task's gold answer.

    Bridge: each supporting passage names the next one, and the gold answer is written in the last.
    Comparison: each passage states its compared value (a year, a city, a director...), and comparing the
    two values gives the gold answer.
    """
    built = _build(world.seed, world.size)
    texts = built.texts if built.world is world else {p.title: p.text for p in world.passages}
    titles = task.supporting_titles
    if not titles or task.expert_queries != titles or any(title not in texts for title in titles):
        return False
    gold = task.answers[0]
    if task.kind != "comparison":
        linked = all(titles[i + 1] in texts[titles[i]] for i in range(len(titles) - 1))
        return task.kind == f"bridge-{len(titles)}" and linked and gold in texts[titles[-1]]
    question = built.questions.get(task.id)
    if question is None or question.titles != titles:
        return False
    (title_a, value_a), (title_b, value_b) = question.facts
    if value_a not in texts[title_a] or value_b not in texts[title_b]:
        return False
    if question.comparison == "same":
        return gold == ("yes" if value_a == value_b else "no")
    if value_a == value_b:  # a tie would make "which came first" ambiguous
        return False
    earlier, later = sorted(((int(value_a), title_a), (int(value_b), title_b)))
    return gold == (earlier if question.comparison == "earlier" else later)[1]
