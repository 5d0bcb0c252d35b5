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
``corpus``    what the env searches and sells: the retriever's class and ranking settings (BM25 library and
              analysis, dense encoder, fusion), a digest of every passage, and an index checksum: a digest of
              the top-k result ids for every task's question, so an on-disk index, an HTTP retrieval server
              or a library that ranks differently shows even where its passages are not visible; a paper
              database (its file, or its papers) and its ranking likewise; WebShop's catalogue (the product
              file, or the products and prices). ``none`` for envs without.
``expert``    the env's own expert played on every task (reset seed 0): its success and a digest of the whole
              transcript, observations, rewards and metrics included. A change to the reward, the dynamics or
              the search ranking along the expert's path shows here.
``packages``  versions of the third-party packages that change scores (the engine, the BM25 library,
              WebShop's fuzzy matcher and noun tagger, the SQLite that ranks paper search).

The panel hash is ``sha256:`` and the first 16 hex digits of the SHA-256 of the components as canonical
JSON. The panels are listed, and the generated ones pinned, in ``panel_list.py`` (``tests/test_panels.py``
recomputes the pins, so a change to a generator fails CI); public panels are pinned once their data has
been hashed on a machine that has it (``pinned=None`` until then: :func:`check_panel` reports the hash
computed, and says it is not pinned).

This module never imports torch or capo_train.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import gymnasium as gym

from .panel_model import Panel, digest, panel_hash  # noqa: F401  (re-exported)

COMPONENTS = ("env", "task_ids", "tasks", "corpus", "expert", "packages")
EXPERT_SEED = 0  # the reset seed of the expert's fingerprint episodes (a demonstrator with expert_skill < 1 draws)


class PanelError(ValueError):
    """A panel that does not exist, or data that cannot hold it (too few tasks, an env that cannot be made)."""


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


# Attributes of a retriever (through its wrappers) that change its ranking: BM25 library and analysis, the
# dense encoder and index type, fusion settings, PISA's algorithm (a server's address is not: its ranking is probed).
_INDEX_SETTINGS = ("library", "analyzer", "encoder", "index_type", "algorithm", "rrf_k", "depth", "weights")
PROBE_K = 5  # results per probe query when the env has no top-k of its own


def _unwrap(obj: Any) -> Any:
    """Through query caches and sharing wrappers (``inner``, ``_inner``) to the object that does the work."""
    for _ in range(8):
        inner = getattr(obj, "inner", None) or getattr(obj, "_inner", None)
        if inner is None:
            break
        obj = inner
    return obj


def describe_retriever(retriever: Any) -> str:
    """The retriever's class and ranking settings, e.g. ``BM25Retriever{"analyzer": "lucene", "library": "bm25s"}``
    (a hybrid lists its members): ``library="auto"`` picks bm25s, tantivy, PISA or Lucene by machine, and they rank
    differently, so the kind alone does not say what searched."""
    retriever = _unwrap(retriever)
    settings = {}
    for name in _INDEX_SETTINGS:
        try:
            value = getattr(retriever, name, None)
        except Exception:  # noqa: BLE001  (a property that needs a closed index, say)
            value = None
        if isinstance(value, (str, int, float)) or (isinstance(value, (list, tuple)) and value):
            settings[name] = value
    text = type(retriever).__name__ + (json.dumps(settings, sort_keys=True) if settings else "")
    members = getattr(retriever, "retrievers", None)
    if isinstance(members, (list, tuple)) and members:
        text += "[" + ", ".join(describe_retriever(m) for m in members) + "]"
    return text


def _passages(retriever: Any) -> Sequence | None:
    retriever = _unwrap(retriever)
    if getattr(retriever, "passages", None) is not None:
        return retriever.passages
    for member in getattr(retriever, "retrievers", None) or ():  # a hybrid: its members share one corpus
        found = _passages(member)
        if found is not None:
            return found
    return None


def _passages_digest(passages: Sequence) -> str:
    h = hashlib.sha256()
    for p in passages:
        h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def probe_queries(first_observations: Sequence[str], records: Sequence[Any]) -> list[str]:
    """One search query per task: its question (QA, papers) or instruction (WebShop), else its first
    observation."""
    queries = []
    for obs, record in zip(first_observations, records):
        text = getattr(record, "question", None)
        if text is None and isinstance(record, Mapping):
            text = record.get("instruction_text") or record.get("question")
        queries.append(str(text if text else obs))
    return queries


def _top_k(env: Any) -> int:
    for name in ("k", "search_limit"):
        value = getattr(env, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return PROBE_K


def _retriever_part(retriever: Any, queries: Sequence[str], k: int) -> str:
    passages = _passages(retriever)
    corpus = (f"{len(passages)} passages {_passages_digest(passages)}" if passages is not None
              else "corpus not visible")  # an HTTP server or an on-disk store: the ranking below still shows
    ranking = [[hit.id for hit in hits] for hits in _unwrap(retriever).search(list(queries), k)] if queries else []
    return f"{describe_retriever(retriever)} {corpus} top-{k} ranking {digest(ranking)}"


def _rows_digest(rows: Any) -> str:
    """A streamed digest of dataclass rows (their field values in order): ``digest`` of 250k papers as dicts
    would take minutes."""
    h, names = hashlib.sha256(), None
    for row in rows:
        names = names or [f.name for f in dataclasses.fields(row)]
        values = json.dumps([getattr(row, n) for n in names], ensure_ascii=False, default=repr)
        h.update(values.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def _paper_db_part(db: Any, queries: Sequence[str], k: int) -> str:
    path = Path(getattr(db, "path", ""))
    papers = file_digest(path) if path.is_file() else _rows_digest(db.iter_papers())
    ranking = [[p.arxiv_id for p in db.search(q, limit=k)] for q in queries]
    return f"PaperDB(ranking {db.ranking}) {len(db)} papers {papers} top-{k} ranking {digest(ranking)}"


def _catalogue_part(store: Any) -> str:
    """WebShop's products, prices and options (the reward compares the bought product's with the goal's)."""
    store = _unwrap(store)
    path = getattr(store, "path", None)
    if path is not None and Path(path).is_file():
        return f"catalogue file {file_digest(Path(path))}"
    products, prices = getattr(store, "_products", None), getattr(store, "_prices", None)
    if products is None:
        return f"catalogue {type(store).__name__} (not visible: not hashed)"
    return f"catalogue {len(products)} products {digest([sorted(products.items()), sorted(prices.items())])}"


def corpus_component(env: Any, queries: Sequence[str] = ()) -> str:
    """What the env searches and sells, and how it ranks: the retriever's settings, a digest of its passages
    and of its top-k result ids for every task's question (an index checksum that also covers an HTTP
    server's or an on-disk index's ranking); a paper database; WebShop's catalogue. "none" for envs without."""
    parts = []
    k = _top_k(env)
    retriever = getattr(env, "retriever", None)
    search_engine = getattr(env, "search_engine", None)
    if retriever is None and search_engine is not None:  # WebShop: its product search ranks search texts
        retriever = getattr(_unwrap(search_engine), "retriever", None)
    if retriever is not None:
        parts.append(_retriever_part(retriever, queries, k))
    db = getattr(env, "db", None)
    if db is not None and hasattr(db, "iter_papers"):
        parts.append(_paper_db_part(db, queries if retriever is None else (), k))
    store = getattr(env, "store", None)
    if store is not None:
        parts.append(_catalogue_part(store))
    return "; ".join(parts) or "none"


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
        if name == "sqlite3":  # the SQLite library Python links (FTS5's ranking), not a distribution
            import sqlite3

            parts.append(f"sqlite3={sqlite3.sqlite_version}")
            continue
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
    corpus = corpus_component(base, probe_queries(first_obs, records))  # before the expert fills any cache
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
        "corpus": corpus,
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


# Kwargs that change only the expert/demonstrator, never what a policy's episode scores (the QA envs' ``guess``,
# what an erring demonstrator answers; the WebShop envs' ``mistake``, what it clicks).
NOT_SCORED_KWARGS = frozenset({"expert_skill", "guess", "mistake", "render_mode"})


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

# The definitions and their pins live in panel_list.py (this module would pass 500 lines otherwise); imported
# last because they are built from Panel, above.
from .panel_list import PANELS  # noqa: E402
