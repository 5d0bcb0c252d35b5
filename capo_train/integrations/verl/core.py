"""The verl adapter's numerics, as pure torch functions of what verl stores per row (no verl import).

verl's V1 trainer keeps one row per agent-loop output under the TransferQueue key
``{uid}_{session_id}_{index}`` (verl/trainer/ppo/v1/agent_loop_tq.py, ``_agent_loop_postprocess``): with the
``capo_env`` agent loop a row is one action, ``{uid}`` the task (prompt), ``{uid}_{session_id}`` one
trajectory (rollout.n sessions per task) and ``index`` the action's step. Tensors are verl's padded
response tensors ``[R, L]`` (R rows = actions, L = longest response), so ``[R, L]`` here is capo_train's
``[A, L]``. ``values[:, 0]`` is the critic's value at the last prompt token, V(s_t) before action t: verl
slices the critic's output with a left shift by one (verl/workers/utils/padding.py, ``no_padding_2_padding``),
as the CAPO authors' code relies on (AgentR1/CAPO arft/core_algos.py, ``step_values = values[:, 0]``).

Everything here calls ``capo_train.algorithms`` itself, so the verl path and the native trainer compute
the same numbers by construction; tests/test_verl_parity.py checks it to float precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from capo_train.algorithms import StepBatch, action_log_ratio, approx_kls, broadcast_actions, get, masked_mean
from capo_train.algorithms.losses import clipped_surrogate

# verl estimator name (algorithm.adv_estimator) -> capo_train algorithm whose estimator the trainer runs.
ESTIMATORS: dict[str, str] = {
    "capo_action_gae": "capo",
    "capo_token_gae": "ppo",
    "capo_grpo": "grpo",
    "capo_rloo": "rloo",
    "capo_reinforce_pp": "reinforce_pp",
    "capo_reinforce_pp_baseline": "reinforce_pp_baseline",
    "capo_gigpo": "gigpo",
}
# verl policy-loss name (actor.policy_loss.loss_mode) -> capo_train ratio mode (losses.action_log_ratio).
LOSSES: dict[str, str] = {"capo_action_ratio": "capo", "capo_action_geomean": "geomean"}
AGENT_LOOP = "capo_env"
TRAINER = "capo_sync"

# extra_fields the capo_env agent loop writes on every action (verl passes extra_fields through unchanged,
# while it overwrites every earlier row's reward_score with the final row's: agent_loop_tq.py).
REWARD, STEP, TERMINATED, TRUNCATED = "capo_reward", "capo_step", "capo_terminated", "capo_truncated"
ACTION_VALID, FINISH_REASON, ANCHOR = "capo_action_valid", "capo_finish_reason", "capo_anchor"
# set on the value-only row the agent loop adds after an env-truncated episode (its state for V(s_{T+1}))
BOOTSTRAP = "capo_bootstrap"


def parse_keys(keys: Sequence[str]) -> tuple[Tensor, Tensor, Tensor]:
    """TransferQueue keys ``{uid}_{session_id}_{index}`` -> ``traj_index, step_index, group_index [R]``.

    ``uid`` may itself contain ``_`` (split from the right, as verl's own
    ``compute_advantage_for_multi_trajectories`` does); trajectories and groups are numbered in order of
    first appearance.
    """
    traj_ids: dict[str, int] = {}
    group_ids: dict[str, int] = {}
    traj, step, group = [], [], []
    for key in keys:
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise ValueError(f"unexpected TransferQueue key {key!r}: expected '{{uid}}_{{session_id}}_{{index}}'")
        uid, session, index = parts
        traj.append(traj_ids.setdefault(f"{uid}_{session}", len(traj_ids)))
        group.append(group_ids.setdefault(uid, len(group_ids)))
        step.append(int(index))
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return as_long(traj), as_long(step), as_long(group)


def boundary_mask(response_mask: Tensor) -> Tensor:
    """``[R, L]`` -> ``[R, L]`` bool, True only on each row's first response token: where verl's critic
    output is V(s_t), the one position CAPO trains the critic on (AgentR1/CAPO arft/ray_agent_trainer.py,
    ``_critic_vf_loss_response_mask``). An all-zero row (verl's padding rows) stays all False."""
    m = response_mask.bool()
    first = m.int().argmax(-1)  # [R] first True column (0 for an empty row, masked below)
    out = torch.zeros_like(m)
    out[torch.arange(m.shape[0]), first] = True
    return out & m


@dataclass
class ActionTargets:
    """What the trainer writes back to TransferQueue: ``advantages, returns [R, L]`` (0 off the response
    mask and on padding rows) and scalars for logging."""

    advantages: Tensor
    returns: Tensor
    metrics: dict[str, float]


def step_batch(
    keys: Sequence[str],
    response_mask: Tensor,
    extra_fields: Sequence[Mapping[str, Any]],
    *,
    values: Tensor | None = None,
    token_kl: Tensor | None = None,
    final_value: Tensor | None = None,
) -> StepBatch:
    """capo_train's estimator input from verl's rows (action rows only: drop padding and bootstrap rows
    first). ``final_value [R]``: V(s_{T+1}) of each row's trajectory where it was truncated and valued."""
    traj, step, group = parse_keys(keys)
    mask = response_mask.float()
    reward = torch.tensor([float(e[REWARD]) for e in extra_fields], dtype=torch.float32)
    truncated = torch.tensor([bool(e.get(TRUNCATED, False)) for e in extra_fields])
    anchors = [e.get(ANCHOR, "") for e in extra_fields]
    batch = StepBatch(reward=reward, traj_index=traj, step_index=step, group_index=group, truncated=truncated,
                      response_mask=mask, anchor=anchors,
                      final_value=final_value if final_value is not None else torch.zeros(len(keys)))
    if values is not None:
        v = torch.where(mask.bool(), values.float(), 0)
        batch.values = v[:, 0]  # V(s_t): verl's left shift puts the last prompt token's value at column 0
        batch.token_values = v  # [R, L] V before each action token (token GAE)
    if token_kl is not None:
        batch.token_kl = torch.where(mask.bool(), token_kl.float(), 0)
    return batch


def action_targets(
    keys: Sequence[str],
    response_mask: Tensor,
    extra_fields: Sequence[Mapping[str, Any]],
    *,
    estimator: str,
    values: Tensor | None = None,
    token_kl: Tensor | None = None,
    is_padding: Sequence[bool] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ActionTargets:
    """Advantages and returns ``[R, L]`` for verl rows, by capo_train's estimator ``ESTIMATORS[estimator]``.

    ``keys``, ``extra_fields`` and ``is_padding`` (verl's padding rows, tag ``is_padding``: copies of a real
    row's fields with an all-zero mask, verl/trainer/ppo/padding_utils.py) are per row; ``values`` is the
    critic's ``[R, L]`` (critic algorithms), ``token_kl`` k1 = old - ref log-probs (KL in the reward).
    ``overrides`` go to ``capo_train.algorithms.get(name).bind``. Truncated episodes are bootstrapped as
    ``capo train`` does (``bootstrap_truncated=True``, capo_train's default): a bootstrap row
    (``extra_fields[BOOTSTRAP]``, written by the agent loop when the critic is on) gives V(s_{T+1}) of its
    trajectory as ``values[:, 0]``; a truncated trajectory without one (cut by the prompt budget, so no state
    to value) bootstraps from 0, as in ``capo train``. ``+capo.estimator.bootstrap_truncated=false`` gives
    the CAPO authors' behaviour (0 always). Bootstrap rows, like padding rows, get no advantage. Per-action
    advantages are broadcast over the action's tokens; returns likewise (the boundary critic reads column 0).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown capo estimator {estimator!r}; one of {sorted(ESTIMATORS)}")
    algo = get(ESTIMATORS[estimator]).bind(dict(overrides or {}))
    R, L = response_mask.shape
    padding = torch.tensor(list(is_padding) if is_padding is not None else [False] * R, dtype=torch.bool)
    bootstrap = torch.tensor([bool(e.get(BOOTSTRAP, False)) for e in extra_fields], dtype=torch.bool) & ~padding
    real = ~padding & ~bootstrap
    idx = real.nonzero().squeeze(1)
    mask = response_mask.bool()
    advantages = torch.zeros(R, L, dtype=torch.float32)
    returns = torch.zeros(R, L, dtype=torch.float32)
    if len(idx) == 0:
        return ActionTargets(advantages, returns, {})
    if algo.needs_critic and values is None:
        raise ValueError(f"{estimator} needs the critic's values (critic.enable=true)")
    final_value = None
    if values is not None and bootstrap.any():  # V(s_{T+1}) by trajectory key, onto that trajectory's rows
        by_traj = {keys[i].rsplit("_", 1)[0]: float(values[i, 0]) for i in bootstrap.nonzero().squeeze(1).tolist()}
        final_value = torch.tensor([by_traj.get(keys[i].rsplit("_", 1)[0], 0.0) for i in idx.tolist()])
    batch = step_batch(
        [keys[i] for i in idx.tolist()],
        response_mask[idx],
        [extra_fields[i] for i in idx.tolist()],
        values=None if values is None else values[idx],
        token_kl=None if token_kl is None or not algo.kl_in_reward else token_kl[idx],
        final_value=final_value,
    )
    estimate = algo.estimate(batch)
    m = mask[idx]
    adv = estimate.advantages if estimate.advantages.dim() == 2 else broadcast_actions(estimate.advantages, m)
    ret = estimate.returns if estimate.returns.dim() == 2 else broadcast_actions(estimate.returns, m)
    advantages[idx] = torch.where(m, adv.float(), 0)
    returns[idx] = torch.where(m, ret.float(), 0)
    per_action = estimate.advantages if estimate.advantages.dim() == 1 else None
    metrics = {"capo/actions": float(len(idx)), "capo/trajectories": float(batch.traj_index.unique().numel()),
               "capo/reward_mean": float(batch.reward.mean())}
    if per_action is not None:
        metrics["capo/advantage_mean"] = float(per_action.mean())
        metrics["capo/advantage_std"] = float(per_action.std()) if len(per_action) > 1 else 0.0
    return ActionTargets(advantages, returns, metrics)


def action_pg_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    ratio_mode: str,
    clip_low: float,
    clip_high: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token surrogate ``[R, L]`` of capo_train's ``action_ppo_loss`` (``token_scale="exact"``): one
    ratio ``w_t = exp(action_log_ratio(...))`` and one clip decision per action, the same value on each of
    its tokens. Aggregating it with ``seq-mean-token-mean`` gives ``action_ppo_loss`` exactly; the verl loss
    aggregates it with verl's ``agg_loss`` and ``global_batch_info``, so data-parallel ranks normalise over
    the global batch. ``mu`` (CAPO's centring) is this micro-batch's per-token mean log-ratio, stop-grad.
    Returns the matrix and detached diagnostics."""
    m = response_mask.bool()
    adv = torch.where(m, advantages, 0)
    log_w = action_log_ratio(log_prob, old_log_prob, m, ratio_mode)  # [R]
    ratio = torch.exp(log_w)[:, None].expand_as(adv)
    pg, clipped, _ = clipped_surrogate(adv, ratio, clip_low, clip_high)
    with torch.no_grad():
        nonempty = m.sum(-1) > 0
        clipped_action = (clipped & m).any(-1)  # [R]
        diag = {
            "pg_clipfrac": masked_mean(clipped_action.float(), nonempty),
            "ratio_mean": masked_mean(torch.exp(log_w), nonempty),
            "log_ratio_std": log_w[nonempty].std() if int(nonempty.sum()) > 1 else log_w.new_tensor(0.0),
            **approx_kls(log_prob, old_log_prob, m),
        }
    return pg, diag


def end_reason(token_ids: Sequence[int], text: str, stop: Sequence[str], eos_ids: Sequence[int],
               max_tokens: int) -> str:
    """``"stop"`` (a stop string ends the text), ``"eos"`` (the last token is an EOS) or ``"length"`` (cut at
    ``max_tokens``: a truncated action). verl maps vLLM's ``stop`` and ``length`` both to
    ``stop_reason="completed"`` (docs/scaleout.md), so the agent loop must tell them apart itself; with
    stop strings kept in the output (``include_stop_str_in_output``) a completed action ends with one."""
    if stop and any(text.endswith(s) for s in stop):
        return "stop"
    if token_ids and token_ids[-1] in set(eos_ids):
        return "eos"
    if len(token_ids) >= max_tokens:
        return "length"
    return "stop"  # a stop token id (vLLM stop_token_ids) ended it below the budget


__all__ = [
    "AGENT_LOOP",
    "BOOTSTRAP",
    "ESTIMATORS",
    "LOSSES",
    "TRAINER",
    "ActionTargets",
    "action_pg_losses",
    "action_targets",
    "boundary_mask",
    "end_reason",
    "parse_keys",
    "step_batch",
]
