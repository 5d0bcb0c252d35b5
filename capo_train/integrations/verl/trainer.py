"""``capo_sync``: verl's synchronous V1 trainer with CAPO's action-level credit assignment.

Select it with ``trainer.use_v1=true trainer.v1.trainer_mode=capo_sync`` and an estimator of
:data:`.core.ESTIMATORS` (``algorithm.adv_estimator=capo_action_gae``, ``critic.enable=true``).

Why a subclass: a registered verl estimator is called with token rewards, the response mask, the config
and the prompt uid only, never with the critic's values or the trajectory and step of a row
(verl/trainer/ppo/ray_trainer.py, ``compute_advantage``), and verl's critic loss covers every response token
(docs/scaleout.md, 1.2 and 1.4). So this trainer overrides two things and nothing else:

- ``_compute_advantage``: reads each row's values, response mask and ``extra_fields`` (the per-action
  reward written by the ``capo_env`` agent loop) from TransferQueue, parses trajectory and step from the
  row keys, runs capo_train's estimator (:func:`.core.action_targets`) and writes ``advantages`` and
  ``returns`` back. verl's rollout correction (``algorithm.rollout_correction``: the off-policy metrics
  between the rollout server's (vLLM/SGLang) log-probs and the actor's, and truncated IS weights / rejection when
  configured) runs first, by verl's own function, as in verl's trainer; the actor's loss reads the weights
  and the mask. verl's KL-in-reward is refused (``algorithm.use_kl_in_reward``): capo_train's
  RLOO/REINFORCE++ put the KL in the reward themselves (``kl_in_reward``), from ``old_log_probs`` and
  ``ref_log_prob``, and the others use the actor's KL loss.
- the critic loss, for boundary critics (CAPO): verl's clipped value loss on each action's first response
  token only (:func:`.losses.capo_value_loss`).

Every other verl behaviour (rollout, FSDP/Megatron workers, weight sync, checkpoints) is the stock
``PPOTrainerSync``: the mode string is reset to ``sync`` before verl reads it, because verl's trainer tests
``trainer_mode == "sync"`` in several places (replay buffer, refill, checkpoints).
"""

from __future__ import annotations

from functools import partial

import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import (
    TOKEN_LEVEL_ROLLOUT_RS_OPTIONS,
    compute_rollout_correction_and_add_to_batch,
)
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import response_to_nested

from capo_train.algorithms import get

from .core import ESTIMATORS, TRAINER, action_targets
from .losses import capo_value_loss
from .registration import assert_registered


def estimator_settings(config) -> tuple[str, dict]:
    """``(estimator name, capo_train overrides)`` from a verl config: ``algorithm.adv_estimator``,
    ``algorithm.gamma`` / ``lam``, then any key under the top-level ``capo.estimator`` (Hydra:
    ``+capo.estimator.whiten_std_floor=0.1``), which wins."""
    name = str(config.algorithm.adv_estimator)
    if name not in ESTIMATORS:
        raise ValueError(f"trainer.v1.trainer_mode={TRAINER} needs algorithm.adv_estimator in {sorted(ESTIMATORS)}, "
                         f"got {name!r}")
    overrides = {"gamma": float(config.algorithm.gamma), "lam": float(config.algorithm.lam)}
    capo = config.get("capo", None) or {}
    overrides.update(dict(capo.get("estimator", None) or {}))
    algo = get(ESTIMATORS[name])
    return name, {k: v for k, v in overrides.items() if k in algo.setting_names}


@register_trainer(TRAINER)
class CapoSyncTrainer(PPOTrainerSync):
    """See the module docstring."""

    def __init__(self, config):
        assert_registered()  # a plugin that failed to import in a worker is skipped silently by verl
        if config.algorithm.get("use_kl_in_reward", False):
            raise ValueError(f"trainer.v1.trainer_mode={TRAINER} does not apply algorithm.use_kl_in_reward: use "
                             "actor_rollout_ref.actor.use_kl_loss=true (CAPO, PPO, GRPO, GiGPO), or capo_rloo / "
                             "capo_reinforce_pp, which put the KL in the reward themselves (+capo.estimator.kl_coef)")
        self.capo_estimator, self.capo_overrides = estimator_settings(config)
        algo = get(ESTIMATORS[self.capo_estimator]).bind(self.capo_overrides)
        self.capo_boundary_critic = algo.critic_at == "boundary"
        self.capo_kl_in_reward = algo.kl_in_reward and algo.kl_coef > 0
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        if algo.needs_critic and not self.use_critic:
            raise ValueError(f"{self.capo_estimator} needs a critic: set critic.enable=true")
        correction = self.rollout_correction()
        token_rs = {o.strip() for o in str((correction or {}).get("rollout_rs", None) or "").split(",")}
        if self.capo_boundary_critic and token_rs & TOKEN_LEVEL_ROLLOUT_RS_OPTIONS:
            raise ValueError("token-level rejection (algorithm.rollout_correction.rollout_rs=token_k*) would move "
                             "the boundary critic's position (each action's first response token); use a "
                             "sequence-level option (seq_*: one action here)")
        if self.capo_kl_in_reward and not self.use_reference_policy:
            raise ValueError(f"{self.capo_estimator} puts the KL to the reference in the reward, which needs reference "
                             "log-probs: set actor_rollout_ref.actor.use_kl_loss=true with kl_loss_coef=0, or "
                             "+capo.estimator.kl_coef=0")

    def _setup(self):
        super()._setup()
        if self.use_critic and self.capo_boundary_critic:
            self.critic_wg.set_loss_fn(partial(capo_value_loss, config=omega_conf_to_dataclass(self.config.critic)))

    def rollout_correction(self):
        """verl's ``algorithm.rollout_correction`` when it applies here (decoupled mode: three policies,
        the rollout server's, the actor's before the update and the actor's), else None."""
        config = self.config.algorithm.get("rollout_correction", None)
        return None if config is None or config.get("bypass_mode", False) else config

    def _compute_advantage(self, batch, metrics: dict):
        fields = ["response_mask", "extra_fields"]
        if self.use_critic:
            fields.append("values")
        correction = self.rollout_correction()
        if self.capo_kl_in_reward or correction is not None:
            fields += ["old_log_probs"]
        if self.capo_kl_in_reward:
            fields += ["ref_log_prob"]
        if correction is not None:
            fields += ["rollout_log_probs"]  # absent with rollout.calculate_log_probs=false: then no correction
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        response_mask = data["response_mask"]  # nested [R, j]
        extra_fields = data.pop("extra_fields").tolist()
        padded = data.to_padded_tensor()
        corrected = {}
        if correction is not None and "rollout_log_probs" in padded.keys():
            rows = DataProto.from_dict(tensors={k: padded[k] for k in ("old_log_probs", "rollout_log_probs",
                                                                        "response_mask")})
            rows, corr_metrics = compute_rollout_correction_and_add_to_batch(rows, correction)
            metrics.update(corr_metrics)
            corrected["response_mask"] = rows.batch["response_mask"]  # rejection sampling may drop tokens
            if "rollout_is_weights" in rows.batch.keys():
                corrected["rollout_is_weights"] = rows.batch["rollout_is_weights"]
        token_kl = padded["old_log_probs"] - padded["ref_log_prob"] if self.capo_kl_in_reward else None
        targets = action_targets(
            list(batch.keys), padded["response_mask"], extra_fields, estimator=self.capo_estimator,
            values=padded["values"] if self.use_critic else None, token_kl=token_kl,
            is_padding=[bool(tag.get("is_padding", False)) for tag in batch.tags], overrides=self.capo_overrides,
        )
        metrics.update(targets.metrics)
        output = TensorDict(
            {"advantages": response_to_nested(targets.advantages, response_mask),
             "returns": response_to_nested(targets.returns, response_mask),
             **{name: response_to_nested(t.to(padded["response_mask"].dtype) if name == "response_mask" else t,
                                         response_mask) for name, t in corrected.items()}},
            batch_size=len(batch),
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


__all__ = ["CapoSyncTrainer", "estimator_settings"]
