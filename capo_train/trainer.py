"""The RL loop, one iteration at a time: rollout -> rows -> targets -> critic and actor updates.

Read it top to bottom: :func:`train` builds everything (``setup.py``), runs the warm start (iteration 0),
then ``config.iterations`` times :func:`rl_iteration`, which

1. collects ``rollout.episodes_per_batch`` episodes (``tasks x group_size``: ``config.batch_shape``) with the
   current policy (``rollout.collect``),
2. lays them out as rows (``rows.build_rows``: packed or one row per action),
3. computes the targets without gradient (critic values at the action boundaries, reference log-probs when
   a KL term is on, then the algorithm's estimator: ``update.compute_targets``; the rollout's own
   log-probs serve as the old ones),
4. updates the critic, then the actor, on mini-batches of rows (``update.update``),

and returns the iteration's log record, assembled in one block at its end (every key: docs/metrics.md).
Held-out evaluation is ``evaluation.py``; what a run writes about itself is ``report.py``. Each phase's
wall time goes into the record as ``time/<phase>_s`` (``report.ITERATION_PHASES``): with the evaluation,
the checkpoint and the writing of the previous record, which ``train`` times, they add up to
``time/iteration_s``.

Randomness is derived from ``(seed, iteration)`` alone, so a run resumed from a checkpoint repeats the
iterations an uninterrupted run would have made.

The loop runs on ``accelerate``: one process on the CPU, or ``accelerate launch`` / ``torchrun`` with one
process per device, each collecting its own episodes, gradients averaged across processes; the main
process logs and writes the checkpoints (every process evaluates its share of the held-out tasks).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import warnings
from dataclasses import asdict
from functools import partial
from pathlib import Path

import gymnasium as gym
import torch

from data_prep.progress import SILENT, Progress

from .algorithms import get
from .backends.select import holds_weights, rollout_backend, sync_rollout_weights
from .config import TrainConfig, batch_shape, default_out_dir, flatten, to_dict
from .distributed import gather_trajectories, make_accelerator
from .envpool import pool_from_config
from .episodes import episode_file, recorder_for
from .evaluation import held_out
from .models.checkpoints import CHECKPOINT, RunState, load_checkpoint, load_run, read_run_state, save_run
from .report import Logger, Stopwatch, plot_curves, progress_postfix, summarise_run
from .rollout import RolloutSettings, collect, has_task_ids, rollout_stats
from .rows import action_features, build_rows, row_frozen_states
from .setup import (
    WARM_START, Run, build_model, freeze_warm_start, initial_reference, load_kl_reference, make_envs,
    make_optimizers, takes_split,
)
from .sft import behaviour_clone, warm_start_tasks
from .update import (compute_targets, critic_fit, final_values, reads_features, recompute_old_logp, recomputes_logprobs,
                     update)


def iteration_seed(seed: int, iteration: int, salt: int = 0) -> int:
    """The seed of one iteration's draws (tasks, mini-batch order), from the run's seed alone (``salt``:
    which draw, and which process)."""
    return (seed * 1_000_003 + iteration * 7_919 + salt) % (2**31)


def rl_iteration(run: Run, iteration: int, envs: list[gym.Env]) -> dict[str, float]:
    """RL iteration ``iteration`` (0-based) on the train ``envs``; returns its log record, with the wall time
    of each phase (``time/*``: ``report.ITERATION_PHASES``; ``train`` adds evaluation, checkpoint, logging
    and the whole, ``time/iteration_s``)."""
    config, model, algo, accelerator = run.config, run.model, run.algo, run.accelerator
    is_main = accelerator is None or accelerator.is_main_process
    rank = accelerator.process_index if accelerator is not None else 0
    watch = Stopwatch()

    # 1. Rollout. rollout.backend: a fresh HFBackend on the actor, or the run's vLLM backend (backends/select.py)
    in_rollout: dict[str, float] = {}  # generate_s, env_s: the backend's and the envs' share of it
    with watch.phase("time/rollout_s"):
        backend = rollout_backend(config, model, run.tokenizer, batch_size=len(envs), vllm_backend=run.vllm_backend,
                                  keep_features=config.rollout.values_from_rollout and algo.needs_critic
                                  and reads_features(model),
                                  keep_frozen_states=config.rollout.frozen_layers_from_rollout)
        run.vllm_backend = backend if holds_weights(backend) else None
        tasks, group = batch_shape(config)
        trajectories = collect(
            envs, backend, run.tokenizer, run.rollout, tasks_per_batch=tasks, group_size=group,
            seed=iteration_seed(config.seed, iteration, salt=104_729 * rank),  # each process its own tasks
            task_pool=run.task_pool, env_pool=run.env_pool, timings=in_rollout,
        )
    rollout_parts = {f"time/rollout_{k}": v for k, v in in_rollout.items()}

    # 2. Rows: R rows of S tokens holding the batch's A actions, each of up to L tokens (rows.py).
    with watch.phase("time/rows_s"):
        rollout = rollout_stats(gather_trajectories(trajectories, accelerator))  # over every process's episodes
        batch = build_rows(trajectories, config.rollout.layout, backend.pad_id)
        # rollout.frozen_layers_from_rollout: the HF rollout's states entering the actor's first trainable layer,
        # so the update runs only the trainable ones; None (the whole actor runs) when any row lacks them
        batch.frozen_states = row_frozen_states(trajectories, config.rollout.layout)
        if batch.num_actions:
            batch.action_id = torch.arange(batch.num_actions)  # [A]
            batch = batch.to(backend.device)
    if batch.num_actions == 0:  # every episode ended before its first action (rollout.max_prompt_tokens)
        return {"iteration": iteration + 1, **{f"rollout/{k}": v for k, v in rollout.items()},
                **watch.seconds, **rollout_parts}

    # 3. Targets, without gradient. Old log-probs first: RLOO/REINFORCE++ put old - ref in the reward.
    logprob_gap = {}
    if recomputes_logprobs(config, backend):
        with watch.phase("time/old_logp_s"):
            logprob_gap = recompute_old_logp(model, batch, config.rollout.temperature)
    final_value = None
    if algo.needs_critic:
        with watch.phase("time/values_s"):  # compute_targets adds its own critic pass to it
            final_value = final_values(model, trajectories, batch, backend.pad_id)  # [A]
    # A shared critic's values come from the hidden states an HF rollout recorded on the actor (keep_features);
    # other backends record none, and the critic makes its own pass.
    features = action_features(trajectories)
    targets = compute_targets(model, algo, batch, final_value, run.reference, config.rollout.temperature, watch,
                              state_features=features)

    # 4. Update: the critic, then the actor, on mini-batches of rows.
    generator = torch.Generator().manual_seed(iteration_seed(config.seed, iteration, salt=1))
    recorder = recorder_for(config, iteration, algo) if is_main else None  # capo view's sample of episodes
    with watch.phase("time/update_s"):
        update_stats = update(run.trainable or model, run.optimizers, algo, batch, targets, config, generator,
                              accelerator, probe=recorder.observe if recorder is not None else None, watch=watch,
                              train_actor=not algo.needs_critic or iteration >= config.optim.critic_warmup)
    if holds_weights(backend):
        with watch.phase("time/weight_sync_s"):
            sync_rollout_weights(backend, model)  # a vLLM backend samples the next rollout with the updated actor
    if recorder is not None:
        with watch.phase("time/record_s"):
            recorder.write(config.out_dir, iteration + 1, trajectories, batch, targets, run.tokenizer, envs[0])

    # The iteration's log record (docs/metrics.md lists every key).
    seconds = watch.seconds
    return {
        "iteration": iteration + 1,
        **{f"rollout/{k}": v for k, v in rollout.items()},  # the episodes: success, reward, lengths, ...
        **logprob_gap,  # rollout/logprob_gap_*: only when the old log-probs were recomputed
        **critic_fit(targets, batch),  # critic/explained_variance: only with a critic
        **update_stats,  # actor/*, critic/* and ratio_spread/*: means over the mini-batches
        **seconds,  # time/<phase>_s, in the order they ran (report.ITERATION_PHASES)
        **rollout_parts,  # time/rollout_generate_s, time/rollout_env_s: parts of time/rollout_s
        "throughput/rollout_tokens_per_s": rollout["tokens_generated"] / max(seconds["time/rollout_s"], 1e-9),
        "throughput/update_action_tokens_per_s": float(batch.action_mask.sum()) / max(seconds["time/update_s"], 1e-9),
    }


def warm_start(run: Run, env: gym.Env, progress: Progress = SILENT) -> dict[str, float]:
    """Iteration 0's behaviour cloning of the env's expert (``sft.episodes``); returns its ``sft/*`` record,
    {} when there is none. With a KL term, the warm-started actor becomes the KL reference: RL's anchor is
    the policy RL starts from, not the checkpoint before it."""
    config, accelerator = run.config, run.accelerator
    if config.sft.from_run:
        record = load_warm_start(run, Path(config.sft.from_run), progress)
    elif config.sft.episodes == 0:
        return {}
    elif not callable(getattr(env.unwrapped, "expert_action", None)):
        if accelerator.is_main_process:
            warnings.warn(f"{config.env.id} has no expert_action(): no warm start", RuntimeWarning, stacklevel=2)
        return {}
    else:
        record = behaviour_clone(run.model, run.tokenizer, config, env, progress=progress)
    if run.algo.kl_coef > 0:
        start = time.perf_counter()
        path = Path(config.out_dir) / WARM_START
        if accelerator.is_main_process:
            freeze_warm_start(run.model, run.tokenizer, path)
        accelerator.wait_for_everyone()
        run.reference = load_kl_reference(path, config, accelerator.device)
        record["time/sft_s"] = record.get("time/sft_s", 0.0) + time.perf_counter() - start  # part of the warm start
    return record


# What a held-out evaluation depends on, besides the actor's weights: a shared warm start's evaluation stands
# for this run's only when these are the same in both configs.
EVAL_SETTINGS = ("model.", "env.", "eval_episodes", "seed", "rollout.state", "rollout.window", "rollout.layout",
                 "rollout.earlier_actions", "rollout.max_prompt_tokens", "rollout.max_action_tokens",
                 "rollout.backend")


def load_warm_start(run: Run, from_run: Path, progress: Progress = SILENT) -> dict[str, float]:
    """``sft.from_run``: load the actor of ``from_run``'s checkpoint, which must hold a warm start and no RL
    iteration, into ``run.model`` (the critic stays as built: a warm start trains the actor only); returns
    ``from_run``'s iteration-0 record, with its ``eval/*`` keys only when its evaluation stands for this run's
    (``EVAL_SETTINGS``; its recorded held-out episodes are copied then too)."""
    saved = read_run_state(from_run)
    if saved is None:
        raise FileNotFoundError(f"sft.from_run={from_run}: no checkpoint there (train it with `capo sft`)")
    directory = from_run / CHECKPOINT
    if not saved.sft_done or saved.iteration != 0:
        raise ValueError(f"sft.from_run={from_run} is not a warm start: its checkpoint is after {saved.iteration} "
                         f"RL iterations (a warm start is `capo sft`, or a run with iterations=0)")
    shared, _ = load_checkpoint(directory, dtype=getattr(torch, run.config.model.dtype))
    try:
        run.model.actor.load_state_dict(shared.actor.state_dict())
    except RuntimeError as e:
        raise ValueError(f"sft.from_run={from_run}: its actor does not fit this run's model "
                         f"(model.path and the LoRA settings must be the same): {e}") from None
    del shared
    record = dict(saved.history[0]) if saved.history else {}
    record.pop("iteration", None)
    theirs, ours = flatten(json.loads((directory / "config.json").read_text())), flatten(to_dict(run.config))
    differs = [k for k in ours if k.startswith(EVAL_SETTINGS) and theirs.get(k) != ours[k]]
    if differs:
        record = {k: v for k, v in record.items() if not k.startswith(("eval/", "time/eval"))}
    elif run.accelerator.is_main_process:
        held_out_file = episode_file(from_run, 0, kind="eval")
        if held_out_file.is_file():
            target = episode_file(run.config.out_dir, 0, kind="eval")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(held_out_file.read_bytes())
    again = f" (evaluated again: {', '.join(differs)} differ)" if differs else ""
    progress.say(f"warm start from {from_run}{again}")
    return record | {"sft/shared": 1.0}


def checkpoint(run: Run, state: RunState) -> None:
    """The run's checkpoint after ``state.iteration`` iterations (written by the main process)."""
    if run.accelerator.is_main_process:
        save_run(Path(run.config.out_dir), run.model, run.tokenizer, run.optimizers, state, to_dict(run.config))
    run.accelerator.wait_for_everyone()


def evaluation(run: Run, eval_envs: list[gym.Env], done: int, progress: Progress) -> dict[str, float]:
    """The held-out evaluation after ``done`` RL iterations and its ``time/eval_s``; {} when it evaluates
    no episodes."""
    start = time.perf_counter()
    record = held_out(run, eval_envs, done, progress)
    return record | {"time/eval_s": time.perf_counter() - start} if record else {}


def close_record(run: Run, state: RunState, logger: Logger | None, record: dict | None,
                 started: float | None) -> float | None:
    """Keep ``record`` (None: there is none) in the run's history, write the checkpoint, then complete the
    record with ``time/checkpoint_s`` and, for an RL iteration (``started``: when it began),
    ``time/iteration_s``, and log it. The checkpoint's copy of the record is completed too, so a resumed
    run's log (written from it) is the same. Returns when the record was complete: what the next record's
    ``time/log_s`` (this record's writing) starts from; None without a record."""
    if record is not None:
        state.history.append(record)
    start = time.perf_counter()
    checkpoint(run, state)
    done = time.perf_counter()
    if record is None:
        return None
    record["time/checkpoint_s"] = done - start
    if started is not None:
        record["time/iteration_s"] = done - started
    path = Path(run.config.out_dir) / CHECKPOINT / "run_state.json"
    if run.accelerator.is_main_process and path.is_file():  # the checkpoint holds the record as it was then
        path.with_suffix(".tmp").write_text(json.dumps(asdict(state)))
        os.replace(path.with_suffix(".tmp"), path)  # a kill meanwhile leaves the first copy, as valid
    if logger is not None:
        logger.log(record)
    return done


def train(config: TrainConfig, *, resume: bool = False, model=None, tokenizer=None, progress: bool = True,
          tag: str = "capo train") -> dict:
    """Warm start (if configured), then ``config.iterations`` RL iterations; returns the summary.

    ``progress``: phase and iteration lines on stdout, ``[tag] ...`` (tqdm bars on a terminal)."""
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    accelerator = make_accelerator(config)
    main = accelerator.is_main_process
    say = Progress(tag, enabled=progress and main)
    if config.out_dir is None:  # a TrainConfig built in code, not through load_config
        config.out_dir = default_out_dir(config.algo, config.env.id)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say.say(f"{config.algo} on {config.env.id}, {config.iterations} iterations, run folder {out_dir}")
    algo = get(config.algo).bind(config.algo_overrides)  # registry defaults + overrides, merged once

    # The envs first: a bad env id or kwargs fails here, in seconds, not after the model has loaded.
    env_pool = pool_from_config(config.rollout)  # None unless rollout.env_pool is thread or process
    try:
        train_envs = make_envs(config, config.env.train_split, math.prod(batch_shape(config)), env_pool)
        eval_envs = make_envs(config, config.env.eval_split, min(config.eval_episodes, 16), env_pool)
    except BaseException:
        if env_pool is not None:
            env_pool.close()
        raise
    task_pool = warm_start_tasks(config, train_envs[0])[1]
    if not takes_split(config.env.id) and has_task_ids(train_envs[0]) and eval_envs and main:
        warnings.warn(f"{config.env.id} takes no split: the held-out tasks are also training tasks", stacklevel=2)

    # The model and its optimizers: from the checkpoint when resuming, else built (or the one given).
    auto_lr = config.optim.actor_lr is None
    resumed = resume and (out_dir / CHECKPOINT).is_dir()
    if resumed:
        model, tokenizer, optimizers, state = load_run(out_dir, partial(make_optimizers, config=config),
                                                       dtype=getattr(torch, config.model.dtype))
        say.say(f"resuming from the checkpoint after iteration {state.iteration}")
    else:
        say.say(f"loading the model {config.model.path}" if model is None else "model given")
        if model is None:
            model, tokenizer = build_model(config, algo)
        optimizers, state = make_optimizers(model, config), RunState()
    model.to(accelerator.device)
    say.say(f"model on {accelerator.device} in {next(model.parameters()).dtype}".replace("torch.", ""))
    trainable, *prepared = accelerator.prepare(model, *optimizers.values())
    optimizers = dict(zip(optimizers, prepared))
    if auto_lr:
        kind = "LoRA" if model.uses_lora else "full fine-tune"
        say.say(f"optim.actor_lr {config.optim.actor_lr:g} (auto, for a {kind} of this model; set it to override)")
    run = Run(config=config, model=model, tokenizer=tokenizer, optimizers=optimizers, algo=algo,
              rollout=RolloutSettings.from_config(config.rollout),
              reference=initial_reference(config, algo, model, resumed, accelerator.device),
              accelerator=accelerator, trainable=trainable, task_pool=task_pool, env_pool=env_pool)
    logger = Logger(out_dir, config, state.history) if main else None

    try:
        logged = None  # when the last record was complete: the next one's time/log_s (writing it) starts there
        if not state.sft_done:  # iteration 0: the warm start (if any), then the held-out figure RL starts from
            record = warm_start(run, train_envs[0], say)
            if config.eval_every and not any(k.startswith("eval/") for k in record):  # sft.from_run's may stand
                record |= evaluation(run, eval_envs, 0, say)
            state.sft_done = True
            logged = close_record(run, state, logger, {"iteration": 0, **record} if record else None, None)
        bar = say.bar(range(state.iteration, config.iterations), "iteration", config.iterations,
                      initial=state.iteration, every_s=0)  # off a terminal: a line per iteration
        for iteration in bar:
            started = time.perf_counter()
            record = rl_iteration(run, iteration, train_envs)
            done = iteration + 1
            if config.eval_every and (done % config.eval_every == 0 or done == config.iterations):
                record |= evaluation(run, eval_envs, done, say)
            if logged is not None:  # the previous record's writing and the progress line, since it was complete
                record["time/log_s"], started = started - logged, logged
            state.iteration = done
            logged = close_record(run, state, logger, record, started)
            bar.set_postfix(progress_postfix(record))
    finally:
        if logger is not None:
            logger.close()
        for env in train_envs + eval_envs:
            env.close()
        if env_pool is not None:
            env_pool.close()

    summary = summarise_run(state.history, config)
    if main:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_curves(state.history, out_dir / "learning_curve.png", config.algo)
    return summary
