"""The ids the webshop domain registers: WebShop on its real catalogue, and SynthShop on a generated one."""

from __future__ import annotations

import importlib.util

from ..core.paths import is_prepared
from ..core.registry import EnvCard


def reward_deps_installed() -> bool:
    """WebShop's reward needs thefuzz (the 'webshop' extra); spaCy is optional (nouns.py)."""
    return importlib.util.find_spec("thefuzz") is not None


_ACTIONS = "search[keywords] | click[value] (the original's text actions; action_format='tags': <action>...</action>)"
_REWARD = (
    "on Buy Now: WebShop's score r_type*(attrs+options+price)/(|attrs|+|options|+1) in [0,1] "
    "(reward='capo': 10 on success, -0.1 per invalid action, + score_weight x the score on any purchase)"
)
_METRICS = "success (score == 1), score, purchased, exact_product, r_type, r_att, r_price"

CARDS: tuple[EnvCard, ...] = (
    EnvCard(
        id="capo/WebShop-v0",
        entry_point="capo_envs.webshop.env:make_webshop_env",
        summary="WebShop: buy the product an instruction describes, by searching 1.18M real products (size='small': 1,000)",
        data="WebShop's product, attribute and human-instruction files + a BM25 index",
        prepare="capo data prepare webshop --size full",
        data_ready=lambda: is_prepared("webshop") and reward_deps_installed(),
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    ),
    EnvCard(
        id="capo/SynthShop-v0",
        entry_point="capo_envs.webshop.synth:SynthShopEnv",
        summary="WebShop's engine and reward over a generated catalogue (1,000 products, 20 types) with synthetic-style goals",
        data="none (generated from a seed in seconds); needs the 'webshop' extra (thefuzz) for the reward",
        prepare="pip install 'capo-gym[webshop]'",
        data_ready=reward_deps_installed,
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    ),
)
