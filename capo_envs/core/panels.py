"""Evaluation panels: a named, pinned set of held-out tasks and a content hash of what decides their score.

A held-out figure ("success 0.64 on HotpotQA") means one thing only when the tasks, the data the env reads
and the code that scores it are the same. A :class:`Panel` names an env id, its kwargs, a split and the
first ``size`` task ids of that split (the order is the env's own ``task_ids()``). Its **fingerprint** is a
handful of components, each a short string, so a mismatch can say what differs:

``env``       the id, split and kwargs, literally (retriever kind and top-k ``k`` are kwargs).
``task_ids``  how many ids and a digest of the pinned id list.
``tasks``     a digest of each task's content: its first observation (question, goal, game intro), and the
              task record where the env keeps one (QA: question, answers and supporting titles; ALFWorld: the
              game file's bytes; WebShop: the goal with its target attributes and price).
``corpus``    for retrieval envs: the retriever's class and a digest of every passage it searches.
``expert``    the env's own expert played on every task (reset seed 0): its success and a digest of the whole
              transcript, observations, rewards and metrics included. A change to the reward, the dynamics or
              the search ranking along the expert's path shows here.
``packages``  versions of the third-party packages that change scores (the engine, the BM25 library).

The panel hash is ``sha256:`` and the first 16 hex digits of the SHA-256 of the components as canonical
JSON. Generated (Synth) panels pin their expected components in code (``tests/test_panels.py`` recomputes
them, so a change to a generator fails CI); public panels are pinned once their data has been hashed on a
machine that has it (``pinned=None`` until then: :func:`check_panel` reports the hash computed, and says
it is not pinned).

This module never imports torch or capo_train.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import gymnasium as gym

COMPONENTS = ("env", "task_ids", "tasks", "corpus", "expert", "packages")
EXPERT_SEED = 0  # the reset seed of the expert's fingerprint episodes (a demonstrator with expert_skill < 1 draws)


class PanelError(ValueError):
    """A panel that does not exist, or data that cannot hold it (too few tasks, an env that cannot be made)."""


@dataclass(frozen=True)
class Panel:
    name: str
    env_id: str
    split: str
    size: int  # the first ``size`` ids of the split's task_ids()
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # to gym.make, besides split
    packages: tuple[str, ...] = ()  # distributions whose versions change scores
    pinned: Mapping[str, str] | None = None  # expected components; None: not pinned yet
    about: str = ""

    @property
    def pinned_hash(self) -> str | None:
        return panel_hash(self.pinned) if self.pinned is not None else None


@dataclass(frozen=True)
class PanelCheck:
    """What :func:`check_panel` found: the components and hash computed here and how they differ from the pin."""

    panel: Panel
    components: dict[str, str]
    differences: list[str]  # "<component>: pinned X, here Y"; [] when it matches (or is not pinned)

    @property
    def hash(self) -> str:
        return panel_hash(self.components)

    @property
    def pinned(self) -> bool:
        return self.panel.pinned is not None

    @property
    def matches(self) -> bool:
        return self.pinned and not self.differences

    def describe(self) -> str:
        if not self.pinned:
            return (f"panel {self.panel.name}: hash {self.hash} (not pinned yet: no reference copy of its data has "
                    "been hashed; compare this hash with other machines' before comparing figures)")
        if self.matches:
            return f"panel {self.panel.name}: hash {self.hash} matches the pin"
        return (f"panel {self.panel.name}: the data here does not match the pinned panel (pinned "
                f"{self.panel.pinned_hash}, here {self.hash}):\n  " + "\n  ".join(self.differences))


# ----------------------------------------------------------------------------- hashing


def digest(value: Any) -> str:
    """First 16 hex digits of SHA-256 over ``value`` as canonical JSON (sorted keys, no NaN guessing)."""
    data = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def panel_hash(components: Mapping[str, str]) -> str:
    return "sha256:" + digest({k: components[k] for k in sorted(components)})


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    return repr(value)


def _task_record(env: Any, task_id: str) -> Any:
    """What the env holds about one task beyond its first observation (None where it keeps nothing known)."""
    tasks = getattr(env, "tasks", None)
    if isinstance(tasks, Mapping) and task_id in tasks:  # QA: question, answers, supporting titles
        return tasks[task_id]
    games = getattr(env, "games", None)
    if isinstance(games, Mapping) and task_id in games:  # ALFWorld: the game file decides the task
        path = getattr(games[task_id], "path", None)
        if path is not None and Path(path).is_file():
            return {"game": Path(path).name, "bytes": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
        return games[task_id]
    goals, index = getattr(env, "goals", None), getattr(env, "_index", None)
    if isinstance(goals, Sequence) and isinstance(index, Mapping) and task_id in index:  # WebShop: the goal
        return goals[index[task_id]]
    return None


def _retriever_passages(retriever: Any) -> tuple[str, Sequence | None]:
    """The retriever's class name (through caches and wrappers) and its passages, when it holds them."""
    seen = 0
    while seen < 8 and getattr(retriever, "passages", None) is None:
        inner = getattr(retriever, "inner", None) or getattr(retriever, "bm25", None)
        if inner is None:
            break
        retriever, seen = inner, seen + 1
    return type(retriever).__name__, getattr(retriever, "passages", None)


def corpus_component(env: Any) -> str:
    retriever = getattr(env, "retriever", None)
    if retriever is None:  # WebShop: its product search holds the catalogue's search texts
        retriever = getattr(getattr(env, "search_engine", None), "retriever", None)
    if retriever is None:
        return "none"
    kind, passages = _retriever_passages(retriever)
    if passages is None:  # an HTTP server, say: its corpus is not visible from here
        return f"{kind} (corpus not visible: not hashed)"
    h = hashlib.sha256()
    for p in passages:
        h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return f"{kind} {len(passages)} passages {h.hexdigest()[:16]}"


def _play_expert(env: gym.Env, task_id: str) -> tuple[list, float] | None:
    """The expert's episode on ``task_id`` as a list of steps, and its success; None when there is no expert."""
    base = env.unwrapped
    obs, _ = env.reset(seed=EXPERT_SEED, options={"task_id": task_id})
    steps: list = [obs]
    done, info, reward = False, {}, 0.0
    while not done:
        action = base.expert_action()
        if action is None:
            return None if len(steps) == 1 else (steps, 0.0)
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append([action, obs, float(reward), bool(terminated), bool(truncated), bool(info.get("action_valid", True))])
        done = terminated or truncated
    metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
    steps.append(metrics)
    return steps, float(metrics.get("success", metrics.get("em", float(reward > 0))))


def package_versions(names: Sequence[str]) -> str:
    parts = []
    for name in names:
        try:
            parts.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name}=absent")
    return " ".join(parts) if parts else "none"


def env_component(panel: Panel, env: gym.Env) -> str:
    """The id and kwargs the env was really made with (``env.spec``: registered defaults plus gym.make's),
    so an env made outside :func:`make_panel_env`, or a changed registration, shows."""
    spec = getattr(env, "spec", None)
    made = dict(spec.kwargs) if spec is not None else {"split": panel.split, **panel.kwargs}
    return json.dumps({"id": spec.id if spec is not None else panel.env_id, "kwargs": made}, sort_keys=True,
                      default=repr)


def fingerprint(panel: Panel, env: gym.Env) -> dict[str, str]:
    """The panel's components, computed from ``env`` (made as :func:`make_panel_env` makes it)."""
    ids = panel_task_ids(panel, env)
    base = env.unwrapped
    first_obs, records = [], []
    for task_id in ids:
        obs, _ = env.reset(seed=EXPERT_SEED, options={"task_id": task_id})
        first_obs.append(obs)
        records.append(_task_record(base, task_id))
    played = [_play_expert(env, task_id) for task_id in ids]
    if any(p is None for p in played):
        expert = "no expert"
    else:
        success = sum(p[1] for p in played) / len(played)
        expert = f"success {success:.3f} {digest([p[0] for p in played])}"
    return {
        "env": env_component(panel, env),
        "task_ids": f"{len(ids)} ids {digest(ids)}",
        "tasks": digest([first_obs, records]),
        "corpus": corpus_component(base),
        "expert": expert,
        "packages": package_versions(panel.packages),
    }


# ----------------------------------------------------------------------------- using a panel


def get_panel(name: str) -> Panel:
    if name not in PANELS:
        near = difflib.get_close_matches(name, list(PANELS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise PanelError(f"unknown panel {name!r}{hint} (known: {', '.join(sorted(PANELS))})")
    return PANELS[name]


def make_panel_env(panel: Panel, **extra: Any) -> gym.Env:
    """The panel's env: ``gym.make(env_id, split=..., **kwargs)``; ``extra`` (e.g. ``data_dir``) says where
    its data lives and must not change a score-deciding kwarg. Any failure is a :class:`PanelError`."""
    clash = sorted(set(extra) & (set(panel.kwargs) | {"split"}))
    if clash:
        raise PanelError(f"panel {panel.name} fixes {clash}; they cannot be overridden (pinned: "
                         f"{json.dumps({k: panel.kwargs.get(k, panel.split) for k in clash})})")
    try:
        import capo_envs  # noqa: F401  (registers the ids)

        return gym.make(panel.env_id, split=panel.split, **dict(panel.kwargs), **extra)
    except Exception as e:  # noqa: BLE001  (missing data, a missing extra: all say so here)
        raise PanelError(f"panel {panel.name}: cannot make {panel.env_id} (split {panel.split!r}, kwargs "
                         f"{dict(panel.kwargs) | extra}): {type(e).__name__}: {e}") from e


def panel_task_ids(panel: Panel, env: gym.Env) -> list[str]:
    """The panel's task ids: the first ``size`` of the split, refused when the split holds fewer."""
    task_ids = getattr(env.unwrapped, "task_ids", None)
    if not callable(task_ids):
        raise PanelError(f"panel {panel.name}: {panel.env_id} has no task_ids(); a panel pins task ids")
    ids = [str(t) for t in task_ids()]
    if len(ids) < panel.size:
        raise PanelError(f"panel {panel.name} needs {panel.size} tasks of split {panel.split!r}; the data here "
                         f"holds {len(ids)}")
    return ids[: panel.size]


# Kwargs that change only the expert/demonstrator, never what a policy's episode scores.
NOT_SCORED_KWARGS = frozenset({"expert_skill", "render_mode"})


def matching_panel(env_id: str, kwargs: Mapping[str, Any] | None, split: str, episodes: int) -> Panel | None:
    """The panel a held-out evaluation of ``episodes`` tasks of ``env_id`` on ``split`` with ``kwargs`` plays
    exactly (same ids in the same order, same scored kwargs), or None: how a trainer's or ``capo compare``'s
    held-out figure can carry a panel name and hash."""
    scored = {k: v for k, v in (kwargs or {}).items() if k not in NOT_SCORED_KWARGS}
    for panel in PANELS.values():
        if (panel.env_id, panel.split, panel.size) == (env_id.rpartition(":")[2], split, episodes) and \
                dict(panel.kwargs) == scored:
            return panel
    return None


def check_panel(panel: Panel, env: gym.Env) -> PanelCheck:
    """Recompute the panel's components from ``env`` and compare them with the pin, component by component."""
    here = fingerprint(panel, env)
    differences = []
    if panel.pinned is not None:
        for key in COMPONENTS:
            want, got = panel.pinned.get(key, "(absent)"), here.get(key, "(absent)")
            if want != got:
                differences.append(f"{key}: pinned {want}, here {got}")
    return PanelCheck(panel, here, differences)


# ----------------------------------------------------------------------------- the panels

# Generated panels: the held-out figures the docs report (the main command's 200 dev episodes of SynthChain
# k=4; Table 1's 100 SynthHop dev questions under the CPU preset) and a test panel of each. The pins are
# recomputed by tests/test_panels.py; a generator change must re-pin them on purpose (and say so).
_SYNTHHOP_PRESET = {"size": "small", "k": 1, "max_passage_chars": 400, "question_kinds": ["bridge-2"]}
_SYNTHHOP_TABLE1 = {"size": "small", "k": 1, "max_passage_chars": 200,
                    "question_kinds": ["bridge-2", "comparison"]}  # docs/results/table1/grid.yaml
_BM25 = ("bm25s", "PyStemmer")  # the default BM25 library and its stemmer decide the search ranking
# The public benchmarks, on their env defaults made explicit (retriever, top-k, step budget decide scores).
_QA = {"retriever": "bm25", "k": 5, "max_steps": 5}
_ALFWORLD = ("alfworld", "textworld")  # the engine (README: ALFWorld versions change scores)

PANELS: dict[str, Panel] = {p.name: p for p in (
    Panel("synthchain-k4-dev-200", "capo/SynthChain-v0", "dev", 200, {"k": 4}, 
          about="the main command's held-out figure: 200 dev tasks of 4 door decisions"),
    Panel("synthchain-k4-test-64", "capo/SynthChain-v0", "test", 64, {"k": 4}, 
          about="64 test tasks of 4 door decisions"),
    Panel("synthchain-k8-test-64", "capo/SynthChain-v0", "test", 64, {"k": 8}, 
          about="64 test tasks of 8 door decisions (Table 1 on diagnostic envs, k = 8)"),
    Panel("synthlength-test-100", "capo/SynthLength-v0", "test", 100, {}, 
          about="100 test tasks: a pick and a long write"),
    Panel("synthtrap-test-100", "capo/SynthTrap-v0", "test", 100, {}, 
          about="100 test tasks with a tempting malformed shortcut"),
    Panel("synthhop-table1-dev-100", "capo/SynthHop-v0", "dev", 100, _SYNTHHOP_TABLE1, _BM25, 
          about="Table 1's held-out figure: every dev two-hop bridge and comparison, one 200-character passage"),
    Panel("synthhop-test-100", "capo/SynthHop-v0", "test", 100, _SYNTHHOP_TABLE1, _BM25, 
          about="every test two-hop bridge and comparison, as Table 1's env"),
    Panel("synthhop-preset-dev-50", "capo/SynthHop-v0", "dev", 50, _SYNTHHOP_PRESET, _BM25, 
          about="the README's SynthHop figure: every dev two-hop bridge under the CPU preset"),
    Panel("synthhop-small-test-200", "capo/SynthHop-v0", "test", 200, {"size": "small"}, _BM25, 
          about="every test question of the small world, env defaults (top-5, 1200-character passages)"),
    # Table 1 on diagnostic envs (docs/results/table1_diagnostics): 100 dev tasks per env.
    Panel("synthchain-k1-dev-100", "capo/SynthChain-v0", "dev", 100, {"k": 1},
          about="Table 1 on diagnostic envs, k = 1: 100 dev tasks"),
    Panel("synthchain-k4-dev-100", "capo/SynthChain-v0", "dev", 100, {"k": 4},
          about="Table 1 on diagnostic envs, k = 4: 100 dev tasks"),
    Panel("synthchain-k8-dev-100", "capo/SynthChain-v0", "dev", 100, {"k": 8},
          about="Table 1 on diagnostic envs, k = 8: 100 dev tasks"),
    Panel("synthlength-w8-recall-dev-100", "capo/SynthLength-v0", "dev", 100,
          {"long_words": 8, "texts": "recall", "ask_by": "number"},
          about="Table 1 on SynthLength: 100 dev tasks, an 8-word recalled write picked by number"),
    # The three newer domains' generated envs (docs/results/domains): 20 dev tasks each.
    Panel("synthhouse-tiny-dev-20", "capo/SynthHouse-v0", "dev", 20, {"size": "tiny", "max_steps": 20}, _ALFWORLD,
          about="20 dev games of the tiny generated house, played by alfworld's engine"),
    # Not pinned: measured, its BM25 scores' last float32 bits change with PYTHONHASHSEED, so products tied up
    # to rounding swap places and the expert's first results page differs between processes (likely cause: a
    # vocabulary numbered in set order changes the terms' summation order). Pin it once ranking is stable.
    Panel("synthshop-dev-20", "capo/SynthShop-v0", "dev", 20, {}, _BM25,
          about="20 dev goals of the generated catalogue (not pinned: its ranking of near-ties is not stable)"),
    Panel("synthscholar-small-dev-20", "capo/SynthScholar-v0", "dev", 20,
          {"size": "small", "max_abstract_chars": 0, "search_limit": 5, "shown_per_call": 5, "pool_view": 5},
          about="20 dev queries of the small scholarly world under the CPU preset"),
    Panel("hotpotqa-dev-500", "capo/HotpotQA-v0", "dev", 500, _QA, _BM25,
          about="the first 500 official dev-distractor questions, BM25 top-5 over the dataset's paragraphs"),
    Panel("2wiki-dev-500", "capo/2WikiMultihopQA-v0", "dev", 500, _QA, _BM25,
          about="the first 500 official 2WikiMultihopQA dev questions, BM25 top-5"),
    Panel("musique-dev-500", "capo/MuSiQue-v0", "dev", 500, _QA, _BM25,
          about="the first 500 official MuSiQue-Ans dev questions, BM25 top-5"),
    Panel("alfworld-seen-140", "capo/ALFWorld-v0", "valid_seen", 140, {}, _ALFWORLD,
          about="all 140 valid_seen games of json_2.1.1 on alfworld 0.4.2"),
    Panel("alfworld-unseen-134", "capo/ALFWorld-v0", "valid_unseen", 134, {}, _ALFWORLD,
          about="all 134 valid_unseen games of json_2.1.1 on alfworld 0.4.2"),
    Panel("webshop-test-500", "capo/WebShop-v0", "test", 500, {"size": "full"}, (),
          about="goals 0-499 of the original's human-goal split (its seed 233), full catalogue, price seed 0"),
)}

# The pinned components of the generated panels (recomputed by tests/test_panels.py on every run).
_PINS: dict[str, dict[str, str]] = {
    "synthchain-k4-dev-200": {
        "task_ids": "200 ids 1f60f2decc571a16",
        "tasks": "8c89dc5e95a37982",
        "corpus": "none",
        "expert": "success 1.000 b1748ac616167dec",
        "packages": "none",
    },
    "synthchain-k4-test-64": {
        "task_ids": "64 ids 8f1832442b331ea0",
        "tasks": "4d4f45e86b240b88",
        "corpus": "none",
        "expert": "success 1.000 e2cc82f975ac6ee1",
        "packages": "none",
    },
    "synthchain-k8-test-64": {
        "task_ids": "64 ids 8f1832442b331ea0",
        "tasks": "12e18272dc863c09",
        "corpus": "none",
        "expert": "success 1.000 ff832058168990a8",
        "packages": "none",
    },
    "synthlength-test-100": {
        "task_ids": "100 ids 27acf0534e0dc897",
        "tasks": "441b9471b461db2f",
        "corpus": "none",
        "expert": "success 1.000 414b4763df310fd8",
        "packages": "none",
    },
    "synthtrap-test-100": {
        "task_ids": "100 ids 5404f74948e48ca4",
        "tasks": "e15a9754614c7fbf",
        "corpus": "none",
        "expert": "success 1.000 2a5ff8485c17f350",
        "packages": "none",
    },
    "synthhop-table1-dev-100": {
        "task_ids": "100 ids 277c5b5be6d00952",
        "tasks": "0f5036f542d51789",
        "corpus": "BM25Retriever 3000 passages 8db5107370c39dcf",
        "expert": "success 1.000 b62cf70fbb3e2369",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-test-100": {
        "task_ids": "100 ids 4c8227df0872b8ac",
        "tasks": "a87f47e9acdfa9f0",
        "corpus": "BM25Retriever 3000 passages 8db5107370c39dcf",
        "expert": "success 1.000 5af1b1dc495359c0",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-preset-dev-50": {
        "task_ids": "50 ids 85a60a895a20f295",
        "tasks": "abd0f1b2d53f54a1",
        "corpus": "BM25Retriever 3000 passages 8db5107370c39dcf",
        "expert": "success 1.000 b7ed13fa82e8eac8",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-small-test-200": {
        "task_ids": "200 ids 1286f662cc1f1c14",
        "tasks": "b4c6f92bd630a9a7",
        "corpus": "BM25Retriever 3000 passages 8db5107370c39dcf",
        "expert": "success 1.000 93815f824c866703",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthchain-k1-dev-100": {
        "task_ids": "100 ids 5ff77eac45defb63",
        "tasks": "d8ac74eed3afaa1c",
        "corpus": "none",
        "expert": "success 1.000 dddb377d8873a5d5",
        "packages": "none",
    },
    "synthchain-k4-dev-100": {
        "task_ids": "100 ids 5ff77eac45defb63",
        "tasks": "b6bffb2f9b04256c",
        "corpus": "none",
        "expert": "success 1.000 ea8eec7efc9a7f95",
        "packages": "none",
    },
    "synthchain-k8-dev-100": {
        "task_ids": "100 ids 5ff77eac45defb63",
        "tasks": "50b4aa183c95a350",
        "corpus": "none",
        "expert": "success 1.000 c874b35a3b0e6057",
        "packages": "none",
    },
    "synthlength-w8-recall-dev-100": {
        "task_ids": "100 ids b640ac447b1f8737",
        "tasks": "a0e58c7d0bed313e",
        "corpus": "none",
        "expert": "success 1.000 e7c680d51757978b",
        "packages": "none",
    },
    "synthscholar-small-dev-20": {
        "task_ids": "20 ids 1c833f5dfa14eea1",
        "tasks": "1bc713331ae4dcc2",
        "corpus": "none",
        "expert": "success 1.000 7c246079d7a2ff3c",
        "packages": "none",
    },
    "synthhouse-tiny-dev-20": {
        "task_ids": "20 ids 415f532586cc47b4",
        "tasks": "9702fa882349ec37",
        "corpus": "none",
        "expert": "success 0.850 6caac7d60494633c",
        "packages": "alfworld=0.4.2 textworld=1.7.0",
    },
}


def _expected_env(panel: Panel) -> str:
    """The ``env`` component a panel made by :func:`make_panel_env` has (the capo cards register no kwargs)."""
    return json.dumps({"id": panel.env_id, "kwargs": {**panel.kwargs, "split": panel.split}}, sort_keys=True)


PANELS = {name: dataclasses.replace(p, pinned={"env": _expected_env(p), **_PINS[name]}) if name in _PINS else p
          for name, p in PANELS.items()}
