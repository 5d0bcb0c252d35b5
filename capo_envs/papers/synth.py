"""``capo/SynthScholar-v0``: paper search over a generated scholarly world (no download, builds in a second)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .db import PaperDB
from .env import PaperSearchEnv
from .world import SIZES, cached_world, generate_world


def synth_database(seed: int = 0, size: str = "small", with_queries: bool = True) -> PaperDB:
    """The world's papers and citations in a new in-memory database (envs share one: ``_shared_database``).
    ``with_queries=False`` (a server) skips generating the queries, and the per-process world cache."""
    world = cached_world(seed, size) if with_queries else generate_world(seed, size, with_queries=False)
    return PaperDB.from_records(world.papers, world.edges(), source=f"synthscholar seed={seed} size={size}")


@lru_cache(maxsize=4)
def _shared_database(seed: int, size: str) -> PaperDB:
    """One database per ``(seed, size)`` per process for the envs: filling it takes seconds at the medium
    size, and a trainer makes an env per episode slot. Its connection is locked, so threads may share it."""
    return synth_database(seed, size)


class _SharedDatabase:
    """A shared database, which one env's ``close()`` must not close for the others."""

    def __init__(self, db: PaperDB):
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def __len__(self) -> int:
        return len(self._db)

    def close(self) -> None:
        pass


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
        super().__init__(_SharedDatabase(_shared_database(seed, size)), world.splits[split], **env_kwargs)
