"""verl plugin entry point (``[project.entry-points."verl.plugins"] capo``): registers CAPO in verl.

``import verl`` imports this module in every process (driver, TaskRunner, actor/critic and agent-loop
workers); verl 0.9 logs a failed plugin import only at DEBUG level and goes on without it
(verl/__init__.py), so :func:`assert_registered` (from :mod:`.registration`, re-exported here) checks
the registrations, and the ``capo_sync`` trainer calls it at start. Importing this module by hand
(``VERL_USE_EXTERNAL_MODULES=capo_train.integrations.verl.plugin`` or a plain import) registers the same
things.

Registered: policy losses :data:`.core.LOSSES`, the agent loop ``capo_env``, the V1 trainer ``capo_sync``
and the estimator names :data:`.core.ESTIMATORS`. The estimators are there so that verl's config checks
and ``get_adv_estimator_fn`` know the names; called through verl's stock ``compute_advantage`` (any trainer
mode but ``capo_sync``) they raise, because that call never passes values nor trajectory and step ids.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from . import agent_loop, losses, trainer  # noqa: F401  their decorators register the loop, losses, trainer
from .core import ESTIMATORS, TRAINER
from .registration import ENTRY_POINT_GROUP, ENTRY_POINT_NAME, assert_registered, registration_problems


def _needs_capo_sync(name: str):
    def estimator(*args, **kwargs):
        raise RuntimeError(
            f"algorithm.adv_estimator={name} runs only in the {TRAINER} trainer (trainer.use_v1=true "
            f"trainer.v1.trainer_mode={TRAINER}): verl's stock compute_advantage gives a registered estimator "
            "neither the critic's values nor the trajectory and step of each row (docs/scaleout.md)"
        )

    estimator.__name__ = estimator.__qualname__ = f"capo_{name}_needs_capo_sync"
    return estimator


for _name in ESTIMATORS:
    if _name not in ADV_ESTIMATOR_REGISTRY:  # registering a different function twice raises in verl
        register_adv_est(_name)(_needs_capo_sync(_name))


__all__ = ["ENTRY_POINT_GROUP", "ENTRY_POINT_NAME", "assert_registered", "registration_problems"]
