"""CAPO inside verl 0.9 (extra ``[verl]``; its own venv: ``scripts/verl_venv.sh``; docs/scaleout.md).

verl loads every ``verl.plugins`` entry point on ``import verl`` in every process (driver, TaskRunner,
actor/critic workers, agent-loop workers), and skips a plugin that fails to import with only a DEBUG log
(verl/__init__.py). Our entry point, :mod:`.plugin`, registers:

- policy losses ``capo_action_ratio`` (CAPO's length-calibrated action ratio) and ``capo_action_geomean``
  (StepPO/GSPO's geometric-mean action ratio), both one ratio and one clip decision per action
  (:mod:`.losses`);
- the agent loop ``capo_env``: one ``AgentLoopOutput`` per action of any capo-contract Gymnasium env, the
  action's own reward in ``extra_fields`` (:mod:`.agent_loop`);
- the V1 trainer ``capo_sync``: action-level GAE from the critic's value at each action's boundary, the
  critic loss masked to that position (:mod:`.trainer`);
- estimator names ``capo_action_gae``, ``capo_token_gae``, ``capo_grpo``, ... for validation only: a
  registered verl estimator never receives the critic's values nor the trajectory and step identity, so
  the trainer computes them (:mod:`.core`).

This module stays light (no verl import): :mod:`.core` is pure torch, the rest imports verl.
"""

from .core import ESTIMATORS, LOSSES, AGENT_LOOP, TRAINER

__all__ = ["AGENT_LOOP", "ESTIMATORS", "LOSSES", "TRAINER"]
