"""The paper-search evaluation of the CAPO authors (``recipe/paper_search/inference/evaluation.py``).

Per query, the pool is sorted by selector score (descending; ties in the order papers were found) and cut
at k in {all, 100, 50, 25}; precision = hits / predictions, recall = hits / gold, F1 their harmonic mean.
Figures are averaged over queries, and a query with no output counts as zero (CAPO's script skips
missing result files instead, which inflates the average when runs fail).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

CUTOFFS: tuple[tuple[str, int | None], ...] = (("all", None), ("100", 100), ("50", 50), ("25", 25))
METRIC_KEYS = tuple(f"{m}_{name}" for name, _ in CUTOFFS for m in ("precision", "recall", "f1"))


def retrieval_metrics(ranked_ids: Sequence[str], gold: Iterable[str]) -> dict[str, float]:
    """Precision, recall and F1 at every cut-off of ``ranked_ids`` (best first) against ``gold``."""
    gold_set = set(gold)
    out: dict[str, float] = {}
    for name, k in CUTOFFS:
        predicted = list(dict.fromkeys(ranked_ids if k is None else ranked_ids[:k]))
        hits = sum(p in gold_set for p in predicted)
        precision = hits / len(predicted) if predicted else 0.0
        recall = hits / len(gold_set) if gold_set else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[f"precision_{name}"], out[f"recall_{name}"], out[f"f1_{name}"] = precision, recall, f1
    return out


def average_metrics(per_query: Sequence[Mapping[str, float] | None]) -> dict[str, float]:
    """The mean of each metric over queries; ``None`` (a query without output) counts as all zeros."""
    if not per_query:
        return {key: 0.0 for key in METRIC_KEYS}
    return {key: sum((m or {}).get(key, 0.0) for m in per_query) / len(per_query) for key in METRIC_KEYS}
