"""One iteration's learning step, once the episodes are laid out as rows: the targets (critic values,
reference log-probs, then the algorithm's estimator) and the critic and actor updates on mini-batches.

Shapes: ``R`` rows and ``S`` tokens per row (``rows.RowBatch``), ``A`` actions and ``L`` tokens per action
in the whole batch; ``a`` actions in one mini-batch.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .algorithms import BoundAlgorithm, StepBatch, kl_loss, token_value_loss, value_loss
from .algorithms.losses import action_log_ratio, entropy_loss
from .backends.select import holds_weights
from .config import TrainConfig
from .distributed import synced_minibatch_count, unwrap
from .models.actor_critic import ActorCritic, SharedCritic
from .models.logprobs import evaluating, frozen_prefix_layers, scored_logp
from .models.scoring import reference_logp
from .report import Stopwatch
from .rows import RowBatch, Trajectory, gather_actions, minibatches, pad_frozen_states

LENGTH_BUCKETS = (8, 16, 32, 64)  # action-length buckets (tokens) for the ratio-spread diagnostic


# ----------------------------------------------------------------------------- targets


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
    (bootstrapping; the authors' code, AgentR1/CAPO arft/core_algos.py, uses 0 here); 0 elsewhere. A shared
    critic reads them from the hidden states the HF rollout recorded (``Trajectory.final_features``); else
    (another critic or backend) one pass over each truncated episode's final state."""
    out = torch.zeros(batch.num_actions)
    cut = [i for i, t in enumerate(trajectories) if t.truncated and t.final_prompt_ids]
    if not cut:
        return out
    device = next(model.parameters()).device
    if reads_features(model) and all(trajectories[i].final_features is not None for i in cut):
        # A shared critic reads the hidden states the HF rollout recorded at those states (prompt_features).
        features = torch.stack([trajectories[i].final_features for i in cut])  # [n, H]
        last = unwrap(model).critic(features.to(device)).cpu()  # [n]
    else:
        prompts = [trajectories[i].final_prompt_ids for i in cut]
        S = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), S), pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), S, dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
        ids, mask = ids.to(device), mask.to(device)
        with evaluating(model):
            values = model(ids, mask, need_values=True, need_logp=False).values  # [n, S]
        last = values[torch.arange(len(prompts), device=device), mask.sum(1) - 1].cpu()  # [n]
    by_traj = dict(zip(cut, last.tolist()))
    for a, traj in enumerate(batch.traj_index.tolist()):
        out[a] = by_traj.get(traj, 0.0)
    return out.to(batch.reward.device)


def reads_features(model: ActorCritic) -> bool:
    """Whether the critic is a head on the actor's final hidden states (``model.critic=shared``), so that
    hidden states recorded while generating give its values (:func:`values_from_features`)."""
    return isinstance(unwrap(model).critic, SharedCritic)


@torch.no_grad()
def values_from_features(model: ActorCritic, features: list[torch.Tensor], batch: RowBatch
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [A], token_values [A, L])`` of a shared critic from each action's ``[L_a, H]`` recorded
    hidden states: row 0 is the last state token (V(s_t), CAPO's boundary value), row j the j-th action
    token, which is what ``gather_actions(shift_right(values))`` reads from a pass over the rows. The
    rollout's pass and a training pass differ only by float rounding (batching and padding differ)."""
    A, L = batch.action_mask.shape
    H = features[0].shape[-1]
    padded = torch.zeros(A, L, H)  # [A, L, H]
    for a, f in enumerate(features):
        padded[a, : f.shape[0]] = f
    device = batch.action_mask.device
    head = unwrap(model).critic
    token_values = head(padded.to(device)) * batch.action_mask  # [A, L]
    return token_values[:, 0].clone(), token_values


def recomputes_logprobs(config: TrainConfig, backend: Any) -> bool:
    """``rollout.recompute_logprobs``, null meaning: when the backend samples from its own copy of the
    weights (vLLM), or when the model runs in half precision. HF generation in bfloat16 scores its tokens with
    the KV cache's kernels, not the training pass's: on an H200 they differed by 0.020 a token on average
    (max 0.12; ``benchmarks/gpu_check.py``, docs/envpool.md), far above CAPO's 3e-4 action clip. In float32
    the actor's own generation log-probs are the training pass's to 1e-4."""
    setting = config.rollout.recompute_logprobs
    if setting is not None:
        return bool(setting)
    return holds_weights(backend) or config.model.dtype != "float32"


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
    watch: Stopwatch | None = None,
    state_features: list[torch.Tensor] | None = None,
) -> Targets:
    """Critic values and reference log-probs (at the rollout's ``temperature``) without gradient, then the
    estimator. ``watch`` times the three: ``time/values_s``, ``time/reference_s``, ``time/estimate_s``.

    ``state_features`` (``rows.action_features``): the actor's hidden states the rollout recorded before each
    action token. A shared critic's values are then its head on them (:func:`values_from_features`), and
    the critic pass over the whole batch is skipped."""
    watch = Stopwatch() if watch is None else watch
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
    critic_from_features = state_features is not None and reads_features(model)
    critic_pass = algo.needs_critic and not critic_from_features
    # padded once for both passes over the batch (the critic's and the reference's), when either runs
    frozen_states = frozen_states_of(model, batch) if critic_pass or algo.kl_coef > 0 else None  # [R, S, H]
    old_values = None
    if algo.needs_critic:
        with watch.phase("time/values_s"), evaluating(model):
            if critic_from_features:
                step.values, step.token_values = values_from_features(model, state_features, batch)
            else:
                values = model(batch.input_ids, batch.attention_mask, need_values=True, need_logp=False,
                               frozen_states=frozen_states).values  # [R, S]
                step.values = values[batch.boundary_row, batch.boundary_pos]  # [A]: V(s_t) at the last state token
                step.token_values = gather_actions(shift_right(values), batch)  # [A, L]: V before each action token
        old_values = step.values if algo.critic_at == "boundary" else step.token_values
    ref_logp = None
    if algo.kl_coef > 0:
        with watch.phase("time/reference_s"):
            ref_logp = gather_actions(
                reference_logp(
                    model, batch.input_ids, batch.attention_mask, reference=reference,
                    logp_mask=batch.action_index >= 0, temperature=temperature,
                    frozen_states=frozen_states,
                ),
                batch,
            )  # [A, L]
        if algo.kl_in_reward:
            step.token_kl = torch.where(batch.action_mask.bool(), batch.old_logp - ref_logp, 0)
    with watch.phase("time/estimate_s"):
        estimate = algo.estimate(step)
    return Targets(estimate.advantages, estimate.returns, old_values, ref_logp)


def frozen_states_of(model, batch: RowBatch) -> torch.Tensor | None:
    """``[R, S, H]``: the rows' recorded states entering the actor's first trainable layer, padded, on the rows'
    device (``rollout.frozen_layers_from_rollout``), so the actor's pass runs only its trainable layers; None
    (the whole actor runs) when the batch has none or the actor now has no frozen leading layers."""
    if batch.frozen_states is None or frozen_prefix_layers(unwrap(model).actor) is None:
        return None
    return pad_frozen_states(batch.frozen_states, batch.input_ids.shape[1], batch.input_ids.device)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns); NaN when the returns hardly vary (a batch in which every
    episode failed), where the ratio says nothing about the critic."""
    var = returns.var()
    return float(1 - (returns - values).var() / var) if var > 1e-6 else float("nan")


def critic_fit(targets: Targets, batch: RowBatch) -> dict[str, float]:
    """``critic/explained_variance`` of the critic's values before the update against the returns (over the
    action tokens for a token-level critic); nothing without a critic."""
    if targets.old_values is None or targets.returns is None:
        return {}
    if targets.returns.dim() == 2:
        mask = batch.action_mask.bool()
    else:
        mask = torch.ones_like(targets.returns, dtype=torch.bool)
    return {"critic/explained_variance": explained_variance(targets.old_values[mask], targets.returns[mask])}


# ----------------------------------------------------------------------------- updates


def optimizer_step(
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


def minibatch_value_loss(algo: BoundAlgorithm, values: torch.Tensor, mb: RowBatch, targets: Targets,
                         cliprange: float):
    """The critic's loss on one mini-batch: at each action's boundary, or on every action token."""
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
    watch: Stopwatch | None = None,
    train_actor: bool = True,
) -> dict[str, float]:
    """Critic first (its own pass, unless it shares the actor's forward), then the actor; returns the
    mean of each ``actor/*``, ``critic/*`` and ``ratio_spread/*`` statistic over the mini-batches.
    ``train_actor=False`` (``optim.critic_warmup``): the critic's steps only, the actor's weights untouched.

    ``model`` may be the accelerator's (DDP-wrapped) model: its forward syncs gradients across processes.
    ``probe``: called with each actor mini-batch's log-probs (``capo view``'s recording, episodes.py).
    ``watch`` times the critic's passes (``time/update_critic_s``) and the actor's (``time/update_actor_s``)."""
    watch = Stopwatch() if watch is None else watch
    stats: dict[str, Any] = {}
    shared_critic = config.model.critic == "shared"  # trained in the actor's steps, unless they are skipped
    if algo.needs_critic and (not shared_critic or not train_actor):
        with watch.phase("time/update_critic_s"):
            _update_critic(model, optimizers, algo, batch, targets, config, generator, accelerator, stats)
    if train_actor:
        with watch.phase("time/update_actor_s"):
            _update_actor(model, optimizers, algo, batch, targets, config, generator, accelerator, probe, stats)
    return summarise(stats)


def _update_critic(model, optimizers, algo, batch, targets, config, generator, accelerator, stats) -> None:
    """The critic's own mini-batch steps: a separate critic's, or a shared critic's head alone (only the
    critic's optimizer steps: the actor's weights stay as they are); adds to ``stats``."""
    inner = unwrap(model)
    shared_critic = config.model.critic == "shared"
    count = synced_minibatch_count(batch.num_rows, config.optim.minibatch_rows, accelerator)
    cliprange = algo.settings.get("value_cliprange", 0.5)
    for _ in range(config.optim.ppo_epochs):
        for mb in minibatches(batch, config.optim.minibatch_rows, generator, count):
            values = model(mb.input_ids, mb.attention_mask, need_values=True, need_logp=False,
                           frozen_states=frozen_states_of(model, mb) if shared_critic else None).values  # [r, S]
            loss, _ = minibatch_value_loss(algo, values, mb, targets, cliprange)
            optimizer_step(loss, list(inner.critic_parameters()), [optimizers["critic"]],
                           config.optim.grad_clip, stats, "critic", accelerator)
            stats.setdefault("critic/loss", []).append(loss.item())


def _update_actor(model, optimizers, algo, batch, targets, config, generator, accelerator, probe, stats) -> None:
    """The actor's mini-batch steps (with the shared critic's head); adds to ``stats``."""
    inner = unwrap(model)
    count = synced_minibatch_count(batch.num_rows, config.optim.minibatch_rows, accelerator)
    shared_critic = algo.needs_critic and config.model.critic == "shared"
    cliprange = algo.settings.get("value_cliprange", 0.5)
    kl_coef = 0.0 if algo.kl_in_reward else algo.kl_coef  # a loss term unless it went into the reward
    entropy_coef = algo.settings.get("entropy_coef", 0.0)
    ratio_mode = "capo" if algo.ratio_mode == "token" else algo.ratio_mode
    target_kl = config.optim.target_kl
    steps, stopped = 0, False
    for _ in range(config.optim.ppo_epochs):
        for mb in minibatches(batch, config.optim.minibatch_rows, generator, count):
            out = model(
                mb.input_ids,
                mb.attention_mask,
                need_values=shared_critic,
                need_entropy=entropy_coef > 0 or config.log_entropy,
                logp_mask=mb.action_index >= 0,
                temperature=config.rollout.temperature,  # the distribution the rollout sampled from
                frozen_states=frozen_states_of(model, mb),  # run only the trainable layers, when recorded
            )
            logp = gather_actions(out.logp, mb)  # [a, L]
            L = logp.shape[1]
            advantages = targets.advantages[mb.action_id]  # [a] or [a, L']
            if advantages.dim() == 2:
                advantages = advantages[:, :L]
            loss, diag = algo.policy_loss(logp, mb.old_logp, advantages, mb.action_mask)
            if target_kl is not None and moved_too_far(diag["approx_kl"], target_kl, accelerator):
                stats["actor/approx_kl_at_stop"] = float(diag["approx_kl"])
                stopped = True  # this mini-batch and the rest are not stepped on; the next iteration samples afresh
                break
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
                v_loss, _ = minibatch_value_loss(algo, out.values, mb, targets, cliprange)
                stats.setdefault("critic/loss", []).append(v_loss.item())
                loss = loss + v_loss
                params, opts = params + list(inner.critic_parameters()), opts + [optimizers["critic"]]
            optimizer_step(loss, params, opts, config.optim.grad_clip, stats, "actor", accelerator)
            steps += 1
            for key, value in diag.items():
                stats.setdefault(f"actor/{key}", []).append(float(value))
            ratio_spread(logp.detach(), mb, ratio_mode, stats)
        if stopped:
            break
    if target_kl is not None:
        stats["actor/steps"] = float(steps)
        stats["actor/stopped_early"] = float(stopped)


def moved_too_far(approx_kl: torch.Tensor, target_kl: float, accelerator=None) -> bool:
    """Whether a mini-batch's ``approx_kl`` (the k3 estimate of KL(pi_old || pi) per action token, before
    its step) exceeds ``optim.target_kl``. Every process decides on the mean over processes, so that all
    stop at the same mini-batch (their gradient all-reduce would otherwise wait forever)."""
    kl = approx_kl.detach().reshape(1).float()
    if accelerator is not None and accelerator.num_processes > 1:
        kl = accelerator.reduce(kl.to(accelerator.device), reduction="mean")
    return kl.item() > target_kl


def ratio_spread(logp: torch.Tensor, mb: RowBatch, mode: str, stats: dict) -> None:
    """Std of the per-action log-ratio in action-length buckets: what CAPO's length calibration equalises."""
    log_w = action_log_ratio(logp, mb.old_logp, mb.action_mask, mode)  # [a]
    lengths = mb.action_mask.sum(1)  # [a]
    lower = 0
    for upper in LENGTH_BUCKETS + (math.inf,):
        inside = (lengths > lower) & (lengths <= upper)
        if inside.sum() > 1:
            name = f"ratio_spread/len_{lower + 1}-{upper if upper != math.inf else 'inf'}"
            stats.setdefault(name, []).append(log_w[inside].std().item())
        lower = upper


def summarise(stats: dict) -> dict[str, float]:
    """Each list of per-mini-batch values as its mean; counts (``*/skipped_updates``) as they are."""
    return {k: (sum(v) / len(v) if isinstance(v, list) else float(v)) for k, v in stats.items() if v != []}
