"""Reading a query's 10 hit passages from a passage file larger than the page cache, three ways, side by
side in one run on fresh positions each query: as Lucene's and PISA's retrievers read them before
2026-12-07 (one after another through the memory map with its default advice, so each page fault reads
around it), through the map advised MADV_RANDOM (``PassageStore`` since), and with all ten asked for at once
first (``PassageStore.prefetch``, a ``posix_fadvise(WILLNEED)`` each, as ``StoredPassagesRetriever.hits``
does since).

    python benchmarks/bench_passage_prefetch.py --passages 21000000 --work-dir /work/scale21

Writes (or reuses) the scale benchmark's synthetic corpus of that size (``bench_retrieval_scale.py``'s
``corpora/n<N>-s<seed>``) and its passage file (``passages-n<N>-s<seed>``, 14.7 GB at 21M), drops the page
cache when it may (root: before each of six blocks of queries, each way twice; otherwise the ways take turns
query by query, and the file must be far larger than free memory for reads to be cold), and prints p50 and
mean wall ms of a query's reads, cold and then again with the same positions cached, the KB a cold query had
read from the disk (``/proc/self/io``) and the disk's read-ahead.
Hits are drawn uniformly: the synthetic corpus is in random order, so BM25's hits are scattered as these.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_retrieval_scale import write_corpus_files  # noqa: E402

from capo_envs.retrieval.base import read_corpus  # noqa: E402
from capo_envs.retrieval.passage_store import OFFSETS_FILE, PassageStore, PassageWriter  # noqa: E402

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def passage_folder(work_dir: Path, n: int, seed: int) -> Path:
    folder = work_dir / f"passages-n{n}-s{seed}"
    if (folder / OFFSETS_FILE).is_file():  # written last by PassageWriter.close
        return folder
    corpus = work_dir / "corpora" / f"n{n}-s{seed}"
    t0 = time.perf_counter()
    write_corpus_files(corpus, n, 1000, seed=seed)
    print(f"corpus: {time.perf_counter() - t0:.0f} s", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with PassageWriter(folder) as writer:
        for passage in read_corpus(corpus / "corpus.jsonl"):
            writer.add(passage)
    print(f"passage file: {time.perf_counter() - t0:.0f} s", flush=True)
    return folder


def read_ahead_kb(path: Path) -> int | None:
    """The read-ahead of the block device holding ``path`` (what a read-around fault reads), where found."""
    try:
        dev = os.stat(path).st_dev
        block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        queue = block / "queue" if (block / "queue").is_dir() else block.resolve().parent / "queue"
        return int((queue / "read_ahead_kb").read_text())
    except (OSError, ValueError):
        return None


def drop_page_cache() -> bool:
    try:
        DROP_CACHES.write_text("3\n")
        return True
    except OSError:
        return False


def disk_read_bytes() -> int:
    """Bytes this process has had read from storage (Linux's /proc/self/io), 0 where unknown."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# The three ways a query's passages are read: as before 2026-12-07 (the mapping's default advice, each page
# fault read around), the mapping advised MADV_RANDOM (PassageStore since), and that with the reads asked
# for together first (StoredPassagesRetriever.hits since).
WAYS = ("read_around", "random_advice", "prefetched")


def read_hits(store: PassageStore, positions: np.ndarray, way: str, disk_kb: list[float]) -> float:
    store._data.madvise(mmap.MADV_NORMAL if way == "read_around" else mmap.MADV_RANDOM)
    before = disk_read_bytes()
    t0 = time.perf_counter()
    if way == "prefetched":
        store.prefetch(positions)
    [store.record(int(p)) for p in positions]
    elapsed = (time.perf_counter() - t0) * 1000
    disk_kb.append((disk_read_bytes() - before) / 1024)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=21_000_000)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/capo-retrieval-scale"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queries", type=int, default=300, help="queries timed each way")
    parser.add_argument("--hits", type=int, default=10)
    args = parser.parse_args()
    folder = passage_folder(args.work_dir, args.passages, args.seed)
    store = PassageStore(folder)
    size_gb = (folder / "passages.jsonl").stat().st_size / 1e9
    rng = np.random.default_rng(args.seed)
    hits = rng.integers(0, len(store), size=(len(WAYS) * args.queries, args.hits))
    cold: dict[str, list[float]] = {way: [] for way in WAYS}
    cold_kb: dict[str, list[float]] = {way: [] for way in WAYS}
    dropped = drop_page_cache()
    order = WAYS + WAYS[::-1]
    if dropped:
        # Blocks of queries, the page cache dropped before each: a read-around fault leaves megabytes
        # cached, which would make later queries' passages warm.
        for block, way in zip(np.array_split(np.arange(len(hits)), len(order)), order):
            drop_page_cache()
            cold[way] += [read_hits(store, hits[i], way, cold_kb[way]) for i in block]
    else:  # take turns, so load on the machine falls on all alike
        for i, positions in enumerate(hits):
            way = WAYS[i % len(WAYS)]
            cold[way].append(read_hits(store, positions, way, cold_kb[way]))
    cached: dict[str, list[float]] = {way: [] for way in WAYS}
    for i, positions in enumerate(hits):
        way = WAYS[i % len(WAYS)]
        cached[way].append(read_hits(store, positions, way, []))
    out = {"passages": len(store), "file_gb": round(size_gb, 2), "page_cache_dropped": dropped,
           "hits_per_query": args.hits, "queries": len(hits),
           "read_ahead_kb": read_ahead_kb(folder / "passages.jsonl")}
    for name, times in (("cold", cold), ("cached", cached)):
        for way in WAYS:
            out[f"{name}_{way}_p50_ms"] = round(float(np.percentile(times[way], 50)), 3)
            out[f"{name}_{way}_mean_ms"] = round(float(np.mean(times[way])), 3)
            if name == "cold":
                out[f"cold_{way}_disk_kb_mean"] = round(float(np.mean(cold_kb[way])), 1)
        out[f"{name}_read_around_over_prefetched_p50"] = round(
            out[f"{name}_read_around_p50_ms"] / out[f"{name}_prefetched_p50_ms"], 2)
    print(json.dumps(out, indent=1))
    store.close()


if __name__ == "__main__":
    main()
