"""WebShop figures: catalogue index build time and memory, search latency, env steps/s, SynthShop oracle success.

    python benchmarks/bench_webshop.py --products 10000 100000 1181430
    python benchmarks/bench_webshop.py --env-only

Peak RSS covers the whole child (generated raw records, loaded product dicts and the index). The saved
index is then loaded in a fresh process ("loaded_index"): what an env pays, since WebShop-v0 keeps the
products in SQLite, not in memory.

Catalogues are SynthShop's generator at the given size (WebShop's full catalogue has 1,181,430 products
after de-duplication). Each size runs in a forked child, so its peak RSS is its own: generation, the
original's load_products, the search text and the BM25 index (capo_envs.retrieval, bm25s engine). Queries
are the goals' key terms (attributes + product type), as the oracle searches, top 50 as the original.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it is not inherited across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_catalog(num_products: int, queries: int, out: mp.Queue) -> None:
    from capo_envs.webshop.products import build_goals, load_products
    from capo_envs.webshop.shop import ProductSearch
    from capo_envs.webshop.world import generate_catalog

    start_rss = _rss_mb()
    t = time.perf_counter()
    raw, attrs = generate_catalog(seed=0, num_products=num_products)
    products = load_products(raw, attrs, human_goals=False)
    del raw
    t_load = time.perf_counter() - t
    _, goals = build_goals(products[:20_000], human=False)  # queries only: a prefix keeps memory down
    t = time.perf_counter()
    search = ProductSearch.build(products, cache_size=0)
    t_index = time.perf_counter() - t
    keys = list(dict.fromkeys(" ".join([*g["attributes"], g["query"]]) for g in goals))[:queries]  # distinct: no cache hits
    latencies = []
    for q in keys:
        t = time.perf_counter()
        search.search(q.split(" "))
        latencies.append((time.perf_counter() - t) * 1000)
    latencies.sort()
    index_dir = Path(tempfile.mkdtemp(prefix="bench-webshop-"))
    t = time.perf_counter()
    search.retriever.save(index_dir / "bm25")
    t_save = time.perf_counter() - t
    disk_mb = sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file()) / 2**20
    child_out = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=bench_loaded_index, args=(str(index_dir / "bm25"), keys, child_out))
    child.start()
    child.join()
    loaded = child_out.get() if child.exitcode == 0 else {"failed": child.exitcode}
    shutil.rmtree(index_dir, ignore_errors=True)
    out.put({
        "index_save_s": round(t_save, 1), "index_disk_mb": round(disk_mb, 0), "loaded_index": loaded,
        "products": len(products), "generate_and_load_s": round(t_load, 1), "index_build_s": round(t_index, 1),
        "peak_rss_mb": round(_rss_mb(), 0), "rss_before_mb": round(start_rss, 0),
        "search_ms_p50": round(statistics.median(latencies), 2),
        "search_ms_p95": round(latencies[int(0.95 * (len(latencies) - 1))], 2), "queries": len(latencies),
    })  # fmt: skip


def bench_loaded_index(index_dir: str, keys: list[str], out: mp.Queue) -> None:
    """What an env process pays: load the saved index (no catalogue in memory), then search."""
    from capo_envs.webshop.shop import ProductSearch

    before = _rss_mb()
    t = time.perf_counter()
    search = ProductSearch.load(index_dir, cache_size=0)
    t_load = time.perf_counter() - t
    latencies = []
    for q in keys:
        t = time.perf_counter()
        search.search(q.split(" "))
        latencies.append((time.perf_counter() - t) * 1000)
    latencies.sort()
    out.put({"load_s": round(t_load, 1), "rss_mb": round(_rss_mb() - before, 0),
             "search_ms_p50": round(statistics.median(latencies), 2),
             "search_ms_p95": round(latencies[int(0.95 * (len(latencies) - 1))], 2)})


def bench_env(split: str) -> dict:
    import gymnasium as gym

    import capo_envs  # noqa: F401

    env = gym.make("capo/SynthShop-v0", split=split).unwrapped
    t, steps, success = time.perf_counter(), 0, []
    for task_id in env.task_ids():
        env.reset(options={"task_id": task_id})
        while True:
            *_, terminated, truncated, info = env.step(env.expert_action())
            steps += 1
            if terminated or truncated:
                success.append(info["metrics"]["success"])
                break
    elapsed = time.perf_counter() - t
    return {"split": split, "episodes": len(success), "oracle_success": round(sum(success) / len(success), 4),
            "oracle_steps_per_s": round(steps / elapsed, 0), "mean_episode_steps": round(steps / len(success), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", type=int, nargs="*", default=[1000, 10000, 100000])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--env-only", action="store_true")
    args = parser.parse_args()
    for split in ("test", "dev", "train"):
        print(bench_env(split), flush=True)
    if args.env_only:
        return
    ctx = mp.get_context("fork")
    for n in args.products:
        out = ctx.Queue()
        child = ctx.Process(target=bench_catalog, args=(n, args.queries, out))
        child.start()
        child.join()
        print(out.get() if child.exitcode == 0 else {"products": n, "failed": child.exitcode}, flush=True)


if __name__ == "__main__":
    main()
