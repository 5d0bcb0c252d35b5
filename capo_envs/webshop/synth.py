"""``capo/SynthShop-v0``: WebShop's engine and reward over a catalogue generated from a seed (``world.py``),
with goals in the original's synthetic style; offline and deterministic in ``seed``."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..core.env import choice_knob, int_knob
from .env import ShopEnv
from .products import SPLIT_RANGES, build_goals, load_products, split_goals
from .shop import MemoryStore, ProductSearch
from .world import generate_catalog


@lru_cache(maxsize=4)
def synth_shop(seed: int, num_products: int,
               all_options: bool = False) -> tuple[MemoryStore, ProductSearch, tuple[dict, ...]]:
    """The generated shop for ``seed``: products, BM25 search and shuffled goals (cached per process)."""
    raw, attributes = generate_catalog(seed, num_products, all_options=all_options)
    products = load_products(raw, attributes, human_goals=False)
    prices, goals = build_goals(products, human=False, price_seed=seed)
    return MemoryStore(products, prices), ProductSearch.build(products), tuple(goals)


class _Shared:
    """Wraps a cached store/search so one env's ``close()`` does not close them for the others."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def close(self) -> None:
        pass


class SynthShopEnv(ShopEnv):
    """``capo/SynthShop-v0``: WebShop's engine and reward over a generated catalogue (``num_products``,
    default 1,000, 20 product types in WebShop's 5 categories) with goals in the original's synthetic style.
    Offline and deterministic in ``seed``."""

    def __init__(self, seed: int = 0, split: str = "train", num_products: int = 1000, all_options: bool = False,
                 **kwargs: Any):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        int_knob("num_products", num_products, 20, 2_000_000)
        choice_knob("split", split, sorted(SPLIT_RANGES))
        if not isinstance(all_options, bool):
            raise ValueError(f"all_options must be a bool, got {all_options!r}")
        store, search, goals = synth_shop(seed, num_products, all_options)
        start = SPLIT_RANGES[split][0]
        kwargs.setdefault("noun_tagger", "heuristic")  # generated names: no need for spaCy
        super().__init__(
            _Shared(store), _Shared(search), split_goals(goals, split), task_prefix=f"synthshop-{seed}",
            goal_offset=start, **kwargs,
        )  # fmt: skip
        self.seed, self.split, self.all_options = seed, split, all_options
