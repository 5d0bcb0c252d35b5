"""The RL loop, one iteration at a time: rollout -> rows -> advantages -> critic -> actor.

Read it top to bottom: ``train`` builds everything, then each ``iteration``

1. collects ``rollout.episodes_per_batch`` episodes (``tasks x group_size``: ``config.batch_shape``) with the
   current policy (``rollout.collect``),
2. lays them out as rows (``rows.build_rows``: packed or one row per action),
3. scores the rows without gradient (critic values at the action boundaries, reference log-probs when a
   KL term is on; the rollout's own log-probs serve as the old ones),
4. runs the algorithm's estimator on per-action tensors (``algorithms``),
5. updates the critic, then the actor, on mini-batches of rows.

Randomness is derived from ``(seed, iteration)`` alone, so a run resumed from a checkpoint repeats the
iterations an uninterrupted run would have made.

The loop runs on ``accelerate``: one process on the CPU, or ``accelerate launch`` / ``torchrun`` with one
process per device, each collecting its own episodes, gradients averaged across processes; the main
process logs and writes the checkpoints (every process evaluates its share of the held-out tasks).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import random
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from .algorithms import BoundAlgorithm, StepBatch, get, kl_loss, token_value_loss, value_loss
from .algorithms.losses import action_log_ratio, entropy_loss
from .backends.base import GenerationBackend
from .backends.hf import HFBackend
from .backends.select import holds_weights, rollout_backend, sync_rollout_weights
from .config import ConfigError, TrainConfig, batch_shape, default_actor_lr, env_kwargs, env_spec, to_dict
from .envpool import EnvPool, pool_from_config
from .episodes import held_out_recorder, recorder_for
from .models.actor_critic import ActorCritic, LoraSettings, build_actor_critic, load_reference
from .models.checkpoints import CHECKPOINT, RunState, load_run, save_run
from .models.logprobs import evaluating, reference_logp, scored_logp
from .progress import SILENT, Progress, duration
from .rollout import RolloutSettings, collect, env_tasks, has_task_ids, rollout_stats
from .rows import RowBatch, Trajectory, build_rows, gather_actions, minibatches

LENGTH_BUCKETS = (8, 16, 32, 64)  # action-length buckets (tokens) for the ratio-spread diagnostic
WARM_START = "warm_start"  # run-folder entry: the warm-started actor, the KL reference when KL is on


# ----------------------------------------------------------------------------- set-up


def resolve_model_path(path: str) -> str:
    if path == "smollm2":
        from .smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    return path


def build_model(config: TrainConfig, algo: BoundAlgorithm) -> tuple[ActorCritic, Any]:
    lora = None
    if config.model.lora:
        lora = LoraSettings(r=config.model.lora_r, alpha=config.model.lora_alpha, last_layers=config.model.lora_last_layers)
    return build_actor_critic(
        resolve_model_path(config.model.path),
        critic=config.model.critic if algo.needs_critic else None,
        dtype=getattr(torch, config.model.dtype),
        lora=lora,
        gradient_checkpointing=config.model.gradient_checkpointing,
    )


def takes_split(env_id: str) -> bool:
    """Whether the env has a ``split`` (its constructor names the parameter, or its registration sets it)."""
    spec = env_spec(env_id)
    if "split" in (spec.kwargs or {}):
        return True
    creator = spec.entry_point
    try:
        if isinstance(creator, str):
            creator = gym.envs.registration.load_env_creator(creator)
        return "split" in inspect.signature(creator).parameters
    except (ImportError, AttributeError, TypeError, ValueError):  # gym.make will say what is wrong
        return False


def make_envs(config: TrainConfig, split: str, count: int, pool: EnvPool | None = None) -> list[gym.Env]:
    """``count`` copies of the configured env on ``split`` (passed only to envs that have a split: README,
    the environment contract), built by ``pool`` (in its worker processes for a process pool) when given.
    Any failure to build one is a ConfigError that names the id and kwargs."""
    kwargs = env_kwargs(config.env)
    if takes_split(config.env.id):
        kwargs["split"] = split
    envs: list[gym.Env] = []
    try:
        for _ in range(count):
            envs.append((pool.make if pool is not None else gym.make)(config.env.id, **kwargs))
    except Exception as e:  # noqa: BLE001  (a wrong kwarg, missing data, an env bug: all stop the run here)
        for env in envs:
            env.close()
        raise ConfigError(f"cannot make env {config.env.id!r} with kwargs {kwargs}: {type(e).__name__}: {e}") from e
    return envs


def iteration_seed(seed: int, iteration: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + iteration * 7_919 + salt) % (2**31)


def make_accelerator(config: TrainConfig):
    """One process on the CPU here; under ``accelerate launch`` / ``torchrun`` one process per device, each
    collecting its own episodes, with gradients averaged across processes (DDP)."""
    from accelerate import Accelerator, DistributedDataParallelKwargs

    # The actor pass leaves a separate critic unused and vice versa.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    return Accelerator(cpu=config.device == "cpu" or not torch.cuda.is_available(), kwargs_handlers=[ddp])


def unwrap(model: torch.nn.Module) -> ActorCritic:
    """The ``ActorCritic`` inside a DDP wrapper (its attributes are not reachable through the wrapper)."""
    return getattr(model, "module", model)


def gather_trajectories(trajectories: list[Trajectory], accelerator) -> list[Trajectory]:
    """Every process's trajectories, for statistics that describe the whole batch."""
    if accelerator is None or accelerator.num_processes == 1:
        return trajectories
    from accelerate.utils import gather_object

    return gather_object(trajectories)


def synced_minibatch_count(rows: int, size: int, accelerator) -> int | None:
    """With several processes, every one must take the same number of optimizer steps: the most any needs."""
    if accelerator is None or accelerator.num_processes == 1:
        return None
    count = torch.tensor([math.ceil(rows / size)], device=accelerator.device)
    return int(accelerator.gather(count).max())


# ----------------------------------------------------------------------------- scoring and targets


@dataclass
class Targets:
    """Per-action training targets, indexed by the batch's original action ids."""

    advantages: torch.Tensor  # [A] or [A, L]
    returns: torch.Tensor | None  # same shape, for the critic
    old_values: torch.Tensor | None  # [A] (boundary) or [A, L] (tokens)
    ref_logp: torch.Tensor | None  # [A, L]


def shift_right(values: torch.Tensor) -> torch.Tensor:
    """``[R, S]`` -> ``[R, S]`` with ``out[:, s] = values[:, s - 1]``: the value *before* token s."""
    return torch.cat([values[:, :1], values[:, :-1]], dim=1)


@torch.no_grad()
def final_values(model: ActorCritic, trajectories: list[Trajectory], batch: RowBatch, pad_id: int) -> torch.Tensor:
    """``[A]``: V of the state after each action's trajectory's last action, for truncated trajectories
    (bootstrapping; the authors' code, AgentR1/CAPO arft/core_algos.py, uses 0 here); 0 elsewhere."""
    out = torch.zeros(batch.num_actions)
    cut = [i for i, t in enumerate(trajectories) if t.truncated and t.final_prompt_ids]
    if not cut:
        return out
    prompts = [trajectories[i].final_prompt_ids for i in cut]
    S = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), S), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), S, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    with evaluating(model):
        values = model(ids, mask, need_values=True, need_logp=False).values  # [n, S]
    last = values[torch.arange(len(prompts), device=device), mask.sum(1) - 1].cpu()  # [n]
    by_traj = dict(zip(cut, last.tolist()))
    for a, traj in enumerate(batch.traj_index.tolist()):
        out[a] = by_traj.get(traj, 0.0)
    return out.to(batch.reward.device)


def recomputes_logprobs(config: TrainConfig, backend: Any) -> bool:
    """``rollout.recompute_logprobs``, null meaning: when the backend samples from its own copy of the
    weights (vLLM), not from the actor module itself (HF)."""
    setting = config.rollout.recompute_logprobs
    return holds_weights(backend) if setting is None else bool(setting)


@torch.no_grad()
def recompute_old_logp(model: ActorCritic, batch: RowBatch, temperature: float) -> dict[str, float]:
    """Replace ``batch.old_logp [A, L]`` (the backend's, as sampled) by the actor's own at the rollout's
    ``temperature``, one forward pass without gradient, so that the first update's ratio starts at exactly 1
    (verl recomputes them the same way). Returns how far the backend's were, over the action tokens: vLLM's
    kernels and dtype differ from the training pass, and CAPO's ratio clip (3e-4) is smaller than that gap."""
    rollout_logp = batch.old_logp
    logp = scored_logp(model.actor, batch.input_ids, batch.attention_mask, logp_mask=batch.action_index >= 0,
                       temperature=temperature)  # [R, S]
    mask = batch.action_mask.bool()
    batch.old_logp = torch.where(mask, gather_actions(logp, batch), 0)  # [A, L]
    gap = (batch.old_logp - rollout_logp)[mask].abs()
    return {"rollout/logprob_gap_mean": float(gap.mean()) if gap.numel() else 0.0,
            "rollout/logprob_gap_max": float(gap.max()) if gap.numel() else 0.0}


@torch.no_grad()
def compute_targets(
    model: ActorCritic,
    algo: BoundAlgorithm,
    batch: RowBatch,
    final_value: torch.Tensor | None,
    reference: torch.nn.Module | None = None,
    temperature: float = 1.0,
) -> Targets:
    """Critic values and reference log-probs (at the rollout's ``temperature``) without gradient, then the
    estimator."""
    step = StepBatch(
        reward=batch.reward,
        traj_index=batch.traj_index,
        step_index=batch.step_index,
        group_index=batch.group_index,
        truncated=batch.truncated,
        final_value=final_value,
        response_mask=batch.action_mask,
        anchor=batch.anchor,
    )
    old_values = None
    if algo.needs_critic:
        with evaluating(model):
            values = model(batch.input_ids, batch.attention_mask, need_values=True, need_logp=False).values
        step.values = values[batch.boundary_row, batch.boundary_pos]  # [A]: V(s_t) at the last state token
        step.token_values = gather_actions(shift_right(values), batch)  # [A, L]: V before each action token
        old_values = step.values if algo.critic_at == "boundary" else step.token_values
    ref_logp = None
    if algo.kl_coef > 0:
        ref_logp = gather_actions(
            reference_logp(
                model, batch.input_ids, batch.attention_mask, reference=reference, logp_mask=batch.action_index >= 0,
                temperature=temperature,
            ),
            batch,
        )
        if algo.kl_in_reward:
            step.token_kl = torch.where(batch.action_mask.bool(), batch.old_logp - ref_logp, 0)
    estimate = algo.estimate(step)
    return Targets(estimate.advantages, estimate.returns, old_values, ref_logp)


# ----------------------------------------------------------------------------- updates


def _optimizers(model: ActorCritic, config: TrainConfig) -> dict[str, torch.optim.Optimizer]:
    if config.optim.actor_lr is None:  # auto, by model kind; written into the config, so the checkpoint keeps it
        config.optim.actor_lr = default_actor_lr(model.uses_lora, sum(p.numel() for p in model.actor.parameters()))
    opts = {
        "actor": torch.optim.AdamW(
            list(model.actor_parameters()), lr=config.optim.actor_lr, weight_decay=config.optim.weight_decay
        )
    }
    critic_params = list(model.critic_parameters())
    if critic_params:
        opts["critic"] = torch.optim.AdamW(critic_params, lr=config.optim.critic_lr, weight_decay=config.optim.weight_decay)
    return opts


def _optimizer_step(
    loss: torch.Tensor, params: list, optimizers: list, grad_clip: float, stats: dict, name: str, accelerator=None
) -> None:
    """Backward, clip, step; a NaN/inf loss or gradient skips the update and leaves the weights untouched.

    With several processes the loss's finiteness is agreed on first, so all of them step or none does."""
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    finite = torch.isfinite(loss.detach())
    if accelerator is not None and accelerator.num_processes > 1:
        finite = accelerator.gather(finite.reshape(1)).all()
    if finite:
        if accelerator is not None:
            accelerator.backward(loss)
            grad_norm = accelerator.clip_grad_norm_(params, grad_clip)
        else:
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        if torch.isfinite(grad_norm):
            for opt in optimizers:
                opt.step()
            stats.setdefault(f"{name}/grad_norm", []).append(grad_norm.item())
            return
        bad = f"gradient norm {grad_norm.item()}"
    else:
        bad = f"loss {loss.item()}"
    warnings.warn(f"{name}: {bad}, update skipped", RuntimeWarning, stacklevel=2)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    stats[f"{name}/skipped_updates"] = stats.get(f"{name}/skipped_updates", 0) + 1


def _value_loss(algo: BoundAlgorithm, values: torch.Tensor, mb: RowBatch, targets: Targets, cliprange: float):
    ids = mb.action_id
    if algo.critic_at == "boundary":
        v = values[mb.boundary_row, mb.boundary_pos]  # [a]
        return value_loss(v, targets.old_values[ids], targets.returns[ids], cliprange=cliprange)
    v = gather_actions(shift_right(values), mb)  # [a, L]
    L = v.shape[1]
    return token_value_loss(
        v, targets.old_values[ids, :L], targets.returns[ids, :L], mb.action_mask, cliprange=cliprange
    )


def update(
    model: ActorCritic,
    optimizers: dict,
    algo: BoundAlgorithm,
    batch: RowBatch,
    targets: Targets,
    config: TrainConfig,
    generator: torch.Generator,
    accelerator=None,
    probe=None,
) -> dict[str, float]:
    """Critic first (its own pass, unless it shares the actor's forward), then the actor.

    ``model`` may be the accelerator's (DDP-wrapped) model: its forward syncs gradients across processes."""
    stats: dict[str, Any] = {}
    inner = unwrap(model)
    count = synced_minibatch_count(batch.num_rows, config.optim.minibatch_rows, accelerator)
    shared_critic = algo.needs_critic and config.model.critic == "shared"
    cliprange = algo.settings.get("value_cliprange", 0.5)
    if algo.needs_critic and not shared_critic:
        for _ in range(config.optim.ppo_epochs):
            for mb in minibatches(batch, config.optim.minibatch_rows, generator, count):
                values = model(mb.input_ids, mb.attention_mask, need_values=True, need_logp=False).values
                loss, _ = _value_loss(algo, values, mb, targets, cliprange)
                _optimizer_step(loss, list(inner.critic_parameters()), [optimizers["critic"]],
                                config.optim.grad_clip, stats, "critic", accelerator)
                stats.setdefault("critic/loss", []).append(loss.item())

    kl_coef = 0.0 if algo.kl_in_reward else algo.kl_coef  # a loss term unless it went into the reward
    entropy_coef = algo.settings.get("entropy_coef", 0.0)
    ratio_mode = "capo" if algo.ratio_mode == "token" else algo.ratio_mode
    for _ in range(config.optim.ppo_epochs):
        for mb in minibatches(batch, config.optim.minibatch_rows, generator, count):
            out = model(
                mb.input_ids,
                mb.attention_mask,
                need_values=shared_critic,
                need_entropy=entropy_coef > 0 or config.log_entropy,
                logp_mask=mb.action_index >= 0,
                temperature=config.rollout.temperature,  # the distribution the rollout sampled from
            )
            logp = gather_actions(out.logp, mb)  # [a, L]
            L = logp.shape[1]
            advantages = targets.advantages[mb.action_id]
            if advantages.dim() == 2:
                advantages = advantages[:, :L]
            loss, diag = algo.policy_loss(logp, mb.old_logp, advantages, mb.action_mask)
            if probe is not None:  # capo view: each action's ratio and clip decision (episodes.py)
                probe(mb.action_id, logp, mb.old_logp, advantages, mb.action_mask)
            if kl_coef > 0:
                kl, _ = kl_loss(logp, targets.ref_logp[mb.action_id, :L], mb.action_mask, kind=algo.settings.get("kl_type", "k3"))
                loss = loss + kl_coef * kl
                stats.setdefault("actor/kl_ref", []).append(kl.item())
            if out.entropy is not None:
                ent, _ = entropy_loss(mb.action_mask, entropy=gather_actions(out.entropy, mb))
                if entropy_coef > 0:
                    loss = loss - entropy_coef * ent
                stats.setdefault("actor/entropy", []).append(ent.item())
            stats.setdefault("actor/loss", []).append(loss.item())
            params, opts = list(inner.actor_parameters()), [optimizers["actor"]]
            if shared_critic:  # the head reads detached features: its loss moves only the head
                v_loss, _ = _value_loss(algo, out.values, mb, targets, cliprange)
                stats.setdefault("critic/loss", []).append(v_loss.item())
                loss = loss + v_loss
                params, opts = params + list(inner.critic_parameters()), opts + [optimizers["critic"]]
            _optimizer_step(loss, params, opts, config.optim.grad_clip, stats, "actor", accelerator)
            for key, value in diag.items():
                stats.setdefault(f"actor/{key}", []).append(float(value))
            _ratio_spread(logp.detach(), mb, ratio_mode, stats)
    return _summarise(stats)


def _ratio_spread(logp: torch.Tensor, mb: RowBatch, mode: str, stats: dict) -> None:
    """Std of the per-action log-ratio in action-length buckets: what CAPO's length calibration equalises."""
    log_w = action_log_ratio(logp, mb.old_logp, mb.action_mask, mode)  # [a]
    lengths = mb.action_mask.sum(1)
    lower = 0
    for upper in LENGTH_BUCKETS + (math.inf,):
        inside = (lengths > lower) & (lengths <= upper)
        if inside.sum() > 1:
            name = f"ratio_spread/len_{lower + 1}-{upper if upper != math.inf else 'inf'}"
            stats.setdefault(name, []).append(log_w[inside].std().item())
        lower = upper


def _summarise(stats: dict) -> dict[str, float]:
    return {k: (sum(v) / len(v) if isinstance(v, list) else float(v)) for k, v in stats.items() if v != []}


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns); NaN when the returns hardly vary (a batch in which every
    episode failed), where the ratio says nothing about the critic."""
    var = returns.var()
    return float(1 - (returns - values).var() / var) if var > 1e-6 else float("nan")


# ----------------------------------------------------------------------------- evaluation


def evaluate(
    model: ActorCritic | None, tokenizer, config: TrainConfig, envs: list[gym.Env], episodes: int, accelerator=None,
    backend: GenerationBackend | None = None, progress: Progress = SILENT, on_trajectories=None,
    env_pool: EnvPool | None = None,
) -> dict[str, float]:
    """Greedy decoding on the first ``episodes`` tasks of the held-out split (the same tasks every time;
    for an env without ``task_ids()`` the held-out reset seeds, ``rollout.env_tasks``), shared out among the
    processes. ``backend`` generates instead of ``model`` (e.g. an ``OpenAIBackend`` in front of a server;
    ``model`` may then be None). ``on_trajectories``: called with the episodes (``capo view``'s recording)."""
    task_ids = list(env_tasks(envs[0], held_out=True)[:episodes]) if envs else []
    start = time.perf_counter()
    progress.say(f"held-out evaluation: {len(task_ids)} episodes")
    if accelerator is not None:
        task_ids = task_ids[accelerator.process_index :: accelerator.num_processes]
    trajectories = []
    if task_ids:
        in_process = backend is None
        backend = HFBackend(model.actor, tokenizer, batch_size=len(envs)) if in_process else backend
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


# ----------------------------------------------------------------------------- the loop


class Logger:
    """JSONL always; TensorBoard and wandb when installed and asked for.

    ``log.jsonl`` starts as ``history``, the records of the checkpoint the run continues from (none for a
    new run): a kill after an iteration was logged but before its checkpoint was written would otherwise
    leave that iteration in the log twice once the resumed run repeats it."""

    def __init__(self, out_dir: Path, config: TrainConfig, history: list[dict] = ()):
        self.path = out_dir / "log.jsonl"
        tmp = out_dir / ".log.jsonl.tmp"
        tmp.write_text("".join(json.dumps(record) + "\n" for record in history))
        os.replace(tmp, self.path)  # atomic: a kill now leaves the old log or the trimmed one
        self.tb = self.wandb = None
        if config.log_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:
                pass
        if config.log_wandb:
            try:
                import wandb  # optional, the extra [wandb]: pip install "capo-gym[wandb]"

                self.wandb = wandb.init(project="capo-gym", config=to_dict(config))
            except ImportError:
                warnings.warn("log_wandb is set but wandb is not installed", RuntimeWarning, stacklevel=2)

    def log(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        step = record.get("iteration", 0)
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


@dataclass(kw_only=True)
class Run:
    """What one training run holds on to between iterations."""

    config: TrainConfig
    model: ActorCritic
    tokenizer: Any
    optimizers: dict
    algo: BoundAlgorithm  # the algorithm with its hyperparameters
    rollout: RolloutSettings  # how episodes are played
    reference: torch.nn.Module | None  # a frozen initial actor; None with LoRA (adapters off) or no KL
    accelerator: Any = None
    trainable: torch.nn.Module | None = None  # ``model`` as the accelerator prepared it (DDP-wrapped on >1 process)
    task_pool: list[str] | None = None  # the train tasks RL draws from (None: all; see sft.tasks)
    env_pool: EnvPool | None = None  # where env calls run (rollout.env_pool; None: serially, in this thread)
    engine: GenerationBackend | None = None  # a rollout backend with its own weights, kept across iterations (vLLM)


def rl_iteration(run: Run, iteration: int, envs: list[gym.Env]) -> dict[str, float]:
    config, model, tokenizer, algo, accelerator = run.config, run.model, run.tokenizer, run.algo, run.accelerator
    rank = accelerator.process_index if accelerator is not None else 0
    start = time.perf_counter()
    # rollout.backend: a fresh HFBackend on the actor, or the run's vLLM engine (backends/select.py)
    backend = rollout_backend(config, model, tokenizer, batch_size=len(envs), engine=run.engine)
    run.engine = backend if holds_weights(backend) else None
    tasks, group = batch_shape(config)
    trajectories = collect(
        envs, backend, tokenizer, run.rollout, tasks_per_batch=tasks, group_size=group,
        seed=iteration_seed(config.seed, iteration, salt=104_729 * rank),  # each process its own tasks
        task_pool=run.task_pool, env_pool=run.env_pool,
    )
    rollout_s = time.perf_counter() - start
    everyone = gather_trajectories(trajectories, accelerator)
    record = {"iteration": iteration + 1, **{f"rollout/{k}": v for k, v in rollout_stats(everyone).items()}}
    batch = build_rows(trajectories, config.rollout.layout, backend.pad_id)
    if batch.num_actions == 0:
        return {**record, "time/rollout_s": rollout_s}
    batch.action_id = torch.arange(batch.num_actions)
    batch = batch.to(backend.device)
    if recomputes_logprobs(config, backend):  # before the targets: RLOO/REINFORCE++ put old - ref in the reward
        record |= recompute_old_logp(model, batch, config.rollout.temperature)
    final_value = final_values(model, trajectories, batch, backend.pad_id) if algo.needs_critic else None
    targets = compute_targets(model, algo, batch, final_value, run.reference, config.rollout.temperature)
    if targets.old_values is not None and targets.returns is not None:
        mask = batch.action_mask.bool() if targets.returns.dim() == 2 else torch.ones_like(targets.returns, dtype=torch.bool)
        record["critic/explained_variance"] = explained_variance(targets.old_values[mask], targets.returns[mask])
    generator = torch.Generator().manual_seed(iteration_seed(config.seed, iteration, salt=1))
    recorder = recorder_for(config, iteration, algo) if accelerator is None or accelerator.is_main_process else None
    update_start = time.perf_counter()
    record |= update(run.trainable or model, run.optimizers, algo, batch, targets, config, generator, accelerator,
                     probe=recorder.observe if recorder is not None else None)
    sync_rollout_weights(backend, model)  # a vLLM engine samples the next rollout with the updated actor
    update_s = time.perf_counter() - update_start
    tokens = float(batch.action_mask.sum())
    record |= {
        "time/rollout_s": rollout_s,
        "time/update_s": update_s,
        "time/iteration_s": time.perf_counter() - start,
        "throughput/rollout_tokens_per_s": record["rollout/tokens_generated"] / max(rollout_s, 1e-9),
        "throughput/update_action_tokens_per_s": tokens / max(update_s, 1e-9),
    }
    if recorder is not None:  # a sample of this iteration's episodes for `capo view`
        recorder.write(config.out_dir, iteration + 1, trajectories, batch, targets, tokenizer, envs[0])
    return record


def train(config: TrainConfig, *, resume: bool = False, model=None, tokenizer=None, progress: bool = True,
          tag: str = "capo train") -> dict:
    """Warm start (if configured), then ``config.iterations`` RL iterations; returns the summary.

    ``progress``: phase and iteration lines on stdout, ``[tag] ...`` (tqdm bars on a terminal)."""
    from .sft import behaviour_clone, warm_start_tasks

    torch.manual_seed(config.seed)
    random.seed(config.seed)
    accelerator = make_accelerator(config)
    main = accelerator.is_main_process
    report = Progress(tag, enabled=progress and main)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report.say(f"{config.algo} on {config.env.id}, {config.iterations} iterations, run folder {out_dir}")
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
    auto_lr = config.optim.actor_lr is None
    resumed = resume and (out_dir / CHECKPOINT).is_dir()
    if resumed:
        model, tokenizer, optimizers, state = load_run(out_dir, lambda m: _optimizers(m, config),
                                                       dtype=getattr(torch, config.model.dtype))
        report.say(f"resuming from the checkpoint after iteration {state.iteration}")
    else:
        report.say(f"loading the model {config.model.path}" if model is None else "model given")
        if model is None:
            model, tokenizer = build_model(config, algo)
        optimizers, state = _optimizers(model, config), RunState()
    model.to(accelerator.device)
    trainable, *prepared = accelerator.prepare(model, *optimizers.values())
    optimizers = dict(zip(optimizers, prepared))

    def kl_reference(path) -> torch.nn.Module:
        return load_reference(path, dtype=getattr(torch, config.model.dtype)).to(accelerator.device)

    reference = None
    # A fresh run ignores a warm_start/ left in out_dir by an earlier run: only this run's own counts.
    if algo.kl_coef > 0 and resumed and (out_dir / WARM_START).is_dir():  # resumed after this run's warm start
        reference = kl_reference(out_dir / WARM_START)
    elif algo.kl_coef > 0 and not model.uses_lora:
        reference = kl_reference(model.meta["base"])
    run = Run(config=config, model=model, tokenizer=tokenizer, optimizers=optimizers, algo=algo,
              rollout=RolloutSettings.from_config(config.rollout), reference=reference, accelerator=accelerator,
              trainable=trainable, task_pool=task_pool, env_pool=env_pool)
    logger = Logger(out_dir, config, state.history) if main else None
    if auto_lr:
        kind = "LoRA" if model.uses_lora else "full fine-tune"
        report.say(f"optim.actor_lr {config.optim.actor_lr:g} (auto, for a {kind} of this model; set it to override)")

    def checkpoint() -> None:
        if main:
            save_run(out_dir, model, tokenizer, optimizers, state, to_dict(config))
        accelerator.wait_for_everyone()

    def log(record: dict) -> None:
        state.history.append(record)
        if logger is not None:
            logger.log(record)

    def held_out(iteration: int = 0) -> dict:  # iteration: the RL iterations done (0: before RL)
        record_to = held_out_recorder(config, iteration, tokenizer, eval_envs[0]) if main and eval_envs else None
        return evaluate(model, tokenizer, config, eval_envs, config.eval_episodes, accelerator,
                        progress=report, on_trajectories=record_to, env_pool=env_pool) if eval_envs else {}

    try:
        if not state.sft_done:  # iteration 0: the warm start (if any), then the held-out figure RL starts from
            record = {}
            if config.sft.episodes > 0 and callable(getattr(train_envs[0].unwrapped, "expert_action", None)):
                record = behaviour_clone(model, tokenizer, config, train_envs[0], progress=report)
                if algo.kl_coef > 0:  # RL's KL anchor is the policy RL starts from, not the checkpoint before it
                    if main:
                        freeze_warm_start(model, tokenizer, out_dir / WARM_START)
                    accelerator.wait_for_everyone()
                    run.reference = kl_reference(out_dir / WARM_START)
            elif config.sft.episodes > 0 and main:
                warnings.warn(f"{config.env.id} has no expert_action(): no warm start", RuntimeWarning, stacklevel=2)
            if record or config.eval_every:
                record |= held_out()
            if record:  # evaluate() has reported the held-out figure
                record["iteration"] = 0
                log(record)
            state.sft_done = True
            checkpoint()
        bar = report.bar(range(state.iteration, config.iterations), "iteration", config.iterations,
                         initial=state.iteration, every_s=0)  # off a terminal: a line per iteration
        for iteration in bar:
            record = rl_iteration(run, iteration, train_envs)
            last = iteration + 1 == config.iterations
            if config.eval_every and ((iteration + 1) % config.eval_every == 0 or last):
                record |= held_out(iteration + 1)
            state.iteration = iteration + 1
            log(record)
            checkpoint()
            bar.set_postfix({
                "success": f"{record.get('rollout/success', 0):.2f}",
                "reward": f"{record.get('rollout/reward_mean', 0):.2f}",
                "invalid": f"{record.get('rollout/invalid_action_rate', 0):.2f}",
                "tok/s": f"{record.get('throughput/rollout_tokens_per_s', 0):.0f}",
            })
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


def freeze_warm_start(model: ActorCritic, tokenizer, path: Path) -> None:
    """Write the warm-started actor (LoRA merged) to ``path`` as a plain HF folder, atomically: the KL
    reference of the RL that follows, and of a resumed run (a frozen copy of the actor at iteration 0;
    with LoRA, disabling the adapters would give the model from before the warm start instead)."""
    import copy

    actor = copy.deepcopy(model.actor)
    actor = actor.merge_and_unload() if model.uses_lora else actor
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    actor.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def summarise_run(history: list[dict], config: TrainConfig) -> dict:
    evals = [(h["iteration"], h["eval/success"]) for h in history if "eval/success" in h]
    iteration_s = [h["time/iteration_s"] for h in history if "time/iteration_s" in h]
    return {
        "algo": config.algo,
        "env": config.env.id,
        "iterations": len(iteration_s),
        "eval_success_after_warm_start": next((s for i, s in evals if i == 0), None),
        "eval_success_final": evals[-1][1] if evals else None,
        "seconds_per_iteration": sum(iteration_s) / len(iteration_s) if iteration_s else None,
    }


def plot_curves(history: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    train = [(h["iteration"], h["rollout/success"]) for h in history if "rollout/success" in h]
    evals = [(h["iteration"], h["eval/success"]) for h in history if "eval/success" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train:
        ax.plot(*zip(*train), label="train rollouts (T=1)")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="held-out (greedy)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
