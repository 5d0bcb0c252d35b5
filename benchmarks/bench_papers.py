"""Paper search measurements: database size, search and expand latency, and the SynthScholar oracle's recall.

    python benchmarks/bench_papers.py                      # a generated 1M-paper database (about 5 minutes)
    python benchmarks/bench_papers.py --size medium        # 50k papers, seconds
    python benchmarks/bench_papers.py --db /tmp/p.sqlite --reuse   # time an existing file again
    python benchmarks/bench_papers.py --size 100k --db /tmp/p100k.sqlite --tasks /tmp/t100k.json --oracle-sizes
        # a 100k world, its dev/test queries written to --tasks; then the rankers' search-alone recall on them
        # (rerun with --reuse: --tasks is then read)

Each search ranker of ``PaperDB`` (``--rankers``, default both: ``fts5`` and ``bm25``) is timed on the same
queries, side by side with their ratio; for BM25 also the time and memory to build its index (or to load it
from ``<db>.bm25``, when saved: ``--fresh-index`` rebuilds).

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
import resource
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capo_envs.papers import vocab  # noqa: E402
from capo_envs.papers.db import PaperDB, build_database  # noqa: E402
from capo_envs.papers.world import SIZES, SizePreset, generate_world  # noqa: E402

# A size between "medium" and "large" for the ranker comparison (generated like the others, seeded by name).
SIZES.setdefault("100k", SizePreset(100_000, 3_000))


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": pick(0.5) * 1e3, "p95_ms": pick(0.95) * 1e3, "p99_ms": pick(0.99) * 1e3,
            "mean_ms": statistics.mean(ordered) * 1e3, "n": len(ordered)}


def rss_mb() -> float:
    """This process's resident memory now (Linux), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn, args_list) -> dict[str, float]:
    samples = []
    for args in args_list:
        start = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def build(size: str, seed: int, path: Path, reuse: bool, tasks: Path | None = None) -> dict:
    """Generate the world and write its database; with ``tasks``, also its dev and test queries (JSON)."""
    if reuse and path.exists():
        return {"reused": str(path)}
    start = time.perf_counter()
    world = generate_world(seed, size, with_queries=tasks is not None)
    generated = time.perf_counter() - start
    if tasks is not None:
        tasks.write_text(json.dumps({split: [{"id": t.id, "gold": list(t.gold), "cutoff": t.cutoff,
                                              "phrases": list(t.search_phrases or (t.question,))}
                                             for t in world.splits[split]] for split in ("dev", "test")}))
    start = time.perf_counter()
    report = build_database(path, world.papers, world.edges(), meta={"source": f"synthscholar {seed} {size}"})
    built = time.perf_counter() - start
    in_degree = Counter(world.cited)
    return {"generate_s": generated, "build_s": built, "papers": report.papers, "edges": report.edges,
            "max_in_degree": max(in_degree.values())}


def latency(path: Path, samples: int, seed: int, ranker: str = "fts5") -> dict:
    rng = random.Random(seed)
    tasks = [t for ts in vocab.FIELDS.values() for t in ts]
    keyword = [(f"{rng.choice(vocab.METHODS)} {rng.choice(tasks)}",) for _ in range(samples)]
    questions = [(rng.choice(vocab.QUESTION_TEMPLATES).format(m=rng.choice(vocab.METHODS), t=rng.choice(tasks)),)
                 for _ in range(samples)]
    with PaperDB(path, ranker=ranker) as db:
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


def index_build(path: Path, fresh: bool) -> dict:
    """Time and memory to get the BM25 index of the file (built, or loaded when saved beside it)."""
    from capo_envs.papers.search import BM25PaperIndex

    with PaperDB(path, ranker="bm25") as db:
        if fresh:
            shutil.rmtree(db.index_dir, ignore_errors=True)
        len(db), db.meta()
        before = rss_mb()
        start = time.perf_counter()
        index = BM25PaperIndex.open(db, db.index_dir)
        seconds = time.perf_counter() - start
        after = rss_mb()
        index.close()
    return {"loaded": index.loaded, "seconds": seconds, "rss_added_mb": after - before,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "saved_mb": sum(f.stat().st_size for f in db.index_dir.rglob("*") if f.is_file()) / 1e6}


def search_recall(db: PaperDB, tasks) -> float:
    """The oracle's search-alone recall@all: the top 10 of each key phrase (``expert_mode="search"``)."""
    recalls = []
    for task in tasks:
        found = set()
        for phrase in task["phrases"]:
            found |= {p.arxiv_id for p in db.search(phrase, 10, max_date=task["cutoff"])}
        recalls.append(len(found & set(task["gold"])) / len(task["gold"]))
    return statistics.mean(recalls)


def file_recall(path: Path, tasks_path: Path, rankers: list[str]) -> dict:
    tasks = json.loads(tasks_path.read_text())
    out = {}
    for ranker in rankers:
        with PaperDB(path, ranker=ranker) as db:
            out[ranker] = {split: search_recall(db, tasks[split]) for split in ("dev", "test")}
    return out


def engine_recall(sizes: list[str], seed: int, rankers: list[str]) -> dict:
    """Search-alone recall of the in-memory worlds' dev and test queries, per ranker."""
    from capo_envs.papers.world import cached_world

    out = {}
    for size in sizes:
        world = cached_world(seed, size)
        for ranker in rankers:
            db = PaperDB.from_records(world.papers, world.edges(), ranker=ranker)
            tasks = {split: [{"gold": t.gold, "phrases": t.search_phrases or (t.question,), "cutoff": t.cutoff}
                             for t in world.splits[split]] for split in ("dev", "test")}
            out[f"{size}/{ranker}"] = {split: search_recall(db, tasks[split]) for split in ("dev", "test")}
            db.close()
    return out


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
    parser.add_argument("--oracle-sizes", nargs="*", default=["small", "medium"],
                        help="in-memory worlds whose oracle (search + expand, search alone) is measured")
    parser.add_argument("--rankers", nargs="+", default=["fts5", "bm25"], choices=["fts5", "bm25"])
    parser.add_argument("--tasks", default=None, help="the --db file's queries for search-alone recall (JSON; "
                                                      "written when the database is built)")
    parser.add_argument("--fresh-index", action="store_true", help="rebuild the BM25 index even when saved")
    args = parser.parse_args(argv)
    path = Path(args.db or f"/tmp/synthscholar-{args.size}.sqlite")
    results = {"size": args.size,
               "build": build(args.size, args.seed, path, args.reuse, Path(args.tasks) if args.tasks else None)}
    file_bytes = os.path.getsize(path)
    with PaperDB(path) as db:
        papers = len(db)
    results["file_mb"] = file_bytes / 1e6
    results["mb_per_million_papers"] = file_bytes / 1e6 / (papers / 1e6)
    if "bm25" in args.rankers:
        results["bm25_index"] = index_build(path, args.fresh_index)
    results["latency"] = {ranker: latency(path, args.samples, args.seed, ranker) for ranker in args.rankers}
    if args.tasks:
        results["file_recall"] = file_recall(path, Path(args.tasks), args.rankers)
    results["engine_recall"] = engine_recall(args.oracle_sizes, args.seed, args.rankers)
    results["oracle"] = oracle_recall(args.oracle_sizes, args.seed)
    print(f"database: {papers:,} papers, {results['file_mb']:.0f} MB "
          f"({results['mb_per_million_papers']:.0f} MB per million papers); build {json.dumps(results['build'])}")
    if "bm25_index" in results:
        print(f"BM25 index: {json.dumps(results['bm25_index'])}")
    rankers = list(results["latency"])
    head = " | ".join(f"{e} p50 ms | {e} p99 ms" for e in rankers)
    ratio = " | fts5/bm25 p50" if rankers == ["fts5", "bm25"] else ""
    print(f"| call | {head}{ratio} |\n|---|" + "---|" * (2 * len(rankers) + bool(ratio)))
    for name in results["latency"][rankers[0]]:
        rows = [results["latency"][e][name] for e in rankers]
        cells = " | ".join(f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f}" for r in rows)
        extra = f" | {rows[0]['p50_ms'] / rows[1]['p50_ms']:.1f}x" if ratio else ""
        print(f"| {name} | {cells}{extra} |")
    print("| search-alone recall@all | dev | test |\n|---|---|---|")
    for name, row in {**{f"{path.name}/{e}": r for e, r in results.get("file_recall", {}).items()},
                      **results["engine_recall"]}.items():
        print(f"| {name} | {row['dev']:.4f} | {row['test']:.4f} |")
    print("| oracle (default ranker) | recall@all | episodes | mean steps | s/episode |\n|---|---|---|---|---|")
    for name, row in results["oracle"].items():
        print(f"| {name} | {row['recall_all']:.3f} | {row['episodes']} | {row['mean_steps']:.2f} | "
              f"{row['seconds_per_episode']:.3f} |")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
