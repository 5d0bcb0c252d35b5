"""Shared test helpers for running envs."""

from __future__ import annotations


def expert_metrics(env) -> list[dict]:
    """Run the env's expert once on every task; return each episode's final ``info["metrics"]``.

    Every expert action must parse: an expert that writes invalid actions is a bug in the env.
    """
    base = env.unwrapped
    finals = []
    for task_id in base.task_ids():
        env.reset(options={"task_id": task_id})
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(base.expert_action())
            assert info["action_valid"], info["invalid_reason"]
            done = terminated or truncated
        finals.append(info["metrics"])
    return finals
