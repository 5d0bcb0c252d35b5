"""Held-out evaluation: greedy episodes on the first tasks of ``env.eval_split``, the same tasks every time.

``train`` evaluates before RL and every ``eval_every`` iterations (``held_out``); ``capo eval`` evaluates a
checkpoint, or a model behind an OpenAI-compatible server (``evaluate`` with a ``backend``)."""

from __future__ import annotations

import contextlib
import math
import time

import gymnasium as gym

from data_prep.progress import SILENT, Progress, duration

from .backends.base import GenerationBackend
from .backends.hf import HFBackend
from .backends.select import common_prefixes
from .config import TrainConfig
from .distributed import gather_trajectories
from .envpool import EnvPool
from .episodes import held_out_recorder
from .models.actor_critic import ActorCritic
from .models.logprobs import evaluating
from .rollout import RolloutSettings, collect, env_tasks, rollout_stats
from .setup import Run


def evaluate(
    model: ActorCritic | None, tokenizer, config: TrainConfig, envs: list[gym.Env], episodes: int, accelerator=None,
    backend: GenerationBackend | None = None, progress: Progress = SILENT, on_trajectories=None,
    env_pool: EnvPool | None = None,
) -> dict[str, float]:
    """Greedy decoding on the first ``episodes`` tasks of the held-out split (the same tasks every time;
    for an env without ``task_ids()`` the held-out reset seeds, ``rollout.env_tasks``), shared out among the
    processes. ``backend`` generates instead of ``model`` (e.g. an ``OpenAIBackend`` in front of a server;
    ``model`` may then be None). ``on_trajectories``: called with the episodes (``capo view``'s recording).
    Returns ``eval/<key>`` for each key of ``rollout_stats``."""
    task_ids = list(env_tasks(envs[0], held_out=True)[:episodes]) if envs else []
    start = time.perf_counter()
    progress.say(f"held-out evaluation: {len(task_ids)} episodes")
    if accelerator is not None:
        task_ids = task_ids[accelerator.process_index :: accelerator.num_processes]
    trajectories = []
    if task_ids:
        in_process = backend is None
        backend = HFBackend(model.actor, tokenizer, batch_size=len(envs),
                            common_prefixes=common_prefixes(config.rollout)) if in_process else backend
        settings = RolloutSettings.from_config(config.rollout).for_evaluation()
        with evaluating(model) if in_process else contextlib.nullcontext():
            trajectories = collect(envs, backend, tokenizer, settings, tasks_per_batch=len(task_ids), group_size=1,
                                   task_ids=task_ids, seed=config.seed, env_pool=env_pool)
    trajectories = gather_trajectories(trajectories, accelerator)
    if on_trajectories is not None:
        on_trajectories(trajectories)
    stats = rollout_stats(trajectories)
    progress.say(f"held-out success {stats.get('success', math.nan):.2f} ({len(trajectories)} episodes, "
                 f"{duration(time.perf_counter() - start)})")
    return {f"eval/{k}": v for k, v in stats.items()}


def held_out(run: Run, eval_envs: list[gym.Env], iteration: int, progress: Progress = SILENT) -> dict[str, float]:
    """The run's held-out evaluation after ``iteration`` RL iterations (0: before RL), recorded for
    ``capo view`` by the main process; {} when the run evaluates no episodes (``eval_episodes=0``)."""
    if not eval_envs:
        return {}
    main = run.accelerator is None or run.accelerator.is_main_process
    record_to = held_out_recorder(run.config, iteration, run.tokenizer, eval_envs[0]) if main else None
    return evaluate(run.model, run.tokenizer, run.config, eval_envs, run.config.eval_episodes, run.accelerator,
                    progress=progress, on_trajectories=record_to, env_pool=run.env_pool)
