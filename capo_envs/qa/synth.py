"""``capo/SynthHop-v0``: the multi-hop QA env over a generated encyclopedia (no download, builds in seconds)."""

from __future__ import annotations

from typing import Any, Sequence

from .env import MultiHopQAEnv


class SynthHopEnv(MultiHopQAEnv):
    """Multi-hop QA over ``build_world(seed, size)``, searched with an in-memory index of kind ``retriever``.

    ``question_kinds`` keeps only some kinds of question (``"bridge-2"``, ``"bridge-3"``, ``"bridge-4"``,
    ``"comparison"``), e.g. an easier curriculum of two-hop bridges."""

    def __init__(
        self,
        seed: int = 0,
        size: str = "small",
        split: str = "train",
        retriever: str = "bm25",
        question_kinds: Sequence[str] | None = None,
        **env_kwargs: Any,
    ):
        from ..retrieval import open_retriever
        from .questions import QUESTION_KINDS
        from .world import build_world

        world = build_world(seed, size)
        if split not in world.splits:
            raise ValueError(f"unknown split {split!r}; SynthHop has {sorted(world.splits)}")
        tasks = world.splits[split]
        if question_kinds is not None:
            if isinstance(question_kinds, str):
                question_kinds = (question_kinds,)
            unknown = sorted(set(question_kinds) - set(QUESTION_KINDS))
            if unknown or not question_kinds:
                raise ValueError(f"question_kinds {unknown or '[]'} unknown; choose from {list(QUESTION_KINDS)}")
            tasks = tuple(t for t in tasks if t.kind in question_kinds)
        self.world = world
        self.split = split
        super().__init__(tasks, open_retriever(retriever, passages=world.passages), **env_kwargs)
