"""Multi-hop question answering by searching a corpus: one env class for every QA dataset.

An episode: the question; each action either searches (the observation is the top-k passages inside
``<information>``) or answers (the episode terminates, reward = exact match). Running out of steps
truncates the episode with reward 0. ``support_reward`` optionally adds a shaped process reward for
finding the supporting passages; ``info["metrics"]["em"]`` stays the benchmark's score.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence

from ..core.env import MAX_COUNT, Outcome, TextEnv, choice_knob, float_knob, int_knob
from ..core.paths import dataset_dir, require
from ..core.protocol import Action
from ..retrieval.base import Hit, Retriever
from .metrics import exact_match, f1_score
from .protocol import make_qa_protocol
from .task import QATask

NO_ANSWER = "unknown"  # what the oracle answers when its searches missed a gold passage


# What a guesser answers with: a name's capitalised word or a number, as the passages read.
GUESS_WORD = re.compile(r"\b(?:[A-Z][a-z]+|[0-9]+)\b")
# A typed guesser's names: runs of capitalised words ("Troulir Prirwald"), less a sentence's first word.
NAME_RUN = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*\b")
NUMBER = re.compile(r"\b[0-9]+\b")
SENTENCE_OPENERS = frozenset({"The", "It", "Its", "A", "An", "In", "He", "She", "His", "Her", "They", "This"})
GUESS_MODES = ("word", "typed", "early")


def format_passages(hits: Sequence[Hit], max_chars: int | None) -> str:
    """Search-R1's observation layout: numbered passages with their titles inside <information>."""
    lines = []
    for rank, hit in enumerate(hits, 1):
        text = hit.text if max_chars is None or len(hit.text) <= max_chars else hit.text[:max_chars] + "..."
        lines.append(f"Doc {rank} (Title: {hit.title}) {text}")
    body = "\n".join(lines) if lines else "No passages found."
    return f"<information>{body}</information>"


class MultiHopQAEnv(TextEnv):
    """Answer ``tasks`` by searching with ``retriever``.

    ``k`` passages per search and ``max_steps`` actions per episode (the paper's defaults: 5 and 5).
    ``action_format`` is ``"tags"`` (``<search>q</search>``, ``<answer>a</answer>``) or ``"tool_call"``
    (Hermes JSON calls). ``forced_first_search`` appends the results of searching the raw question to the
    first observation, as the CAPO recipe does. ``support_reward`` (default 0: outcome reward only, as
    in the benchmarks) is the reward of a search for each supporting passage it shows for the first time:
    a step reward for the hop that found the bridge entity, which an action-level critic can credit.
    ``guess`` is what ``random_action`` answers (an erring demonstrator's mistake, ``sft.expert_skill``):
    ``"word"`` any capitalised word or number seen; ``"typed"`` a number seen when the gold answer is a
    number, else a name seen (a run of capitalised words), so that a guess is the plausible wrong answer
    of answering before the last hop (the first passage's year), not noise; ``"early"`` a typed guess
    only while a supporting passage is unseen, and no guess once all are found (the expert acts), so
    that the demonstrator's one mistake is answering before the last hop, never the value after it.
    """

    def __init__(
        self,
        tasks: Sequence[QATask],
        retriever: Retriever,
        *,
        k: int = 5,
        max_steps: int = 5,
        action_format: str = "tags",
        invalid_penalty: float = 0.0,
        max_passage_chars: int | None = 1200,
        forced_first_search: bool = False,
        support_reward: float = 0.0,
        max_context_chars: int | None = None,
        guess: str = "word",
        render_mode: str | None = None,
    ):
        choice_knob("guess", guess, GUESS_MODES)
        if not tasks:
            raise ValueError("MultiHopQAEnv needs at least one task")
        int_knob("k", k, 1, MAX_COUNT)
        float_knob("support_reward", support_reward, 0.0, math.inf)
        super().__init__(
            make_qa_protocol(action_format),
            max_steps=max_steps,
            invalid_penalty=invalid_penalty,
            max_context_chars=max_context_chars,
            render_mode=render_mode,
        )
        self.tasks = {t.id: t for t in tasks}
        self._ids = tuple(self.tasks)
        self.retriever = retriever
        self.k = k
        self.max_passage_chars = max_passage_chars
        self.forced_first_search = forced_first_search
        self.support_reward = float(support_reward)
        self.guess = guess
        self._task: QATask | None = None
        self._searched: list[str] = []
        self._seen_titles: set[str] = set()
        self._seen_guesses: list[str] = []
        self._seen_texts: list[str] = []
        self._answer: str | None = None

    # --- TextEnv hooks ---------------------------------------------------------------------------------
    def task_ids(self) -> Sequence[str]:
        return self._ids

    def _start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._task = self.tasks[task_id]
        self._searched, self._seen_titles, self._seen_guesses, self._seen_texts = [], set(), [], []
        self._answer = None
        observation = f"Question: {self._task.question}"
        if self.forced_first_search:
            observation += "\n" + self._search(self._task.question)
        return observation, {"question": self._task.question}

    def _act(self, action: Action) -> Outcome:
        if action.name == "search":
            query = action.args["query"]
            gold = set(self._task.supporting_titles)
            found_before = len(self._seen_titles & gold)
            observation = self._search(query)
            newly_found = len(self._seen_titles & gold) - found_before
            return Outcome(observation, reward=self.support_reward * newly_found, info={"query": query})
        self._answer = action.args["answer"]
        em = exact_match(self._answer, self._task.answers)
        return Outcome(f"Your answer: {self._answer}", reward=em, terminated=True)

    def _metrics(self) -> dict[str, float]:
        answered = self._answer is not None
        golds = self._task.answers
        titles = self._task.supporting_titles
        return {
            "em": exact_match(self._answer, golds) if answered else 0.0,
            "f1": f1_score(self._answer, golds) if answered else 0.0,
            "answered": float(answered),
            "searches": float(len(self._searched)),
            "support_recall": (sum(t in self._seen_titles for t in titles) / len(titles)) if titles else 0.0,
        }

    def expert_action(self) -> str | None:
        """An oracle that follows the gold hops: search each hop's query, then answer.

        It answers the gold answer only if every gold passage was actually retrieved, so its success rate
        measures whether the tasks are solvable with this retriever and ``k``.
        """
        task = self._task
        if task is None or self._done or not task.expert_queries:
            return None
        remaining = [q for q in task.expert_queries if q not in self._searched]
        steps_left = self.max_steps - self._steps
        if remaining and steps_left > 1:
            return self.protocol.render(Action("search", {"query": remaining[0]}))
        answer = task.answers[0] if self.found_all_support() else NO_ANSWER
        return self.protocol.render(Action("answer", {"answer": answer}))

    def found_all_support(self) -> bool:
        """Whether every gold passage of the current task has been retrieved (the expert's answer is right)."""
        return all(t in self._seen_titles for t in self._task.supporting_titles)

    def random_action(self, rng) -> str | None:
        """A guess: answer with a capitalised word or a number drawn from the passages seen so far (the
        answers are names and years, so a guess is sometimes right), or with ``guess="typed"`` a name or
        number of the gold answer's kind; None before any search, when the expert acts (and with
        ``guess="early"`` once every supporting passage has been seen). Free-text searches are never drawn."""
        if self._task is None or self._done or not self._seen_guesses:
            return None
        if self.guess == "early" and self.found_all_support():
            return None
        guesses = self._seen_guesses
        if self.guess in ("typed", "early"):
            seen = [n for n in self._typed_guesses() if n]
            guesses = seen or guesses
        return self.protocol.render(Action("answer", {"answer": rng.choice(guesses)}))

    def _typed_guesses(self) -> list[str]:
        """The names (or, for a numeric gold answer, the numbers) in the passages seen so far, in order."""
        text = " ".join(self._seen_texts)
        if self._task.answers and self._task.answers[0].strip().isdigit():
            found = NUMBER.findall(text)
        else:
            found = [" ".join(w for w in run.split() if w not in SENTENCE_OPENERS) for run in NAME_RUN.findall(text)]
        return list(dict.fromkeys(found))

    def close(self) -> None:
        if self.retriever is not None:
            self.retriever.close()
        super().close()

    # --- helpers -------------------------------------------------------------------------------------------
    def _search(self, query: str) -> str:
        hits = self.retriever.search([query], self.k)[0]
        self._searched.append(query)
        self._seen_titles.update(h.title for h in hits)
        observation = format_passages(hits, self.max_passage_chars)
        self._seen_guesses.extend(w for h in hits for w in GUESS_WORD.findall(h.text) if w not in self._seen_guesses)
        self._seen_texts.extend(h.text for h in hits)
        return observation


def corpus_paths(dataset: str, corpus: str, retriever: str) -> tuple[Path, Path]:
    """Resolve the corpus kwarg to (corpus.jsonl, index dir): the dataset's own, wiki18, or a user file."""
    if corpus in ("default", dataset):
        root = dataset_dir(dataset)
        return root / "corpus.jsonl", root / "index" / retriever
    if corpus == "wiki18":
        root = dataset_dir("wiki18")
        return root / "corpus.jsonl", root / "index" / retriever
    path = Path(corpus).expanduser()
    return path, path.with_name(path.name + ".index") / retriever


def make_qa_env(
    dataset: str,
    split: str = "dev",
    corpus: str = "default",
    retriever: str = "bm25",
    **env_kwargs: Any,
) -> MultiHopQAEnv:
    """Build the env for a prepared public dataset (HotpotQA, 2WikiMultihopQA, MuSiQue)."""
    from ..retrieval import open_retriever
    from .datasets import load_split

    tasks = load_split(dataset, split)
    prepare = f"capo data prepare {dataset if corpus == 'default' else corpus}"
    if retriever.startswith(("http://", "https://")):
        return MultiHopQAEnv(tasks, open_retriever(retriever), **env_kwargs)
    corpus_file, index_dir = corpus_paths(dataset, corpus, retriever)
    require(corpus_file, f"the corpus {corpus!r}", prepare)
    return MultiHopQAEnv(tasks, open_retriever(retriever, corpus=corpus_file, index_dir=index_dir), **env_kwargs)
