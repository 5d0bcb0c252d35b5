"""verl plugin entry point (``[project.entry-points."verl.plugins"] capo``): registers CAPO in verl.

``import verl`` imports this module in every process (driver, TaskRunner, actor/critic and agent-loop
workers); verl 0.9 logs a failed plugin import only at DEBUG level and goes on without it
(verl/__init__.py), so :func:`assert_registered` checks the registrations, and the ``capo_sync`` trainer
calls it at start. Importing this module by hand (``VERL_USE_EXTERNAL_MODULES=capo_train.integrations.verl.plugin``
or a plain import) registers the same things.

Registered: policy losses :data:`.core.LOSSES`, the agent loop ``capo_env``, the V1 trainer ``capo_sync``
and the estimator names :data:`.core.ESTIMATORS`. The estimators are there so that verl's config checks
and ``get_adv_estimator_fn`` know the names; called through verl's stock ``compute_advantage`` (any trainer
mode but ``capo_sync``) they raise, because that call never passes values nor trajectory and step ids.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, register_adv_est

from . import agent_loop, losses, trainer  # noqa: F401  their decorators register the loop, losses, trainer
from .core import AGENT_LOOP, ESTIMATORS, LOSSES, TRAINER

ENTRY_POINT_GROUP, ENTRY_POINT_NAME = "verl.plugins", "capo"


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


def registration_problems() -> list[str]:
    """What is missing for CAPO to run in verl, in this process and for verl's other processes; [] if
    nothing. Those processes import the ``verl.plugins`` entry point, so it must be installed (the
    ``capo-gym[verl]`` extra) and not filtered out by ``VERL_USE_EXTERNAL_PLUGINS``."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    problems = [f"policy loss {n!r} not registered" for n in LOSSES if n not in POLICY_LOSS_REGISTRY]
    problems += [f"advantage estimator {n!r} not registered" for n in ESTIMATORS if n not in ADV_ESTIMATOR_REGISTRY]
    if AGENT_LOOP not in _agent_loop_registry:
        problems.append(f"agent loop {AGENT_LOOP!r} not registered")
    if TRAINER not in TRAINER_REGISTRY:
        problems.append(f"trainer {TRAINER!r} not registered")
    ours = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME]
    if not ours or ours[0].value != __name__:
        problems.append(f"entry point {ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} -> {__name__} is not installed "
                        "(pip install -e '.[verl]'); verl's Ray workers would not load CAPO")
    policy = os.getenv("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    allowed = policy == "auto" or ENTRY_POINT_NAME in {p.strip() for p in policy.split(",")}
    if not allowed:
        problems.append(f"VERL_USE_EXTERNAL_PLUGINS={policy!r} keeps verl's workers from loading the "
                        f"{ENTRY_POINT_NAME!r} plugin")
    return problems


def assert_registered() -> None:
    """Raise ``RuntimeError`` listing :func:`registration_problems`, if any."""
    problems = registration_problems()
    if problems:
        raise RuntimeError("CAPO is not fully registered in verl: " + "; ".join(problems))


__all__ = ["assert_registered", "registration_problems"]
