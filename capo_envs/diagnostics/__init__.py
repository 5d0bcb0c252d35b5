"""The diagnostics domain: tiny generated tasks, each isolating one property an RL algorithm for LLM agents
must handle (credit assignment over many actions, actions of very different lengths, an invalid-action
trap). ``env.py`` holds the three envs, ``base.py`` what they share, ``protocol.py`` their action formats;
docs/diagnostics.md says what each isolates and what the oracle and a random policy score.

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from .cards import CARDS

__all__ = ["CARDS"]
