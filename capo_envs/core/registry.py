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


CATALOG: dict[str, EnvCard] = {}


def register_card(card: EnvCard) -> None:
    CATALOG[card.id] = card
    if card.id not in gym.registry:
        # No max_episode_steps: the env's own step budget sets `truncated`, so TimeLimit is not stacked on it.
        gym.register(id=card.id, entry_point=card.entry_point, kwargs=dict(card.kwargs))
