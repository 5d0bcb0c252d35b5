"""Registration by id, plus a catalogue of what each id needs (shown by ``capo envs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym


@dataclass(frozen=True)
class EnvCard:
    id: str
    entry_point: str
    summary: str
    data: str  # what the env reads, in words
    action_format: str
    reward: str
    metrics: str
    prepare: str | None = None  # the command that prepares its data; None when it needs none
    data_ready: Callable[[], bool] = lambda: True
    kwargs: dict[str, Any] = field(default_factory=dict)
    # kwargs that size the env for training on a CPU (a small world, short observations); `capo train` uses
    # them when `env.kwargs` is null. The registered id itself keeps the env's full-size defaults.
    cpu_preset: dict[str, Any] = field(default_factory=dict)
    # what the preset changes from the defaults, and why, in a sentence (`capo envs -v` shows it)
    cpu_preset_why: str = ""


CATALOG: dict[str, EnvCard] = {}


def cpu_preset(env_id: str) -> dict[str, Any]:
    """The CPU preset of a registered capo id (``module:Id`` accepted), or {} for any other id."""
    card = CATALOG.get(env_id.rpartition(":")[2])
    return dict(card.cpu_preset) if card else {}


def register_card(card: EnvCard) -> None:
    CATALOG[card.id] = card
    if card.id not in gym.registry:
        # No max_episode_steps: the env's own step budget sets `truncated`, so TimeLimit is not stacked on it.
        gym.register(id=card.id, entry_point=card.entry_point, kwargs=dict(card.kwargs))
