"""Report of ``bench_retrieval_scale.py``: tables per size, Lucene overlap, log-log fits, 21M, plot.

    python benchmarks/retrieval_scale_plot.py /tmp/capo-retrieval-scale/results.jsonl

Latency and throughput are shown on the wall clock and in CPU time of the serving process (robust
to other processes' load: see ``bench_retrieval_scale.py``); the plot uses CPU time.

The fit per library and metric is least squares on (log size, log value): value = a * size ** b. With
two sizes it is the line through them; ``b`` near 1 means linear growth. Extrapolations beyond the
largest measured size are marked with ``*``: they assume the measured trend continues (e.g. that
the index still fits in memory), which only a measurement can confirm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

TARGETS = (1_000_000, 5_000_000, 21_000_000)
# (label, key, format, lower is better)
METRICS = (
    ("build s", "build_s", "{:.1f}", True),
    ("disk MB (all)", "disk_mb", "{:.0f}", True),
    ("build peak RSS MB", "build_peak_rss_mb", "{:.0f}", True),
    ("serving RSS MB", "rss_serving_mb", "{:.0f}", True),
    ("load s", "load_s", "{:.2f}", True),
    ("build CPU s", "build_cpu_s", "{:.1f}", True),
    ("single p50 ms", "single_p50_ms", "{:.3f}", True),
    ("single p99 ms", "single_p99_ms", "{:.3f}", True),
    ("single p50 CPU ms", "single_p50_cpu_ms", "{:.3f}", True),
    ("batch q/s 1 thread", "batch_qps_t1", "{:,.0f}", False),
    ("batch q/s 2 threads", "batch_qps_t2", "{:,.0f}", False),
    ("batch q/CPU-s 1 thread", "batch_cpu_qps_t1", "{:,.0f}", False),
    ("recall@5", "recall5", "{:.3f}", False),
    ("top-10 overlap w/ Lucene", "overlap_lucene", "{:.3f}", False),
)
CLOCKS = (("wall", "single_p50_ms", "batch_qps_t1"), ("CPU", "single_p50_cpu_ms", "batch_cpu_qps_t1"))
FIT_KEYS = ("build_s", "build_cpu_s", "disk_mb", "rss_serving_mb", "single_p50_ms", "single_p50_cpu_ms",
            "batch_qps_t1", "batch_cpu_qps_t1")


def latest_rows(results: Path) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for line in Path(results).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if "error" not in r:
                rows[(r["library"], r["passages"], r["seed"])] = r
    return list(rows.values())


def add_lucene_overlap(rows: list[dict], work: Path) -> None:
    """Mean |top-10 ∩ Lucene's top-10| / |Lucene's top-10| over queries where Lucene found something."""
    lucene = {(r["passages"], r["seed"]): r for r in rows if r["library"] == "lucene"}
    for r in rows:
        ref = lucene.get((r["passages"], r["seed"]))
        if ref is None or "topk" not in r or not (work / r["topk"]).is_file():
            continue
        mine, theirs = np.load(work / r["topk"]), np.load(work / ref["topk"])
        scores = []
        for a, b in zip(mine, theirs):
            b = set(b[b >= 0].tolist())
            if b:
                scores.append(len(b & set(a[a >= 0].tolist())) / len(b))
        r["overlap_lucene"] = float(np.mean(scores)) if scores else float("nan")


def fit(sizes, values) -> tuple[float, float] | None:
    """(a, b) of value = a * size ** b, or None with fewer than two usable points."""
    pts = [(s, v) for s, v in zip(sizes, values) if v is not None and v > 0 and np.isfinite(v)]
    if len({s for s, _ in pts}) < 2:
        return None
    x, y = np.log([s for s, _ in pts]), np.log([v for _, v in pts])
    b, log_a = np.polyfit(x, y, 1)
    return float(np.exp(log_a)), float(b)


def _fmt(fmt: str, v) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else fmt.format(v)


def report(results: Path, plot: Path | None = None, out=sys.stdout) -> dict:
    """Print the tables and fits; draw the plot when ``plot`` is given. Returns the fits."""
    results = Path(results)
    rows = latest_rows(results) if results.is_file() else []
    if not rows:
        print(f"no results in {results}", file=out)
        return {}
    add_lucene_overlap(rows, results.parent)
    libraries = sorted({r["library"] for r in rows}, key=lambda e: (e != "lucene", e))
    sizes = sorted({r["passages"] for r in rows})
    by = {(r["library"], r["passages"]): r for r in rows}
    loads = [r.get("loadavg_start", 0) for r in rows] + [r.get("loadavg_end", 0) for r in rows]
    print(f"\n{len(rows)} cells from {results}; load average during the runs {min(loads):.1f} to {max(loads):.1f} "
          f"on {rows[0].get('cpus')} CPUs (above ~0.5 the machine was not quiet)", file=out)
    for n in sizes:
        present = [e for e in libraries if (e, n) in by]
        ref = by.get(("lucene", n))
        print(f"\n== {n:,} passages ({by[(present[0], n)].get('queries', '?')} queries, k=10) ==", file=out)
        print(f"{'metric':<26}" + "".join(f"{e:>16}" for e in present), file=out)
        for label, key, fmt, _ in METRICS:
            print(f"{label:<26}" + "".join(f"{_fmt(fmt, by[(e, n)].get(key)):>16}" for e in present), file=out)
        if ref:
            for clock, lat_key, qps_key in CLOCKS:
                print(f"{'x Lucene p50/batch ' + clock:<26}" + "".join(
                    f"{_ratio(by[(e, n)], ref, lat_key, qps_key):>16}" for e in present), file=out)
    fits: dict = {}
    print("\n== fitted cost = a * passages ** b, extrapolated (* = beyond the largest measured size) ==", file=out)
    print(f"{'library':<16}{'metric':<16}{'b':>7}" + "".join(f"{_size(t):>12}" for t in TARGETS), file=out)
    for e in libraries:
        mine = sorted((r for r in rows if r["library"] == e), key=lambda r: r["passages"])
        for key in FIT_KEYS:
            f = fit([r["passages"] for r in mine], [r.get(key) for r in mine])
            if f is None:
                continue
            fits[(e, key)] = f
            largest = max(r["passages"] for r in mine)
            cells = "".join(f"{_fmt('{:,.4g}', f[0] * t ** f[1]) + ('*' if t > largest else ' '):>12}" for t in TARGETS)
            print(f"{e:<16}{key:<16}{f[1]:>7.2f}{cells}", file=out)
    for clock, lat_key, qps_key in CLOCKS:
        if ("lucene", qps_key) not in fits or ("lucene", lat_key) not in fits:
            continue
        print(f"\n== predicted speed vs Lucene from the {clock} fits: Lucene's single p50 / the library's; "
              "the library's batch q/s / Lucene's (1 thread) ==", file=out)
        print(f"{'library':<16}" + "".join(f"{_size(t):>20}" for t in TARGETS), file=out)
        for e in libraries:
            if e == "lucene" or (e, qps_key) not in fits or (e, lat_key) not in fits:
                continue
            cells = ""
            for t in TARGETS:
                lat = _at(fits[("lucene", lat_key)], t) / _at(fits[(e, lat_key)], t)
                qps = _at(fits[(e, qps_key)], t) / _at(fits[("lucene", qps_key)], t)
                cells += f"{f'{lat:.2f}x / {qps:.2f}x':>20}"
            print(f"{e:<16}{cells}", file=out)
    print("\n== affine fit of per-query CPU cost = fixed + slope * passages (ms; from single p50 CPU and "
          "1/batch q/CPU-s), extrapolated ==", file=out)
    print(f"{'library':<16}{'metric':<14}{'fixed ms':>10}{'ms per 1M':>11}" + "".join(f"{_size(t):>10}" for t in TARGETS), file=out)
    for e in libraries:
        mine = sorted((r for r in rows if r["library"] == e), key=lambda r: r["passages"])
        sizes_e = [r["passages"] for r in mine]
        for label, values in (("single p50", [r.get("single_p50_cpu_ms") for r in mine]),
                              ("batch/query", [1000 / r["batch_cpu_qps_t1"] if r.get("batch_cpu_qps_t1") else None for r in mine])):
            f = affine_fit(sizes_e, values)
            if f is None:
                continue
            fits[(e, "affine " + label)] = f
            cells = "".join(f"{f[0] + f[1] * t:>10.3g}" for t in TARGETS)
            print(f"{e:<16}{label:<14}{f[0]:>10.3f}{f[1] * 1e6:>11.3f}{cells}", file=out)
    if plot is not None:
        draw(rows, fits, libraries, Path(plot))
        print(f"\nplot: {plot}", file=out)
    return fits


def affine_fit(sizes, values) -> tuple[float, float] | None:
    """(fixed, per passage) of value = fixed + per_passage * size, least squares, both >= 0: a
    query's cost is a fixed overhead plus work in proportion to the postings it reads, which an
    exhaustive library's grow with the corpus. Where the power fit's exponent is well below 1 only
    because the fixed part dominates the measured sizes, this one extrapolates more honestly."""
    pts = [(s, v) for s, v in zip(sizes, values) if v is not None and np.isfinite(v)]
    if len({s for s, _ in pts}) < 2:
        return None
    x, y = np.array([s for s, _ in pts], float), np.array([v for _, v in pts], float)
    slope, fixed = np.polyfit(x, y, 1)
    if fixed < 0:
        fixed, slope = 0.0, float(np.sum(x * y) / np.sum(x * x))
    if slope < 0:
        fixed, slope = float(np.mean(y)), 0.0
    return float(fixed), float(slope)


def _at(f: tuple[float, float], size: float) -> float:
    return f[0] * size ** f[1]


def _size(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k"


def _ratio(row: dict, ref: dict, lat_key: str, qps_key: str) -> str:
    """Lucene's single p50 / this library's, and this library's batch q/s / Lucene's (1 thread)."""
    try:
        return f"{ref[lat_key] / row[lat_key]:.1f}x/{row[qps_key] / ref[qps_key]:.1f}x"
    except (KeyError, ZeroDivisionError, TypeError):
        return "-"


def draw(rows: list[dict], fits: dict, libraries: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("build_cpu_s", "build CPU time (s)"), ("disk_mb", "index on disk (MB)"),
              ("rss_serving_mb", "serving RSS (MB)"), ("single_p50_cpu_ms", "single-query p50, CPU ms"),
              ("batch_cpu_qps_t1", "batch, queries per CPU-second (1 thread)"), ("recall5", "recall@5 vs gold")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    grid = np.logspace(4, np.log10(21e6), 50)
    for ax, (key, title) in zip(axes.flat, panels):
        for i, e in enumerate(libraries):
            mine = sorted((r for r in rows if r["library"] == e and r.get(key) is not None), key=lambda r: r["passages"])
            if not mine:
                continue
            color = f"C{i}"
            ax.plot([r["passages"] for r in mine], [r[key] for r in mine], "o", color=color, label=e)
            if (e, key) in fits:
                a, b = fits[(e, key)]
                ax.plot(grid, a * grid**b, "--", color=color, alpha=0.6)
        ax.set_xscale("log")
        if key != "recall5":
            ax.set_yscale("log")
        ax.axvline(21e6, color="grey", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel("passages (dashed: fit, extrapolated to 21M)")
        ax.grid(alpha=0.3, which="both")
    labelled = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labelled.setdefault(label, handle)
    fig.legend(list(labelled.values()), list(labelled), loc="lower center", ncol=max(1, len(labelled)), fontsize=9)
    fig.suptitle("BM25 libraries vs corpus size (benchmarks/bench_retrieval_scale.py)")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--plot", type=Path, default=None)
    a = p.parse_args()
    report(a.results, plot=a.plot or a.results.with_name("retrieval_scale.png"))
