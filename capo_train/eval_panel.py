"""``capo eval`` on a panel: any policy, repeated episodes, pass@k, per-task results and a replay log.

The policy is a run's checkpoint, a plain Hugging Face model folder, or an OpenAI-compatible completions
server (``capo serve``, vLLM with token ids; the tokenizer is read from a local folder, since prompts are
token ids). The tasks are a panel's pinned ids (``capo_envs.core.panels``; the data is refused when it does
not match the pin) or, without a panel, the first ``episodes`` held-out tasks of an env, as the trainer's
held-out evaluation picks them. Each task is played ``repeats`` times: greedily when ``repeats`` is 1
(the trainer's held-out figure), else sampled at ``temperature`` (1.0 by default), seeded.

The result (``RESULT_FILE`` beside the recording, and on stdout) carries the panel's name and hash; the
numbers are explained in :mod:`capo_train.eval_stats`. ``record`` also writes ``episodes/eval-000000.jsonl``
for ``capo view`` and ``replay.jsonl`` for ``capo eval --reverify`` (:mod:`capo_train.reverify`).
"""

from __future__ import annotations

import datetime
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from capo_envs.core.panels import PanelError, check_panel, get_panel, make_panel_env, panel_task_ids
from data_prep.progress import SILENT, Progress, duration

from .eval_stats import pass_at_ks, percentiles, success_summary
from .reverify import REPLAY_FILE, RecordingEnv, episodes_in_order, write_replay

RESULT_FILE = "eval_result.json"
PER_TASK_FILE = "per_task.jsonl"
MAX_PARALLEL_ENVS = 16  # episodes generated together (one batched generate call per turn)


class EvalError(ValueError):
    """Bad input to ``capo eval``: said in a sentence, never a traceback."""


@dataclass
class EvalRequest:
    policy: str | None  # a checkpoint (or its run folder) or a HF model folder; with a server, the tokenizer's folder
    server: str | None = None
    served_model: str | None = None
    panel: str | None = None
    env_id: str = "capo/SynthHop-v0"  # without a panel
    split: str = "test"
    env_kwargs: dict[str, Any] | None = None
    episodes: int = 100  # tasks, without a panel
    repeats: int = 1
    temperature: float | None = None  # None: greedy for 1 repeat, 1.0 for more
    seed: int = 0
    record: str | None = None
    out: str | None = None
    per_task: str | None = None
    notes: list[str] = field(default_factory=list)
    rollout: dict = field(default_factory=dict)  # the rollout settings used (filled by run_eval)

    def decoding(self) -> tuple[bool, float]:
        """``(greedy, temperature)``."""
        if self.temperature is None:
            return (self.repeats == 1, 1.0)
        return (self.temperature == 0, 1.0 if self.temperature == 0 else self.temperature)


def validate(request: EvalRequest) -> None:
    if request.repeats < 1:
        raise EvalError(f"--repeats must be >= 1, got {request.repeats}")
    if request.episodes < 1:
        raise EvalError(f"--episodes must be >= 1, got {request.episodes}")
    if request.temperature is not None and (not math.isfinite(request.temperature) or request.temperature < 0):
        raise EvalError(f"--temperature must be a number >= 0, got {request.temperature}")
    if request.policy is None:
        raise EvalError("say which policy to evaluate: --checkpoint DIR (a run, its checkpoint/ or a Hugging Face "
                        "model folder; with --server, the folder its tokenizer is read from)")
    greedy, _ = request.decoding()
    if greedy and request.repeats > 1:
        request.notes.append("greedy decoding with repeats: each task's repeats differ only where the env or the "
                             "backend is not deterministic")


# ----------------------------------------------------------------------------- the policy


@dataclass
class Policy:
    backend: Any
    tokenizer: Any
    kind: str  # "checkpoint", "hf", "server"
    where: str
    actor: Any = None  # the in-process model, put in eval mode
    # the run's own rollout settings (checkpoint/config.json), so its prompts and action budget are the
    # trainer's; {} for a plain model folder (the defaults, as `capo train` would start with)
    rollout: dict = field(default_factory=dict)


def load_policy(request: EvalRequest, batch_size: int) -> Policy:
    from .models import CHECKPOINT, load_checkpoint, load_tokenizer
    from .models.actor_critic import load_actor
    from .models.checkpoints import CHECKPOINT_META

    given = Path(request.policy)
    checkpoint = given / CHECKPOINT if (given / CHECKPOINT).is_dir() else given  # a run folder holds checkpoint/
    is_checkpoint = (checkpoint / CHECKPOINT_META).is_file()
    rollout = run_rollout_settings(checkpoint) if is_checkpoint else {}
    if not is_checkpoint and not (given / "config.json").is_file():
        raise EvalError(f"{request.policy} is neither a capo checkpoint (no {CHECKPOINT}/{CHECKPOINT_META}) nor a "
                        "Hugging Face model folder (no config.json)")
    if request.server:
        from .backends.openai import OpenAIBackend

        folder = checkpoint / "actor" if is_checkpoint and (checkpoint / "actor").is_dir() else (
            checkpoint if is_checkpoint else given)
        try:
            backend = OpenAIBackend(request.server, request.served_model or request.policy)
        except ValueError as e:
            raise EvalError(f"--server {request.server}: {e}") from None
        return Policy(backend, load_tokenizer(folder), "server", request.server, rollout=rollout)
    from .backends.hf import HFBackend

    if is_checkpoint:
        model, tokenizer = load_checkpoint(checkpoint)
        actor, kind = model.actor, "checkpoint"
    else:
        actor, tokenizer = load_actor(given)
        kind = "hf"
    actor.eval().requires_grad_(False)
    return Policy(HFBackend(actor, tokenizer, batch_size=batch_size), tokenizer, kind, str(given), actor, rollout)


ROLLOUT_KEYS = ("max_action_tokens", "max_prompt_tokens", "state", "window")  # what shapes an eval episode


def run_rollout_settings(checkpoint: Path) -> dict:
    """The rollout keys of the run that wrote ``checkpoint`` (its ``config.json``), or {} without one."""
    try:
        saved = json.loads((checkpoint / "config.json").read_text()).get("rollout", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: saved[k] for k in ROLLOUT_KEYS if k in saved} if isinstance(saved, dict) else {}


# ----------------------------------------------------------------------------- the tasks


def _panel_envs(request: EvalRequest, progress: Progress):
    """A maker of the panel's env, one env made, its task ids and what the result says about the panel;
    refuses data that does not match the pin."""
    try:
        panel = get_panel(request.panel)
        if request.env_kwargs:
            raise PanelError(f"panel {panel.name} fixes the env and its kwargs; drop {sorted(request.env_kwargs)}")
        first = make_panel_env(panel)
        progress.say(f"checking panel {panel.name} ({panel.size} tasks of {panel.env_id} {panel.split})")
        check = check_panel(panel, first)
        task_ids = panel_task_ids(panel, first)
    except PanelError as e:
        raise EvalError(str(e)) from None
    if check.pinned and not check.matches:
        first.close()
        raise EvalError(check.describe())
    if not check.pinned:
        request.notes.append(check.describe())
    about = {"name": panel.name, "hash": check.hash, "pinned_hash": panel.pinned_hash,
             "matches_pin": check.matches if check.pinned else None, "components": check.components}
    return (lambda: make_panel_env(panel)), first, task_ids, about


def _plain_envs(request: EvalRequest):
    """The same for an env without a panel: the first ``episodes`` held-out tasks, as the trainer's."""
    from .config import ConfigError, EnvConfig, TrainConfig
    from .rollout import env_tasks
    from .setup import make_envs

    config = TrainConfig(env=EnvConfig(id=request.env_id, kwargs=request.env_kwargs or None))
    try:
        first = make_envs(config, request.split, 1)[0]
    except ConfigError as e:
        raise EvalError(str(e)) from None
    task_ids = [str(t) for t in list(env_tasks(first, held_out=True)[: request.episodes])]
    return (lambda: make_envs(config, request.split, 1)[0]), first, task_ids, None


# ----------------------------------------------------------------------------- running


def run_eval(request: EvalRequest, progress: Progress = SILENT) -> dict:
    """Evaluate and write the files asked for; returns the result (see the module doc)."""
    import torch

    from .config import TrainConfig
    from .rollout import RolloutSettings, collect

    validate(request)
    start = time.perf_counter()
    make, first, task_ids, panel = _panel_envs(request, progress) if request.panel else _plain_envs(request)
    recorders = [RecordingEnv(first)]
    try:
        while len(recorders) < min(len(task_ids) * request.repeats, MAX_PARALLEL_ENVS):
            recorders.append(RecordingEnv(make()))
        policy = load_policy(request, batch_size=len(recorders))
        greedy, temperature = request.decoding()
        rollout = replace(TrainConfig().rollout, **policy.rollout)
        settings = replace(RolloutSettings.from_config(rollout).for_evaluation(), greedy=greedy,
                           temperature=temperature)
        request.rollout = {k: getattr(rollout, k) for k in ROLLOUT_KEYS}
        progress.say(f"{len(task_ids)} tasks x {request.repeats} repeats, "
                     f"{'greedy' if greedy else f'sampled at T={temperature}'}, policy {policy.kind} {policy.where}")
        with torch.no_grad():
            trajectories = collect(recorders, policy.backend, policy.tokenizer, settings,
                                   tasks_per_batch=len(task_ids), group_size=request.repeats, task_ids=task_ids,
                                   seed=request.seed)
        replayed = episodes_in_order(recorders, len(trajectories))
        wall = time.perf_counter() - start
        result = summarise(request, trajectories, task_ids, panel, policy, first, greedy, temperature, wall)
        write_outputs(request, result, trajectories, replayed, policy, recorders[0], panel)
        progress.say(f"success {result['success']['mean']:.3f} (95% {result['success']['ci95'][0]:.3f}-"
                     f"{result['success']['ci95'][1]:.3f}) over {len(trajectories)} episodes, {duration(wall)}")
        return result
    finally:
        for env in recorders:
            env.close()


def per_task_rows(trajectories, task_ids: list[str]) -> list[dict]:
    from .rollout import episode_success, success_key

    key = success_key(trajectories)
    by_task: dict[str, list] = {t: [] for t in task_ids}
    for traj in trajectories:
        by_task[str(traj.task_id)].append(traj)
    rows = []
    for task_id, trajs in by_task.items():
        successes = [episode_success(t, key) for t in trajs]
        rows.append({
            "task_id": task_id,
            "repeats": len(trajs),
            "success": successes,
            "success_mean": sum(successes) / len(successes) if successes else math.nan,
            "return": [sum(a.reward for a in t.actions) for t in trajs],
            "actions": [len(t.actions) for t in trajs],
            "invalid_actions": [sum(not a.action_valid for a in t.actions) for t in trajs],
            "ended": ["terminated" if t.terminated else "truncated" if t.truncated else "cut" for t in trajs],
            "metrics": [t.metrics for t in trajs],
        })
    return rows


def summarise(request, trajectories, task_ids, panel, policy, env, greedy, temperature, wall) -> dict:
    rows = per_task_rows(trajectories, task_ids)
    actions = [a for t in trajectories for a in t.actions]
    n = max(len(trajectories), 1)
    spec = getattr(env, "spec", None)
    metric_keys = sorted({k for t in trajectories for k in t.metrics})
    return {
        "panel": panel,
        "env": {"id": spec.id if spec else request.env_id, "kwargs": dict(spec.kwargs) if spec else {}},
        "policy": {"kind": policy.kind, "where": policy.where, "served_model": request.served_model},
        "decoding": {"greedy": greedy, "temperature": None if greedy else temperature, "seed": request.seed},
        "rollout": {**request.rollout, "from": "the run's config.json" if policy.rollout else "defaults"},
        "tasks": len(task_ids),
        "repeats": request.repeats,
        "episodes": len(trajectories),
        "success": success_summary([r["success"] for r in rows]),
        "pass_at_k": pass_at_ks([r["success"] for r in rows]),
        "invalid_action_rate": sum(not a.action_valid for a in actions) / max(len(actions), 1),
        "episode_actions": percentiles([len(t.actions) for t in trajectories]),
        "action_tokens": percentiles([len(a.action_ids) for a in actions]),
        "terminated_rate": sum(t.terminated for t in trajectories) / n,
        "truncated_rate": sum(t.truncated for t in trajectories) / n,
        "env_metrics": {k: sum(float(t.metrics.get(k, 0.0)) for t in trajectories) / n for k in metric_keys},
        "wall_s": round(wall, 2),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "notes": list(request.notes),
        "per_task": rows,  # written to its own JSONL, not printed
    }


def write_outputs(request, result, trajectories, replayed, policy, env, panel) -> None:
    rows = result.pop("per_task")
    per_task = request.per_task or (str(Path(request.record) / PER_TASK_FILE) if request.record else None)
    if per_task:  # each row names its panel (or env), so a row copied out of the file still says what it scored
        tag = {"panel": panel["name"], "panel_hash": panel["hash"]} if panel else {"panel": None, "env": result["env"]}
        _write(Path(per_task), "".join(json.dumps({**tag, **r}, ensure_ascii=False) + "\n" for r in rows))
        result["per_task_file"] = per_task
    if request.record:
        from .episodes import episode_file, write_episodes

        record = Path(request.record)
        write_episodes(episode_file(record, 0, kind="eval"), trajectories, 0, policy.tokenizer, env, "held-out")
        header = {"env_id": result["env"]["id"], "env_kwargs": result["env"]["kwargs"],
                  "panel": panel["name"] if panel else None, "panel_hash": panel["hash"] if panel else None}
        write_replay(record / REPLAY_FILE, header, replayed)
        result["record"] = str(record)
    out = request.out or (str(Path(request.record) / RESULT_FILE) if request.record else None)
    if out:
        _write(Path(out), json.dumps(result, indent=2) + "\n")
        result["result_file"] = out


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def table_line(result: dict) -> str:
    """One Markdown row: panel, hash, success with its interval, pass@k, invalid rate."""
    panel = result.get("panel") or {}
    s = result["success"]
    passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in result["pass_at_k"].items())
    return (f"| {panel.get('name', result['env']['id'])} | {panel.get('hash', '-')} | {s['mean']:.3f} "
            f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] | {passes} | {result['invalid_action_rate']:.3f} |")
