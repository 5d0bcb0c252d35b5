"""Where one PISA query's time goes on a saved index: the query's analysis, PISA's retrieval (MaxScore),
and reading the hits' passages from the passage file; then the same queries again, their passages cached.

    python benchmarks/bench_pisa_query_split.py --index <work-dir>/indexes/pisa-n21000000-s0 \\
        --corpus <work-dir>/corpora/n21000000-s0

Run it on an index that ``bench_retrieval_scale.py --keep-indexes`` kept. Prints p50 and mean of each part,
in wall and CPU ms (a part whose wall time is far above its CPU time waits on the disk).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_retrieval_scale import read_queries  # noqa: E402

from capo_envs.retrieval.pisa import PisaRetriever  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="the corpus dir (its queries are used)")
    parser.add_argument("--singles", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    queries, _ = read_queries(args.corpus)
    retriever = PisaRetriever.load(args.index)
    for q in queries[-args.warmup:] if args.warmup else []:  # as the scale benchmark's serve step warms up
        retriever.search([q], 10)
    parts = ("analyse", "retrieve", "hits", "total")
    wall: dict[str, list[float]] = {p: [] for p in parts}
    cpu: dict[str, list[float]] = {p: [] for p in parts}
    for q in queries[: args.singles]:
        marks = [(time.perf_counter(), time.process_time())]
        retriever._query_terms(q)  # what search_positions does first, timed alone
        marks.append((time.perf_counter(), time.process_time()))
        pairs = retriever.search_positions([q], 10)[0]
        marks.append((time.perf_counter(), time.process_time()))
        retriever.hits([pairs])  # the passages read as search reads them (ahead together, then decoded)
        marks.append((time.perf_counter(), time.process_time()))
        for part, (a, b) in zip(parts, [(0, 1), (1, 2), (2, 3), (0, 3)]):
            wall[part].append((marks[b][0] - marks[a][0]) * 1000)
            cpu[part].append((marks[b][1] - marks[a][1]) * 1000)
    again = []
    for q in queries[: args.singles]:
        t0 = time.perf_counter()
        retriever.search([q], 10)
        again.append((time.perf_counter() - t0) * 1000)
    out = {p: {"wall_p50_ms": float(np.percentile(wall[p], 50)), "wall_mean_ms": float(np.mean(wall[p])),
               "cpu_p50_ms": float(np.percentile(cpu[p], 50)), "cpu_mean_ms": float(np.mean(cpu[p]))} for p in parts}
    out["again_total_wall_p50_ms"] = float(np.percentile(again, 50))
    print(json.dumps(out, indent=1))
    retriever.close()


if __name__ == "__main__":
    main()
