"""Ratios, policy losses, value loss, KL and entropy: pure torch, no model code.

Shape conventions (the same in every function):

- ``A``  actions in the batch (one action = one LLM response = one env step; however the trainer laid
  them out as model-input rows, ``capo_train.rows.gather_actions`` hands the losses one entry per action).
- ``L``  padded action length (action tokens only; prompts/observations are never part of an action).
- ``logp``, ``old_logp``, ``ref_logp``: ``[A, L]`` per-token log-probs of the action tokens under the
  current, rollout (old) and reference policy. Values at padded positions are ignored (they may be
  anything, even ``-inf``/NaN: every function masks with ``torch.where`` before using them).
- ``mask``: ``[A, L]`` 1 (or True) on action tokens, 0 on padding. ``L_t = mask[t].sum()``.
- ``advantages``: ``[A]`` (one per action, broadcast over its tokens) or ``[A, L]`` (per token).

Every loss returns ``(loss, diagnostics)``: ``loss`` is a scalar tensor to minimise and
``diagnostics`` a dict of detached 0-dim tensors (call ``.item()`` when logging; we do not, to avoid a
device sync per call).

Aggregation modes (``agg``), as in verl's ``agg_loss``:

- ``"seq-mean-token-mean"`` (default everywhere, the authors' setting; verl's "seq" is one action here):
  mean over actions with ``L_t > 0`` of the action's token mean. Every action has weight 1, whatever its
  length.
- ``"token-mean"``: mean over all action tokens of the batch (long actions weigh more).
- ``"seq-mean-token-sum"``: mean over actions of the action's token sum.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")
RATIO_MODES = ("capo", "geomean", "sum")
MAX_LOG_RATIO = 10.0  # GSPO's clamp on the sequence log-ratio (verl compute_policy_loss_gspo)


# ----------------------------------------------------------------------------- small helpers


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is set; 0 when the mask is empty. Any shape."""
    m = mask.bool()
    return torch.where(m, x, 0).sum() / m.sum().clamp(min=1)


def agg_loss(loss_mat: Tensor, mask: Tensor, agg: str = "seq-mean-token-mean") -> Tensor:
    """Aggregate a per-token loss ``[A, L]`` over ``mask [A, L]`` into a scalar (see module doc)."""
    m = mask.bool()
    per_token = torch.where(m, loss_mat, 0)  # [A, L]; where, not *, so NaN padding cannot leak
    if agg == "token-mean":
        return per_token.sum() / m.sum().clamp(min=1)
    lengths = m.sum(-1)  # [A]
    has_tokens = lengths > 0  # [A]; an empty action (no token) does not count
    action_sum = per_token.sum(-1)  # [A]
    if agg == "seq-mean-token-mean":
        per_action = action_sum / lengths.clamp(min=1)
    elif agg == "seq-mean-token-sum":
        per_action = action_sum
    else:
        raise ValueError(f"unknown agg {agg!r}; expected one of {AGG_MODES}")
    return torch.where(has_tokens, per_action, 0).sum() / has_tokens.sum().clamp(min=1)


def broadcast_actions(action_values: Tensor, mask: Tensor) -> Tensor:
    """``[A]`` per-action values -> ``[A, L]``: the value on every action token, 0 on padding."""
    return torch.where(mask.bool(), action_values[:, None].to(mask.device), 0)


def _token_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Accept ``[A]`` or ``[A, L]`` advantages; return ``[A, L]`` (0 on padding)."""
    if advantages.dim() == 1:
        return broadcast_actions(advantages, mask)
    if advantages.shape != mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [A] or match mask {tuple(mask.shape)}")
    return torch.where(mask.bool(), advantages, 0)


def approx_kls(logp: Tensor, old_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the policy moved from the rollout's, as CleanRL logs it: with ``logratio = logp - old_logp``
    per action token (``[A, L]``, means over ``mask``),

    - ``old_approx_kl = mean(-logratio)``: the k1 estimate of KL(pi_old || pi), unbiased but noisy (can be
      negative);
    - ``approx_kl = mean((ratio - 1) - logratio)``: the k3 estimate, never negative, lower variance.
    """
    m = mask.bool()
    log_r = torch.where(m, logp - old_logp, 0)  # NaN/-inf padding never enters
    return {"old_approx_kl": masked_mean(-log_r, m), "approx_kl": masked_mean(torch.expm1(log_r) - log_r, m)}


# ----------------------------------------------------------------------------- action ratio


def log_ratio_sums(logp: Tensor, old_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per action ``S_t = sum_j z_{t,j}`` and ``L_t`` (both ``[A]``), ``z = logp - old_logp`` on action tokens.

    Useful to compute CAPO's batch mean ``mu = sum(S) / sum(L)`` over a mini-batch that is fed to
    :func:`action_log_ratio` in several micro-batches (pass the result as ``mu=``).
    """
    m = mask.bool()
    z = torch.where(m, logp - old_logp, 0)  # [A, L]
    return z.sum(-1), m.sum(-1).to(z.dtype)


def action_log_ratio(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    mode: str = "capo",
    *,
    mu: Tensor | float | None = None,
    max_log_ratio: float = MAX_LOG_RATIO,
) -> Tensor:
    """One log importance ratio per action: ``[A, L]`` token log-probs -> ``log w [A]``.

    With ``z_{t,j} = logp - old_logp`` on action tokens, ``S_t = sum_j z_{t,j}``, ``L_t = #action tokens``:

    - ``mode="capo"`` (CAPO paper, Fig. 2(c): centring, x 1/sqrt(L_t), mean restoration):
      ``log w_t = mu + (S_t - L_t mu) / sqrt(L_t)``, where
      ``mu = stopgrad(sum_t S_t / sum_t L_t)`` is the per-token mean log-ratio of the *whole batch passed
      in* (centring, x 1/sqrt(L), mean restoration). Pass ``mu=`` to centre over a larger batch (e.g. a
      mini-batch split into micro-batches, see :func:`log_ratio_sums`); it is always detached.
    - ``mode="geomean"``: ``log w_t = S_t / L_t`` (StepPO, GSPO's sequence ratio; what the authors' code
      runs: ``loss_mode=gspo`` in AgentR1/CAPO run_steppo.sh).
    - ``mode="sum"``: ``log w_t = S_t`` (the exact product of token ratios).

    ``log w`` is clamped to ``<= max_log_ratio`` (10, as verl's GSPO code does; above it the gradient is 0).
    Actions with ``L_t = 0`` get ``log w = 0`` (w = 1) instead of 0/0; the losses leave them out.
    Gradients flow through ``S_t`` only (``mu`` is stop-grad).
    """
    if mode not in RATIO_MODES:
        raise ValueError(f"unknown ratio mode {mode!r}; expected one of {RATIO_MODES}")
    S, L = log_ratio_sums(logp, old_logp, mask)  # [A], [A]
    has_tokens = L > 0
    L1 = L.clamp(min=1)  # avoids 0/0 on empty actions; their result is replaced below
    if mode == "sum":
        log_w = S
    elif mode == "geomean":
        log_w = S / L1
    else:
        if mu is None:
            mu = S.detach().sum() / L.sum().clamp(min=1)  # 0 when the batch has no action tokens
        mu = torch.as_tensor(mu, dtype=S.dtype, device=S.device).detach()
        log_w = mu + (S - L * mu) / L1.sqrt()
    log_w = torch.where(has_tokens, log_w, 0)
    return log_w.clamp(max=max_log_ratio)


# ----------------------------------------------------------------------------- policy losses


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``[A, L]`` per-token ``logp - old_logp`` (0 on padding), clamped to [-20, 20] as verl does, so that
    ``exp`` stays finite."""
    return torch.where(mask.bool(), logp - old_logp, 0).clamp(-20.0, 20.0)


def clipped_surrogate(
    A: Tensor, ratio: Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's per-token surrogate ``pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` over ``[A, L]``
    advantages and ratios, with dual-clip (``pg <= -A * dual_clip`` where ``A < 0``) when ``dual_clip`` is set.

    Returns ``pg``, ``clipped`` (bool: the clipped branch is the larger one, i.e. that token gets no gradient
    from the ratio) and ``dual_active`` (bool: the dual-clip bound replaced ``pg``). The policy losses and the
    episode recorder (``capo_train.episodes``) both decide clipping here.
    """
    pg_unclipped = -A * ratio
    pg_clipped = -A * ratio.clamp(1 - clip_low, 1 + clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    clipped = pg_clipped > pg_unclipped
    if dual_clip is None:
        return pg, clipped, torch.zeros_like(clipped)
    dual_active = (A < 0) & (pg > -A * dual_clip)
    pg = torch.where(A < 0, torch.minimum(pg, -A * dual_clip), pg)  # bounded loss for very large ratios on bad actions
    return pg, clipped, dual_active


def action_ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ratio_mode: str = "capo",
    clip_low: float = 3e-4,
    clip_high: float = 3e-4,
    token_scale: str = "exact",
    mu: Tensor | float | None = None,
    max_log_ratio: float = MAX_LOG_RATIO,
    agg: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Action-level PPO-clip: one ratio ``w_t`` and one clip decision per action (CAPO paper, README: "update
    whole actions consistently"; the authors' code: verl's GSPO loss on actions, AgentR1/CAPO run_steppo.sh).

    ``l_t = -min(w_t A_t, clip(w_t, 1 - clip_low, 1 + clip_high) A_t)``, mean over actions (those with
    ``L_t > 0``). ``w_t = exp(action_log_ratio(..., ratio_mode))``. No dual-clip, no per-token clip (as in
    the authors' GSPO path).

    Shapes: ``logp, old_logp, mask [A, L]``; ``advantages [A]`` (CAPO) or ``[A, L]`` (token advantages, e.g.
    the ``capo_no_action_credit`` ablation: then the surrogate is computed per token with the action's
    ratio and aggregated with ``agg``; for ``[A]`` advantages the default seq-mean-token-mean is exactly
    the mean over actions, while "token-mean" would weigh actions by length).

    ``token_scale`` picks the gradient (the forward value is identical):

    - ``"exact"`` (default): the exact derivative of the surrogate with ``mu`` stop-grad. On an unclipped
      action the gradient w.r.t. its tokens is ``-w_t A_t / sqrt(L_t) / n_actions`` for CAPO
      (``/ L_t`` for geomean, ``/ 1`` for sum); clipped actions get 0.
    - ``"inv_len"``: verl's GSPO trick ``log s_{t,j} = sg[log w_t] + logp_{t,j} - sg[logp_{t,j}]`` with a
      token mean per action, which gives every token the factor ``1 / L_t`` whatever ``ratio_mode`` is.
      For ``ratio_mode="geomean"`` both options coincide. Which one the CAPO authors use is unknown.

    Default clip 3e-4 on both sides is the authors' code (run_steppo.sh, geometric-mean ratio). For the
    sqrt(L) ratio the CAPO paper (arXiv 2604.18401) does not publish a value; the ratio's
    log-scale is sqrt(L) times the geomean's, so sweep it.

    Diagnostics: ``clip_frac`` (share of actions whose clipped branch is active, zero gradient),
    ``clip_frac_high`` / ``clip_frac_low``, ``ratio_mean/min/max`` and ``log_ratio_mean/std`` over actions,
    ``mu`` (CAPO centring, else the batch per-token mean log-ratio), ``old_approx_kl`` and ``approx_kl``
    (per action token, see :func:`approx_kls`).
    """
    m = mask.bool()
    A = _token_advantages(advantages, m)  # [A, L]
    log_w = action_log_ratio(logp, old_logp, m, ratio_mode, mu=mu, max_log_ratio=max_log_ratio)  # [A]
    if token_scale == "exact":
        ratio = torch.exp(log_w)[:, None].expand_as(A)  # [A, L]: the same w_t on every token of action t
    elif token_scale == "inv_len":
        logp_safe = torch.where(m, logp, 0)  # keep NaN/-inf padding out of the graph
        ratio = torch.exp(log_w.detach()[:, None] + logp_safe - logp_safe.detach())  # [A, L], value w_t
    else:
        raise ValueError(f"unknown token_scale {token_scale!r}; expected 'exact' or 'inv_len'")
    pg, clipped, _ = clipped_surrogate(A, ratio, clip_low, clip_high)  # pg = -min(wA, clip(w)A)
    loss = agg_loss(pg, m, agg)

    with torch.no_grad():
        nonempty = m.sum(-1) > 0  # [A]
        w = torch.exp(log_w)
        clipped = clipped.float()
        high = ((A > 0) & (ratio > 1 + clip_high)).float()
        low = ((A < 0) & (ratio < 1 - clip_low)).float()
        S, L = log_ratio_sums(logp, old_logp, m)
        lw = log_w[nonempty]
        diag = {
            "clip_frac": agg_loss(clipped, m, agg),
            "clip_frac_high": agg_loss(high, m, agg),
            "clip_frac_low": agg_loss(low, m, agg),
            "ratio_mean": masked_mean(w, nonempty),
            "ratio_max": w[nonempty].max() if nonempty.any() else w.new_tensor(1.0),
            "ratio_min": w[nonempty].min() if nonempty.any() else w.new_tensor(1.0),
            "log_ratio_mean": masked_mean(log_w, nonempty),
            "log_ratio_std": lw.std() if lw.numel() > 1 else w.new_tensor(0.0),
            "mu": torch.as_tensor(mu, dtype=S.dtype) if mu is not None else S.sum() / L.sum().clamp(min=1),
            **approx_kls(logp, old_logp, m),
        }
    return loss, diag


def token_ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO-clip (vanilla PPO, GRPO, RLOO, REINFORCE++, GiGPO), as verl ``compute_policy_loss``.

    Per token: ``r = exp(clamp(logp - old_logp, -20, 20))``,
    ``l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` dual-clip caps it:
    ``l = min(l, -A * dual_clip)`` (``dual_clip=None`` disables; it must be > 1).
    Shapes: ``logp, old_logp, mask [A, L]``, ``advantages [A]`` (broadcast) or ``[A, L]``.
    Aggregated with ``agg`` (default seq-mean-token-mean; ``"token-mean"`` as option).

    Diagnostics: ``clip_frac`` (tokens where the clipped branch is active), ``dual_clip_frac`` (negative-A
    tokens capped by dual-clip), ``ratio_mean/min/max`` over tokens, ``old_approx_kl`` and ``approx_kl``
    (see :func:`approx_kls`).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    m = mask.bool()
    A = _token_advantages(advantages, m)  # [A, L]
    ratio = torch.exp(token_log_ratio(logp, old_logp, m))  # [A, L]
    pg, clipped, dual_active = clipped_surrogate(A, ratio, clip_low, clip_high, dual_clip)
    loss = agg_loss(pg, m, agg)

    with torch.no_grad():
        r = ratio[m]
        diag = {
            "clip_frac": masked_mean(clipped.float(), m),
            "dual_clip_frac": masked_mean(dual_active.float(), m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": r.max() if r.numel() else ratio.new_tensor(1.0),
            "ratio_min": r.min() if r.numel() else ratio.new_tensor(1.0),
            **approx_kls(logp, old_logp, m),
        }
    return loss, diag


# ----------------------------------------------------------------------------- value loss


def _masked(mask: Tensor, *xs: Tensor) -> list[Tensor]:
    """Zero the padded entries first, so NaN/inf there cannot reach the loss or its gradient."""
    return [torch.where(mask, x, 0) for x in xs]


def _clipped_value_error(values: Tensor, old_values: Tensor, returns: Tensor, cliprange: float):
    """Elementwise ``max((V - R)^2, (clip(V, V_old +- c) - R)^2)`` and whether the clipped term won.

    Inside the clip range the clipped value is ``V`` itself, not ``V_old + (V - V_old)``: that sum can
    differ from ``V`` in the last bit (V and V_old of opposite signs), and the clip fraction would then
    count an unclipped entry whenever the rounding went the wrong way. An entry counts as clipped only
    when the clip moved V (|V - V_old| > c) and the clipped error is the larger one (verl's vf_clipfrac).
    """
    outside = (values - old_values).abs() > cliprange  # the clip moves V
    v_clipped = torch.where(outside, old_values + (values - old_values).clamp(-cliprange, cliprange), values)
    err = (values - returns) ** 2
    err_clipped = (v_clipped - returns) ** 2
    return torch.maximum(err, err_clipped), outside & (err_clipped > err)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor | None = None,
    *,
    cliprange: float = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss with ONE value per action (CAPO: the critic at the action boundary; the
    authors' code, AgentR1/CAPO arft/ray_agent_trainer.py, masks the critic loss to that position).

    ``0.5 * mean_t max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)``, c = 0.5 (verl).
    Shapes: ``values, old_values, returns [A]``; ``mask [A]`` (1 = the action counts; default all).
    Diagnostics: ``vf_clipfrac`` (share of actions where the clipped error won), ``vpred_mean``.
    """
    m = torch.ones_like(values, dtype=torch.bool) if mask is None else mask.bool()
    err, clipped = _clipped_value_error(*_masked(m, values, old_values, returns), cliprange)  # [A]
    loss = 0.5 * masked_mean(err, m)
    with torch.no_grad():
        diag = {"vf_clipfrac": masked_mean(clipped.float(), m), "vpred_mean": masked_mean(values, m)}
    return loss, diag


def token_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    cliprange: float = 0.5,
    agg: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss per token (PPO with token GAE: a value at every action token).

    Same formula as :func:`value_loss`; shapes ``values, old_values, returns, mask [A, L]``, aggregated with
    ``agg`` (seq-mean-token-mean, verl's critic default). Passing a mask that is 1 only at column 0
    reproduces the authors' boundary-only critic mask on ``[A, L]`` tensors.
    """
    m = mask.bool()
    err, clipped = _clipped_value_error(*_masked(m, values, old_values, returns), cliprange)  # [A, L]
    loss = 0.5 * agg_loss(err, m, agg)
    with torch.no_grad():
        diag = {"vf_clipfrac": masked_mean(clipped.float(), m), "vpred_mean": masked_mean(values, m)}
    return loss, diag


# ----------------------------------------------------------------------------- KL and entropy

KL_KINDS = ("k1", "kl", "k2", "mse", "k3", "low_var_kl")


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate, same shape as the inputs (verl ``kl_penalty``).

    - ``"k1"`` / ``"kl"``: ``logp - ref_logp`` (unbiased, can be negative; used as a reward penalty).
    - ``"k2"`` / ``"mse"``: ``0.5 (logp - ref_logp)^2``.
    - ``"k3"`` / ``"low_var_kl"``: ``exp(r) - r - 1`` with ``r = clamp(ref_logp - logp, -20, 20)``, the
      result clamped to ``[-10, 10]`` (both clamps as in verl; the outer one bounds the loss for
      far-off-policy tokens, with zero gradient there).
    """
    if kind in ("k1", "kl"):
        return logp - ref_logp
    if kind in ("k2", "mse"):
        return 0.5 * (logp - ref_logp) ** 2
    if kind in ("k3", "low_var_kl"):
        r = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(r) - r - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL kind {kind!r}; expected one of {KL_KINDS}")


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    *,
    kind: str = "k3",
    agg: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-to-reference loss term (multiply by ``kl_coef``, 0.001 for CAPO/PPO/GRPO/GSPO/GiGPO).

    Shapes: ``logp, ref_logp, mask [A, L]``. Returns the aggregated per-token estimate and ``{"kl": ...}``.
    """
    m = mask.bool()
    kl = kl_penalty(torch.where(m, logp, 0), torch.where(m, ref_logp, 0), kind)  # [A, L]
    loss = agg_loss(kl, m, agg)
    return loss, {"kl": loss.detach()}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of softmax(logits): ``[..., V] -> [...]`` (e.g. ``[A, L, V] -> [A, L]``)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def entropy_loss(
    mask: Tensor,
    *,
    logits: Tensor | None = None,
    entropy: Tensor | None = None,
    agg: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean policy entropy over action tokens. Give ``logits [A, L, V]`` or per-token ``entropy [A, L]``.

    Returns the aggregated entropy (a bonus: the trainer adds ``-entropy_coef * value`` to the loss;
    entropy_coef defaults to 0 for every registered algorithm) and ``{"entropy": ...}``.
    """
    if (logits is None) == (entropy is None):
        raise ValueError("give exactly one of logits= or entropy=")
    ent = entropy_from_logits(logits) if logits is not None else entropy  # [A, L]
    value = agg_loss(ent, mask, agg)
    return value, {"entropy": value.detach()}


__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "RATIO_MODES",
    "action_log_ratio",
    "action_ppo_loss",
    "agg_loss",
    "approx_kls",
    "broadcast_actions",
    "entropy_from_logits",
    "entropy_loss",
    "kl_loss",
    "kl_penalty",
    "log_ratio_sums",
    "masked_mean",
    "token_ppo_loss",
    "token_value_loss",
    "value_loss",
]

