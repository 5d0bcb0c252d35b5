"""Algorithms by name: an advantage estimator + a policy loss + whether a critic is trained, and defaults.

Adding an algorithm = write an estimator (or reuse one) and add one ``register(Algorithm(...))`` line.

``defaults`` holds every hyperparameter the trainer needs (spec sections 2 and 6). Keys:

- clip_low, clip_high, dual_clip  policy-loss clip (dual_clip None = off)
- token_scale                     action-level losses: "exact" | "inv_len" gradient (see losses.py)
- kl_coef, kl_type, kl_in_reward  KL to the reference: a loss term (kl_in_reward False, k3) or a reward
                                  penalty applied before the estimator (True, k1)
- entropy_coef                    0 everywhere (authors)
- group_size                      rollouts per task (8 for group baselines, 1 for critic methods)
- gamma, lam, ...                 estimator hyperparameters (passed to the estimator when it accepts them)
- value_cliprange                 critic loss clip (0.5)

``Algorithm.estimate`` and ``Algorithm.policy_loss_fn`` hand each function only the defaults its
signature accepts, so one defaults dict serves both.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from . import estimators, losses

CriticAt = str  # "boundary" (one value per row, at the last state token) | "tokens" (every action token)


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm.

    name          registry key.
    estimator     ``fn(StepBatch, **kw) -> Estimate`` (advantages [B] or [B, L]).
    policy_loss   ``fn(logp, old_logp, advantages, mask, **kw) -> (loss, diagnostics)``.
    needs_critic  whether a value model is trained.
    critic_at     "boundary": values [B] at the action boundary, trained with ``losses.value_loss``;
                  "tokens": values [B, L] on every action token, ``losses.token_value_loss``; None.
    ratio_mode    "capo" | "geomean" | "sum" (action-level ratio) or "token" (per-token ratio).
    defaults      hyperparameters (see module doc).
    """

    name: str
    estimator: Callable[..., estimators.Estimate]
    policy_loss: Callable[..., tuple]
    needs_critic: bool
    critic_at: CriticAt | None
    ratio_mode: str
    defaults: dict[str, Any] = field(default_factory=dict)

    def _kwargs_for(self, fn: Callable, overrides: dict[str, Any]) -> dict[str, Any]:
        """The defaults (+ overrides, + ratio_mode) that ``fn``'s signature accepts."""
        accepted = inspect.signature(fn).parameters
        merged = {**self.defaults, "ratio_mode": self.ratio_mode, **overrides}
        return {k: v for k, v in merged.items() if k in accepted}

    def _check(self, overrides: dict[str, Any], *fns: Callable) -> None:
        accepted = set(self.defaults) | {"ratio_mode"}
        for fn in fns:
            accepted |= set(inspect.signature(fn).parameters)
        unknown = set(overrides) - accepted
        if unknown:
            raise TypeError(f"{self.name}: unknown hyperparameter(s) {sorted(unknown)}")

    def estimate(self, batch: estimators.StepBatch, **overrides: Any) -> estimators.Estimate:
        """Run the estimator with the defaults; applies KL-in-reward first when ``kl_in_reward`` is set."""
        self._check(overrides, self.estimator)
        settings = {**self.defaults, **overrides}
        if settings.get("kl_in_reward") and settings.get("kl_coef", 0.0):
            batch = estimators.apply_kl_in_reward(batch, settings["kl_coef"])
        return self.estimator(batch, **self._kwargs_for(self.estimator, overrides))

    def policy_loss_fn(self, logp, old_logp, advantages, mask, **overrides: Any):
        """``policy_loss(logp [B, L], old_logp [B, L], advantages [B] | [B, L], mask [B, L])`` with defaults."""
        self._check(overrides, self.policy_loss)
        return self.policy_loss(logp, old_logp, advantages, mask, **self._kwargs_for(self.policy_loss, overrides))


ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` to :data:`ALGORITHMS` (a name may be registered once)."""
    if algorithm.name in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def get(name: str) -> Algorithm:
    """The registered algorithm called ``name``; a clear error listing the known names otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; registered: {', '.join(sorted(ALGORITHMS))}") from None


# ----------------------------------------------------------------------------- defaults (spec 2 and 6)

_KL_LOSS = {"kl_coef": 0.001, "kl_type": "k3", "kl_in_reward": False}  # PPO, CAPO, GRPO, GSPO, GiGPO
_KL_REWARD = {"kl_coef": 0.001, "kl_type": "k1", "kl_in_reward": True}  # RLOO, REINFORCE++
_COMMON = {"entropy_coef": 0.0, "value_cliprange": 0.5}
_TOKEN_CLIP = {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}
# Authors' code (run_steppo.sh): 3e-4 both sides. Open: S2 says 1e-3 for the sqrt(L) ratio (spec 7.1).
_ACTION_CLIP = {"clip_low": 3e-4, "clip_high": 3e-4, "dual_clip": None, "token_scale": "exact"}
_GAE = {"gamma": 0.99, "lam": 1.0, "bootstrap_truncated": True}
_CRITIC = {**_COMMON, **_KL_LOSS, **_GAE, "group_size": 1}
_GROUP = {**_COMMON, "group_size": 8}

register(Algorithm("capo", estimators.capo, losses.action_ppo_loss, True, "boundary", "capo",
                   {**_CRITIC, **_ACTION_CLIP}))
register(Algorithm("ppo", estimators.ppo, losses.token_ppo_loss, True, "tokens", "token",
                   {**_CRITIC, **_TOKEN_CLIP}))
register(Algorithm("grpo", estimators.grpo, losses.token_ppo_loss, False, None, "token",
                   {**_GROUP, **_KL_LOSS, **_TOKEN_CLIP}))
register(Algorithm("rloo", estimators.rloo, losses.token_ppo_loss, False, None, "token",
                   {**_GROUP, **_KL_REWARD, **_TOKEN_CLIP}))
register(Algorithm("reinforce_pp", estimators.reinforce_pp, losses.token_ppo_loss, False, None, "token",
                   {**_GROUP, **_KL_REWARD, **_TOKEN_CLIP, "gamma": 1.0}))
register(Algorithm("reinforce_pp_baseline", estimators.reinforce_pp_baseline, losses.token_ppo_loss, False,
                   None, "token", {**_GROUP, **_KL_REWARD, **_TOKEN_CLIP}))
# GSPO: GRPO advantage + sequence (geometric-mean) ratio with verl's 1/L token form. Authors' scripts clip
# 3e-4 on both sides (spec 2); the GSPO paper uses clip_high 4e-4.
register(Algorithm("gspo", estimators.grpo, losses.action_ppo_loss, False, None, "geomean",
                   {**_GROUP, **_KL_LOSS, **_ACTION_CLIP, "token_scale": "inv_len"}))
register(Algorithm("gigpo", estimators.gigpo, losses.token_ppo_loss, False, None, "token",
                   {**_GROUP, **_KL_LOSS, **_TOKEN_CLIP, "omega": 1.0, "gamma": 1.0}))
# Ablations (Fig. 4): "w/o action-level CA" = token GAE + CAPO ratio (CAPO's clip);
# "w/o action-aware PR" = action GAE + token ratio (PPO's clip 0.2 + dual-clip: a 3e-4 token clip would
# freeze learning).
register(Algorithm("capo_no_action_credit", estimators.ppo, losses.action_ppo_loss, True, "tokens", "capo",
                   {**_CRITIC, **_ACTION_CLIP}))
register(Algorithm("capo_no_action_ratio", estimators.capo, losses.token_ppo_loss, True, "boundary", "token",
                   {**_CRITIC, **_TOKEN_CLIP}))

__all__ = ["ALGORITHMS", "Algorithm", "get", "register"]
