"""Reciprocal-rank fusion (RRF) of several retrievers, e.g. BM25 + dense.

RRF sums ``weight / (rrf_k + rank)`` over the lists a passage appears in. It uses ranks, not
scores, because BM25 and cosine scores live on incomparable scales; rrf_k=60 (Cormack et al., 2009)
keeps one list's top hit from drowning agreement between lists.
"""

from __future__ import annotations

from typing import Sequence

from .base import Hit, Retriever, check_search_args


class HybridRetriever(Retriever):
    """Fuses each member's top-``depth`` hits; a passage is identified by its id across members.

    Ties in fused score go to the passage with the better best rank, then to the earlier member
    that gave it that rank, then to its id, so the order is deterministic.
    """

    def __init__(self, retrievers: Sequence[Retriever], *, rrf_k: int = 60, depth: int = 50, weights: Sequence[float] | None = None):
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        if weights is not None and len(weights) != len(retrievers):
            raise ValueError(f"got {len(weights)} weights for {len(retrievers)} retrievers")
        if rrf_k < 0 or depth < 1:
            raise ValueError(f"need rrf_k >= 0 and depth >= 1, got rrf_k={rrf_k}, depth={depth}")
        self.retrievers = list(retrievers)
        self.rrf_k = rrf_k
        self.depth = depth
        self.weights = [1.0] * len(retrievers) if weights is None else [float(w) for w in weights]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        depth = max(self.depth, k)
        member_results = [r.search(list(queries), depth) for r in self.retrievers]
        return [self._fuse([results[qi] for results in member_results], k) for qi in range(len(queries))]

    def _fuse(self, lists: list[list[Hit]], k: int) -> list[Hit]:
        fused: dict[str, float] = {}
        best: dict[str, tuple[int, int]] = {}  # id -> (best rank, member giving it)
        first_hit: dict[str, Hit] = {}
        for member, (hits, weight) in enumerate(zip(lists, self.weights)):
            for rank, hit in enumerate(hits, 1):
                fused[hit.id] = fused.get(hit.id, 0.0) + weight / (self.rrf_k + rank)
                best[hit.id] = min(best.get(hit.id, (rank, member)), (rank, member))
                first_hit.setdefault(hit.id, hit)
        ranked = sorted(fused, key=lambda pid: (-fused[pid], best[pid], pid))[:k]
        return [Hit(pid, first_hit[pid].title, first_hit[pid].text, fused[pid]) for pid in ranked]

    def close(self) -> None:
        for retriever in self.retrievers:
            retriever.close()
