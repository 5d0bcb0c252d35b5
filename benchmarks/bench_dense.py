"""Dense retrieval speed and memory on this machine: MiniLM encoding, then faiss flat vs hnsw vs ivfpq.

    python benchmarks/bench_dense.py --passages 2000

Uses the same synthetic corpus as bench_bm25.py. faiss is timed on pre-encoded query vectors so the
index types are compared alone; "agree@5" is the overlap of each index's top 5 with the exact
(flat) top 5, i.e. what the approximation costs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_bm25 import make_corpus
from capo_envs.retrieval.dense import INDEX_TYPES, cached_embeddings, load_encoder, make_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    import faiss
    import torch

    passages, queries = make_corpus(args.passages)
    texts = [q for q, _ in queries]
    texts = (texts * (args.queries // len(texts) + 1))[: args.queries]
    encoder = load_encoder(args.encoder)
    print(f"{args.encoder}: {len(passages):,} passages, {len(texts):,} queries, torch threads {torch.get_num_threads()}")

    with tempfile.TemporaryDirectory() as cache:  # fresh cache: time real encoding
        t0 = time.perf_counter()
        embeddings = cached_embeddings(args.encoder, passages, Path(cache), args.batch_size, False)
        encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    query_vectors = encoder.encode_queries(texts)
    query_s = time.perf_counter() - t0
    print(f"encode passages: {len(passages) / encode_s:,.0f} passages/s ({encode_s:.1f}s)  "
          f"queries: {len(texts) / query_s:,.0f} queries/s   dim {embeddings.shape[1]}")

    exact = None
    gold = [passages[g].id for _, g in queries[: len(texts)]]
    print(f"{'index':<8}{'build s':>9}{'search q/s':>12}{'bytes/passage':>15}{'agree@5':>9}{'recall@5':>10}")
    for index_type in INDEX_TYPES:
        t0 = time.perf_counter()
        index = make_index(embeddings, index_type)
        build_s = time.perf_counter() - t0
        index.search(query_vectors[:8], 5)
        t0 = time.perf_counter()
        _, top = index.search(query_vectors, 5)
        qps = len(texts) / (time.perf_counter() - t0)
        bytes_per = len(faiss.serialize_index(index)) / len(passages)
        exact = top if exact is None else exact
        agree = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top, exact)])
        found = [{passages[i].id for i in row if i >= 0} for row in top[: len(gold)]]
        recall = np.mean([g in f for g, f in zip(gold, found)])
        print(f"{index_type:<8}{build_s:>9.2f}{qps:>12,.0f}{bytes_per:>15,.0f}{agree:>9.3f}{recall:>10.3f}")
    print("bytes/passage is the serialized index size / passages: the RAM the index needs per passage")


if __name__ == "__main__":
    main()
