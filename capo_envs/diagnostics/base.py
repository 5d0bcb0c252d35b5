"""What the diagnostic envs share: generated task ids per split, fixed-horizon episodes, legal-action checks.

A diagnostic episode is exactly ``horizon`` actions long. An invalid action (malformed, or well-formed but
not legal now, such as a door that does not exist) is not a free retry: it uses up that decision, scores
it wrong and, after the format feedback, shows the next decision's cue. Reaching the horizon ends the task
(``terminated``, never ``truncated``: nothing is cut off, so a trainer must not bootstrap a value there),
and the end-of-episode reward is paid whether the last action was valid or not.

Tasks are generated on demand from ``random.Random(task_id)`` (a str seed is hashed with SHA-512, so the
same id gives the same task in every process whatever ``PYTHONHASHSEED`` is); the id holds the env's name,
its ``seed``, the split and an index, so the splits' task seeds are disjoint.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from ..core.env import TextEnv, choice_knob, float_knob, int_knob
from ..core.protocol import Action, ToolSpec
from .protocol import RULED_PROTOCOLS

SPLITS = ("train", "dev", "test")
DEFAULT_TASKS = {"train": 10_000, "dev": 500, "test": 500}

# Simple, common, short words (no articles, no yes/no: the QA metrics' normaliser drops or special-cases
# those) so a tiny byte-level model and SmolLM2 read them easily.
WORDS = (
    "red", "blue", "green", "gold", "black", "white", "big", "small", "old", "new", "warm", "cold", "fast",
    "slow", "tall", "soft", "dark", "bright", "quiet", "loud", "sun", "moon", "star", "rain", "snow", "wind",
    "tree", "leaf", "rock", "sand", "sea", "lake", "hill", "road", "boat", "ship", "car", "bus", "train",
    "house", "door", "wall", "roof", "bed", "cup", "pot", "pan", "bread", "milk", "rice", "fish", "egg",
    "apple", "pear", "plum", "corn", "seed", "rose", "lamp", "book", "pen", "map", "key", "box", "bag", "hat",
    "coat", "shoe", "ring", "bell", "drum", "song", "game", "ball", "kite", "nest", "wing", "horn", "tail",
    "king", "queen", "child", "friend", "farmer", "baker", "runs", "sits", "sings", "reads", "jumps", "swims",
    "sleeps", "walks", "finds", "keeps", "near", "under", "over", "behind", "past", "with", "and", "then",
)  # fmt: skip


class DiagnosticEnv(TextEnv):
    """Base of the diagnostic envs. A subclass sets ``name`` (the task-id prefix) and provides ``_begin``
    (generate the task), ``_act``, ``_observe`` (the cue of decision ``self._decisions``), ``_metrics``,
    ``oracle_action``; optionally ``_illegal``, ``_final_reward``, ``available_actions``, ``random_action``.
    """

    name = "diagnostic"

    def __init__(
        self,
        tools: Sequence[ToolSpec],
        *,
        horizon: int,
        seed: int,
        split: str,
        num_tasks: int | None,
        action_format: str,
        invalid_penalty: float,
        max_context_chars: int | None,
        render_mode: str | None,
        expert_skill: float = 1.0,
        final_tool: str | None = None,
    ):
        choice_knob("split", split, SPLITS)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        num_tasks = DEFAULT_TASKS[split] if num_tasks is None else int_knob("num_tasks", num_tasks, 1, 10**7)
        choice_knob("action_format", action_format, sorted(RULED_PROTOCOLS) if final_tool else ["tags"])
        kwargs = {"final": final_tool} if action_format == "tool_call" else {}
        protocol = RULED_PROTOCOLS[action_format](tools, **kwargs)
        protocol.illegal, protocol.cue = self._illegal, self._cue
        super().__init__(
            protocol,
            max_steps=horizon,
            invalid_penalty=float_knob("invalid_penalty", invalid_penalty, 0.0, 1e9),
            max_context_chars=max_context_chars,
            render_mode=render_mode,
        )
        self.horizon, self.seed, self.split = horizon, seed, split
        # < 1: a demonstrator that errs. With probability 1 - expert_skill, expert_action() is a uniformly
        # random legal action instead of the oracle's: 0 gives a warm start that learns the action format
        # and nothing of the task, so RL has the whole task left to learn (docs/diagnostics.md).
        self.expert_skill = float_knob("expert_skill", expert_skill, 0.0, 1.0)
        self._ids = tuple(f"{self.name}-{seed}-{split}-{n}" for n in range(num_tasks))
        self._decisions = 0  # actions taken this episode, valid or not

    # --- what a diagnostic env provides ------------------------------------------------------------
    def _begin(self, rng: random.Random) -> None:
        """Generate the task from ``rng`` and reset the episode's counters."""
        raise NotImplementedError

    def _observe(self) -> str:
        """The cue for decision number ``self._decisions`` (0-based)."""
        raise NotImplementedError

    def _illegal(self, action: Action) -> str | None:
        """Why a well-formed ``action`` is not legal now, or None when it is."""
        return None

    def _final_reward(self) -> float:
        """The reward paid when the episode ends (outcome reward); 0 where rewards come per step."""
        return 0.0

    def oracle_action(self) -> str:
        """The right action now (the episode is running)."""
        raise NotImplementedError

    def expert_action(self) -> str | None:
        if self._done:
            return None
        if self.expert_skill < 1.0 and self.np_random.random() >= self.expert_skill:
            return self.random_action(random.Random(int(self.np_random.integers(2**31))))
        return self.oracle_action()

    def random_action(self, rng: random.Random) -> str:
        """A uniformly random legal action (the baseline policy of docs/diagnostics.md)."""
        return rng.choice(self.available_actions())

    # --- TextEnv hooks -----------------------------------------------------------------------------
    def task_ids(self) -> Sequence[str]:
        return self._ids

    def _start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._decisions = 0
        self._begin(random.Random(task_id))
        return self._observe(), {}

    def _cue(self) -> str:
        return self._observe() if self._decisions < self.horizon else ""

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if not self._done:  # a step after the end raises in TextEnv.step and must not count
            self._decisions += 1  # counted before the action is applied: _act and the feedback see it
        obs, reward, terminated, truncated, info = super().step(action)
        if truncated and info.get("ended_by") == "step_budget":
            # The last decision was invalid: the task is over all the same (its horizon is part of the task,
            # not a time limit), and the outcome reward for the decisions made is still paid.
            terminated, truncated = True, False
            info["ended_by"] = "terminated"
            reward += self._final_reward()
        return obs, reward, terminated, truncated, info
