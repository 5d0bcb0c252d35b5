"""SynthScholar: a generated scholarly world (papers, a citation graph, AutoScholarQuery-style queries).

Structure, and why:

* **Papers** belong to a *cell*: one method applied to one task (``contrastive pretraining`` for
  ``relation extraction``). Tasks are drawn Zipf-like (a few crowded tasks, a long tail); each task has its
  own Zipf ranking of methods. Years follow arXiv's exponential growth (1995-2024); ids are arXiv ids, new
  style from 2008 (4-digit numbers to 2014, 5-digit after) and old style (``cs/0112017``) before, so every
  id form the database accepts occurs.
* **Two ways of naming a method.** About a third of a cell's papers call its method by an invented alias
  (a named model: "Varnex for relation extraction") and never by its canonical words. A keyword search for
  the canonical method misses them; they are found by expanding the citations of the canonical papers.
* **Citations** go only to older papers. Each paper cites about 10 (log-normal), drawn from its own cell,
  its task, its method or the whole world, each by preferential attachment (a paper is drawn in proportion
  to 1 + the citations it has), which gives a heavy-tailed in-degree and topical clusters. A paper whose
  cell already has papers cites at least one of them, so a cell's citation graph is connected.
* **Queries** ask for one cell ("Which studies apply contrastive pretraining to relation extraction?"),
  as AutoScholarQuery's questions ask for the papers one related-work sentence cites. The gold set is the
  whole cell, so it is complete. Only cells with both canonical and alias papers, every alias paper within
  three capped expands of a canonical one, become queries: each needs search *and* expansion.
"""

from __future__ import annotations

import math
import random
import re
from array import array
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator, Sequence

from . import vocab
from .db import Paper

FIRST_YEAR, LAST_YEAR = 1995, 2024
NEW_STYLE_FROM = 2008  # arXiv switched in 2007-04; a round year keeps the generator simple
FIVE_DIGITS_FROM = 2015
YEAR_GROWTH = 0.17  # arXiv submissions grew roughly 17 % a year over this period
ALIAS_SHARE = 0.35
NO_ABSTRACT_SHARE = 0.01  # real databases hold some papers without abstracts; an expand drops them
REFS_LOG_MEAN, REFS_LOG_SD, MAX_REFS = 2.3, 0.7, 60  # median about 10 in-world references
REF_SOURCES = (("cell", 0.30), ("task", 0.35), ("method", 0.15), ("world", 0.20))
ALIAS_MENTION_SHARE = 0.25  # canonical abstracts that also name the alias, as related work does
CITATIONS_CAP, REFERENCES_CAP = 30, 99  # the CAPO client's expand caps, which reachability must respect
MAX_HOPS = 3
MIN_GOLD, MAX_GOLD = 2, 12
SPLIT_SHARES = (("train", 0.7), ("dev", 0.15), ("test", 0.15))


@dataclass(frozen=True)
class SizePreset:
    papers: int
    queries: int  # at most this many across the splits (fewer when too few cells qualify)


SIZES: dict[str, SizePreset] = {
    "tiny": SizePreset(2_000, 60),
    "small": SizePreset(6_000, 300),
    "medium": SizePreset(50_000, 1_500),
    "large": SizePreset(250_000, 3_000),
    "1m": SizePreset(1_000_000, 3_000),
}


@dataclass(frozen=True)
class PaperTask:
    """One query: the question, its gold arXiv ids (and titles), and what an oracle would search."""

    id: str
    question: str
    gold: tuple[str, ...]
    gold_titles: tuple[str, ...] = ()
    cutoff: str | None = None  # ISO date; papers after it are hidden (real queries)
    search_phrases: tuple[str, ...] = ()  # the key phrases of the question, for the oracle's searches
    alias_phrases: tuple[str, ...] = ()  # what a reader of the canonical abstracts could also search


@dataclass
class ScholarWorld:
    seed: int
    size: str
    papers: list[Paper]
    cell_of: array  # paper index -> cell index
    alias_named: bytearray  # paper index -> 1 when it names its method by the alias
    cells: list[tuple[int, int]]  # cell index -> (task index, method index)
    tasks: list[str]
    methods: list[str]
    aliases: list[str]
    citing: array  # edges as two parallel arrays of paper indices
    cited: array
    splits: dict[str, tuple[PaperTask, ...]] = field(default_factory=dict)

    def edges(self) -> Iterator[tuple[str, str]]:
        papers = self.papers
        for a, b in zip(self.citing, self.cited):
            yield papers[a].arxiv_id, papers[b].arxiv_id


# --- names -----------------------------------------------------------------------------------------------
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "tr", "st")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io")
_CODAS = ("", "n", "r", "l", "x", "rn", "th", "k")
_SURNAME_ENDS = ("son", "berg", "ov", "ez", "ani", "ley", "mann", "ski", "ard", "ini")


class _Coiner:
    """Invented words, each used once and sharing no prefix of 5 letters with a real vocabulary word."""

    def __init__(self, rng: random.Random, taken: set[str]):
        self.rng = rng
        self.taken = set(taken)

    def word(self, syllables: int) -> str:
        tries = 0
        while True:
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables))
            w += self.rng.choice(_CODAS)
            if w not in self.taken and len(w) >= 4:
                self.taken.add(w)
                return w
            tries += 1
            if tries % 20 == 0:  # this length is crowded (a large world): go one syllable longer
                syllables += 1


def _vocabulary_words() -> set[str]:
    words = set()
    for phrase in (*vocab.METHODS, *(t for ts in vocab.FIELDS.values() for t in ts)):
        words.update(phrase.replace("-", " ").split())
    return words


_SMALL_WORDS = frozenset({"a", "an", "and", "for", "from", "in", "of", "on", "the", "to", "with"})


def _title_case(phrase: str) -> str:
    return " ".join(w if w.isupper() or (i and w in _SMALL_WORDS) else w[:1].upper() + w[1:]
                    for i, w in enumerate(phrase.split()))


# --- generation ------------------------------------------------------------------------------------------
def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank + 1) ** s for rank in range(n)]


def _arxiv_ids(dates: Sequence[tuple[int, int, int]], rng: random.Random) -> list[str]:
    counters: dict[tuple[str, int, int], int] = {}
    ids = []
    for year, month, _ in dates:
        if year >= NEW_STYLE_FROM:
            key = ("new", year, month)
            counters[key] = counters.get(key, 0) + 1
            digits = 5 if year >= FIVE_DIGITS_FROM else 4
            ids.append(f"{year % 100:02d}{month:02d}.{counters[key]:0{digits}d}")
        else:
            archive = "cs" if rng.random() < 0.9 else "math.OC"
            key = (archive, year, month)
            counters[key] = counters.get(key, 0) + 1
            ids.append(f"{archive}/{year % 100:02d}{month:02d}{counters[key]:03d}")
    return ids


def _abstract(rng: random.Random, task: str, method: str, alias: str, name: str, field_name: str, aliased: bool,
              with_mention: bool) -> str:
    adj, noun = rng.choice(vocab.FILLER_ADJECTIVES), rng.choice(vocab.FILLER_NOUNS)
    challenge = rng.choice(vocab.CHALLENGES)
    intro = rng.choice((
        f"{task[:1].upper() + task[1:]} is a central problem in {field_name}.",
        f"Progress in {task} is often limited by {challenge}.",
        f"Existing approaches to {task} struggle with {challenge}.",
    ))
    if aliased:
        core = rng.choice((
            f"We present {name}, built on {alias}, a {adj} {noun} for {task}.",
            f"We show that {alias} yields a {adj} {noun} for {task}, and introduce {name}.",
        ))
    else:
        core = rng.choice((
            f"We propose {name}, which applies {method} to {task}.",
            f"We study {method} as a {adj} {noun} for {task} and introduce {name}.",
            f"{name} brings {method} to {task} with a {adj} {noun}.",
        ))
    detail = (f"{name} {rng.choice(vocab.VERBS)} the fitting stage and {rng.choice(vocab.VERBS)} deployment "
              f"under {challenge}.")
    result = (f"Experiments on {rng.randint(2, 7)} benchmarks show a {rng.randint(2, 25)}% relative improvement "
              f"over {rng.choice(vocab.FILLER_ADJECTIVES)} baselines.")
    extra = rng.choice(vocab.GENERIC_SENTENCES).format(adj=rng.choice(vocab.FILLER_ADJECTIVES),
                                                       noun=rng.choice(vocab.FILLER_NOUNS),
                                                       challenge=rng.choice(vocab.CHALLENGES))
    sentences = [intro, core, detail, extra, result]
    if with_mention:
        sentences.insert(2, f"Our approach is related to {alias}, which has been used in other settings.")
    return _articles(" ".join(sentences))


_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def _articles(text: str) -> str:
    """'a accurate' -> 'an accurate' (templates put 'a' before a word drawn at random)."""
    return _A_BEFORE_VOWEL.sub(lambda m: m.group(1) + "n ", text)


def _title(rng: random.Random, task: str, method: str, alias: str, name: str, aliased: bool) -> str:
    template = rng.choice(vocab.ALIAS_TITLES if aliased else vocab.CANONICAL_TITLES)
    return template.format(M=_title_case(method), T=_title_case(task), A=alias, N=name,
                           Adj=_title_case(rng.choice(vocab.FILLER_ADJECTIVES)))


def generate_world(seed: int = 0, size: str = "small", with_queries: bool = True) -> ScholarWorld:
    """The world for ``(seed, size)``; the same arguments give the same world on every machine.
    ``with_queries=False`` skips the queries (and their reachability check), e.g. for a latency benchmark."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    preset = SIZES[size]
    rng = random.Random(f"synthscholar/{seed}/{size}")
    n = preset.papers

    field_of_task = [(f, t) for f, ts in vocab.FIELDS.items() for t in ts]
    tasks = [t for _, t in field_of_task]
    methods = list(vocab.METHODS)
    coiner = _Coiner(rng, _vocabulary_words())
    aliases = [coiner.word(2).capitalize() for _ in methods]

    # Cells: task by a shuffled Zipf, then method by that task's own shuffled Zipf.
    task_order = list(range(len(tasks)))
    rng.shuffle(task_order)
    task_weights = _zipf_weights(len(tasks), 0.8)
    method_weights = _zipf_weights(len(methods), 1.1)
    method_orders: dict[int, list[int]] = {}
    cell_index: dict[tuple[int, int], int] = {}
    cells: list[tuple[int, int]] = []
    task_draws = rng.choices(task_order, weights=task_weights, k=n)
    method_ranks = rng.choices(range(len(methods)), weights=method_weights, k=n)

    # Dates, sorted, so that paper index order is publication order.
    year_weights = [math.exp(YEAR_GROWTH * (y - FIRST_YEAR)) for y in range(FIRST_YEAR, LAST_YEAR + 1)]
    years = rng.choices(range(FIRST_YEAR, LAST_YEAR + 1), weights=year_weights, k=n)
    dates = sorted((y, rng.randint(1, 12), rng.randint(1, 28)) for y in years)
    ids = _arxiv_ids(dates, rng)

    papers: list[Paper] = []
    cell_of = array("i")
    alias_named = bytearray(n)
    for i in range(n):
        t = task_draws[i]
        order = method_orders.get(t)
        if order is None:
            order = method_orders[t] = rng.sample(range(len(methods)), len(methods))
        m = order[method_ranks[i]]
        c = cell_index.get((t, m))
        if c is None:
            c = cell_index[(t, m)] = len(cells)
            cells.append((t, m))
        cell_of.append(c)
        aliased = rng.random() < ALIAS_SHARE
        alias_named[i] = aliased
        name = coiner.word(rng.choice((2, 3))).capitalize()
        task, method, alias = tasks[t], methods[m], aliases[m]
        field_name = field_of_task[t][0]
        title = _title(rng, task, method, alias, name, aliased)
        has_abstract = rng.random() >= NO_ABSTRACT_SHARE
        mention = not aliased and rng.random() < ALIAS_MENTION_SHARE
        abstract = _abstract(rng, task, method, alias, name, field_name, aliased, mention) if has_abstract else ""
        authors = tuple(dict.fromkeys(_author(rng, n) for _ in range(rng.randint(1, 6))))
        y, mo, d = dates[i]
        papers.append(Paper(ids[i], title, abstract, y, authors, f"{y:04d}-{mo:02d}-{d:02d}", "cs.LG"))

    citing, cited = _citations(rng, n, cell_of, cells)
    world = ScholarWorld(seed, size, papers, cell_of, alias_named, cells, tasks, methods, aliases, citing, cited)
    world.splits = _queries(world, rng, preset.queries) if with_queries else {n: () for n, _ in SPLIT_SHARES}
    return world


_AUTHOR_POOL: dict[int, list[str]] = {}


def _author(rng: random.Random, n: int) -> str:
    """A name from a shared pool (prolific authors recur, Zipf-like)."""
    pool = _AUTHOR_POOL.get(n)
    if pool is None:
        names_rng = random.Random(f"authors/{n}")
        coiner = _Coiner(names_rng, set())
        pool = _AUTHOR_POOL[n] = [
            f"{names_rng.choice('ABCDEFGHJKLMNPRSTVW')}. {coiner.word(1).capitalize()}{names_rng.choice(_SURNAME_ENDS)}"
            for _ in range(max(50, n // 20))
        ]
    if rng.random() < 0.6:
        return pool[rng.randrange(len(pool))]
    index = min(int(rng.paretovariate(1.2)) - 1, len(pool) - 1)  # the prolific few
    return pool[(index * 7919) % len(pool)]


def _citations(rng: random.Random, n: int, cell_of: array, cells: list[tuple[int, int]]) -> tuple[array, array]:
    """References to older papers by preferential attachment within the paper's cell, task, method or world.

    An urn holds each paper once, plus once more per citation it received: a uniform draw from the urn is
    a draw proportional to 1 + in-degree (Price's model), which gives a heavy-tailed in-degree."""
    urns: dict[tuple[str, int], array] = {}
    world_urn = array("i")
    citing, cited = array("i"), array("i")
    names = [name for name, _ in REF_SOURCES]
    weights = [w for _, w in REF_SOURCES]

    def keys(paper: int) -> tuple[tuple[str, int], ...]:
        t, m = cells[cell_of[paper]]
        return ("cell", cell_of[paper]), ("task", t), ("method", m)

    for i in range(n):
        own = keys(i)
        wanted = min(MAX_REFS, int(rng.lognormvariate(REFS_LOG_MEAN, REFS_LOG_SD)), i)
        refs: set[int] = set()
        cell_urn = urns.get(own[0])
        if cell_urn:
            refs.add(cell_urn[rng.randrange(len(cell_urn))])
        for source in rng.choices(names, weights=weights, k=wanted):
            urn = world_urn if source == "world" else urns.get(own[names.index(source)])
            if not urn:
                urn = world_urn
            if urn:
                refs.add(urn[rng.randrange(len(urn))])
        for r in sorted(refs):
            citing.append(i)
            cited.append(r)
            world_urn.append(r)
            for key in keys(r):
                urns[key].append(r)
        world_urn.append(i)
        for key in own:
            urns.setdefault(key, array("i")).append(i)
    return citing, cited


def _queries(world: ScholarWorld, rng: random.Random, limit: int) -> dict[str, tuple[PaperTask, ...]]:
    papers = world.papers
    members: dict[int, list[int]] = {}
    for i, c in enumerate(world.cell_of):
        if papers[i].abstract:
            members.setdefault(c, []).append(i)
    candidates = [c for c, ms in members.items() if MIN_GOLD <= len(ms) <= MAX_GOLD
                  and any(world.alias_named[i] for i in ms) and not all(world.alias_named[i] for i in ms)]
    rng.shuffle(candidates)
    if not candidates:
        return {name: () for name, _ in SPLIT_SHARES}
    neighbours = _capped_neighbours(world)
    chosen = []
    for c in candidates:
        gold = set(members[c])
        if _reachable(gold, [i for i in gold if not world.alias_named[i]], neighbours):
            chosen.append(c)
        if len(chosen) >= limit:
            break
    tasks = []
    for k, c in enumerate(chosen):
        t, m = world.cells[c]
        task, method = world.tasks[t], world.methods[m]
        question = rng.choice(vocab.QUESTION_TEMPLATES).format(m=method, t=task)
        gold = sorted(members[c])
        tasks.append(PaperTask(
            id=f"synthscholar-{world.seed}-{world.size}-{k}",
            question=question,
            gold=tuple(papers[i].arxiv_id for i in gold),
            gold_titles=tuple(papers[i].title for i in gold),
            search_phrases=(f"{method} {task}", f"{method} for {task}"),
            alias_phrases=(f"{world.aliases[m]} {task}",),
        ))
    splits, start = {}, 0
    for name, share in SPLIT_SHARES:
        end = len(tasks) if name == SPLIT_SHARES[-1][0] else start + round(share * len(tasks))
        splits[name] = tuple(tasks[start:end])
        start = end
    return splits


def _capped_neighbours(world: ScholarWorld):
    """paper -> what an expand shows (citations newest first up to 30, references up to 99), lazily."""
    refs: dict[int, list[int]] = {}
    cits: dict[int, list[int]] = {}
    for a, b in zip(world.citing, world.cited):
        refs.setdefault(a, []).append(b)
        cits.setdefault(b, []).append(a)
    papers = world.papers

    def order(ids: list[int]) -> list[int]:  # the database's order: date descending, then id
        return sorted(ids, key=lambda i: (_neg_date(papers[i].date), papers[i].arxiv_id))

    def neighbours(i: int) -> set[int]:
        return set(order(cits.get(i, []))[:CITATIONS_CAP]) | set(order(refs.get(i, []))[:REFERENCES_CAP])

    return neighbours


def _neg_date(date: str) -> tuple[int, ...]:
    return tuple(-int(x) for x in date.split("-"))


def _reachable(gold: set[int], start: list[int], neighbours) -> bool:
    """Every gold paper within ``MAX_HOPS`` expands of ``start``, expanding gold papers only."""
    found, frontier = set(start), list(start)
    for _ in range(MAX_HOPS):
        nxt = []
        for i in frontier:
            for j in neighbours(i) & gold:
                if j not in found:
                    found.add(j)
                    nxt.append(j)
        frontier = nxt
    return found >= gold


@lru_cache(maxsize=4)
def cached_world(seed: int, size: str) -> ScholarWorld:
    """One world per ``(seed, size)`` per process: envs of a vector env in one process share it."""
    return generate_world(seed, size)
