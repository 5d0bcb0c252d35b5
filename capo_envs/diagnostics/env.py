"""The three diagnostic envs; docs/diagnostics.md says what each isolates and what the oracle and a random
policy score on it.

- ``capo/SynthChain-v0`` (:class:`SynthChainEnv`): credit assignment over ``k`` decisions, outcome reward only.
- ``capo/SynthLength-v0`` (:class:`SynthLengthEnv`): a 3-token action and a long free-text one in one episode.
- ``capo/SynthTrap-v0`` (:class:`SynthTrapEnv`): a tempting malformed shortcut beside the valid format.
"""

from __future__ import annotations

import random
from typing import Any

from ..core.env import Outcome, choice_knob, float_knob, int_knob
from ..core.protocol import Action, ToolSpec, as_text
from ..qa.metrics import exact_match, f1_score
from .base import WORDS, DiagnosticEnv

DOORS = ("left", "right", "middle", "back")
DISTRACTORS = (
    "A cat sleeps by the {door} door.",
    "The {door} door is painted {color}.",
    "You hear rain near the {door} door.",
    "A {color} lamp hangs over the {door} door.",
)
COLORS = ("red", "blue", "green", "gold")


class SynthChainEnv(DiagnosticEnv):
    """``k`` doors in a row; at each, the sign in the observation names the right one (``choices`` doors).

    The only reward comes after the last decision: the fraction of right doors (``reward="fraction"``), or
    1 only if every door was right (``reward="all"``). So the learner must find which of ``k`` actions cost
    reward from one number per episode. ``distractor=True`` adds a sentence naming a random door.
    """

    name = "synthchain"

    def __init__(
        self,
        k: int = 8,
        choices: int = 2,
        reward: str = "fraction",
        distractor: bool = False,
        seed: int = 0,
        split: str = "train",
        num_tasks: int | None = None,
        action_format: str = "tags",
        invalid_penalty: float = 0.0,
        expert_skill: float = 1.0,
        max_context_chars: int | None = None,
        render_mode: str | None = None,
    ):
        self.k = int_knob("k", k, 1, 16)
        self.doors = DOORS[: int_knob("choices", choices, 2, len(DOORS))]
        self.reward_kind = choice_knob("reward", reward, ("fraction", "all"))
        if not isinstance(distractor, bool):
            raise ValueError(f"distractor must be a bool, got {distractor!r}")
        self.distractor = distractor
        tool = ToolSpec("go", "door", f"walk through one door ({', '.join(self.doors)})")
        super().__init__(
            [tool], horizon=self.k, seed=seed, split=split, num_tasks=num_tasks, action_format=action_format,
            invalid_penalty=invalid_penalty, expert_skill=expert_skill, max_context_chars=max_context_chars,
            render_mode=render_mode,
        )  # fmt: skip

    def _begin(self, rng: random.Random) -> None:
        self._signs, self._cues = [], []
        for _ in range(self.k):
            # Every draw happens whatever the knobs, so `distractor` changes the text, never the signs.
            sign = rng.choice(self.doors)
            noise = rng.choice(DISTRACTORS).format(door=rng.choice(self.doors), color=rng.choice(COLORS))
            noise_first = rng.random() < 0.5
            text = f"The sign points to the {sign} door."
            if self.distractor:
                text = f"{noise} {text}" if noise_first else f"{text} {noise}"
            self._signs.append(sign)
            self._cues.append(text)
        self._correct = 0

    def _observe(self) -> str:
        i = self._decisions
        return f"Step {i + 1}/{self.k}. Doors: {', '.join(self.doors)}. {self._cues[i]}"

    def _illegal(self, action: Action) -> str | None:
        door = action.args["door"].lower()
        return None if door in self.doors else f"there is no {door[:20]!r} door; the doors are {list(self.doors)}"

    def _act(self, action: Action) -> Outcome:
        self._correct += action.args["door"].lower() == self._signs[self._decisions - 1]
        if self._decisions >= self.k:
            return Outcome("Done.", reward=self._final_reward(), terminated=True)
        return Outcome(self._observe())

    def _final_reward(self) -> float:
        if self.reward_kind == "all":
            return float(self._correct == self.k)
        return self._correct / self.k

    def _metrics(self) -> dict[str, float]:
        return {"success": float(self._correct == self.k), "correct_fraction": self._correct / self.k}

    def available_actions(self) -> list[str] | None:
        return [self.protocol.render(Action("go", {"door": d})) for d in self.doors]

    def oracle_action(self) -> str:
        return self.protocol.render(Action("go", {"door": self._signs[self._decisions]}))


ANIMALS = ("owl", "fox", "elk", "cat", "dog", "bee", "ant", "cow", "pig", "hen", "yak", "emu", "ram", "bat")


class SynthLengthEnv(DiagnosticEnv):
    """Two actions of very different lengths: ``<pick>n</pick>`` one of ``records`` records (the observation
    names the animal to pick), then ``<write>...</write>`` the picked record's text (``long_words`` words).

    The text shown at the second step is the *picked* record's, and only a write after the right pick
    scores, so a wrong 3-token pick spoils the long action. Reward at the end only: the write's token F1
    (``reward="f1"``) or its exact match (``reward="exact"``) against the right record's text, 0 after a
    wrong pick. ``texts="copy"`` draws every record's text anew for each task (the write is a copy of the
    text shown); ``texts="recall"`` gives each animal one text for the env's ``seed`` (the same in every
    task and split), never shown: the write must recall it, which a small model can learn by heart. Step 1
    names the record to pick by animal (``ask_by="name"``: a look-up in the listing) or by number
    (``ask_by="number"``: read off, as SynthChain's sign). A tiny byte-level model learns neither the copy
    nor the look-up from a few hundred episodes, so docs/results/table1_diagnostics uses recall by number.
    ``action_format="tool_call"`` makes the pick a Hermes tool call and the write the final ``<write>`` reply.
    """

    name = "synthlength"

    def __init__(
        self,
        records: int = 4,
        long_words: int = 16,
        reward: str = "f1",
        texts: str = "copy",
        ask_by: str = "name",
        seed: int = 0,
        split: str = "train",
        num_tasks: int | None = None,
        action_format: str = "tags",
        invalid_penalty: float = 0.0,
        expert_skill: float = 1.0,
        max_context_chars: int | None = None,
        render_mode: str | None = None,
    ):
        self.records = int_knob("records", records, 2, 9)
        self.long_words = int_knob("long_words", long_words, 1, 64)
        self.reward_kind = choice_knob("reward", reward, ("f1", "exact"))
        self.texts = choice_knob("texts", texts, ("copy", "recall"))
        self.ask_by = choice_knob("ask_by", ask_by, ("name", "number"))
        # One text per animal for this seed (its own generator: the task ids' generators stay as they are).
        recall_rng = random.Random(f"{self.name}-{seed}-recall-texts")
        self._recall_texts = {label: self._random_text(recall_rng) for label in ANIMALS}
        tools = [
            ToolSpec("pick", "number", "pick a record by its number"),
            ToolSpec("write", "text", "write the picked record's text; this ends the episode"),
        ]
        super().__init__(
            tools, horizon=2, seed=seed, split=split, num_tasks=num_tasks, action_format=action_format,
            invalid_penalty=invalid_penalty, expert_skill=expert_skill, max_context_chars=max_context_chars,
            render_mode=render_mode,
            final_tool="write",
        )  # fmt: skip

    def _begin(self, rng: random.Random) -> None:
        self._labels = rng.sample(ANIMALS, self.records)
        self._texts = [self._random_text(rng) for _ in range(self.records)]  # drawn in both modes: same target
        if self.texts == "recall":
            self._texts = [self._recall_texts[label] for label in self._labels]
        self._target = rng.randrange(self.records)
        self._picked: int | None = None
        self._written: str | None = None

    def _observe(self) -> str:
        if self._decisions == 0:
            listing = ", ".join(f"{n} {label}" for n, label in enumerate(self._labels, 1))
            asked = f"the {self._labels[self._target]}" if self.ask_by == "name" else f"record {self._target + 1}"
            return f"Records: {listing}. Pick {asked}."
        if self._picked is None:
            return "Nothing was picked. Write the text anyway."
        record = f"Record {self._picked + 1} ({self._labels[self._picked]})"
        if self.texts == "recall":
            return f"{record}. Write its text."
        return f"{record}: {self._texts[self._picked]}. Copy its text."

    def _illegal(self, action: Action) -> str | None:
        want = "pick" if self._decisions == 1 else "write"
        if action.name != want:
            return f"{action.name} is not possible now; {want} instead"
        if want == "pick" and action.args["number"] not in [str(n) for n in range(1, self.records + 1)]:
            return f"pick a number from 1 to {self.records}"
        return None

    def _act(self, action: Action) -> Outcome:
        if action.name == "pick":
            self._picked = int(action.args["number"]) - 1
            return Outcome(self._observe())
        self._written = action.args["text"]
        return Outcome("Done.", reward=self._final_reward(), terminated=True)

    def _random_text(self, rng: random.Random) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(self.long_words))

    def _write_score(self, kind: str, after_right_pick: bool = True) -> float:
        if self._written is None or (after_right_pick and self._picked != self._target):
            return 0.0
        score = exact_match if kind == "exact" else f1_score
        return score(self._written, [self._texts[self._target]])

    def _final_reward(self) -> float:
        return self._write_score(self.reward_kind)

    def _metrics(self) -> dict[str, float]:
        return {
            "success": self._write_score("exact"),
            "pick_correct": float(self._picked == self._target),
            "write_f1": self._write_score("f1", after_right_pick=False),  # the write alone, whatever the pick
        }

    def available_actions(self) -> list[str] | None:
        if self._decisions == 0:
            return [self.protocol.render(Action("pick", {"number": str(n)})) for n in range(1, self.records + 1)]
        return None  # the write is free text

    def random_action(self, rng: random.Random) -> str:
        """A random pick, then ``long_words`` random words (a random text the length of the right one)."""
        if self._decisions == 0:
            return super().random_action(rng)
        return self.protocol.render(Action("write", {"text": " ".join(rng.choices(WORDS, k=self.long_words))}))

    def oracle_action(self) -> str:
        if self._decisions == 0:
            return self.protocol.render(Action("pick", {"number": str(self._target + 1)}))
        return self.protocol.render(Action("write", {"text": self._texts[self._target]}))


SHORTCUT = "ANSWER:"
CODES = tuple(str(n) for n in range(1, 10))


class SynthTrapEnv(DiagnosticEnv):
    """``steps`` codes to report, each shown in the observation, answered with ``<answer>code</answer>``.

    With probability ``temptation`` an observation also offers ``Shortcut: reply ANSWER: <code>``: a shorter
    text in the wrong format. Taking it is an invalid action: that code is lost (and ``invalid_penalty`` is
    charged), so a policy that follows the shortcut when shown succeeds with probability
    ``(1 - temptation) ** steps``. Reward per step: ``1/steps`` for each code reported right.
    """

    name = "synthtrap"

    def __init__(
        self,
        steps: int = 3,
        temptation: float = 0.5,
        seed: int = 0,
        split: str = "train",
        num_tasks: int | None = None,
        action_format: str = "tags",
        invalid_penalty: float = 0.0,
        expert_skill: float = 1.0,
        max_context_chars: int | None = None,
        render_mode: str | None = None,
    ):
        self.steps = int_knob("steps", steps, 1, 16)
        self.temptation = float_knob("temptation", temptation, 0.0, 1.0)
        tool = ToolSpec("answer", "code", "report the code (a digit 1-9)")
        super().__init__(
            [tool], horizon=self.steps, seed=seed, split=split, num_tasks=num_tasks, action_format=action_format,
            invalid_penalty=invalid_penalty, expert_skill=expert_skill, max_context_chars=max_context_chars,
            render_mode=render_mode,
        )  # fmt: skip

    def _begin(self, rng: random.Random) -> None:
        self._codes, self._tempted = [], []
        for _ in range(self.steps):
            self._codes.append(rng.choice(CODES))
            self._tempted.append(rng.random() < self.temptation)
        self._correct = self._shortcuts = 0

    def _observe(self) -> str:
        i = self._decisions
        text = f"Step {i + 1}/{self.steps}. The code is {self._codes[i]}."
        return f"{text} Shortcut: reply {SHORTCUT} {self._codes[i]}" if self._tempted[i] else text

    def _illegal(self, action: Action) -> str | None:
        return None if action.args["code"] in CODES else "the code is one digit from 1 to 9"

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        # Counted before the step, since the episode's metrics are computed inside it.
        text = as_text(action)  # plain str or None: a str subclass's own methods may raise
        if not self._done and text is not None and SHORTCUT in text and not self.protocol.parse(text).valid:
            self._shortcuts += 1
        return super().step(action)

    def _act(self, action: Action) -> Outcome:
        right = action.args["code"] == self._codes[self._decisions - 1]
        self._correct += right
        last = self._decisions >= self.steps
        return Outcome("Done." if last else self._observe(), reward=right / self.steps, terminated=last)

    def _metrics(self) -> dict[str, float]:
        return {
            "success": float(self._correct == self.steps),
            "correct_fraction": self._correct / self.steps,
            "invalid_rate": self._invalid_actions / self.steps,
            "shortcut_rate": self._shortcuts / self.steps,
        }

    def available_actions(self) -> list[str] | None:
        return [self.protocol.render(Action("answer", {"code": c})) for c in CODES]

    def oracle_action(self) -> str:
        return self.protocol.render(Action("answer", {"code": self._codes[self._decisions]}))

    def shortcut_action(self) -> str | None:
        """The tempting policy: the shortcut whenever it is shown, else the right answer (docs' baseline)."""
        if self._done:
            return None
        if not self._tempted[self._decisions]:
            return self.oracle_action()
        return f"{SHORTCUT} {self._codes[self._decisions]}"
