"""Paper search measurements: database size, search and expand latency, and the SynthScholar oracle's recall.

    python benchmarks/bench_papers.py                      # a generated 1M-paper database (about 5 minutes)
    python benchmarks/bench_papers.py --size medium        # 50k papers, seconds
    python benchmarks/bench_papers.py --db /tmp/p.sqlite --reuse   # time an existing file again

Latency is per call on one thread through ``PaperDB`` (what the env and ``capo serve papers`` run):
``search`` (top 10, BM25 over title and abstract) for short keyword queries ("<method> <task>"), the same
with a date cut-off (as PaperSearch-v0 applies per query), and for full AutoScholarQuery-style questions, and ``expand`` (30 citations + 99 references, no abstract-less
papers) for uniformly drawn papers and for the 1 % most cited. The oracle's recall is measured on
SynthScholar's dev and test queries, with search alone and with search + expand.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capo_envs.papers import vocab  # noqa: E402
from capo_envs.papers.db import PaperDB, build_database  # noqa: E402
from capo_envs.papers.world import SIZES, generate_world  # noqa: E402


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": pick(0.5) * 1e3, "p95_ms": pick(0.95) * 1e3, "mean_ms": statistics.mean(ordered) * 1e3,
            "n": len(ordered)}


def timed(fn, args_list) -> dict[str, float]:
    samples = []
    for args in args_list:
        start = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def build(size: str, seed: int, path: Path, reuse: bool) -> dict:
    if reuse and path.exists():
        return {"reused": str(path)}
    start = time.perf_counter()
    world = generate_world(seed, size, with_queries=False)
    generated = time.perf_counter() - start
    start = time.perf_counter()
    report = build_database(path, world.papers, world.edges(), meta={"source": f"synthscholar {seed} {size}"})
    built = time.perf_counter() - start
    in_degree = Counter(world.cited)
    return {"generate_s": generated, "build_s": built, "papers": report.papers, "edges": report.edges,
            "max_in_degree": max(in_degree.values())}


def latency(path: Path, samples: int, seed: int) -> dict:
    rng = random.Random(seed)
    tasks = [t for ts in vocab.FIELDS.values() for t in ts]
    keyword = [(f"{rng.choice(vocab.METHODS)} {rng.choice(tasks)}",) for _ in range(samples)]
    questions = [(rng.choice(vocab.QUESTION_TEMPLATES).format(m=rng.choice(vocab.METHODS), t=rng.choice(tasks)),)
                 for _ in range(samples)]
    with PaperDB(path) as db:
        n = len(db)
        ids = [r[0] for r in db._rows("SELECT arxiv_id FROM papers WHERE rowid IN (%s)" % ",".join(
            str(rng.randint(1, n)) for _ in range(samples)))]
        cited = [r[0] for r in db._rows(
            "SELECT p.arxiv_id FROM (SELECT cited, count(*) c FROM edges GROUP BY cited ORDER BY c DESC LIMIT ?) e "
            "JOIN papers p ON p.rowid = e.cited", (max(1, min(samples, n // 100)),))]
        db.search("warm up the page cache")
        return {
            "search_keywords": timed(db.search, keyword),
            "search_questions": timed(db.search, questions),
            "search_keywords_cutoff_2020": timed(lambda q: db.search(q, max_date="2020-06-30"), keyword),
            "expand_random": timed(db.expand, [(i,) for i in ids]),
            "expand_most_cited": timed(db.expand, [(i,) for i in cited]),
            "get": timed(db.get, [(i,) for i in ids]),
        }


def oracle_recall(sizes: list[str], seed: int) -> dict:
    import gymnasium as gym

    import capo_envs  # noqa: F401

    out = {}
    for size in sizes:
        for mode in ("search", "full"):
            recalls, steps, start, episodes = [], [], time.perf_counter(), 0
            for split in ("dev", "test"):
                env = gym.make("capo/SynthScholar-v0", seed=seed, size=size, split=split, expert_mode=mode)
                for task_id in env.unwrapped.task_ids():
                    env.reset(options={"task_id": task_id})
                    done = False
                    while not done:
                        _, _, terminated, truncated, info = env.step(env.unwrapped.expert_action())
                        done = terminated or truncated
                    recalls.append(info["metrics"]["recall_all"])
                    steps.append(info["metrics"]["steps"])
                    episodes += 1
                env.close()
            out[f"{size}/{mode}"] = {"recall_all": statistics.mean(recalls), "episodes": episodes,
                                     "mean_steps": statistics.mean(steps),
                                     "seconds_per_episode": (time.perf_counter() - start) / episodes}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1m", choices=sorted(SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", default=None, help="where the database is written (default: /tmp/synthscholar-<size>.sqlite)")
    parser.add_argument("--reuse", action="store_true", help="time an existing --db instead of building it")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--oracle-sizes", nargs="*", default=["small", "medium"])
    args = parser.parse_args(argv)
    path = Path(args.db or f"/tmp/synthscholar-{args.size}.sqlite")
    results = {"size": args.size, "build": build(args.size, args.seed, path, args.reuse)}
    file_bytes = os.path.getsize(path)
    with PaperDB(path) as db:
        papers = len(db)
    results["file_mb"] = file_bytes / 1e6
    results["mb_per_million_papers"] = file_bytes / 1e6 / (papers / 1e6)
    results["latency"] = latency(path, args.samples, args.seed)
    results["oracle"] = oracle_recall(args.oracle_sizes, args.seed)
    print(f"database: {papers:,} papers, {results['file_mb']:.0f} MB "
          f"({results['mb_per_million_papers']:.0f} MB per million papers); build {json.dumps(results['build'])}")
    print("| call | p50 ms | p95 ms | mean ms | n |\n|---|---|---|---|---|")
    for name, row in results["latency"].items():
        print(f"| {name} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} | {row['mean_ms']:.2f} | {row['n']} |")
    print("| oracle | recall@all | episodes | mean steps | s/episode |\n|---|---|---|---|---|")
    for name, row in results["oracle"].items():
        print(f"| {name} | {row['recall_all']:.3f} | {row['episodes']} | {row['mean_steps']:.2f} | "
              f"{row['seconds_per_episode']:.3f} |")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
