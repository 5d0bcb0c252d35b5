"""A compiled (numba) scorer for the bm25s score matrix: the same scores as the scipy product, faster.

The scipy path (``Bm25sIndex.search`` without numba) multiplies a (query x term) count matrix by
the (term x passage) score matrix: every posting of every query term is touched, through a general
sparse-sparse product that allocates a result matrix per batch. This kernel touches the same
postings but accumulates them into a reusable dense float32 array, then reads the totals back
(revisiting the postings, or sweeping the whole array when the postings are many) into a small
sorted top-k buffer, with no allocation per query. Both sum a query's terms in increasing term id with
float32 arithmetic, so the scores are bit-identical and the rankings equal (ties broken by corpus
position, as everywhere in this package). ``benchmarks/bench_retrieval_scale.py`` measures the gain.

The cost is still linear in the postings a query touches (no dynamic pruning such as Lucene's
block-max WAND), so it grows with the corpus: docs/results/performance.md (section 4a) has the measured
curve and why an exact MaxScore variant was not kept; ``bm25_choice.py`` the rule built on it.

numba is optional (``pip install "capo-gym[bm25-fast]"``); ``available()`` says whether it imports.
Compiled functions are cached on disk (numba ``cache=True``), so only the first process compiles.
"""

from __future__ import annotations

import queue
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=None)
def available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


# Sweep the whole accumulator instead of revisiting the postings when they number more than
# 1/DENSE_SCAN_RATIO of the passages: a sequential read-and-zero of one float costs several times
# less than a random one (timings: docs/results/performance.md, section 4a).
DENSE_SCAN_RATIO = 8


@lru_cache(maxsize=None)
def _kernels():
    import numba
    from numba import njit, prange

    @njit(cache=True, nogil=True)
    def insert(out_score, out_pos, found, k, s, doc):
        """Put (s, doc) into the best-first buffer of ``found`` entries (at most k); ties: lower doc first."""
        if found == k:
            last = out_score[k - 1]
            if s < last or (s == last and doc > out_pos[k - 1]):
                return found
            slot = k - 1
        else:
            slot = found
            found += 1
        while slot > 0 and (s > out_score[slot - 1] or (s == out_score[slot - 1] and doc < out_pos[slot - 1])):
            out_score[slot] = out_score[slot - 1]
            out_pos[slot] = out_pos[slot - 1]
            slot -= 1
        out_score[slot] = s
        out_pos[slot] = doc
        return found

    @njit(cache=True, nogil=True)
    def score_query(indptr, indices, data, terms, weights, acc, k, out_pos, out_score):
        """Top ``k`` of one query into out_pos/out_score (-1 padded); leaves ``acc`` all zero.

        Walk 1 adds every posting into ``acc``, in increasing term id (the scipy product's order,
        hence its float32 sums bit for bit), with no branch. Then either the whole array is swept
        once (many postings), or walk 2 goes over the same postings,
        reads each passage's total once and zeroes it, so a passage met again in a later term reads
        0 and is skipped, and the array never needs clearing. Its one branch, "does it beat the k-th
        so far?", is almost always false, so well predicted.
        """
        postings = 0
        for t in range(terms.shape[0]):
            term = terms[t]
            weight = weights[t]
            postings += indptr[term + 1] - indptr[term]
            for j in range(indptr[term], indptr[term + 1]):
                acc[indices[j]] += weight * data[j]
        found = 0
        bar = np.float32(0.0)  # the k-th best score once k are found
        if postings * DENSE_SCAN_RATIO > acc.shape[0]:
            # Many postings: one sequential sweep of the whole array is cheaper than revisiting
            # them at random. Passages come in increasing position, so a tie never displaces.
            for doc in range(acc.shape[0]):
                s = acc[doc]
                if s > bar:
                    found = insert(out_score, out_pos, found, k, s, doc)
                    if found == k:
                        bar = out_score[k - 1]
                acc[doc] = 0.0
            for i in range(found, k):
                out_pos[i] = -1
            return found
        for t in range(terms.shape[0]):
            term = terms[t]
            for j in range(indptr[term], indptr[term + 1]):
                doc = indices[j]
                s = acc[doc]
                acc[doc] = 0.0
                if s <= bar:
                    if s <= 0.0 or s < bar or doc > out_pos[k - 1]:
                        continue  # taken already (zeroed), below the bar, or a tie that loses on position
                found = insert(out_score, out_pos, found, k, s, doc)
                if found == k:
                    bar = out_score[k - 1]
        for i in range(found, k):
            out_pos[i] = -1
        return found

    @njit(cache=True, nogil=True)
    def search_serial(indptr, indices, data, q_ptr, q_terms, q_weights, k, acc, out_pos, out_score):
        for q in range(q_ptr.shape[0] - 1):
            lo, hi = q_ptr[q], q_ptr[q + 1]
            score_query(indptr, indices, data, q_terms[lo:hi], q_weights[lo:hi], acc, k, out_pos[q], out_score[q])

    @njit(cache=True, nogil=True, parallel=True)
    def search_parallel(indptr, indices, data, q_ptr, q_terms, q_weights, k, accs, out_pos, out_score):
        n_lanes = accs.shape[0]
        n_queries = q_ptr.shape[0] - 1
        for lane in prange(n_lanes):  # one lane per thread, each with its own accumulator
            for q in range(lane, n_queries, n_lanes):
                lo, hi = q_ptr[q], q_ptr[q + 1]
                score_query(indptr, indices, data, q_terms[lo:hi], q_weights[lo:hi], accs[lane], k, out_pos[q], out_score[q])

    return numba, search_serial, search_parallel


class NumbaScorer:
    """Scores batches of (term id, weight) queries against a term-major CSR score matrix.

    Working memory is one float32 accumulator of length n_passages per thread (4 bytes per passage
    per thread), allocated on first use and reused; a pool hands each concurrent caller its own, so
    the scorer is thread-safe.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_passages: int, threads: int = 1):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int32)
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        self.n_passages = n_passages
        self.threads = max(1, int(threads))
        self._pool: queue.SimpleQueue = queue.SimpleQueue()

    def _buffers(self, lanes: int) -> np.ndarray:
        try:
            accs = self._pool.get_nowait()
        except queue.Empty:
            accs = None
        if accs is None or accs.shape[0] < lanes:
            accs = np.zeros((lanes, self.n_passages), dtype=np.float32)
        return accs

    def search(self, queries: list[tuple[np.ndarray, np.ndarray]], k: int) -> list[list[tuple[int, float]]]:
        """``queries``: (sorted distinct term ids, float32 weights) per query."""
        numba, search_serial, search_parallel = _kernels()
        n = len(queries)
        if n == 0:
            return []
        q_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(t) for t, _ in queries], out=q_ptr[1:])
        q_terms = np.concatenate([t for t, _ in queries]).astype(np.int64) if q_ptr[-1] else np.zeros(0, np.int64)
        q_weights = np.concatenate([w for _, w in queries]).astype(np.float32) if q_ptr[-1] else np.zeros(0, np.float32)
        k_eff = max(1, min(k, self.n_passages))
        out_pos = np.full((n, k_eff), -1, dtype=np.int64)
        out_score = np.zeros((n, k_eff), dtype=np.float32)
        lanes = min(self.threads, n, numba.config.NUMBA_NUM_THREADS)
        accs = self._buffers(lanes)
        args = (self.indptr, self.indices, self.data, q_ptr, q_terms, q_weights, k_eff)
        try:
            if lanes == 1:
                search_serial(*args, accs[0], out_pos, out_score)
            else:
                numba.set_num_threads(lanes)
                search_parallel(*args, accs[:lanes], out_pos, out_score)
        except BaseException:
            accs = None  # interrupted mid-query: the accumulators may not be all zero; drop them
            raise
        finally:
            if accs is not None:
                self._pool.put(accs)
        results = []
        for row_pos, row_score in zip(out_pos.tolist(), out_score.tolist()):
            results.append([(p, s) for p, s in zip(row_pos, row_score) if p >= 0])
        return results
