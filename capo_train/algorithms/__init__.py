"""The algorithm core of capo_train: advantage estimators, ratios and losses, and a registry by name.

Pure torch: no environment, model or tokenizer code, so every function can be called (and tested) on
small hand-made tensors. Everything here is per action (one LLM response = one env step; the
trainer's model-input rows are ``capo_train.rows``' business). Shapes: ``A`` actions, ``L`` padded action
length in tokens (``[A, L]``: action tokens), ``N`` trajectories, ``T`` actions per trajectory. See
``estimators.py`` and ``losses.py`` for the conventions and ``registry.py`` for the algorithms (capo, ppo,
grpo, rloo, reinforce_pp, reinforce_pp_baseline, gspo, gigpo, capo_no_action_credit, capo_no_action_ratio).

A CAPO update, in the trainer's words::

    alg = get("capo").bind({"gamma": 0.95})  # registry defaults + overrides, merged once
    adv, ret = alg.estimate(StepBatch(reward, traj_index, step_index, values=boundary_values))
    loss, info = alg.policy_loss(logp, old_logp, adv, response_mask)          # action-level clip
    loss = loss + alg.kl_coef * kl_loss(logp, ref_logp, response_mask)[0]
    critic_loss, _ = value_loss(new_values, boundary_values, ret)             # one value per action
"""

from .estimators import (
    Estimate,
    StepBatch,
    action_gae,
    apply_kl_in_reward,
    discounted_cumsum,
    whiten,
)
from .losses import (
    action_log_ratio,
    action_ppo_loss,
    agg_loss,
    approx_kls,
    broadcast_actions,
    entropy_from_logits,
    entropy_loss,
    kl_loss,
    kl_penalty,
    log_ratio_sums,
    masked_mean,
    token_ppo_loss,
    token_value_loss,
    value_loss,
)
from .registry import ALGORITHMS, Algorithm, BoundAlgorithm, get, register

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BoundAlgorithm",
    "Estimate",
    "StepBatch",
    "action_gae",
    "action_log_ratio",
    "action_ppo_loss",
    "agg_loss",
    "apply_kl_in_reward",
    "approx_kls",
    "broadcast_actions",
    "discounted_cumsum",
    "entropy_from_logits",
    "entropy_loss",
    "get",
    "kl_loss",
    "kl_penalty",
    "log_ratio_sums",
    "masked_mean",
    "register",
    "token_ppo_loss",
    "token_value_loss",
    "value_loss",
    "whiten",
]
