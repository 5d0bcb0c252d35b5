"""Academic paper search (PaSa / the CAPO authors' flow): search and expand to build a pool of papers.

An episode: a scholarly query. Each action holds up to ``max_calls`` (5) calls:

* ``search(query)``: the top ``search_limit`` (10) papers of the database (its FTS5 BM25 search, or
  ``retriever="bm25" | "dense" | "hybrid"``: capo's retrievers over the same papers), shown with id, title, year,
  authors and abstract; the new ones scored by the selector join the pool (those under ``min_score``,
  0.01, are dropped, as in the CAPO flow);
* ``expand(paper_id)``: a pool paper's citations (at most 30, newest first) and references (at most 99),
  papers without an abstract dropped, scored and pooled the same way;
* ``stop`` alone ends the episode (``terminated``); the step budget (``max_steps``, 5) truncates it.

Papers are named by their arXiv id (PaSa's protocol). ``paper_handles="pool"`` names each pool paper by a
short handle instead, ``P1``, ``P2``, ... in the order it joined the pool (stable within an episode), and
``expand`` takes that handle (or still an arXiv id): a CPU preset for small models, which copy a 3-token
handle where they miscopy a 10-digit id (SmolLM2 wrote the year printed beside it).

A repeated query, or expanding a paper that is not in the pool or was expanded already, is refused and
costs ``invalid_call_penalty`` (0.5, the paper's value); the action's other calls still run. A malformed
action is invalid as a whole (TextEnv's rule: feedback, ``invalid_penalty``, nothing runs).

Rewards (``reward=``): ``"gold"`` (default): newly found gold papers, each worth 1/|gold|, so that an
episode's return is its recall; ``"selector"``: the paper's, per call the sum of the top-3 selector
scores of the papers it added; ``"mix"``: ``(1 - selector_weight) * gold + selector_weight * selector``.
At the end ``info["metrics"]`` holds precision/recall/F1 at all, 100, 50 and 25 of the pool ranked by
selector score, and ``success`` = recall at all.

``make_papersearch_env`` is the entry point of ``capo/PaperSearch-v0``: the env over PaSa's real queries
and a prepared database. ``capo data prepare papers`` writes ``$CAPO_DATA_DIR/papers/``: ``papers.sqlite``
(arXiv metadata and citation edges, see ``db.py``), ``queries/AutoScholarQuery/{train,dev,test}.jsonl`` and
``queries/RealScholarQuery/test.jsonl`` (PaSa's files as released: ``question``, ``answer`` titles,
``answer_arxiv_id``, ``source_meta.published_time``, ``qid``), and ``manifest.json`` last. Gold ids are
normalised (a version suffix such as ``1803.00316v1`` is stripped, as the CAPO evaluation does). Each
query's ``published_time`` is its date cut-off: search and expand hide later papers (``use_cutoff=False``
shows everything), as PaSa restricts its searches to before the source paper. ``capo/SynthScholar-v0``
(``synth.py``) runs the same env over a generated world (``world.py``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..core.env import MAX_COUNT, Outcome, TextEnv, choice_knob, float_knob, int_knob
from ..core.paths import dataset_dir, require
from ..core.protocol import Action
from .db import Paper, PaperDB
from .ids import normalize_arxiv_id
from .metrics import retrieval_metrics
from .protocol import DEFAULT_MAX_CALLS, MultiAction, make_paper_protocol, render_calls
from .selector import make_selector
from .world import PaperTask

REWARDS = ("gold", "selector", "mix")
TOP_SCORES = 3  # the CAPO reward sums the top-3 scores of a call's new papers
EXPERT_MODES = ("full", "search")
PAPER_HANDLES = ("arxiv", "pool")


@dataclass
class PoolEntry:
    paper: Paper
    score: float
    source: str  # "search" or "expand"
    origin: str  # the query, or the id of the expanded paper
    order: int
    expanded: bool = False

    @property
    def handle(self) -> str:
        return f"P{self.order + 1}"


def _query_key(query: str) -> str:
    """Queries count as repeated when equal after case folding and whitespace collapsing."""
    return " ".join(query.casefold().split())


def _open_retriever(db: PaperDB, retriever: Any, index_dir: str | None):
    """None for the database's own FTS5 search (``"fts"``); else one of capo's retrievers over the same
    papers (``"bm25"``, ``"dense"``, ``"hybrid"``: the foundation's BM25 + dense fusion, or a ``Retriever``),
    built from title + abstract, or loaded from ``index_dir``."""
    if retriever is None or retriever == "fts":
        return None
    if not isinstance(retriever, str):
        return retriever
    from ..retrieval import Passage, open_retriever

    passages = [Passage(p.arxiv_id, p.title, p.abstract) for p in db.iter_papers()]
    return open_retriever(retriever, passages=passages, index_dir=index_dir)


class PaperSearchEnv(TextEnv):
    """Find the papers ``tasks`` ask for in ``db``. See the module docstring for actions and rewards."""

    def __init__(
        self,
        db: PaperDB,
        tasks: Sequence[PaperTask],
        *,
        selector: Any = "lexical",
        reward: str = "gold",
        selector_weight: float = 0.5,
        max_steps: int = 5,
        max_calls: int = DEFAULT_MAX_CALLS,
        search_limit: int = 10,
        citations_limit: int = 30,
        references_limit: int = 99,
        min_score: float = 0.01,
        invalid_call_penalty: float = 0.5,
        invalid_penalty: float = 0.0,
        action_format: str = "tags",
        stop_without_call: bool = False,
        pool_view: int = 10,
        shown_per_call: int = 10,
        max_abstract_chars: int = 200,
        use_cutoff: bool = True,
        retriever: Any = "fts",
        retriever_index: str | None = None,
        expert_mode: str = "full",
        paper_handles: str = "arxiv",
        max_context_chars: int | None = None,
        render_mode: str | None = None,
    ):
        if not tasks:
            raise ValueError("PaperSearchEnv needs at least one task")
        choice_knob("reward", reward, REWARDS)
        choice_knob("expert_mode", expert_mode, EXPERT_MODES)
        choice_knob("paper_handles", paper_handles, PAPER_HANDLES)
        for name, value in (("max_calls", max_calls), ("search_limit", search_limit), ("pool_view", pool_view)):
            int_knob(name, value, 1, MAX_COUNT)
        float_knob("selector_weight", selector_weight, 0.0, 1.0)
        super().__init__(
            make_paper_protocol(action_format, max_calls=max_calls, stop_without_call=stop_without_call,
                                by_handle=paper_handles == "pool"),
            max_steps=max_steps,
            invalid_penalty=invalid_penalty,
            max_context_chars=max_context_chars,
            render_mode=render_mode,
        )
        self.db = db
        self.tasks = {t.id: t for t in tasks}
        self._ids = tuple(self.tasks)
        self.selector = make_selector(selector)
        self.reward_kind, self.selector_weight = reward, float(selector_weight)
        self.search_limit, self.citations_limit, self.references_limit = search_limit, citations_limit, references_limit
        self.min_score, self.invalid_call_penalty = float(min_score), float(invalid_call_penalty)
        self.pool_view, self.shown_per_call, self.max_abstract_chars = pool_view, shown_per_call, max_abstract_chars
        self.use_cutoff, self.expert_mode, self.paper_handles = use_cutoff, expert_mode, paper_handles
        self.retriever = _open_retriever(db, retriever, retriever_index)
        self._task: PaperTask | None = None
        self._gold: frozenset[str] = frozenset()
        self._pool: dict[str, PoolEntry] = {}
        self._queries: set[str] = set()
        self._found_gold: set[str] = set()
        self._counts = {"searches": 0, "expands": 0, "refused_calls": 0}
        self._expand_cache: dict[str, list[Paper]] = {}

    # --- TextEnv hooks ---------------------------------------------------------------------------------
    def task_ids(self) -> Sequence[str]:
        return self._ids

    def _start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._task = self.tasks[task_id]
        self._gold = frozenset(self._task.gold)
        self._pool, self._queries, self._found_gold = {}, set(), set()
        self._counts = {"searches": 0, "expands": 0, "refused_calls": 0}
        self._expand_cache = {}
        observation = f"User Query: {self._task.question}\n\n{self._pool_text()}"
        return observation, {"question": self._task.question}

    def _act(self, action: Action) -> Outcome:
        if action.name == "stop":
            return Outcome(f"Search stopped with {len(self._pool)} papers in the pool.", terminated=True,
                           info={"new_papers": 0, "gold_new": 0})
        calls = action.calls if isinstance(action, MultiAction) and action.calls else (action,)
        blocks, reward, new_total, gold_before = [], 0.0, 0, len(self._found_gold)
        for call in calls:
            if call.name == "search":
                text, call_reward, new = self._search(call.args["query"])
            else:
                text, call_reward, new = self._expand(call.args["paper_id"])
            blocks.append(text)
            reward += call_reward
            new_total += new
        if isinstance(action, MultiAction) and action.dropped:
            blocks.append(f"({action.dropped} calls past the limit of {self.protocol.max_calls} were ignored.)")
        blocks.append(self._pool_text())
        gold_new = len(self._found_gold) - gold_before
        return Outcome("\n\n".join(blocks), reward=reward, info={"new_papers": new_total, "gold_new": gold_new})

    def _metrics(self) -> dict[str, float]:
        ranked = [e.paper.arxiv_id for e in sorted(self._pool.values(), key=lambda e: (-e.score, e.order))]
        metrics = retrieval_metrics(ranked, self._gold)
        return {
            "success": metrics["recall_all"],
            **metrics,
            "pool_size": float(len(self._pool)),
            "gold_found": float(len(self._found_gold)),
            "gold_total": float(len(self._gold)),
            "searches": float(self._counts["searches"]),
            "expands": float(self._counts["expands"]),
            "refused_calls": float(self._counts["refused_calls"]),
        }

    def close(self) -> None:
        if self.retriever is not None:
            self.retriever.close()
        if self.db is not None:
            self.db.close()
        self.selector.close()
        super().close()

    # --- the two calls ---------------------------------------------------------------------------------
    @property
    def _max_date(self) -> str | None:
        return self._task.cutoff if self.use_cutoff and self._task is not None else None

    def _refuse(self, what: str, why: str) -> tuple[str, float, int]:
        self._counts["refused_calls"] += 1
        return f"{what}: refused ({why}); -{self.invalid_call_penalty:g}", -self.invalid_call_penalty, 0

    def _search(self, query: str) -> tuple[str, float, int]:
        key = _query_key(query)
        if key in self._queries:
            return self._refuse(f"[Search] {query}", "this query was already searched")
        self._queries.add(key)
        self._counts["searches"] += 1
        hits = self._search_papers(query)
        kept, reward = self._add(hits, "search", query)
        lines = [f"[Search] {query}: {len(hits)} results, {len(kept)} new in the pool"]
        for paper in hits:
            entry = self._pool.get(paper.arxiv_id)
            mark = "" if entry is None else f" ({entry.score:.2f})"
            lines.append(self._paper_line(paper, mark, entry))
        return "\n".join(lines), reward, len(kept)

    def _search_papers(self, query: str) -> list[Paper]:
        if self.retriever is None:
            return self.db.search(query, self.search_limit, max_date=self._max_date)
        # Another index over the same papers: ask for more hits when a cut-off may hide some.
        depth = self.search_limit * (4 if self._max_date else 1)
        papers = [self.db.get(hit.id) for hit in self.retriever.search([query], depth)[0]]
        kept = [p for p in papers if p is not None and (not self._max_date or p.date <= self._max_date)]
        return kept[: self.search_limit]

    def _pool_entry(self, paper_id: str) -> PoolEntry | None:
        """The pool paper ``paper_id`` names: an arXiv id, or with ``paper_handles="pool"`` a handle (P3)."""
        if self.paper_handles == "pool":
            handle = re.fullmatch(r"[Pp](\d{1,9})", paper_id.strip(), re.ASCII)
            if handle:
                order = int(handle.group(1)) - 1
                return next((e for e in self._pool.values() if e.order == order), None)
        arxiv_id = normalize_arxiv_id(paper_id)
        return self._pool.get(arxiv_id) if arxiv_id else None

    def _name(self, entry: PoolEntry) -> str:
        return entry.handle if self.paper_handles == "pool" else entry.paper.arxiv_id

    def _expand(self, paper_id: str) -> tuple[str, float, int]:
        entry = self._pool_entry(paper_id)
        if entry is None:
            return self._refuse(f"[Expand] {paper_id}", "not a paper of your pool")
        if entry.expanded:
            return self._refuse(f"[Expand] {paper_id}", "already expanded")
        entry.expanded = True
        self._counts["expands"] += 1
        arxiv_id = entry.paper.arxiv_id
        linked = self._linked(arxiv_id)
        kept, reward = self._add(linked, "expand", arxiv_id)
        shown = sorted(kept, key=lambda e: -e.score)[: self.shown_per_call]
        lines = [f"[Expand] {self._name(entry)}: {len(linked)} linked papers, {len(kept)} new in the pool"]
        lines += [self._paper_line(e.paper, f" ({e.score:.2f})", e) for e in shown]
        if len(kept) > len(shown):
            lines.append(f"  ... and {len(kept) - len(shown)} more added to the pool")
        return "\n".join(lines), reward, len(kept)

    def _linked(self, arxiv_id: str) -> list[Paper]:
        linked = self._expand_cache.get(arxiv_id)
        if linked is None:
            linked = self._expand_cache[arxiv_id] = self.db.expand(
                arxiv_id, self.citations_limit, self.references_limit, max_date=self._max_date)
        return linked

    def _add(self, papers: Sequence[Paper], source: str, origin: str) -> tuple[list[PoolEntry], float]:
        """Score the papers not yet in the pool, keep those >= min_score; return them and the call's reward."""
        fresh = [p for p in dict((p.arxiv_id, p) for p in papers).values() if p.arxiv_id not in self._pool]
        scores = self.selector.score(self._task.question, fresh) if fresh else []
        kept = []
        for paper, score in zip(fresh, scores):
            if score < self.min_score:
                continue
            entry = PoolEntry(paper, float(score), source, origin, order=len(self._pool))
            self._pool[paper.arxiv_id] = entry
            kept.append(entry)
        gold_new = [e for e in kept if e.paper.arxiv_id in self._gold]
        self._found_gold.update(e.paper.arxiv_id for e in gold_new)
        gold_reward = len(gold_new) / len(self._gold) if self._gold else 0.0
        selector_reward = sum(sorted((e.score for e in kept), reverse=True)[:TOP_SCORES])
        if self.reward_kind == "gold":
            return kept, gold_reward
        if self.reward_kind == "selector":
            return kept, selector_reward
        return kept, (1 - self.selector_weight) * gold_reward + self.selector_weight * selector_reward

    # --- observation text ------------------------------------------------------------------------------
    def _paper_line(self, paper: Paper, mark: str, entry: PoolEntry | None) -> str:
        """One paper of a search or expand result; ``entry`` is its pool entry (None: not pooled, so a
        handle-named paper shows its arXiv id, which no expand accepts)."""
        authors = ", ".join(paper.authors[:3]) + (" et al." if len(paper.authors) > 3 else "")
        year = paper.year if paper.year is not None else "n.d."
        name = self._name(entry) if entry is not None else paper.arxiv_id
        line = f"  [{name}]{mark} {paper.title} ({year}; {authors or 'unknown authors'})"
        if self.max_abstract_chars <= 0:  # titles only: short observations for small models
            return line
        abstract = paper.abstract
        if len(abstract) > self.max_abstract_chars:
            abstract = abstract[: self.max_abstract_chars].rstrip() + "..."
        return f"{line}\n    {abstract}"

    def _pool_text(self) -> str:
        if not self._pool:
            return "Paper pool: empty."
        entries = sorted(self._pool.values(), key=lambda e: (-e.score, e.order))
        expanded = [e for e in entries if e.expanded]
        open_ = [e for e in entries if not e.expanded]
        lines = [f"Paper pool: {len(entries)} papers, {len(expanded)} expanded. "
                 f"Top {min(self.pool_view, len(open_))} not yet expanded:"]
        lines += [f"  [{self._name(e)}] ({e.score:.2f}) {e.paper.title}" for e in open_[: self.pool_view]]
        if expanded:
            lines.append("Expanded: " + ", ".join(self._name(e) for e in expanded[: 3 * self.pool_view]))
        return "\n".join(lines)

    def random_action(self, rng) -> str | None:
        """Expand 1 to ``max_calls`` papers drawn at random from those the pool view shows not yet expanded
        (what a policy that expands what it sees would do); None before anything is in the pool."""
        if self._task is None or self._done:
            return None
        entries = sorted(self._pool.values(), key=lambda e: (-e.score, e.order))
        shown = [self._name(e) for e in entries if not e.expanded][: self.pool_view]
        if not shown:
            return None
        picked = rng.sample(shown, rng.randint(1, min(self.protocol.max_calls, len(shown))))
        return render_calls(self.protocol, [Action("expand", {"paper_id": pid}) for pid in picked])

    # --- the oracle ------------------------------------------------------------------------------------
    def expert_action(self) -> str | None:
        """An oracle that knows the gold set. It searches the query's key phrases first, then expands the
        pool papers whose citations or references hold the most gold papers not yet found (a greedy cover,
        read from the database), then searches the method's alias, then stops. ``expert_mode="search"``
        only searches the query's key phrases: the difference measures what expansion adds."""
        if self._task is None or self._done:
            return None
        task, max_calls = self._task, self.protocol.max_calls
        missing = set(self._gold) - self._found_gold
        if not missing:
            return render_calls(self.protocol, [])
        phrases = [p for p in (task.search_phrases or (task.question,)) if _query_key(p) not in self._queries]
        if phrases and not self._counts["searches"]:
            return render_calls(self.protocol, [Action("search", {"query": p}) for p in phrases[:max_calls]])
        calls: list[Action] = []
        if self.expert_mode == "full":
            remaining = set(missing)
            candidates = [pid for pid, e in self._pool.items() if not e.expanded and pid in self._gold]
            gains = {pid: {p.arxiv_id for p in self._linked(pid)} for pid in candidates}
            while remaining and len(calls) < max_calls:
                best = max(candidates, key=lambda pid: (len(gains[pid] & remaining), -self._pool[pid].order),
                           default=None)
                if best is None or not gains[best] & remaining:
                    break
                calls.append(Action("expand", {"paper_id": self._name(self._pool[best])}))
                remaining -= gains[best]
                candidates.remove(best)
        if not calls:
            aliases = task.alias_phrases if self.expert_mode == "full" else ()
            extra = [p for p in (*phrases, *aliases) if _query_key(p) not in self._queries]
            calls = [Action("search", {"query": p}) for p in extra[:max_calls]]
        return render_calls(self.protocol, calls)


# --- capo/PaperSearch-v0: PaSa's queries over the prepared database -----------------------------------

DATASET = "papers"
DB_FILE = "papers.sqlite"
QUERY_FILES = {
    "train": "AutoScholarQuery/train.jsonl",
    "dev": "AutoScholarQuery/dev.jsonl",
    "test": "AutoScholarQuery/test.jsonl",
    "realscholar": "RealScholarQuery/test.jsonl",
}
PREPARE = "capo data prepare papers"


def _cutoff(published: Any) -> str | None:
    text = str(published or "")
    if len(text) == 8 and text.isdigit():
        return f"{text[:4]}-{text[4:6]}-{text[6:]}"
    return None


def load_queries(path: str | Path) -> list[PaperTask]:
    """PaSa's JSONL queries as tasks; a query whose gold ids are all unusable is skipped."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            ids = row.get("answer_arxiv_id") or []
            titles = row.get("answer") or []
            gold, gold_titles = [], []
            for i, raw in enumerate(ids):
                arxiv_id = normalize_arxiv_id(raw)
                if arxiv_id and arxiv_id not in gold:
                    gold.append(arxiv_id)
                    gold_titles.append(" ".join(str(titles[i]).split()) if i < len(titles) else "")
            if not gold:
                continue
            tasks.append(PaperTask(
                id=str(row.get("qid") or f"{Path(path).stem}_{number}"),
                question=str(row["question"]),
                gold=tuple(gold),
                gold_titles=tuple(gold_titles),
                cutoff=_cutoff((row.get("source_meta") or {}).get("published_time")),
                search_phrases=(str(row["question"]),),
            ))
    return tasks


def make_papersearch_env(
    split: str = "dev",
    db: str | None = None,
    queries_dir: str | None = None,
    **env_kwargs: Any,
) -> PaperSearchEnv:
    """The env over the prepared database (or ``db``, any database ``build_database`` wrote), on the
    queries of ``split``: train, dev, test (AutoScholarQuery) or realscholar (RealScholarQuery)."""
    if split not in QUERY_FILES:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(QUERY_FILES)}")
    root = dataset_dir(DATASET)
    db_path = Path(db).expanduser() if db else require(root / DB_FILE, "the paper database", PREPARE)
    queries_root = Path(queries_dir).expanduser() if queries_dir else root / "queries"
    queries = require(queries_root / QUERY_FILES[split], f"the {split} queries", PREPARE)
    return PaperSearchEnv(PaperDB(db_path), load_queries(queries), **env_kwargs)
