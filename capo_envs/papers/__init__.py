"""The papers domain: its engine, its real env and its generated (Synth*) variant.

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from __future__ import annotations

from ..core.registry import EnvCard

CARDS: tuple[EnvCard, ...] = ()
