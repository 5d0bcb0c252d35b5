"""Bad input never crashes an env: any Python object sent to ``step`` gives an ``action_valid=False`` step with
feedback (or is parsed, if it is a string), and the step counter, transcript and ``info`` types stay consistent,
in single envs and in both vector env kinds.

Every catalogue id that needs no downloaded data (or whose data is prepared) is covered automatically. Run
with ``-s`` to see how many bad inputs each env took (``BAD_INPUTS_TRIED``).
"""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter, defaultdict
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capo_envs
from capo_envs.core.protocol import ToolCallProtocol, ToolSpec
from test_env_contract import close_promptly, make_vector

# Smallest settings that still build a real env, for ids whose default is slower than it needs to be here.
# Short episodes so the fuzz examples (at most 8 actions, few of them the oracle's) end some episodes.
FAST_KWARGS = {
    "capo/SynthHop-v0": {"size": "tiny"},
    "capo/SynthShop-v0": {"max_steps": 4},
    "capo/SynthHouse-v0": {"size": "tiny", "max_steps": 4, "num_tasks": 6},
}


def offline_variants() -> list[tuple[str, dict]]:
    ids = sorted(i for i, card in capo_envs.CATALOG.items() if card.prepare is None or card.data_ready())
    variants = [(i, FAST_KWARGS.get(i, {})) for i in ids]
    return variants + [("capo/SynthHop-v0", {"size": "tiny", "action_format": "tool_call"})]


VARIANTS = offline_variants()
BAD_INPUTS_TRIED: Counter[str] = Counter()  # variant name -> actions stepped (single + sync + async)


def variant_name(variant: tuple[str, dict]) -> str:
    env_id, kwargs = variant
    return env_id + (f"[{kwargs['action_format']}]" if "action_format" in kwargs else "")


@pytest.fixture(params=VARIANTS, ids=variant_name)
def variant(request):
    return request.param


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print("\nbad inputs tried per env:", dict(sorted(BAD_INPUTS_TRIED.items())))


# --- hostile objects ----------------------------------------------------------------------------------
class Hostile:
    """Every dunder a careless env might call on an action raises."""

    def __repr__(self):
        raise RuntimeError("__repr__")

    __str__ = __repr__

    def __len__(self):
        raise RuntimeError("__len__")

    def __eq__(self, other):
        raise RuntimeError("__eq__")

    def __hash__(self):
        raise RuntimeError("__hash__")

    def __bool__(self):
        raise RuntimeError("__bool__")

    def __iter__(self):
        raise RuntimeError("__iter__")

    def __format__(self, spec):
        raise RuntimeError("__format__")


class HostileStr(str):
    """A string whose every method a parser might call raises or lies: it must be parsed as its plain text."""

    def __len__(self):
        raise RuntimeError("__len__")

    def __iter__(self):
        raise RuntimeError("__iter__")

    def __contains__(self, item):
        raise RuntimeError("__contains__")

    def __getitem__(self, index):
        raise RuntimeError("__getitem__")

    def __eq__(self, other):
        raise RuntimeError("__eq__")

    def __hash__(self):
        raise RuntimeError("__hash__")

    def __str__(self):
        raise RuntimeError("__str__")

    def __repr__(self):  # kept working so hypothesis can print a failing example (Hostile's repr raises)
        return f"HostileStr({str.__repr__(self)})"

    def find(self, *args):
        raise RuntimeError("find")

    def strip(self, *args):
        raise RuntimeError("strip")

    def isprintable(self):
        raise RuntimeError("isprintable")


class LyingStr(str):
    def __len__(self):
        return 0


class SpoofsStr:
    """``isinstance(x, str)`` is True (it reads ``__class__``), but it is no string."""

    @property
    def __class__(self):
        return str

    def __len__(self):
        raise RuntimeError("__len__")


class _NamelessMeta(type):
    @property
    def __name__(cls):
        raise RuntimeError("__name__")


class Nameless(metaclass=_NamelessMeta):
    pass


def _self_referencing_list():
    loop = []
    loop.append(loop)
    return loop


HUGE_JSON_INT = '<tool_call>{"name": "search", "arguments": {"query": 1' + "0" * 5000 + "}}</tool_call>"
NASTY = [
    None, True, 0, -1, 10**5000, -(10**5000), float("nan"), float("inf"), -0.0, 1e308, complex("nan+nanj"),
    np.int64(7), np.float64("nan"), np.array(["<search>q</search>"]), np.str_("<search>numpy</search>"),
    b"<search>q</search>", bytearray(b"<answer>a</answer>"), memoryview(b"<search>q</search>"),
    [], ["<search>q</search>"], list(range(100_000)), _self_referencing_list(), (), {},
    {"name": "search", "args": {"query": "q"}}, {"<search>q</search>"}, frozenset(), object(), Ellipsis, str, len,
    Hostile(), Nameless(), SpoofsStr(),
    HostileStr("<search>hostile</search>"), HostileStr(""), HostileStr("x" * 100_000), LyingStr("y" * 100_000),
    "", "\ud800", "\udfff" * 1000, "<search>\ud800</search>", "<search>q\ud800</search>", "\x00", "\x00" * 100_000,
    "<search>\x00</search>", "<answer>a\x00b</answer>", "x" * 1_000_000, "<search>" + "q" * 1_000_000 + "</search>",
    "<search>q</search>" * 10_000, "<think>" * 10_000, "<tool_call>" + "[" * 100_000 + "</tool_call>", HUGE_JSON_INT,
    '<tool_call>{"name": "search", "arguments": "' + "[" * 50_000 + '"}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": NaN}}</tool_call>', "\u202e<search>rtl</search>",
]


def picklable(action) -> bool:
    """AsyncVectorEnv pickles actions to its workers; an unpicklable one fails in the caller, not the env."""
    try:
        pickle.loads(pickle.dumps(action))
        return True
    except Exception:
        return False


# --- hypothesis strategies ------------------------------------------------------------------------
ANY_CHAR = st.characters(exclude_categories=())  # control characters and lone surrogates included
TAG_PIECES = st.sampled_from(
    ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<tool_call>", "</tool_call>",
     '{"name": "search", "arguments": {"query": ', '{"name": "answer"', "}}", '"', "\x00", "\ud800", " ", "\n"]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(ANY_CHAR, max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=200),
    st.lists(TAG_PIECES | st.text(ANY_CHAR, max_size=12), max_size=16).map("".join),  # tag soup
    st.builds(lambda tag, body: f"<{tag}>{body}</{tag}>", st.sampled_from(["search", "answer"]),
              st.text(ANY_CHAR, max_size=60)),
    st.builds(lambda name, args: f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>",
              st.sampled_from(["search", "answer", "", "nope"]), JSON_VALUES),
)


@dataclass(frozen=True)
class ExpertEdit:
    """Stands for the env's own expert action with text glued around it, resolved at step time, so the fuzz
    also sends valid and nearly valid actions to envs whose tools it cannot guess (and so ends episodes)."""

    before: str
    after: str

    def resolve(self, expert: str | None) -> str:
        return self.before + (expert or "") + self.after


def resolve(action, expert_action):
    return action.resolve(expert_action()) if isinstance(action, ExpertEdit) else action


GLUE = st.text(ANY_CHAR, max_size=8)
EDITS = st.just(ExpertEdit("", "")) | st.builds(ExpertEdit, GLUE, GLUE)
ANY_ACTION = st.one_of(
    EDITS, EDITS,  # twice: a third of the draws are (nearly) the expert's action
    TEXT, TEXT.map(HostileStr), TEXT.map(LyingStr), TEXT.map(np.str_),
    st.none(), st.booleans(), st.integers(), st.floats(), st.complex_numbers(), st.binary(),
    st.binary().map(bytearray), st.lists(TEXT, max_size=3), st.dictionaries(st.text(max_size=5), TEXT, max_size=3),
    JSON_VALUES,
)
FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- the checks ---------------------------------------------------------------------------------------
def info_types(info: dict, prefix: str = ""):
    """(dotted key, type) for every value, nested dicts included: what Gymnasium's vector info merge sees."""
    for key, value in info.items():
        yield prefix + str(key), type(value)
        if isinstance(value, dict):
            yield from info_types(value, f"{prefix}{key}.")


class SingleEnvChecker:
    """Steps one env with bad actions, checks the contract after each, and resets when an episode ends."""

    def __init__(self, variant):
        env_id, kwargs = variant
        self.name = variant_name(variant)
        self.env = gym.make(env_id, **kwargs, render_mode="ansi")
        self.types: defaultdict[str, set[type]] = defaultdict(set)
        self.valid = self.invalid = self.episodes = 0
        self.reset(seed=0)

    def reset(self, seed):
        self._record(self.env.reset(seed=seed)[1])
        self.done = False

    def _record(self, info):
        for key, kind in info_types(info):
            self.types[key].add(kind)

    def step(self, action):
        env = self.env.unwrapped
        steps, transcript = env._steps, len(env._transcript)
        # A string (subclass or not) is recorded as its plain characters; anything else is invalid.
        plain = "".join([action]) if isinstance(action, str) and type(action) is not SpoofsStr else None
        obs, reward, terminated, truncated, info = self.env.step(action)
        BAD_INPUTS_TRIED[self.name] += 1
        assert type(obs) is str and obs in env.observation_space
        assert type(reward) is float and math.isfinite(reward)
        assert info["step"] == steps + 1 == env._steps
        assert len(env._transcript) == transcript + 2 and all(type(x) is str for x in env._transcript[-2:])
        assert info["action_valid"] == (info["invalid_reason"] == "") == (info["action"]["name"] != "")
        if plain is None:
            assert not info["action_valid"] and obs.startswith("Invalid action: an action must be a str")
        else:
            assert env._transcript[-2] == plain
        assert not (terminated and truncated)
        self._record(info)
        self.valid += info["action_valid"]
        self.invalid += not info["action_valid"]
        if terminated or truncated:
            self.episodes += 1
            assert "metrics" in info and "ended_by" in info
            self.done = True

    def assert_one_type_per_key(self):
        mixed = {key: kinds for key, kinds in self.types.items() if len(kinds) > 1}
        assert not mixed, f"info keys with more than one type (breaks vector envs): {mixed}"


def take_every_nasty_action(variant) -> None:
    """Each NASTY action, resetting when an episode ends; every info key keeps one type throughout."""
    checker = SingleEnvChecker(variant)
    for action in NASTY:
        if checker.done:
            checker.reset(seed=0)
        checker.step(action)
    checker.assert_one_type_per_key()
    checker.env.close()


def test_every_nasty_object_is_an_invalid_step_or_parsed(variant):
    take_every_nasty_action(variant)


def test_hypothesis_actions_never_crash_a_single_env(variant):
    checker = SingleEnvChecker(variant)

    # One example = a reset and a few actions, so that hypothesis can replay (and shrink) a failure.
    @FUZZ
    @given(st.integers(0, 10**6), st.lists(ANY_ACTION, min_size=1, max_size=8))
    def check(seed, actions):
        checker.reset(seed)
        for action in actions:
            if checker.done:
                checker.reset(seed)
            checker.step(resolve(action, checker.env.unwrapped.expert_action))

    check()
    checker.assert_one_type_per_key()
    assert checker.valid and checker.invalid and checker.episodes  # the fuzz also reached real actions and ends
    checker.env.close()


VECTOR_SIZE = 3


def vector_step_and_check(envs, name, actions):
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    BAD_INPUTS_TRIED[name] += len(actions)
    assert len(obs) == len(actions) and all(type(o) is str for o in obs)
    assert rewards.dtype == float and np.isfinite(rewards).all()
    assert not (terminated & truncated).any()
    stepped = infos.get("_action_valid", np.zeros(len(actions), dtype=bool))
    for i in np.flatnonzero(stepped):  # sub-envs that autoreset this step carry reset infos instead
        valid = bool(infos["action_valid"][i])
        assert (infos["invalid_reason"][i] == "") == valid and (infos["action"]["name"][i] != "") == valid


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bad_inputs_never_crash_vector_envs(variant, mode):
    env_id, kwargs = variant
    name = variant_name(variant)
    envs = make_vector(mode, [lambda: gym.make(env_id, **kwargs) for _ in range(VECTOR_SIZE)])
    try:
        envs.reset(seed=list(range(VECTOR_SIZE)))
        # Vector envs autoreset, so steps simply go on across episodes.
        nasty = [a for a in NASTY if mode == "sync" or picklable(a)]
        for start in range(0, len(nasty), VECTOR_SIZE):
            chunk = nasty[start : start + VECTOR_SIZE]
            vector_step_and_check(envs, name, chunk + ["<search>q</search>"] * (VECTOR_SIZE - len(chunk)))

        @settings(FUZZ, max_examples=40)
        @given(
            st.integers(0, 10**6),
            st.lists(st.lists(ANY_ACTION, min_size=VECTOR_SIZE, max_size=VECTOR_SIZE), min_size=1, max_size=6),
        )
        def check(seed, steps):
            envs.reset(seed=seed)
            for actions in steps:
                if any(isinstance(a, ExpertEdit) for a in actions):
                    experts = envs.call("expert_action")
                    actions = [resolve(a, lambda: e) for a, e in zip(actions, experts)]
                vector_step_and_check(envs, name, actions)

        check()
    finally:
        close_promptly(envs)


def test_string_subclasses_are_parsed_as_their_plain_text():
    env = gym.make("capo/SynthHop-v0", size="tiny")
    env.reset(seed=0)
    for action, query in ((HostileStr("<search>hostile</search>"), "hostile"), (np.str_("<search>np</search>"), "np")):
        _, _, _, _, info = env.step(action)
        assert info["action_valid"] and info["action"] == {"name": "search", "args": {"query": query}}
    _, _, _, _, info = env.step(LyingStr("<search>" + "q" * 100_000 + "</search>"))  # its __len__ says 0
    assert not info["action_valid"] and "limit" in info["invalid_reason"]


def test_huge_json_int_is_an_invalid_tool_call():
    # json.loads raises ValueError (not JSONDecodeError) past Python's 4300-digit int limit.
    protocol = ToolCallProtocol((ToolSpec("search", "query", "search"), ToolSpec("answer", "answer", "answer")))
    result = protocol.parse(HUGE_JSON_INT)
    assert not result.valid and "JSON" in result.error
    doubly_encoded = json.dumps(json.dumps({"query": 1})).replace("1", "1" + "0" * 5000)
    result = protocol.parse('<tool_call>{"name": "search", "arguments": ' + doubly_encoded + "}</tool_call>")
    assert not result.valid


def test_human_render_prints_lone_surrogates(capsys):
    env = gym.make("capo/SynthHop-v0", size="tiny", render_mode="human")
    env.reset(seed=0)
    env.step("<search>\ud800</search>")
    env.unwrapped.render()
    assert "\\ud800" in capsys.readouterr().out
