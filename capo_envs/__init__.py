"""capo_envs: Gymnasium text environments with explicit action boundaries.

``import capo_envs`` registers every id; ``gymnasium.make("capo/SynthHop-v0")`` then builds one.
Each domain package (qa, diagnostics, alfworld, webshop, papers, remote) lists its ids in its ``cards.py``;
this module only gathers and registers them. This package never imports torch or capo_train.
"""

from __future__ import annotations

from .alfworld import CARDS as _ALFWORLD_CARDS
from .core import CATALOG, EnvCard, TextEnv, register_card
from .diagnostics import CARDS as _DIAGNOSTICS_CARDS
from .papers import CARDS as _PAPERS_CARDS
from .qa import CARDS as _QA_CARDS
from .remote import CARDS as _REMOTE_CARDS
from .webshop import CARDS as _WEBSHOP_CARDS

__version__ = "0.1.0"

DOMAINS = ("qa", "diagnostics", "alfworld", "webshop", "papers", "remote")  # the domain packages, in registration order

for _card in (*_QA_CARDS, *_DIAGNOSTICS_CARDS, *_ALFWORLD_CARDS, *_WEBSHOP_CARDS, *_PAPERS_CARDS, *_REMOTE_CARDS):
    register_card(_card)

__all__ = ["CATALOG", "DOMAINS", "EnvCard", "TextEnv", "__version__"]
