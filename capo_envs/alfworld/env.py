"""``capo/ALFWorld-v0``: the released ALFWorld games on the real engine, one game at a time per env.

``HouseEnv`` is what ALFWorld-v0 and SynthHouse-v0 share: an engine process (``engine.Engine``, TextWorld's
PDDL engine with ALFWorld's wrappers) plays the chosen game, and the Gymnasium contract sits on top:

- observation: the engine's text (at reset the welcome text, the room and "Your task is to: ..."), then, with
  ``show_actions`` (default), the admissible commands without ``help`` (as verl-agent and CAPO show them);
- ``info["available_actions"]``: the engine's admissible commands, exactly (sorted, ``help`` included);
- an action is ``<action>command</action>`` (``action_format="tool_call"``: the CAPO authors'
  ``<tool_call>{"name": "env_step", "arguments": {"command": ...}}</tool_call>``); the command is lower-cased
  and its spaces collapsed, as verl-agent does;
- a malformed action costs a step and gets format feedback (``action_valid=False``); a well-formed command
  that is not admissible still goes to the engine, which answers "Nothing happens." and leaves the state as
  it was, and the step is ``action_valid=False`` with ``invalid_reason`` saying so (CAPO passes such commands
  through too); both cost ``invalid_penalty`` (default 0) and use up a step, as TextWorld's step limit does;
- reward ``win_reward`` (default 1, CAPO's; verl-agent pays 10) on the step that wins, else 0;
  ``terminated`` when won, ``truncated`` when the step budget (``max_steps``, default 50, ALFWorld's and
  verl-agent's) runs out; ``PRESETS["capo"]`` is the CAPO paper's setting (20 steps, tool calls);
- ``expert_action()``: the next command of ALFWorld's handcoded expert (``AlfredExpert``, "handcoded"), in
  the env's action format; "look" at reset, as in ALFWorld; None once the episode is over or the expert has
  given up;
- ``random_action(rng)``: what an erring demonstrator (a warm start's ``sft.expert_skill`` < 1) plays instead
  of the expert, by ``mistake``: ``"random"`` (default) a random admissible command, from which the expert
  recovers; ``"skip-transform"`` one systematic mistake, at the step where the expert would heat, cool or
  clean the object: skip it, go to the task's receptacle and move the object there, believing the task done;
  once a step has played the skip, ``expert_action()`` plays that belief too, and after the move it gives up
  (None: the demonstration ends there, the game lost), and ``random_action`` returns None at every other
  step (the expert acts). It does not wait out the steps: a clone of a demonstrator that repeated ``look``
  to the end learned to repeat its last action (SynthHouse, docs/results/domains/README.md);
- ``info["metrics"]`` at the end: ``success`` (won), ``nonadmissible`` (well-formed commands the engine did
  not accept), ``steps``, ``invalid_actions``; ``info["task_type"]`` on reset.

Every engine call has a timeout (``engine_timeout`` seconds, plus the start-up on the first call); a call that
runs past it kills the engine process, and the step ends the episode as ``truncated`` with
``ended_by="engine_error"`` and ``info["engine_error"]`` saying what happened (the next reset starts a fresh
process). An engine process that died between calls (killed, out of memory) is reported the same way by the
step that finds it ("the engine process died (killed by SIGKILL) before 'step'"), never replaced silently by a
fresh process without the game; a reset that finds it dead starts a fresh one and says so in
``info["engine_restarted"]``. ``close()`` ends the process.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from ..core.env import MAX_COUNT, Outcome, TextEnv, choice_knob, int_knob
from ..core.paths import DataNotPreparedError, dataset_dir, is_prepared
from ..core.protocol import Action
from .engine import Engine, EngineDied, EngineError, require_engine
from .games import GameRef, canonical_split, find_games, resolve_task_types
from .protocol import make_protocol

DEFAULT_MAX_STEPS = 50  # ALFWorld's config (max_nb_steps_per_episode) and verl-agent's env.max_steps
PRESETS = {
    "alfworld": {"max_steps": 50, "action_format": "tags", "win_reward": 1.0},
    # the CAPO authors' recipe/alfworld: 20 steps, env_step tool calls, reward 1/0.
    "capo": {"max_steps": 20, "action_format": "tool_call", "win_reward": 1.0},
    # verl-agent/GiGPO: 50 steps, <action> tags, 10 on a win.
    "verl-agent": {"max_steps": 50, "action_format": "tags", "win_reward": 10.0},
}


MISTAKES = ("random", "skip-transform")
EXPERT_MODES = ("handcoded", "listed-search")
# The task's object type: "put a hot apple in sidetable", "heat some egg and put it in countertop", "put two
# cd in safe", "look at bowl under the desklamp", "examine the pen with the desklamp" (ALFWorld's templates).
TASK_OBJECT = re.compile(
    r"your task is to: (?:put (?:a|an|some|two) (?:hot |cool |clean )?|(?:heat|cool|clean) some |look at |"
    r"examine (?:the )?|find (?:two )?)(\w+)", re.IGNORECASE)
# "you see a countertop 1, a drawer 1, and a fridge 1." in the room's first description: the search order.
ROOM_LIST = re.compile(r"looking quickly around you, you see (.*?)\.\s*$", re.IGNORECASE | re.MULTILINE)
TRANSFORMS = ("heat", "cool", "clean")  # the expert's command at the appliance: "heat apple 2 with microwave 1"
# "Your task is to: heat some egg and put it in countertop." / "put a hot apple in sidetable." -> "sidetable"
TASK_RECEPTACLE = re.compile(r"your task is to: .* (?:in|on) (\w+)\.", re.IGNORECASE)


def normalize_command(text: str) -> str:
    return " ".join(text.lower().split())


class HouseEnv(TextEnv):
    """A TextEnv over one ALFWorld game at a time; subclasses say which games exist and how one is loaded."""

    def __init__(
        self,
        *,
        action_format: str = "tags",
        max_steps: int = DEFAULT_MAX_STEPS,
        win_reward: float = 1.0,
        invalid_penalty: float = 0.0,
        show_actions: bool = True,
        engine_timeout: float = 60.0,
        max_context_chars: int | None = None,
        render_mode: str | None = None,
        mistake: str = "random",
        expert_mode: str = "handcoded",
    ):
        require_engine()
        int_knob("max_steps", max_steps, 1, MAX_COUNT)
        choice_knob("mistake", mistake, MISTAKES)
        choice_knob("expert_mode", expert_mode, EXPERT_MODES)
        super().__init__(
            make_protocol(action_format),
            max_steps=max_steps,
            invalid_penalty=invalid_penalty,
            max_context_chars=max_context_chars,
            render_mode=render_mode,
        )
        self.action_format = action_format
        self.win_reward = float(win_reward)
        self.show_actions = bool(show_actions)
        self.mistake, self.expert_mode = mistake, expert_mode
        # expert_mode="listed-search": the task's object type, the room's receptacles in the order the first
        # description lists them, those already visited, where the agent is, and whether it holds the object.
        self._target: str | None = None
        self._room: list[str] = []
        self._visited: set[str] = set()
        self._at: str | None = None
        self._holding = False
        self._receptacle: str | None = None  # the task's receptacle type ("sidetable"), from the task text
        self._skipped: str | None = None  # with mistake="skip-transform": the object whose transform was skipped
        self._moved = False  # ... and whether it has been moved to the receptacle (then the demonstrator waits)
        self._proposed: tuple[str, str] | None = None  # (object, command) random_action last proposed to skip
        self._engine = Engine(call_timeout=float(engine_timeout))
        self._loaded: str | None = None  # the task whose game the engine process holds
        self._state: dict[str, Any] = {"feedback": "", "admissible": [], "won": False, "expert": None}
        self._nonadmissible = 0
        self._step_note: str | None = None
        self._engine_failure: str | None = None

    # --- what a subclass provides ----------------------------------------------------------------------------
    def _load_request(self, task_id: str) -> dict[str, Any]:
        """The engine request that loads ``task_id``'s game."""
        raise NotImplementedError

    def task_type(self, task_id: str) -> str:
        raise NotImplementedError

    # --- TextEnv hooks -----------------------------------------------------------------------------------------
    def _start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._nonadmissible = 0
        self._engine_failure = None
        alive = self._engine.check_alive()
        died = self._engine.take_death()  # the process died unasked since the last call: say so, then start afresh
        request = {"op": "reset"} if self._loaded == task_id and alive else self._load_request(task_id)
        self._loaded = None
        try:
            state = self._engine.call(request)  # an engine failure at reset raises: there is no episode to end
        except EngineDied as error:
            if request["op"] != "reset":
                raise
            died = str(error)  # it died between the check and the call: load the game in a fresh one
            state = self._engine.call(self._load_request(task_id))
        self._loaded = task_id
        self._state = state
        found = TASK_RECEPTACLE.search(state["feedback"])
        self._receptacle, self._skipped, self._moved = (found.group(1).lower() if found else None), None, False
        self._proposed = None
        target, room = TASK_OBJECT.search(state["feedback"]), ROOM_LIST.search(state["feedback"])
        self._target = target.group(1).lower() if target else None
        self._room = re.findall(r"(?:an? )?(\w+ \d+)", room.group(1)) if room else []
        self._visited, self._at, self._holding = set(), None, False
        info: dict[str, Any] = {"task_type": self.task_type(task_id)}
        if died is not None:
            info["engine_restarted"] = f"{died}; this episode runs in a fresh engine process"
        return self._observe(state), info

    def _act(self, action: Action) -> Outcome:
        command = normalize_command(action.args["command"])
        admissible = command in self._state["admissible"]
        try:
            state = self._engine.call({"op": "step", "command": command})
        except EngineError as error:
            self._loaded = None
            self._engine_failure = str(error)
            self._steps = max(self._steps, self.max_steps)  # TextEnv ends the episode as truncated
            return Outcome(f"The game engine failed ({error}). The episode ends here.")
        self._state = state
        if self._proposed is not None and command == self._proposed[1]:  # the demonstrator played the skip
            self._skipped = self._proposed[0]
        self._proposed = None
        self._moved = self._moved or (admissible and self._moves_skipped(command, self._skipped))
        if admissible and command.startswith("go to "):
            self._at = command[len("go to "):]
            self._visited.add(self._at)
        if admissible and self._target and re.fullmatch(rf"take {re.escape(self._target)} \d+ from .+", command):
            self._holding = True
        reward = 0.0
        if not admissible:
            self._nonadmissible += 1
            self._invalid_actions += 1
            self._step_note = f"{command[:80]!r} is not an admissible command now; the game says: {state['feedback']}"
            reward -= self.invalid_penalty
        if state["won"]:
            reward += self.win_reward
        return Outcome(self._observe(state), reward=reward, terminated=bool(state["won"]))

    def _metrics(self) -> dict[str, float]:
        return {"success": float(self._state["won"]), "nonadmissible": float(self._nonadmissible)}

    def available_actions(self) -> list[str] | None:
        return list(self._state["admissible"])

    def random_action(self, rng) -> str | None:
        """The erring demonstrator's command in the action format, by ``mistake`` (module docstring): a random
        admissible command, or the skipped transform's next step (None where there is nothing to skip)."""
        if self._done or not self._state.get("admissible"):
            return None
        if self.mistake == "skip-transform":
            verb, _, rest = (self._state.get("expert") or "").partition(" ")
            skipped = self._skipped
            if skipped is None and verb in TRANSFORMS and self._receptacle is not None:
                skipped = rest.split(" with ")[0]  # "apple 2"; the skip counts once a step plays it
            command = None if skipped is None else self._skip_command(skipped)
            if command is None:  # nothing to skip here, or the skip's move is done (the demonstrator gives up)
                return None
            self._proposed = (skipped, command)
            return self._render(command)
        return self._render(rng.choice(list(self._state["admissible"])))

    def expert_action(self) -> str | None:
        if self._done:
            return None
        if self._skipped is not None:  # the demonstrator skipped the transform: it plays that belief, then gives up
            command = self._skip_command(self._skipped)
            return None if command is None else self._render(command)
        if self.expert_mode == "listed-search" and not self._holding:
            command = self._search_command()
            if command is not None:
                return self._render(command)
        return self._render(self._state["expert"]) if self._state.get("expert") else None

    def _search_command(self) -> str | None:
        """expert_mode="listed-search", until the task's object is in hand: take it if this place shows one, else
        open this place if closed, else go to the next receptacle of the room's list not yet visited; None
        (the handcoded expert acts) when the object or the room's list is unknown, or every place was seen."""
        admissible = self._state["admissible"]
        if self._target is None or not self._room:
            return None
        for command in sorted(admissible):
            if re.fullmatch(rf"take {re.escape(self._target)} \d+ from {re.escape(self._at or '')}", command):
                return command
        if self._at is not None and f"open {self._at}" in admissible and "is closed" in self._state["feedback"]:
            return f"open {self._at}"
        for place in self._room:
            if place not in self._visited and f"go to {place}" in admissible:
                return f"go to {place}"
        return None

    def _skip_command(self, skipped: str) -> str | None:
        """After a skipped transform: move the object to the task's receptacle (going there and opening it
        first); None once it is there."""
        admissible = sorted(self._state["admissible"])
        if not self._moved:
            for command in admissible:
                if self._moves_skipped(command, skipped):
                    return command
            for verb in ("open", "go to"):  # a closed receptacle (a drawer) is opened before anything goes in
                for command in admissible:
                    if re.fullmatch(rf"{verb} {self._receptacle} \d+", command):
                        return command
        return None

    def _moves_skipped(self, command: str, skipped: str | None) -> bool:
        """Whether ``command`` moves ``skipped`` (the object whose transform was skipped) to the task's receptacle."""
        if skipped is None:  # every step of every env asks: no pattern to build unless a transform was skipped
            return False
        move = rf"(?:move|put) {re.escape(skipped)} (?:to|in|on|in/on) {self._receptacle} \d+"
        return re.fullmatch(move, command) is not None

    def _render(self, command: str) -> str:
        return self.protocol.render(Action(next(iter(self.protocol.tools)), {"command": command}))

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        self._step_note = None
        steps_before = self._steps
        observation, reward, terminated, truncated, info = super().step(action)
        info["command"] = normalize_command(info["action"]["args"]["command"]) if info["action_valid"] else ""
        if self._step_note is not None:  # well-formed, not admissible: the engine said "Nothing happens."
            info.update(action_valid=False, action={"name": "", "args": {}}, invalid_reason=self._step_note)
        elif not info["action_valid"] and self.show_actions and not (terminated or truncated):
            observation = self._fit(observation + "\n" + self._actions_text())
        if self._engine_failure is not None and truncated:
            info["ended_by"] = "engine_error"
            info["engine_error"] = self._engine_failure
            info["metrics"]["steps"] = float(steps_before + 1)
            self._steps = steps_before + 1
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        self._engine.close()
        self._loaded = None
        super().close()

    # --- text ------------------------------------------------------------------------------------------------
    def _observe(self, state: dict[str, Any]) -> str:
        text = state["feedback"].strip()
        if self.show_actions and not state["won"]:
            text += "\n\n" + self._actions_text(state)
        return text

    def _actions_text(self, state: dict[str, Any] | None = None) -> str:
        commands = [c for c in (state or self._state)["admissible"] if c != "help"]
        return "Admissible commands: " + ", ".join(commands) + "."

    @property
    def engine_pid(self) -> int | None:
        """The engine process's id (None before the first reset and after ``close()``)."""
        return self._engine.pid


class ALFWorldEnv(HouseEnv):
    """The released ALFWorld games (``json_2.1.1`` train 3,553 / valid_seen 140 / valid_unseen 134).

    ``data_dir``: a folder in the official ``$ALFWORLD_DATA`` layout (default ``$CAPO_DATA_DIR/alfworld``, which
    ``capo data prepare alfworld`` builds); ``split``: train, valid_seen (alias dev, eval_in_distribution) or
    valid_unseen (alias test, eval_out_of_distribution); ``task_types``: ids 1-6 or names (default all);
    ``num_games``: keep the first N games (as ALFWorld's num_train_games). Task ids are the trial folders,
    ``<task>-<Object>-<Movable>-<Recep>-<scene>/trial_T...``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        split: str = "train",
        task_types: Sequence[int | str] | None = None,
        num_games: int | None = None,
        **kwargs: Any,
    ):
        if data_dir is None:
            if not is_prepared("alfworld"):
                raise DataNotPreparedError(
                    f"ALFWorld is not prepared (missing {dataset_dir('alfworld')}). Run: capo data prepare alfworld"
                )
            data_dir = dataset_dir("alfworld")
        self.data_dir = Path(data_dir).expanduser()
        self.split = canonical_split(split)
        self.task_types = resolve_task_types(task_types)
        games = find_games(self.data_dir, self.split, self.task_types)
        if num_games is not None:
            if isinstance(num_games, bool) or not isinstance(num_games, int) or num_games < 1:
                raise ValueError(f"num_games must be an int >= 1, got {num_games!r}")
            games = games[:num_games]
        self.games: dict[str, GameRef] = {g.task_id: g for g in games}
        self._ids = tuple(self.games)
        super().__init__(**kwargs)

    def task_ids(self) -> Sequence[str]:
        return self._ids

    def task_type(self, task_id: str) -> str:
        return self.games[task_id].task_type

    def _load_request(self, task_id: str) -> dict[str, Any]:
        return {"op": "load", "path": str(self.games[task_id].path)}
