"""Rollouts: drive text envs with a generation backend and record token-level trajectories.

The trainer knows an env only through the contract (README, "The environment contract"): text from
``reset``/``step``; optionally ``info["protocol"]`` (``instructions``, ``stop_strings``) on reset,
``info["action_valid"]``, ``info["metrics"]`` at the end, and ``env.unwrapped.task_ids()`` with
``reset(options={"task_id": ...})`` (without it a task is a reset seed: :func:`env_tasks`). Everything the
model saw and wrote is kept as token ids (:mod:`capo_train.rows`).

What the policy is conditioned on at step t (the state) is built by :mod:`capo_train.states`:
``rollout.state=concat`` (a growing chat) or ``window`` (a prompt rebuilt each step).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import gymnasium as gym

from .backends.base import GenerationBackend
from .config import RolloutConfig
from .envpool import EnvPool, pool_map
from .rows import ActionRecord, Trajectory
from .states import ChatFormat, ConcatState, WindowState

# Tasks of an env without task_ids(): task i is reset seed i, training from seed 0 and held-out
# evaluation from seed HELD_OUT_SEED (disjoint ranges of that many seeds each).
HELD_OUT_SEED = 1_000_000
def has_task_ids(env: gym.Env) -> bool:
    return callable(getattr(env.unwrapped, "task_ids", None))


def env_tasks(env: gym.Env, *, held_out: bool = False) -> Sequence:
    """The tasks episodes are drawn from: ``env.unwrapped.task_ids()`` (the split's, held-out or not), or
    for an env without it reset seeds, ``range(0, HELD_OUT_SEED)`` for training and the next
    ``HELD_OUT_SEED`` seeds for held-out evaluation."""
    if has_task_ids(env):
        return list(env.unwrapped.task_ids())
    start = HELD_OUT_SEED if held_out else 0
    return range(start, start + HELD_OUT_SEED)


def _text(value: Any, env: gym.Env, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{_name(env)} returned a {type(value).__name__} observation from {where}; the trainer "
                        "needs text (str) observations (README: the environment contract)")
    return value


def _name(env: gym.Env) -> str:
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def read_protocol(info: dict, env: gym.Env) -> tuple[str, tuple[str, ...]]:
    """``(instructions, stop strings)`` from the reset info's ``protocol``; without one, no system prompt
    and actions end at the model's EOS or ``max_action_tokens``."""
    protocol = info.get("protocol")
    if protocol is None:
        return "", ()
    if not isinstance(protocol, dict):
        raise TypeError(f"{_name(env)}: info['protocol'] must be a dict with 'instructions' and 'stop_strings', "
                        f"got {type(protocol).__name__}")
    instructions, stop = protocol.get("instructions") or "", protocol.get("stop_strings") or ()
    if not isinstance(instructions, str) or isinstance(stop, str) or not all(isinstance(x, str) for x in stop):
        raise TypeError(f"{_name(env)}: info['protocol'] needs 'instructions' as a str and 'stop_strings' as a "
                        f"list of str, got {instructions!r} and {stop!r}")
    return instructions, tuple(stop)


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """How every episode of a run is played, built once from the config (:meth:`from_config`).

    max_action_tokens  most tokens one action may have (generation stops there).
    max_prompt_tokens  a longer state ends its episode before generating (see :func:`collect`).
    state              "concat" (:class:`ConcatState`) or "window" (:class:`WindowState`, the last ``window``
                       (observation, action) pairs, and up to ``earlier_actions`` actions before them).
    temperature        sampling temperature; ``greedy`` decodes the most likely token instead.
    instructions       text added to the system prompt after the env's protocol instructions.
    """

    max_action_tokens: int
    max_prompt_tokens: int
    state: str = "concat"
    window: int = 2
    earlier_actions: int = 0
    temperature: float = 1.0
    greedy: bool = False
    instructions: str = ""

    def __post_init__(self):
        if self.state not in ("concat", "window"):
            raise ValueError(f"state must be 'concat' or 'window', got {self.state!r}")

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> RolloutSettings:
        return cls(max_action_tokens=rollout.max_action_tokens, max_prompt_tokens=rollout.max_prompt_tokens,
                   state=rollout.state, window=rollout.window, earlier_actions=rollout.earlier_actions,
                   temperature=rollout.temperature)

    def for_evaluation(self) -> RolloutSettings:
        """Greedy decoding, as the authors' validation runs (AgentR1/CAPO launch scripts: T = 0); the
        temperature goes back to 1, so the recorded log-probs are the model's own."""
        return replace(self, greedy=True, temperature=1.0)


@dataclass
class _Episode:
    env: gym.Env
    traj: Trajectory
    state: ConcatState | WindowState
    stop: tuple[str, ...]
    obs: str  # the observation the next action answers (its anchor)


def collect(
    envs: Sequence[gym.Env] | Callable[[], gym.Env],
    backend: GenerationBackend,
    tokenizer,
    settings: RolloutSettings,
    *,
    tasks_per_batch: int,
    group_size: int,
    seed: int | None = None,
    task_ids: Sequence[str] | None = None,
    task_pool: Sequence[str] | None = None,
    env_pool: EnvPool | None = None,
    timings: dict[str, float] | None = None,
) -> list[Trajectory]:
    """Run ``tasks_per_batch x group_size`` episodes and return their trajectories (in episode order).

    Episodes run in lockstep: each turn, one batched ``backend.generate`` call (per distinct set of stop
    strings) serves every live episode. With a list of envs, ``len(envs)`` episodes run at a time (in waves
    when there are more episodes); a factory is called once per episode and its envs closed afterwards.

    Tasks: ``task_ids`` if given (one per group), else ``tasks_per_batch`` distinct ids drawn with a
    ``seed``-ed RNG from ``task_pool`` (default: ``env_tasks(envs[0])``, the env's task ids or its training
    seeds). The ``group_size`` episodes of a group reset to the same task (``options={"task_id": ...}``, or
    for an env without task ids the same reset seed) and share ``group_id``.

    ``settings`` say how each episode is played (:class:`RolloutSettings`). The system prompt is the
    protocol's ``instructions`` from the reset info, then ``settings.instructions`` if any. A state longer
    than ``settings.max_prompt_tokens`` ends its episode before generating: ``truncated=True``,
    ``metrics={}`` (the env never reported any) and the last recorded action gets ``obs_ids=[]``; an
    episode cut before its first action has no actions at all.
    An episode the env truncates records the state it stopped in as ``final_prompt_ids`` (unless that is
    over the prompt budget too) so the critic can bootstrap; a cut one has none.
    ``settings.temperature``/``settings.greedy`` go to the backend, and so does a seed: each generate call
    gets its own, drawn from an RNG seeded with ``seed``, so a run is reproducible given ``seed``.

    ``env_pool`` (:mod:`capo_train.envpool`) runs each wave's resets and each turn's steps concurrently (on
    threads, or in worker processes for the envs it made); without one they run one after the other. Every
    seed is drawn before the calls and results are recorded in episode order, so the trajectories are the
    same whatever the pool.

    ``timings``: adds the seconds spent in ``backend.generate`` (``"generate_s"``) and in the envs' resets
    and steps (``"env_s"``) to it; the rest of the rollout builds the states (chat templates, tokens).
    """
    timings = {} if timings is None else timings
    rng = random.Random(seed)
    n_episodes = tasks_per_batch * group_size
    own_envs = callable(envs)
    pool = [envs() for _ in range(n_episodes)] if own_envs else list(envs)
    if not pool:
        raise ValueError("no envs given")
    if task_ids is None:
        all_ids = env_tasks(pool[0]) if task_pool is None else task_pool
        if len(all_ids) >= tasks_per_batch:
            task_ids = rng.sample(all_ids, tasks_per_batch)
        else:
            task_ids = rng.choices(all_ids, k=tasks_per_batch)
    if len(task_ids) != tasks_per_batch:
        raise ValueError(f"got {len(task_ids)} task_ids for tasks_per_batch={tasks_per_batch}")

    fmt = ChatFormat(tokenizer)
    trajectories: list[Trajectory] = []
    try:
        for wave in range(0, n_episodes, len(pool)):
            starts = [(pool[slot], task_ids[e // group_size], rng.randrange(2**31), e)
                      for slot, e in enumerate(range(wave, min(wave + len(pool), n_episodes)))]
            with _timed(timings, "env_s"):
                firsts = pool_map(env_pool, lambda s: reset_env(s[0], s[1], seed=s[2]), starts)
            live = []
            for (env, task_id, episode_seed, e), first in zip(starts, firsts):
                episode = start_episode(env, fmt, task_id, seed=episode_seed, traj_id=e, group_id=e // group_size,
                                        state=settings.state, window=settings.window,
                                        earlier_actions=settings.earlier_actions,
                                        instructions=settings.instructions, first=first)
                trajectories.append(episode.traj)
                live.append(episode)
            while live:
                live = _turn(live, backend, rng, settings, seeded=seed is not None, env_pool=env_pool,
                             timings=timings)
    finally:
        if own_envs:
            for env in pool:
                env.close()
    return trajectories


class _timed:
    """``with _timed(timings, key):`` adds the block's wall seconds to ``timings[key]``."""

    def __init__(self, timings: dict[str, float], key: str):
        self.timings, self.key = timings, key

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.timings[self.key] = self.timings.get(self.key, 0.0) + time.perf_counter() - self.start


def _turn(live: list[_Episode], backend: GenerationBackend, rng: random.Random, settings: RolloutSettings,
          seeded: bool, env_pool: EnvPool | None = None, timings: dict[str, float] | None = None) -> list[_Episode]:
    """One action for every live episode; returns the episodes still running."""
    by_stop: dict[tuple[str, ...], list[tuple[_Episode, list[int]]]] = defaultdict(list)
    for ep in live:
        prompt = ep.state.prompt()
        if len(prompt) > settings.max_prompt_tokens:  # over the prompt budget: cut (see collect's doc)
            ep.traj.truncated = True
            if ep.traj.actions:
                ep.traj.actions[-1].obs_ids = []
            continue
        by_stop[ep.stop].append((ep, prompt))

    timings = {} if timings is None else timings
    still: list[_Episode] = []
    for stop, items in by_stop.items():
        with _timed(timings, "generate_s"):
            generations = backend.generate(
                [prompt for _, prompt in items],
                stop=list(stop),
                max_new_tokens=settings.max_action_tokens,
                temperature=settings.temperature,
                greedy=settings.greedy,
                seed=rng.randrange(2**31) if seeded else None,
            )
        with _timed(timings, "env_s"):
            results = pool_map(env_pool, lambda pair: pair[0][0].env.step(pair[1].text),
                               list(zip(items, generations)))
        cut = []  # episodes the env truncated in a state within budget: their bootstrap state's features
        for (ep, prompt), gen, result in zip(items, generations, results):
            if step_episode(ep, prompt, gen.token_ids, gen.logprobs, gen.text, settings.max_prompt_tokens,
                            result=result, features=gen.features, frozen_states=gen.frozen_states):
                still.append(ep)
            elif ep.traj.truncated and ep.traj.final_prompt_ids and gen.features is not None:
                cut.append(ep.traj)
        if cut:  # now, while the backend still caches the sequences this turn's actions finished
            with _timed(timings, "generate_s"):
                for traj, features in zip(cut, backend.prompt_features([t.final_prompt_ids for t in cut])):
                    traj.final_features = features
    return still


def start_episode(
    env: gym.Env,
    fmt: ChatFormat,
    task_id: str,
    *,
    seed: int,
    traj_id: int,
    group_id: int,
    state: str = "concat",
    window: int = 2,
    earlier_actions: int = 0,
    instructions: str = "",
    first: tuple[Any, dict] | None = None,
) -> _Episode:
    """Reset ``env`` to ``task_id`` (for an env without task ids, ``task_id`` is the reset seed and ``seed``
    is unused) and open the episode's trajectory and state builder. ``first``: the ``(obs, info)`` of a
    :func:`reset_env` already made (by an env pool), instead of resetting here."""
    obs, info = reset_env(env, task_id, seed=seed) if first is None else first
    obs = _text(obs, env, "reset")
    protocol, stop = read_protocol(info, env)
    system = "\n\n".join(part for part in (protocol, instructions) if part)
    builder = (ConcatState(fmt, system, obs) if state == "concat"
               else WindowState(fmt, system, obs, window, earlier_actions))
    traj = Trajectory(traj_id=traj_id, task_id=str(task_id), group_id=group_id, actions=[], terminated=False,
                      truncated=False, metrics={}, anchors=[])
    return _Episode(env, traj, builder, stop, obs)


def reset_env(env: gym.Env, task_id: str, *, seed: int) -> tuple[Any, dict]:
    """``env.reset`` to ``task_id``: ``options={"task_id": ...}``, or for an env without task ids the reset
    seed ``task_id`` (``seed`` unused)."""
    if has_task_ids(env):
        return env.reset(seed=seed, options={"task_id": task_id})
    return env.reset(seed=int(task_id))


def step_episode(
    ep: _Episode, prompt: list[int], token_ids: list[int], logprobs: list[float], text: str, max_prompt_tokens: int,
    result: tuple | None = None, features: Any = None, frozen_states: Any = None,
) -> bool:
    """Send one action to the env and record it (prompt, tokens, log-probs, reward, the observation's tokens
    or the episode's end); returns whether the episode goes on. ``result``: the ``env.step(text)`` tuple of a
    step already made (by an env pool), instead of stepping here. ``features``: the backend's ``[L, H]``
    hidden states before each action token (``Generation.features``), kept on the record; ``frozen_states``:
    its hidden states entering the first trainable layer (``Generation.frozen_states``), likewise."""
    obs, reward, terminated, truncated, info = ep.env.step(text) if result is None else result
    valid = bool(info.get("action_valid", True))
    record = ActionRecord(prompt_ids=prompt, action_ids=token_ids, old_logprobs=logprobs, reward=float(reward),
                          action_valid=valid, obs_ids=[], state_features=features, frozen_states=frozen_states,
                          invalid_reason="" if valid else str(info.get("invalid_reason") or "")[:300])
    if frozen_states is not None and ep.traj.actions:
        _share_frozen_states(ep.traj.actions, record)
    ep.traj.actions.append(record)
    ep.traj.anchors.append(ep.obs)
    if terminated or truncated:
        ep.traj.terminated, ep.traj.truncated = bool(terminated), bool(truncated)
        ep.traj.metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
        if truncated:  # the state the episode stopped in, for bootstrapping; obs_ids stays []
            ep.state.advance(token_ids, text, _text(obs, ep.env, "step"))
            final = ep.state.prompt()
            ep.traj.final_prompt_ids = final if len(final) <= max_prompt_tokens else []
        return False
    record.obs_ids = ep.state.advance(token_ids, text, _text(obs, ep.env, "step"))
    ep.obs = obs
    return True


def _share_frozen_states(earlier: list[ActionRecord], record: ActionRecord) -> None:
    """With concatenated states, ``record``'s prompt starts with the previous action's prompt and action, so
    the previous action's frozen-layer states become a view of ``record``'s, and so do those of the actions
    before it that were views of the previous one's: an episode then holds one ``[tokens, H]`` tensor instead
    of one per turn (O(T) memory, not O(T^2)), and each action's last token, which its own generate call never
    fed, gets its state too. The values are the same: the backend reused the previous states as the cached
    prefix, or recomputed the same tokens through the same frozen layers (float rounding apart). Window
    states rebuild the prompt, so nothing is shared there."""
    prev = earlier[-1]
    if prev.frozen_states is None:
        return
    n = len(prev.prompt_ids) + len(prev.action_ids)
    if record.frozen_states.shape[0] < n or record.prompt_ids[:n] != prev.prompt_ids + prev.action_ids:
        return
    storage = prev.frozen_states.untyped_storage().data_ptr()  # the tensor the earlier views share
    for a in earlier[:-1]:
        if a.frozen_states is not None and a.frozen_states.untyped_storage().data_ptr() == storage:
            a.frozen_states = record.frozen_states[: a.frozen_states.shape[0]]
    prev.frozen_states = record.frozen_states[:n]


def rollout_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Summary numbers for logging.

    ``success`` is the mean over episodes of ``metrics["success"]`` (else ``metrics["em"]``) when some
    episode reports one, an episode cut by the prompt budget (no metrics) counting as 0; for an env that
    reports neither, an episode succeeded when its last step's reward is > 0 (:func:`episode_success`).
    ``env_<key>`` is the mean of each end-of-episode metric the env reports (``env_em``, ``env_f1``, ...).
    Action lengths are in tokens; percentiles are nearest-rank.
    """
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0.0}
    actions = [a for t in trajectories for a in t.actions]
    lengths = sorted(len(a.action_ids) for a in actions)
    stats = {
        "episodes": float(n),
        "reward_mean": sum(sum(a.reward for a in t.actions) for t in trajectories) / n,
        "actions_per_episode": len(actions) / n,
        "invalid_action_rate": sum(not a.action_valid for a in actions) / max(len(actions), 1),
        "terminated_rate": sum(t.terminated for t in trajectories) / n,
        "truncated_rate": sum(t.truncated for t in trajectories) / n,
        "tokens_generated": float(sum(lengths)),
        "prompt_tokens_max": float(max((len(a.prompt_ids) for a in actions), default=0)),
    }
    if lengths:
        stats |= {
            "action_tokens_mean": sum(lengths) / len(lengths),
            "action_tokens_p50": float(lengths[math.ceil(0.5 * len(lengths)) - 1]),
            "action_tokens_p90": float(lengths[math.ceil(0.9 * len(lengths)) - 1]),
            "action_tokens_max": float(lengths[-1]),
        }
    key = success_key(trajectories)
    stats["success"] = sum(episode_success(t, key) for t in trajectories) / n
    for key in sorted({k for t in trajectories for k in t.metrics}):  # the env's own metrics: em, f1, ...
        stats[f"env_{key}"] = sum(float(t.metrics.get(key, 0.0)) for t in trajectories) / n
    return stats


def success_key(trajectories: Sequence[Trajectory]) -> str | None:
    """The metric that says an episode succeeded: ``success``, else ``em``, if some episode reports it."""
    return next((k for k in ("success", "em") if any(k in t.metrics for t in trajectories)), None)


def episode_success(traj: Trajectory, key: str | None) -> float:
    """``metrics[key]`` (0 when absent), or without a key whether the last step's reward was > 0."""
    if key is not None:
        return float(traj.metrics.get(key, 0.0))
    return float(bool(traj.actions) and traj.actions[-1].reward > 0)
