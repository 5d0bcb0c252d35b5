"""``capo/SynthHop-v0``: the multi-hop QA env over a generated encyclopedia (no download, builds in seconds)."""

from __future__ import annotations

from typing import Any

from ..qa.env import MultiHopQAEnv


class SynthHopEnv(MultiHopQAEnv):
    """Multi-hop QA over ``build_world(seed, size)``, searched with an in-memory index of kind ``retriever``."""

    def __init__(
        self,
        seed: int = 0,
        size: str = "small",
        split: str = "train",
        retriever: str = "bm25",
        **env_kwargs: Any,
    ):
        from ..retrieval import open_retriever
        from .synthhop import build_world

        world = build_world(seed, size)
        if split not in world.splits:
            raise ValueError(f"unknown split {split!r}; SynthHop has {sorted(world.splits)}")
        self.world = world
        self.split = split
        super().__init__(world.splits[split], open_retriever(retriever, passages=world.passages), **env_kwargs)
