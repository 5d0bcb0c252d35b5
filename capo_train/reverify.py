"""Re-verification: replay an evaluation's recorded actions in a fresh env and report what differs.

A figure is only as good as the env that scored it. ``capo eval --record DIR`` writes ``DIR/replay.jsonl``:
a header (the env id and the kwargs it was really made with, the panel and its hash) and, per episode, the
reset seed and options, the exact text each action sent to the env (``Generation.text``, which the
recorded-for-viewing ``episodes/`` files do not keep: they show the tokens with special tokens and cut long
texts) and what the env answered (reward, terminated, truncated, validity, a SHA-256 of every observation,
the end-of-episode metrics). ``capo eval --reverify DIR`` makes the env again from the header, replays every
episode and reports each one whose first observation, rewards, flags, observations or metrics differ:
a check that the env is deterministic and that a run's numbers came from this env version.

:class:`RecordingEnv` is the recorder: a Gymnasium wrapper around each evaluation env, so the rollout code
needs no hook; it sees exactly the calls the rollout makes.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym

REPLAY_FILE = "replay.jsonl"
REPLAY_KIND = "capo-replay"
REPLAY_VERSION = 1
OBS_HEAD_CHARS = 200  # how much of an observation is kept as text beside its hash (enough to read a diff)
REWARD_TOLERANCE = 1e-9  # float noise, not a changed reward


class ReplayError(ValueError):
    """A replay file that is missing, not one, or damaged."""


def text_sha(text: Any) -> str:
    return hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:16]


class RecordingEnv(gym.Wrapper):
    """Records every reset (seed, options, first observation) and step (action text, outcome) of ``env``;
    ``episodes`` holds one dict per reset, in order."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.episodes: list[dict] = []
        self._lock = threading.Lock()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        with self._lock:
            self.episodes.append({"task_id": str(info.get("task_id", "")), "reset_seed": seed,
                                  "reset_options": dict(options or {}), "first_observation": text_sha(obs),
                                  "first_observation_head": str(obs)[:OBS_HEAD_CHARS], "steps": []})
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        step = {"action": action if isinstance(action, str) else repr(action), "reward": float(reward),
                "terminated": bool(terminated), "truncated": bool(truncated),
                "action_valid": bool(info.get("action_valid", True)), "observation": text_sha(obs),
                "observation_head": str(obs)[:OBS_HEAD_CHARS]}
        if terminated or truncated:
            step["metrics"] = {k: float(v) for k, v in info.get("metrics", {}).items()}
        with self._lock:
            self.episodes[-1]["steps"].append(step)
        return obs, reward, terminated, truncated, info


def episodes_in_order(recorders: list[RecordingEnv], count: int) -> list[dict]:
    """The recorded episodes in the rollout's episode order: ``rollout.collect`` plays episode e on env
    ``e % len(envs)`` (waves of ``len(envs)``), so it is that env's ``e // len(envs)``-th reset."""
    n = len(recorders)
    return [recorders[e % n].episodes[e // n] for e in range(count)]


def write_replay(path: Path, header: dict, episodes: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"kind": REPLAY_KIND, "version": REPLAY_VERSION, **header}, ensure_ascii=False)]
    lines += [json.dumps({"episode": i, **ep}, ensure_ascii=False) for i, ep in enumerate(episodes)]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return path


def read_replay(run_dir: str | Path) -> tuple[dict, list[dict]]:
    """The header and episodes of ``RUN_DIR/replay.jsonl`` (or a replay file given directly)."""
    path = Path(run_dir)
    path = path / REPLAY_FILE if path.is_dir() else path
    if not path.is_file():
        viewing = (path.parent / "episodes").is_dir()
        why = (" (its episodes/ files are for viewing: they keep the decoded tokens, cut long texts and no reset "
               "seeds, so they cannot be replayed exactly)") if viewing else ""
        raise ReplayError(f"no {REPLAY_FILE} in {path.parent}{why}; record one with "
                          "`capo eval ... --record DIR`, then `capo eval --reverify DIR`")
    try:
        # split on "\n" only: str.splitlines also splits on U+0085, U+2028 and others, which a model's action
        # text can hold (a random tiny model wrote U+0085) and JSON keeps raw with ensure_ascii=False
        lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    except UnicodeDecodeError as e:
        raise ReplayError(f"{path} is not a capo replay file (not UTF-8 text: {e})") from None
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:  # a first line that is not JSON: some other file, given by mistake
            what = ("is not a capo replay file (its first line is not JSON)" if number == 1
                    else f"is damaged: line {number}: {e}")
            raise ReplayError(f"{path} {what}") from None
    if not rows or not isinstance(rows[0], dict) or rows[0].get("kind") != REPLAY_KIND:
        raise ReplayError(f"{path} is not a capo replay file (its first line is not a {REPLAY_KIND!r} header)")
    if rows[0].get("version") != REPLAY_VERSION:
        raise ReplayError(f"{path} has replay version {rows[0].get('version')!r}; this capo reads {REPLAY_VERSION}")
    for row in rows[1:]:
        if not isinstance(row, dict) or not isinstance(row.get("steps"), list) or "task_id" not in row:
            raise ReplayError(f"{path}: episode line {row!r:.80} lacks task_id or steps")
    return rows[0], rows[1:]


def _same(recorded: Any, replayed: Any) -> bool:
    if isinstance(recorded, float) and isinstance(replayed, float):
        return math.isclose(recorded, replayed, rel_tol=REWARD_TOLERANCE, abs_tol=REWARD_TOLERANCE)
    return recorded == replayed


def _diff_metrics(recorded: dict, replayed: dict) -> list[str]:
    keys = sorted(set(recorded) | set(replayed))
    return [k for k in keys if not _same(recorded.get(k), replayed.get(k))]


def replay_episode(env: gym.Env, episode: dict) -> list[dict]:
    """Replay one recorded episode in ``env``; the differences found, stopping at the first step that
    differs (after it, the episodes have diverged and every later step would differ too)."""
    where = {"episode": episode.get("episode"), "task_id": episode["task_id"]}
    seed = episode.get("reset_seed")
    obs, _ = env.reset(seed=seed, options=episode.get("reset_options") or None)
    if text_sha(obs) != episode.get("first_observation"):
        return [{**where, "step": None, "field": "first observation", "recorded": episode.get("first_observation_head"),
                 "replayed": str(obs)[:OBS_HEAD_CHARS]}]
    for t, rec in enumerate(episode["steps"]):
        try:
            obs, reward, terminated, truncated, info = env.step(rec["action"])
        except Exception as e:  # noqa: BLE001  (e.g. the replayed episode had already ended)
            return [{**where, "step": t, "field": "step", "recorded": "a step", "replayed": f"{type(e).__name__}: {e}"}]
        replayed = {"reward": float(reward), "terminated": bool(terminated), "truncated": bool(truncated),
                    "action_valid": bool(info.get("action_valid", True))}
        found = [{**where, "step": t, "field": key, "recorded": rec.get(key), "replayed": value}
                 for key, value in replayed.items() if not _same(rec.get(key), value)]
        if text_sha(obs) != rec.get("observation"):
            found.append({**where, "step": t, "field": "observation", "recorded": rec.get("observation_head"),
                          "replayed": str(obs)[:OBS_HEAD_CHARS]})
        if "metrics" in rec:
            metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
            for key in _diff_metrics(rec["metrics"], metrics):
                found.append({**where, "step": t, "field": f"metrics.{key}", "recorded": rec["metrics"].get(key),
                              "replayed": metrics.get(key)})
        if found:
            return found
    return []


def reverify(run_dir: str | Path, env: gym.Env | None = None) -> dict:
    """Replay every episode of ``run_dir``'s replay file in a fresh env (made from its header, unless
    ``env`` is given) and return ``{"episodes", "differing_episodes", "differences": [...], ...}``."""
    header, episodes = read_replay(run_dir)
    own = env is None
    if own:
        import capo_envs  # noqa: F401  (registers the ids)

        try:
            env = gym.make(header["env_id"], **header.get("env_kwargs", {}))
        except Exception as e:  # noqa: BLE001
            raise ReplayError(f"cannot make {header.get('env_id')!r} with the recorded kwargs "
                              f"{header.get('env_kwargs')}: {type(e).__name__}: {e}") from None
    differences: list[dict] = []
    differing = 0
    try:
        for episode in episodes:
            found = replay_episode(env, episode)
            differing += bool(found)
            differences += found
    finally:
        if own:
            env.close()
    return {"run": str(run_dir), "env_id": header.get("env_id"), "env_kwargs": header.get("env_kwargs"),
            "panel": header.get("panel"), "panel_hash": header.get("panel_hash"), "episodes": len(episodes),
            "differing_episodes": differing, "differences": differences}


def describe(report: dict, limit: int = 20) -> str:
    """The report in a few lines: how many episodes replayed identically, then the differences."""
    head = (f"reverify {report['run']}: {report['episodes']} episodes of {report['env_id']} replayed; "
            f"{report['differing_episodes']} differ")
    lines = [head]
    for d in report["differences"][:limit]:
        step = "reset" if d["step"] is None else f"step {d['step']}"
        lines.append(f"  episode {d['episode']} (task {d['task_id']}), {step}, {d['field']}: recorded "
                     f"{d['recorded']!r:.120}, replayed {d['replayed']!r:.120}")
    if len(report["differences"]) > limit:
        lines.append(f"  ... and {len(report['differences']) - limit} more")
    return "\n".join(lines)
