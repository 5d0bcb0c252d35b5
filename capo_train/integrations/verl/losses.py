"""CAPO's action-ratio policy losses and the boundary-masked critic loss, in verl's loss signatures.

Policy losses are called by verl's actor ``ppo_loss`` per micro-batch inside the actor worker, with keyword
arguments ``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config: ActorConfig,
rollout_is_weights)`` and return ``(loss, metrics)`` (verl/workers/utils/losses.py). Clip bounds come
from ``actor.clip_ratio_low`` / ``clip_ratio_high`` (CAPO's authors: 3e-4 for the geometric-mean ratio,
run_steppo.sh); use ``actor.loss_agg_mode=seq-mean-token-mean`` (every action weighs 1, as capo_train).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss, register_policy_loss
from verl.utils.metric import AggregationType, Metric
from verl.utils.torch_functional import masked_mean
from verl.workers.config import ActorConfig, CriticConfig
from verl.workers.utils.padding import no_padding_2_padding

from .core import LOSSES, action_pg_losses, boundary_mask


def _action_ratio_loss(
    ratio_mode: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Optional[ActorConfig] = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    if config is None:
        raise ValueError("CAPO's action-ratio loss needs the actor config (clip_ratio_low/high)")
    clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    pg, diag = action_pg_losses(log_prob, old_log_prob, advantages, response_mask, ratio_mode=ratio_mode,
                                clip_low=clip_low, clip_high=clip_high)
    if rollout_is_weights is not None:
        pg = pg * rollout_is_weights
    global_info = dict(getattr(config, "global_batch_info", None) or {})
    loss = agg_loss(loss_mat=pg, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_info)
    metrics = {
        "actor/pg_clipfrac": diag["pg_clipfrac"].item(),
        "actor/ppo_kl": diag["old_approx_kl"].item(),
        "actor/pg_clipfrac_lower": 0.0,
        "actor/capo_ratio_mean": diag["ratio_mean"].item(),
        "actor/capo_log_ratio_std": diag["log_ratio_std"].item(),
    }
    return loss, metrics


@register_policy_loss("capo_action_ratio")
def capo_action_ratio(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                      config=None, rollout_is_weights=None):
    """CAPO's length-calibrated action ratio (CAPO paper, Fig. 2(c)): ``log w_t = mu + (S_t - L_t mu) /
    sqrt(L_t)``, one clip decision per action (capo_train.algorithms.losses.action_ppo_loss)."""
    return _action_ratio_loss(LOSSES["capo_action_ratio"], old_log_prob, log_prob, advantages, response_mask,
                              loss_agg_mode, config, rollout_is_weights)


@register_policy_loss("capo_action_geomean")
def capo_action_geomean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="seq-mean-token-mean",
                        config=None, rollout_is_weights=None):
    """StepPO/GSPO's geometric-mean action ratio ``log w_t = S_t / L_t`` (what the CAPO authors' code runs:
    ``loss_mode=gspo`` on action rows, AgentR1/CAPO run_steppo.sh), exact gradient."""
    return _action_ratio_loss(LOSSES["capo_action_geomean"], old_log_prob, log_prob, advantages, response_mask,
                              loss_agg_mode, config, rollout_is_weights)


def boundary_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float,
    dp_size: int = 1,
    global_batch_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's clipped value loss with the mask reduced to each action's first response token (V(s_t)).

    Aggregated ``seq-mean-token-mean`` over rows: each action counts once, ``0.5 * mean_t max(...)``, which
    is capo_train's ``value_loss`` on ``[A]`` values. ``token-mean`` would divide by the global number of
    response tokens that verl counts from the unmasked response (``batch_num_tokens``), so it is not used.
    """
    mask = boundary_mask(response_mask)
    return compute_value_loss(vpreds=vpreds, values=values, returns=returns, response_mask=mask,
                              cliprange_value=cliprange_value, loss_agg_mode="seq-mean-token-mean",
                              dp_size=dp_size, global_batch_size=global_batch_size)


def capo_value_loss(config: CriticConfig, model_output, data: TensorDict, dp_group=None):
    """The critic loss of the ``capo_sync`` trainer for boundary critics, in the signature of verl's
    ``value_loss`` (verl/workers/utils/losses.py), which ``critic_wg.set_loss_fn`` installs."""
    vpreds = no_padding_2_padding(model_output["values"], data)  # [bsz, response_length]
    dp_size, global_batch_size = data["dp_size"], data["global_batch_size"]
    aggregation = AggregationType.SUM if dp_size > 1 or global_batch_size is not None else AggregationType.MEAN
    padded = data.select("values", "returns", "response_mask").to_padded_tensor()
    response_mask = padded["response_mask"].to(bool)
    vf_loss, vf_clipfrac = boundary_value_loss(vpreds, padded["values"], padded["returns"], response_mask,
                                               cliprange_value=config.cliprange_value, dp_size=dp_size,
                                               global_batch_size=global_batch_size)
    metrics = {
        "critic/vf_loss": Metric(value=vf_loss, aggregation=aggregation),
        "critic/vf_clipfrac": vf_clipfrac.detach().item(),
        "critic/vpred_mean": masked_mean(vpreds, boundary_mask(response_mask)).detach().item(),
    }
    return vf_loss, metrics


__all__ = ["boundary_value_loss", "capo_action_geomean", "capo_action_ratio", "capo_value_loss"]
