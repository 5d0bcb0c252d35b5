"""Algorithms by name: an advantage estimator + a policy loss + whether a critic is trained, and defaults.

Adding an algorithm = write an estimator (or reuse one) and add one ``register(Algorithm(...))`` line that
names which of its settings go to the estimator and which to the loss.

``defaults`` holds every hyperparameter the trainer needs: the authors' launch scripts (AgentR1/CAPO,
``examples/<env>/run_*.sh``) unless a comment says otherwise. Keys:

- clip_low, clip_high, dual_clip  policy-loss clip (dual_clip None = off)
- token_scale                     action-level losses: "exact" | "inv_len" gradient (see losses.py)
- kl_coef, kl_type, kl_in_reward  KL to the reference: a loss term (kl_in_reward False, k3) or a reward
                                  penalty applied before the estimator (True, k1)
- entropy_coef                    0 everywhere (authors)
- group_size                      rollouts per task (8 for group baselines, 1 for critic methods)
- gamma, lam, ...                 estimator hyperparameters
- value_cliprange                 critic loss clip (0.5)

An algorithm is used through :meth:`Algorithm.bind`: ``get("capo").bind(overrides)`` merges the defaults
with the overrides once and returns a frozen :class:`BoundAlgorithm` whose ``estimate(step_batch)`` and
``policy_loss(logp, old_logp, advantages, mask)`` are ready to call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from . import estimators, losses

CriticAt = str  # "boundary" (one value per action, at its last state token) | "tokens" (every action token)


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """One registered algorithm.

    name           registry key.
    estimator      ``fn(StepBatch, **estimator_keys) -> Estimate`` (advantages [A] or [A, L]).
    estimator_keys the settings passed to ``estimator`` (when set in ``defaults`` or the overrides).
    policy_loss    ``fn(logp, old_logp, advantages, mask, **loss_keys) -> (loss, diagnostics)``.
    loss_keys      the settings passed to ``policy_loss``; ``ratio_mode`` among them gets this algorithm's
                   ``ratio_mode`` unless overridden.
    needs_critic   whether a value model is trained.
    critic_at      "boundary": values [A] at the action boundary, trained with ``losses.value_loss``;
                   "tokens": values [A, L] on every action token, ``losses.token_value_loss``; None.
    ratio_mode     "capo" | "geomean" | "sum" (action-level ratio) or "token" (per-token ratio).
    defaults       hyperparameters (see module doc).
    """

    name: str
    estimator: Callable[..., estimators.Estimate]
    estimator_keys: tuple[str, ...]
    policy_loss: Callable[..., tuple]
    loss_keys: tuple[str, ...]
    needs_critic: bool
    critic_at: CriticAt | None
    ratio_mode: str
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def setting_names(self) -> frozenset[str]:
        """Every key this algorithm reads: its defaults and what its estimator and loss take."""
        return frozenset(self.defaults) | frozenset(self.estimator_keys) | frozenset(self.loss_keys)

    def bind(self, overrides: Mapping[str, Any] | None = None) -> BoundAlgorithm:
        """The algorithm with its settings fixed: ``defaults`` updated by ``overrides``.

        A key this algorithm does not read but another registered one does (``whiten_std_floor`` for GRPO,
        say) is dropped, so one set of overrides serves a whole benchmark grid; a key no registered
        algorithm reads is an error (a typo)."""
        overrides = dict(overrides or {})
        used_anywhere = frozenset().union(self.setting_names, *(a.setting_names for a in ALGORITHMS.values()))
        unknown = set(overrides) - used_anywhere
        if unknown:
            raise ValueError(f"{self.name}: unknown hyperparameter(s) {sorted(unknown)}; "
                             f"{self.name} reads {sorted(self.setting_names)}")
        mine = {k: v for k, v in overrides.items() if k in self.setting_names}
        settings = {**self.defaults, **mine}
        with_ratio = {"ratio_mode": self.ratio_mode, **settings}

        def picked(keys: tuple[str, ...], source: dict[str, Any]) -> Mapping[str, Any]:
            return MappingProxyType({k: source[k] for k in keys if k in source})

        return BoundAlgorithm(
            algorithm=self,
            settings=MappingProxyType(settings),
            estimator_kwargs=picked(self.estimator_keys, settings),
            loss_kwargs=picked(self.loss_keys, with_ratio),
        )


@dataclass(frozen=True, kw_only=True)
class BoundAlgorithm:
    """An :class:`Algorithm` with its hyperparameters merged (:meth:`Algorithm.bind`).

    settings          defaults updated by the overrides this algorithm reads (read-only).
    estimator_kwargs  what ``estimate`` passes to the estimator; ``loss_kwargs``: to the policy loss.
    """

    algorithm: Algorithm
    settings: Mapping[str, Any]
    estimator_kwargs: Mapping[str, Any]
    loss_kwargs: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.algorithm.name

    @property
    def needs_critic(self) -> bool:
        return self.algorithm.needs_critic

    @property
    def critic_at(self) -> CriticAt | None:
        return self.algorithm.critic_at

    @property
    def ratio_mode(self) -> str:
        return self.algorithm.ratio_mode

    @property
    def kl_coef(self) -> float:
        """Weight of the KL to the reference (a loss term, or a reward penalty with ``kl_in_reward``)."""
        return self.settings.get("kl_coef", 0.0)

    @property
    def kl_in_reward(self) -> bool:
        return bool(self.settings.get("kl_in_reward", False))

    def estimate(self, batch: estimators.StepBatch) -> estimators.Estimate:
        """Run the estimator (advantages [A] or [A, L]); applies KL-in-reward first when it is set."""
        if self.kl_in_reward and self.kl_coef:
            batch = estimators.apply_kl_in_reward(batch, self.kl_coef)
        return self.algorithm.estimator(batch, **self.estimator_kwargs)

    def policy_loss(self, logp, old_logp, advantages, mask) -> tuple:
        """``policy_loss(logp [A, L], old_logp [A, L], advantages [A] | [A, L], mask [A, L])``."""
        return self.algorithm.policy_loss(logp, old_logp, advantages, mask, **self.loss_kwargs)


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


# ----------------------------------------------------------------------------- what each function takes

# The keyword arguments of each estimator and loss (tests/test_config.py keeps them in step).
GAE_KEYS = ("gamma", "lam", "bootstrap_truncated", "whiten_advantages", "whiten_std_floor")  # capo, ppo
GRPO_KEYS = ("eps", "norm_by_std")
REINFORCE_PP_KEYS = ("gamma", "whiten_std_floor")
REINFORCE_PP_BASELINE_KEYS = ("whiten_level", "whiten_std_floor")
GIGPO_KEYS = ("omega", "gamma", "eps", "step_norm")
ACTION_LOSS_KEYS = ("ratio_mode", "clip_low", "clip_high", "token_scale", "mu", "max_log_ratio", "agg")
TOKEN_LOSS_KEYS = ("clip_low", "clip_high", "dual_clip", "agg")
ACTION_LOSS = {"policy_loss": losses.action_ppo_loss, "loss_keys": ACTION_LOSS_KEYS}
TOKEN_LOSS = {"policy_loss": losses.token_ppo_loss, "loss_keys": TOKEN_LOSS_KEYS}
BOUNDARY_CRITIC = {"needs_critic": True, "critic_at": "boundary"}
TOKEN_CRITIC = {"needs_critic": True, "critic_at": "tokens"}
NO_CRITIC = {"needs_critic": False, "critic_at": None}

# ----------------------------------------------------------------------------- defaults
# The authors' launch scripts (AgentR1/CAPO, examples/<env>/run_*.sh) for the paper's Table 1 runs.

_KL_LOSS = {"kl_coef": 0.001, "kl_type": "k3", "kl_in_reward": False}  # PPO, CAPO, GRPO, GSPO, GiGPO
_KL_REWARD = {"kl_coef": 0.001, "kl_type": "k1", "kl_in_reward": True}  # RLOO, REINFORCE++
_COMMON = {"entropy_coef": 0.0, "value_cliprange": 0.5}
_TOKEN_CLIP = {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}
# The authors' code (run_steppo.sh, geometric-mean ratio): 3e-4 both sides. For the paper's sqrt(L) ratio
# the CAPO paper (arXiv 2604.18401) does not publish the value: docs/results/learning.md measures it.
_ACTION_CLIP = {"clip_low": 3e-4, "clip_high": 3e-4, "dual_clip": None, "token_scale": "exact"}
_GAE = {"gamma": 0.99, "lam": 1.0, "bootstrap_truncated": True}
_CRITIC = {**_COMMON, **_KL_LOSS, **_GAE, "group_size": 1}
_GROUP = {**_COMMON, "group_size": 8}

register(Algorithm(name="capo", estimator=estimators.capo, estimator_keys=GAE_KEYS, **ACTION_LOSS,
                   **BOUNDARY_CRITIC, ratio_mode="capo", defaults={**_CRITIC, **_ACTION_CLIP}))
register(Algorithm(name="ppo", estimator=estimators.ppo, estimator_keys=GAE_KEYS, **TOKEN_LOSS,
                   **TOKEN_CRITIC, ratio_mode="token", defaults={**_CRITIC, **_TOKEN_CLIP}))
register(Algorithm(name="grpo", estimator=estimators.grpo, estimator_keys=GRPO_KEYS, **TOKEN_LOSS,
                   **NO_CRITIC, ratio_mode="token", defaults={**_GROUP, **_KL_LOSS, **_TOKEN_CLIP}))
register(Algorithm(name="rloo", estimator=estimators.rloo, estimator_keys=(), **TOKEN_LOSS,
                   **NO_CRITIC, ratio_mode="token", defaults={**_GROUP, **_KL_REWARD, **_TOKEN_CLIP}))
register(Algorithm(name="reinforce_pp", estimator=estimators.reinforce_pp, estimator_keys=REINFORCE_PP_KEYS,
                   **TOKEN_LOSS, **NO_CRITIC, ratio_mode="token",
                   defaults={**_GROUP, **_KL_REWARD, **_TOKEN_CLIP, "gamma": 1.0}))
register(Algorithm(name="reinforce_pp_baseline", estimator=estimators.reinforce_pp_baseline,
                   estimator_keys=REINFORCE_PP_BASELINE_KEYS, **TOKEN_LOSS, **NO_CRITIC, ratio_mode="token",
                   defaults={**_GROUP, **_KL_REWARD, **_TOKEN_CLIP}))
# GSPO: GRPO advantage + sequence (geometric-mean) ratio with verl's 1/L token form. The authors' scripts
# clip 3e-4 on both sides (run_gspo.sh); the GSPO paper uses clip_high 4e-4.
register(Algorithm(name="gspo", estimator=estimators.grpo, estimator_keys=GRPO_KEYS, **ACTION_LOSS,
                   **NO_CRITIC, ratio_mode="geomean",
                   defaults={**_GROUP, **_KL_LOSS, **_ACTION_CLIP, "token_scale": "inv_len"}))
register(Algorithm(name="gigpo", estimator=estimators.gigpo, estimator_keys=GIGPO_KEYS, **TOKEN_LOSS,
                   **NO_CRITIC, ratio_mode="token",
                   defaults={**_GROUP, **_KL_LOSS, **_TOKEN_CLIP, "omega": 1.0, "gamma": 1.0}))
# Ablations (CAPO paper, Fig. 4): "w/o action-level CA" = token GAE + CAPO ratio (CAPO's clip);
# "w/o action-aware PR" = action GAE + token ratio (PPO's clip 0.2 + dual-clip: a 3e-4 token clip would
# freeze learning).
register(Algorithm(name="capo_no_action_credit", estimator=estimators.ppo, estimator_keys=GAE_KEYS, **ACTION_LOSS,
                   **TOKEN_CRITIC, ratio_mode="capo", defaults={**_CRITIC, **_ACTION_CLIP}))
register(Algorithm(name="capo_no_action_ratio", estimator=estimators.capo, estimator_keys=GAE_KEYS, **TOKEN_LOSS,
                   **BOUNDARY_CRITIC, ratio_mode="token", defaults={**_CRITIC, **_TOKEN_CLIP}))

__all__ = ["ALGORITHMS", "Algorithm", "BoundAlgorithm", "get", "register"]
