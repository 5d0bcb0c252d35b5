"""Adapters that run capo_train's algorithms and capo-contract envs inside other RL frameworks.

Each adapter is an optional extra with its own dependencies and lives in its own sub-package, so that
importing ``capo_train`` never imports one of them: ``capo_train.integrations.verl`` (extra ``[verl]``,
docs/scaleout.md).
"""
