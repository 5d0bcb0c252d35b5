"""Compare the BM25 libraries side by side on one synthetic corpus: build time, speed, memory, recall@5.

    python benchmarks/bench_bm25.py --passages 100000

The corpus is fictional encyclopedic passages, generated deterministically from --seed. Each query
targets one gold passage: half name the entity (in an inflected form, so stemming matters), half
only combine attributes that many distractor passages share individually. Each library runs in a
forked child so its memory delta is not blurred by the previous library's leftovers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import shutil
import tempfile
import time
from pathlib import Path

from capo_envs.retrieval.base import Passage
from capo_envs.retrieval.bm25 import DEFAULT_LIBRARY, LIBRARIES, BM25Retriever

_SYLLABLES = "ka lo ver mi tra son del qua rin bel osh tek mar vin dra zul fen har po lis gar nu ith cor sel wyn bro tal ge fu".split()
_KINDS = "river fortress guild monastery observatory village library dynasty festival canal academy harbour".split()
_TRADES = "salt copper silk timber glass wool amber spice iron paper".split()
_EXTRAS = (
    "A chronicle by {p} describes it.",
    "In {y} a fire destroyed the {a} quarter.",
    "Its {a} gate was restored by {p} after a long dispute with the council.",
    "Pilgrims arrived every spring.",
    "The traveller {p} wrote in {y} that its streets were {a} and crowded with carts, scribes and merchants.",
)
_ADJS = "ancient northern fortified coastal remote prosperous ruined sacred walled famous".split()


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def make_corpus(n: int, seed: int = 0) -> tuple[list[Passage], list[tuple[str, int]]]:
    """``n`` passages and one query per 10 passages (max 2000), each ``(query, gold position)``."""
    rng = random.Random(seed)
    places = [_name(rng, 3) for _ in range(max(20, n // 200))]
    people = [f"{_name(rng, 2)} {_name(rng, 3)}" for _ in range(max(50, n // 50))]
    passages, facts = [], []
    for i in range(n):
        entity, kind, place, adj = _name(rng, rng.choice((3, 4))), rng.choice(_KINDS), rng.choice(places), rng.choice(_ADJS)
        founder, rival, trade = rng.choice(people), rng.choice(people), rng.choice(_TRADES)
        year = rng.randint(900, 1950)
        text = (
            f"{entity} is a {adj} {kind} near {place}. It was founded in {year} by {founder}, "
            f"who traded {trade} with merchants from {rng.choice(places)}. During the reign of {rival} the "
            f"{kind} was besieged twice and later rebuilt in {rng.choice(_ADJS)} stone. Today {entity} "
            f"is known for its {trade} market and its archive of {rng.randint(2, 90)} thousand letters."
        )
        # Real passages vary in length; identical lengths would make BM25 ties unrealistically common.
        for _ in range(rng.randint(0, 4)):
            text += " " + rng.choice(_EXTRAS).format(p=rng.choice(people), y=rng.randint(900, 1950), a=rng.choice(_ADJS))
        passages.append(Passage(f"p{i}", entity, text))
        facts.append((entity, kind, place, founder, trade, year, adj))
    queries = []
    for gold in rng.sample(range(n), min(2000, max(1, n // 10))):
        entity, kind, place, founder, trade, year, adj = facts[gold]
        style = rng.randrange(4)
        if style == 0:  # names the entity, in an inflected sentence
            queries.append((f"who was the founder of the {kind}s of {entity}?", gold))
        elif style == 1:  # attributes only, each shared by many distractors
            queries.append((f"{kind} near {place} whose founder {founder} traded {trade}", gold))
        elif style == 2:
            queries.append((f"{trade}-trading {kind}s founded by {founder.split()[1]} in {year}", gold))
        else:
            queries.append((f"the {adj} {kind}s around {place}", gold))
    return passages, queries


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _measure(build, passages, queries, batch: int, singles: int) -> dict:
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    retriever = build(passages)
    build_s = time.perf_counter() - t0
    rss = _rss_bytes() - rss0
    texts = [q for q, _ in queries]
    batch_texts = (texts * (batch // len(texts) + 1))[:batch]
    retriever.search(texts[:8], 5)  # warm caches and lazy imports outside the timings
    t0 = time.perf_counter()
    retriever.search(batch_texts, 5)
    batch_qps = batch / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for q in texts[:singles]:
        retriever.search([q], 5)
    single_ms = (time.perf_counter() - t0) / singles * 1000
    results = retriever.search(texts, 5)
    golds = [passages[g].id for _, g in queries]
    recall = sum(gold in {h.id for h in hits} for gold, hits in zip(golds, results)) / len(queries)
    disk = None
    if hasattr(retriever, "save"):
        tmp = Path(tempfile.mkdtemp())
        try:
            retriever.save(tmp / "index")
            disk = _dir_bytes(tmp / "index")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    retriever.close()
    return dict(build_s=build_s, batch_qps=batch_qps, single_ms=single_ms, rss_mb=rss / 2**20,
                disk_mb=None if disk is None else disk / 2**20, recall5=recall)


def _bm25_builder(library: str):
    return lambda passages: BM25Retriever.build(passages, library=library)


def _lucene_builder():
    """The pyserini library, or a reason it cannot run here."""
    try:
        from capo_envs.retrieval.lucene import LuceneRetriever
    except Exception as e:  # the module is optional and needs pyserini + a JDK
        return None, f"capo_envs.retrieval.lucene does not import ({type(e).__name__}: {e})"
    return LuceneRetriever.build, None


def _child(args):
    name, passages, queries, batch, singles = args
    build = _lucene_builder()[0] if name == "lucene" else _bm25_builder(name)
    try:
        return name, _measure(build, passages, queries, batch, singles), None
    except Exception as e:  # e.g. Lucene without a working Java: report and go on
        return name, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000, help="queries in the batched timing")
    parser.add_argument("--singles", type=int, default=200, help="queries in the one-at-a-time timing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    passages, queries = make_corpus(args.passages, args.seed)
    print(f"corpus: {len(passages):,} passages, {len(queries):,} queries (generated in {time.perf_counter() - t0:.1f}s)")
    libraries = list(LIBRARIES)
    if _lucene_builder()[0] is None:
        print(f"note: skipping lucene: {_lucene_builder()[1]}")
    else:
        libraries.append("lucene")
    results = {}
    ctx = mp.get_context("fork")
    for name in libraries:
        with ctx.Pool(1) as pool:
            name, metrics, error = pool.apply(_child, ((name, passages, queries, args.batch, args.singles),))
        if error:
            print(f"note: skipping {name}: {error}")
        else:
            results[name] = metrics

    rows = [
        ("build s", "build_s", "{:.1f}"),
        (f"batch q/s ({args.batch})", "batch_qps", "{:.0f}"),
        ("single query ms", "single_ms", "{:.2f}"),
        ("RSS delta MB", "rss_mb", "{:.0f}"),
        ("on-disk MB", "disk_mb", "{:.0f}"),
        ("recall@5", "recall5", "{:.3f}"),
    ]
    names = list(results)
    base = results.get(DEFAULT_LIBRARY)
    header = f"{'metric':<22}" + "".join(f"{n:>12}" for n in names)
    header += "".join(f"{n + '/' + DEFAULT_LIBRARY:>18}" for n in names if n != DEFAULT_LIBRARY and base)
    print(header)
    for label, key, fmt in rows:
        cells = [results[n][key] for n in names]
        line = f"{label:<22}" + "".join(f"{'-' if c is None else fmt.format(c):>12}" for c in cells)
        for n in names:
            if n != DEFAULT_LIBRARY and base:
                a, b = results[n][key], base[key]
                line += f"{'-' if a is None or not b else f'{a / b:.2f}x':>18}"
        print(line)
    print(f"default library (library='auto'): {DEFAULT_LIBRARY}")


if __name__ == "__main__":
    main()
