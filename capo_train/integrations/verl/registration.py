"""Whether CAPO is registered in verl: the check the ``capo_sync`` trainer makes at start, and that
``capo_train.integrations.verl.plugin`` (the entry point, which does the registering) re-exports.

A module of its own so that the trainer can ask without importing the plugin, which imports the trainer."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

from .core import AGENT_LOOP, ESTIMATORS, LOSSES, TRAINER

ENTRY_POINT_GROUP, ENTRY_POINT_NAME = "verl.plugins", "capo"
PLUGIN_MODULE = "capo_train.integrations.verl.plugin"  # what the entry point names (pyproject.toml)


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
    if not ours or ours[0].value != PLUGIN_MODULE:
        problems.append(f"entry point {ENTRY_POINT_GROUP}:{ENTRY_POINT_NAME} -> {PLUGIN_MODULE} is not installed "
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
