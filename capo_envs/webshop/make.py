"""The registered entry points: ``capo/WebShop-v0`` (prepared real data) and ``capo/SynthShop-v0`` (generated).

Prepared data (``capo data prepare webshop --size small|full``) lives in ``$CAPO_DATA_DIR/webshop`` (full,
1.18M products) or ``$CAPO_DATA_DIR/webshop-small`` (1,000): ``products.sqlite`` (products in
``load_products``' layout and their prices), ``goals_human.json`` / ``goals_synthetic.json`` (shuffled
with the original's seed 233), ``index/bm25/`` and ``manifest.json``, written last.

Splits index the shuffled goal list as the original does (session ``fixed_{i}`` = goal i): test = goals
[0, 500), dev = [500, 1500), train = the rest (WS baseline_models); task ids are ``webshop-<goals>-<i>``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.paths import DataNotPreparedError, dataset_dir, is_prepared
from .env import ShopEnv
from .products import SPLIT_RANGES, build_goals, load_products, split_goals
from .shop import MemoryStore, ProductSearch, SqliteStore
from .synth import generate_catalog

SIZES = {"small": "webshop-small", "full": "webshop"}
GOAL_KINDS = ("human", "synthetic")


def prepared_dir(size: str, data_dir: str | Path | None = None) -> Path:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return (Path(data_dir).expanduser() / SIZES[size]) if data_dir else dataset_dir(SIZES[size])


def webshop_ready(size: str = "full") -> bool:
    return is_prepared(SIZES[size])


def make_webshop_env(
    size: str = "full", goals: str = "human", split: str = "test", data_dir: str | None = None,
    retriever: str = "bm25", **kwargs: Any,
) -> ShopEnv:  # fmt: skip
    """``capo/WebShop-v0``: the original's catalogue, goals, pages and reward."""
    if goals not in GOAL_KINDS:
        raise ValueError(f"goals must be one of {GOAL_KINDS}, got {goals!r}")
    root = prepared_dir(size, data_dir)
    if not (root / "manifest.json").is_file():
        raise DataNotPreparedError(
            f"WebShop ({size}) is not prepared (missing {root / 'manifest.json'}). "
            f"Run: capo data prepare webshop --size {size}"
        )
    goal_file = root / f"goals_{goals}.json"
    if not goal_file.is_file():
        raise DataNotPreparedError(f"{goal_file} is missing; re-run: capo data prepare webshop --size {size}")
    all_goals = json.loads(goal_file.read_text())
    start = SPLIT_RANGES.get(split, (0, None))[0]
    store = SqliteStore(root / "products.sqlite")
    search = ProductSearch.load(root / "index" / retriever, kind=retriever)
    return ShopEnv(store, search, split_goals(all_goals, split), task_prefix=f"webshop-{goals}", goal_offset=start, **kwargs)


@lru_cache(maxsize=4)
def synth_shop(seed: int, num_products: int) -> tuple[MemoryStore, ProductSearch, tuple[dict, ...]]:
    """The generated shop for ``seed``: products, BM25 search and shuffled goals (cached per process)."""
    raw, attributes = generate_catalog(seed, num_products)
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

    def __init__(self, seed: int = 0, split: str = "train", num_products: int = 1000, **kwargs: Any):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if isinstance(num_products, bool) or not isinstance(num_products, int) or not 20 <= num_products <= 2_000_000:
            raise ValueError(f"num_products must be an int in [20, 2000000], got {num_products!r}")
        if split not in SPLIT_RANGES:
            raise ValueError(f"split must be one of {sorted(SPLIT_RANGES)}, got {split!r}")
        store, search, goals = synth_shop(seed, num_products)
        start = SPLIT_RANGES[split][0]
        kwargs.setdefault("noun_tagger", "heuristic")  # generated names: no need for spaCy
        super().__init__(
            _Shared(store), _Shared(search), split_goals(goals, split), task_prefix=f"synthshop-{seed}",
            goal_offset=start, **kwargs,
        )  # fmt: skip
        self.seed, self.split = seed, split
