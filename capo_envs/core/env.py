"""``TextEnv``: the one base class every capo env subclasses.

It implements the contract once: text spaces, task selection on reset, the step budget (``truncated``),
invalid actions (feedback, optional penalty, never an exception), the ``info`` keys and episode metrics.
A concrete env only says what its tasks are, how a task starts, what a valid action does, and what its
metrics are.
"""

from __future__ import annotations

import difflib
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym

from .protocol import Action, ActionProtocol, as_text, safe_repr
from .spaces import UnicodeText

TRUNCATION_MARK = "\n[... observation truncated ...]"
TEMPLATE_SLOT = re.compile(r"<\w+>")  # an available action with a slot to fill, e.g. search[<keywords>]


@dataclass
class Outcome:
    """What a valid action did: the next observation, its reward, whether the episode really ended."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """A Gymnasium env whose observations and actions are text and whose actions are parsed by a protocol.

    ``info`` on every step: ``action_valid`` (bool), ``action`` (the parsed action as
    ``{"name": str, "args": {str: str}}``; for an invalid action ``{"name": "", "args": {}}``: no tool has an
    empty name, so ``info["action"]["name"]`` is the tool used, or "" for none), ``invalid_reason`` (why the
    action was rejected; "" when valid), ``task_id`` (str), ``step`` (int); ``available_actions`` (list of
    str) where the env has a finite set of legal actions; ``metrics`` ({str: float}) and ``ended_by`` (str)
    when the episode ends. ``info`` on reset also carries ``protocol`` (instructions, stop strings) so a
    trainer needs nothing but the info dicts.

    Every key keeps one type whatever the action's validity: Gymnasium's vector envs merge the sub-envs'
    infos key by key into arrays (nested dicts recursively, with a ``_key`` mask for keys a sub-env lacks), and
    a key that is a dict in one sub-env and None in another crashes that merge.

    ``step`` accepts any Python object: a ``str`` (or ``str`` subclass) is parsed; anything else is an invalid
    action. Neither raises, so a bad action cannot kill an ``AsyncVectorEnv`` worker.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        protocol: ActionProtocol,
        *,
        max_steps: int,
        invalid_penalty: float = 0.0,
        max_observation_chars: int = 65_536,
        max_context_chars: int | None = None,
        render_mode: str | None = None,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.protocol = protocol
        self.max_steps = max_steps
        self.invalid_penalty = float(invalid_penalty)
        self.max_context_chars = max_context_chars
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_observation_chars)
        self.action_space = UnicodeText(protocol.max_action_chars)
        self._task_id: str | None = None
        self._task_id_set: frozenset[str] | None = None
        self._steps = 0
        self._invalid_actions = 0
        self._context_chars = 0
        self._done = True
        self._transcript: list[str] = []

    # --- what a concrete env provides --------------------------------------------------------------
    def task_ids(self) -> Sequence[str]:
        """Every task this env can run, in a fixed order."""
        raise NotImplementedError

    def _start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Begin ``task_id``; return the first observation and extra info."""
        raise NotImplementedError

    def _act(self, action: Action) -> Outcome:
        """Apply a valid parsed action."""
        raise NotImplementedError

    def _metrics(self) -> dict[str, float]:
        """The episode's metrics, called once when it ends (terminated or truncated)."""
        raise NotImplementedError

    def available_actions(self) -> list[str] | None:
        """The legal actions now, where that set is finite (ALFWorld, WebShop); None otherwise."""
        return None

    def expert_action(self) -> str | None:
        """The text an expert would send now, in this env's action format; None where there is no expert."""
        return None

    def random_action(self, rng: random.Random) -> str | None:
        """A uniformly random legal action now, as text the env accepts as it is; None where the legal actions
        are not a finite set. An erring demonstrator plays it (``capo train sft.expert_skill``), so a warm start
        can leave RL something to learn. The default draws from ``available_actions()``, skipping templates
        such as ``search[<keywords>]``; an env whose list is not in its action format renders it instead."""
        actions = [a for a in (self.available_actions() or []) if not TEMPLATE_SLOT.search(a)]
        return rng.choice(actions) if actions and not self._done else None

    # --- the contract --------------------------------------------------------------------------------
    @property
    def task_id(self) -> str | None:
        return self._task_id

    def _choose_task(self, options: dict[str, Any]) -> str:
        ids = self.task_ids()
        if not ids:
            raise RuntimeError(f"{type(self).__name__} has no tasks")
        if "task_id" in options:
            task_id = str(options["task_id"])
            if task_id not in self._known_task_ids():
                near = difflib.get_close_matches(task_id, [str(i) for i in ids[:10_000]], n=3)
                hint = f"; did you mean {near}?" if near else ""
                raise ValueError(f"unknown task_id {task_id!r} ({len(ids)} tasks in this split){hint}")
            return task_id
        if "task_index" in options:
            index = options["task_index"]
            if not isinstance(index, int) or not 0 <= index < len(ids):
                raise ValueError(f"task_index must be an int in [0, {len(ids)}), got {index!r}")
            return ids[index]
        return ids[int(self.np_random.integers(len(ids)))]

    def _known_task_ids(self) -> frozenset[str]:
        if self._task_id_set is None:  # task lists are fixed once the env is built
            self._task_id_set = frozenset(self.task_ids())
        return self._task_id_set

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        self._task_id = self._choose_task(options)
        self._steps = self._invalid_actions = 0
        observation, extra = self._start(self._task_id)
        observation = self._fit(observation)
        self._context_chars = len(observation)
        self._done = False
        self._transcript = [observation]
        info = {"task_id": self._task_id, "step": 0, "protocol": self.protocol.describe(), **extra}
        self._add_available_actions(info)
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() was called on a finished episode; call reset() first")
        # Nothing below may raise on a hostile action: the protocol parses any object, and the transcript
        # keeps text as plain str and anything else as a bounded repr that cannot raise.
        text = as_text(action)
        parsed = self.protocol.parse(text if text is not None else action)
        self._steps += 1
        if parsed.valid:
            outcome = self._act(parsed.action)
        else:
            self._invalid_actions += 1
            outcome = Outcome(self.protocol.feedback(parsed.error), reward=0.0 - self.invalid_penalty)
        observation = self._fit(outcome.observation)
        self._context_chars += len(observation) + (len(text) if text is not None else 0)

        terminated = bool(outcome.terminated)
        ended_by = "terminated" if terminated else None
        truncated = False
        if not terminated and self._steps >= self.max_steps:
            truncated, ended_by = True, "step_budget"
        elif not terminated and self.max_context_chars and self._context_chars > self.max_context_chars:
            truncated, ended_by = True, "context_budget"

        info: dict[str, Any] = {
            **outcome.info,  # the env's extras first, so they cannot change the contract keys' types
            "task_id": self._task_id,
            "step": self._steps,
            "action_valid": parsed.valid,
            "action": parsed.action.to_dict() if parsed.valid else {"name": "", "args": {}},
            "invalid_reason": parsed.error or "",
        }
        if terminated or truncated:
            self._done = True
            info["ended_by"] = ended_by
            info["metrics"] = {
                **{name: float(value) for name, value in self._metrics().items()},
                "steps": float(self._steps),
                "invalid_actions": float(self._invalid_actions),
            }
        else:
            self._add_available_actions(info)
        self._transcript += [text if text is not None else safe_repr(action), observation]
        if self.render_mode == "human":
            _print_text(self._transcript[-2] + "\n" + observation)
        return observation, float(outcome.reward), terminated, truncated, info

    def render(self) -> str | None:
        text = "\n---\n".join(self._transcript)
        if self.render_mode == "human":
            _print_text(text)
            return None
        return text

    def _fit(self, observation: str) -> str:
        limit = self.observation_space.max_length
        if len(observation) <= limit:
            return observation
        return observation[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK

    def _add_available_actions(self, info: dict[str, Any]) -> None:
        actions = self.available_actions()
        if actions is not None:
            info["available_actions"] = list(actions)


# The upper bound of count knobs that have no natural one (results a page, calls, top-k).
MAX_COUNT = 1_000_000_000


# Checks of an env kwarg's value, with an error that names the kwarg and its range.
def int_knob(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return value


def float_knob(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def choice_knob(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _print_text(text: str) -> None:
    """Print an action or observation even if it holds lone surrogates ("\\ud800"), which strict stdout
    encoders refuse: they are shown as backslash escapes."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
