"""The engine process: one ALFWorld game on TextWorld's PDDL engine, driven by JSON lines on stdin/stdout.

It is started by ``engine.Engine`` (``python worker.py``), never imported by ``capo_envs``. It plays games the
way ``AlfredTWEnv`` and ``alfworld-play-tw`` do (alfworld 0.4.2): ``textworld.envs.PddlEnv`` wrapped in
``AlfredDemangler(shuffle=False)``, ``AlfredInfos`` and ``AlfredExpert(expert_type="handcoded")`` (built with the
keyword: ``AlfredTWEnv.init_env`` passes the type positionally and so loses it), with ``won``,
``admissible_commands`` and ``facts`` requested. TextWorld's step limit is not added: the Gymnasium env owns
the step budget.

Why a process: Fast Downward runs as a C library inside the process that loads it, so a slow call cannot be
interrupted from Python; in a child process it can be timed out and killed, and ``close()`` frees its memory.

Requests (one JSON object per line) and replies (one per request):
  {"op": "load", "path": ".../game.tw-pddl"}         -> the state after reset
  {"op": "load_synth", "task_id": ..., "task_type": ..., "size": ...}
                                                    -> the same for a SynthHouse game, generated here
                                                       (world.make_game) and written to this process's own
                                                       temporary folder: the expert reads traj_data.json beside it
  {"op": "reset"}                                    -> the state after reset (same game)
  {"op": "step", "command": "go to fridge 1"}        -> the state after the command
  {"op": "close"}                                    -> exits
A state is {"feedback": str, "admissible": [str], "won": bool, "expert": str or null}; a failure is
{"error": "..."}. End of input (the parent died) ends the process too.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import traceback

MAX_DRAWS = 25
EXPERT_SEED = 0


def main() -> int:
    # Replies go to the real stdout; anything the libraries print goes to stderr, so it cannot corrupt them.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    workdir = tempfile.TemporaryDirectory(prefix="capo-alfworld-")
    os.environ["ALFWORLD_DATA"] = workdir.name  # importing alfworld creates this folder; keep it out of $HOME
    try:
        game: Game | None = Game(workdir.name)
        broken = ""
    except Exception as error:  # e.g. a broken engine install: say so in the reply instead of dying silently
        game, broken = None, f"the engine could not start: {type(error).__name__}: {error}"
    try:
        for line in sys.stdin:
            try:
                request = json.loads(line)
                if request.get("op") == "close":
                    break
                reply = game.handle(request) if game is not None else {"error": broken}
            except Exception as error:  # the parent turns this into an error naming the game
                reply = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(limit=8)}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        if game is not None:
            game.close()
        workdir.cleanup()
    return 0


def cache_translations(size: int = 8) -> None:
    """Reuse Fast Downward's PDDL-to-SAS translation across resets of the same game.

    TextWorld's ``PddlState`` translates the problem twice on every reset (``fast_downward.pddl2sas``, plain and
    optimized), about two thirds of a reset; the result depends only on the domain and problem text and is only
    read afterwards, so the last ``size`` translations are kept (a bounded cache: memory stays flat)."""
    import functools

    import fast_downward

    if getattr(fast_downward.pddl2sas, "cached", False):
        return
    translate = functools.lru_cache(maxsize=size)(fast_downward.pddl2sas)

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        return translate(domain, problem, verbose=verbose, optimize=optimize)

    pddl2sas.cached = True
    fast_downward.pddl2sas = pddl2sas


def cache_parses(size: int = 4096) -> None:
    """Parse each grammar and query string once instead of at every derivation.

    TextWorld's text generator re-parses, with TatSu, the symbol string it derives (``textgen._parse_and_convert``)
    and every rule condition it tests (``Rule.parse_conjunctive_query``) on every step: about two thirds of a
    step. Both depend only on the string. Derivations mutate the symbols they get, so those are deep copies
    of the cached parse; query rules are only read. The cache changes no output (feedback, admissible
    commands, ``won``, expert commands); docs/envs/alfworld.md ("Engine processes") has that check and the
    time it saves."""
    import copy
    import functools

    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic

    if getattr(textgen._parse_and_convert, "cached", False):
        return
    parse_symbols = textgen._parse_and_convert
    symbols = functools.lru_cache(maxsize=size)(lambda text, rule_name, trace: parse_symbols(text, rule_name=rule_name, trace=trace))

    def parse_and_convert(*args, **kwargs):
        if len(args) == 1 and isinstance(args[0], str) and set(kwargs) <= {"rule_name", "trace"}:
            return copy.deepcopy(symbols(args[0], kwargs.get("rule_name"), bool(kwargs.get("trace", False))))
        return parse_symbols(*args, **kwargs)

    parse_and_convert.cached = True
    textgen._parse_and_convert = parse_and_convert
    parse_query = logic.Rule.parse_conjunctive_query.__func__
    queries = functools.lru_cache(maxsize=size)(lambda cls, expr: parse_query(cls, expr))
    logic.Rule.parse_conjunctive_query = classmethod(lambda cls, expr: queries(cls, expr))


class Game:
    def __init__(self, workdir: str):
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
        from textworld.envs.pddl import PddlEnv

        cache_translations()
        cache_parses()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, feedback=True, facts=True,
                                   extras=["gamefile", "expert_plan"])  # fmt: skip
        env = PddlEnv(infos)
        env = AlfredDemangler(env, shuffle=False)
        env = AlfredInfos(env)
        self.env = AlfredExpert(env, expert_type="handcoded")
        self.workdir = workdir
        self.loaded = False
        self.verified: dict[tuple[str, str], int] = {}  # SynthHouse task -> the draw its check passed

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "load":
            self.env.load(request["path"])
            self.loaded = True
            return self.reset(request)
        if op == "load_synth":
            path, loaded = self.make_synth(request["task_id"], request["task_type"], request["size"])
            if not loaded:
                self.env.load(path)
            self.loaded = True
            return self.reset(request)
        if not self.loaded:
            return {"error": "no game loaded"}
        if op == "reset":
            return self.reset(request)
        if op == "step":
            try:
                state, _, _ = self.env.step(str(request["command"]))
            except Exception as error:
                # AlfredExpert raises after the engine step when the handcoded expert gives up (its 200-step
                # timeout or a plan it cannot finish); the step itself happened, so report it without an expert.
                state = getattr(self.env, "state", None)
                if state is None:
                    raise
                return self.state(state, expert_failed=f"{type(error).__name__}: {error}")
            return self.state(state)
        return {"error": f"unknown op {op!r}"}

    def reset(self, request: dict) -> dict:
        # The handcoded expert breaks ties with the global ``random``: seeding it on every reset makes its
        # commands, and so the walkthrough make_synth verified, the same on every reset.
        random.seed(EXPERT_SEED)
        return self.state(self.env.reset())

    def make_synth(self, task_id: str, task_type: str, size: str) -> tuple[str, bool]:
        """Write a SynthHouse game the handcoded expert wins, as ``alfworld-generate`` keeps only games its
        solvability check (the expert played to the end) passes: a draw it loses is replaced by the next
        draw (``task_id#1``, ``#2``, ...). The draw that passed is remembered, so a later reset of the same
        task skips the check."""
        from capo_envs.alfworld.world import EXPERT_BUDGET, make_game

        folder = os.path.join(self.workdir, "game")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "game.tw-pddl")
        known = self.verified.get((task_id, size))
        for attempt in ([known] if known is not None else range(MAX_DRAWS)):
            game, traj = make_game(task_id if attempt == 0 else f"{task_id}#{attempt}", task_type, size)
            traj["task_id"] = task_id
            with open(os.path.join(folder, "traj_data.json"), "w", encoding="utf-8") as f:
                json.dump(traj, f)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(game, f)
            if known is not None:
                return path, False
            self.env.load(path)
            if self.expert_wins(EXPERT_BUDGET):
                self.verified[(task_id, size)] = attempt
                return path, True
        raise RuntimeError(f"the expert lost {MAX_DRAWS} draws of {task_id}")

    def expert_wins(self, budget: int) -> bool:
        random.seed(EXPERT_SEED)
        try:
            state = self.env.reset()
            for _ in range(budget):
                plan = state.get("extra.expert_plan") or []
                if not plan:
                    return False
                state, _, _ = self.env.step(plan[0])
                if state["won"]:
                    return True
        except Exception:
            return False
        return False

    @staticmethod
    def state(state, expert_failed: str | None = None) -> dict:
        plan = state.get("extra.expert_plan") or []
        return {
            "feedback": state["feedback"],
            "admissible": list(state["admissible_commands"]),
            "won": bool(state["won"]),
            "expert": None if expert_failed or not plan else str(plan[0]),
        }

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:
            pass


if __name__ == "__main__":
    sys.exit(main())
