"""The demonstrator a warm start clones (``sft.expert_skill``) and ``capo demo`` shows: the env's expert
(``expert_action()``), erring with probability 1 - skill by playing the env's ``random_action(rng)`` instead.
Torch-free, so ``capo demo`` runs without loading the trainer."""

from __future__ import annotations

import random
from typing import Any


def demonstrator_action(env: Any, rng: random.Random, expert_skill: float) -> str | None:
    """The demonstrator's next action in ``env`` (the unwrapped env): with probability 1 - ``expert_skill`` a
    random legal action (where the env has ``random_action``; it may answer None where its legal actions are
    not a finite set), else the expert's; the expert goes on from wherever an error led. None when there is
    no expert, or when it gives up (SynthHouse's skip-transform demonstrator, once it has made its mistaken
    move): the caller ends the demonstration there, as lost."""
    action = None
    if expert_skill < 1.0 and rng.random() >= expert_skill and callable(getattr(env, "random_action", None)):
        action = env.random_action(rng)
    if action is None and callable(getattr(env, "expert_action", None)):
        action = env.expert_action()
    return action
