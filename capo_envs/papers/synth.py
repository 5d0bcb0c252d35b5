"""``capo/SynthScholar-v0``: paper search over a generated scholarly world (no download, builds in a second)."""

from __future__ import annotations

from typing import Any

from .db import PaperDB
from .env import PaperSearchEnv
from .world import SIZES, cached_world, generate_world


def synth_database(seed: int = 0, size: str = "small", with_queries: bool = True) -> PaperDB:
    """The world's papers and citations in an in-memory database (one per call: each env owns its own).
    ``with_queries=False`` (a server) skips generating the queries, and the per-process world cache."""
    world = cached_world(seed, size) if with_queries else generate_world(seed, size, with_queries=False)
    return PaperDB.from_records(world.papers, world.edges(), source=f"synthscholar seed={seed} size={size}")


class SynthScholarEnv(PaperSearchEnv):
    """Paper search over ``generate_world(seed, size)`` (``size``: tiny, small, medium, large, 1m), on the
    queries of ``split`` (train, dev or test). Every other keyword goes to :class:`PaperSearchEnv`."""

    def __init__(self, seed: int = 0, size: str = "small", split: str = "train", **env_kwargs: Any):
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
        world = cached_world(seed, size)
        if split not in world.splits:
            raise ValueError(f"unknown split {split!r}; SynthScholar has {sorted(world.splits)}")
        self.world, self.split = world, split
        super().__init__(synth_database(seed, size), world.splits[split], **env_kwargs)
