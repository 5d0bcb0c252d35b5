"""What ``library="auto"`` builds: a BM25 library picked by speed first, then by whether its build fits
in memory.

1. Speed. With numba: bm25s at every size, scored by numba from ``NUMBA_MIN_PASSAGES`` on and by scipy
   below (bit-identical; small corpora skip numba's load time). Without numba: bm25s up to
   ``SCIPY_MAX_PASSAGES``, tantivy above (it is faster than bm25s's scipy kernel on large corpora). PISA is
   no speed pick: up to 1M passages, where both were measured, bm25s's numba kernel answers as fast or faster.
2. Memory. The peak that the build adds to a process already holding the passages is estimated as a
   line in the number of passages (``BUILD_MEMORY``, per library and analyzer) and must fit in
   ``BUILD_MEMORY_SHARE`` of the memory available now (``available_memory_bytes``: MemAvailable, capped
   by the cgroup limit). When the pick of step 1 does not fit: PISA (``library="pisa"``, ``pisa.py``:
   Lucene's ranking, several times Lucene's speed) if pyterrier-pisa's extension is installed, the analysis
   is Lucene's (the default) and its build fits (it streams the passages through disk), else Lucene (``open_retriever`` builds the ``lucene`` kind)
   when pyserini, pyjnius and Java are installed, else tantivy if it fits (not for an explicit
   ``analyzer="lucene"``, which tantivy cannot do), else a ``MemoryError`` that names the options.

The thresholds and the memory lines come from ``benchmarks/bench_retrieval_scale.py``; the measurements,
and what they mean on a given machine, are in docs/results/performance.md (section 4a).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .bm25_libraries import DEFAULT_ANALYZER, analysis, resolve_kernel

logger = logging.getLogger("capo_envs.retrieval.bm25")  # one logger for the BM25 retriever and its choice

LIBRARIES = ("bm25s", "tantivy")
DEFAULT_LIBRARY = "bm25s"  # what "auto" builds for small corpora (and at every size with numba)
# Above this many passages, without numba, "auto" builds tantivy (see library_choice).
SCIPY_MAX_PASSAGES = 50_000
# What building an index adds to a process that already holds the passages, as (fixed bytes, bytes per
# passage), per (library, analyzer): least-squares lines through build_peak_rss_mb - build_rss_passages_mb
# of the quiet 10k/100k/1M cells in docs/results/retrieval_scale.jsonl (tests/test_bm25_library_choice.py
# refits them). Generated Wikipedia-like passages (~100 words); longer passages need more.
BUILD_MEMORY = {
    ("bm25s", "snowball"): (148_000_000, 4_627),
    ("bm25s", "lucene"): (148_000_000, 5_101),  # more: the pass that rounds lengths as Lucene does
    ("tantivy", "snowball"): (123_000_000, 1_184),  # its 512 MB writer heap included
    # PISA's build: tokenisation works in batches of 200k passages, so up to 1M its peak flattens (81 / 640
    # / 1,289 MB at 10k / 100k / 1M), but the compressed index its compressor holds keeps growing (3,599 MB
    # at 5M, 11,451 MB at 21M). An upper line over the cells, 1% above the 5M and 21M peaks (~515 B per
    # passage between them). tests/test_bm25_library_choice.py checks it against docs/results/retrieval_scale_pisa.jsonl.
    ("pisa", "lucene"): (1_210_000_000, 520),
}
# "auto" plans a build to use at most this share of the available memory: the estimate is from one
# corpus, and the rest of the process (env workers, the trainer) keeps allocating.
BUILD_MEMORY_SHARE = 0.8


def build_memory_bytes(library: str, n_passages: int, analyzer: str = DEFAULT_ANALYZER) -> int:
    """Estimated peak memory that building ``library`` over ``n_passages`` adds to a process that
    already holds the passages (``BUILD_MEMORY``)."""
    fixed, per_passage = BUILD_MEMORY[(library, analysis(analyzer).name if library == "bm25s" else _OWN_ANALYZER[library])]
    return int(fixed + per_passage * max(0, int(n_passages)))


_OWN_ANALYZER = {"tantivy": "snowball", "pisa": "lucene"}


def pisa_unavailable() -> str | None:
    """Why the ``pisa`` library cannot be built here (pyterrier-pisa's extension and its TBB runtime), or None."""
    from .pisa import pisa_unavailable as why_not

    return why_not()


def _cgroup_free_bytes() -> int | None:
    """What this process's memory cgroup (v2, or v1) still allows, counting reclaimable page cache as
    free; None without a limit. Only the process's own cgroup is read, not its ancestors."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2
            names, root = ("memory.max", "memory.current", "inactive_file"), Path("/sys/fs/cgroup")
        elif "memory" in controllers.split(","):  # v1
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            root = Path("/sys/fs/cgroup/memory")
        else:
            continue
        # inside a container's cgroup namespace the listed path may not exist: its root is the limit
        for folder in (root / rel.lstrip("/"), root):
            try:
                limit = (folder / names[0]).read_text().strip()
                used = int((folder / names[1]).read_text())
                stat = dict(l.split() for l in (folder / "memory.stat").read_text().splitlines() if l.count(" ") == 1)
            except (OSError, ValueError):
                continue
            if limit == "max" or int(limit) >= 2**60:  # no limit (v1 writes a huge number)
                break
            return max(0, int(limit) - used + int(stat.get(names[2], 0)))
    return None


def available_memory_bytes() -> int | None:
    """Memory a build may take now: Linux's MemAvailable (free + reclaimable), capped by the cgroup
    limit; elsewhere the free pages from ``os.sysconf``; None when neither can be read."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    cgroup = _cgroup_free_bytes()
    return free if cgroup is None else min(free, cgroup)


def lucene_unavailable() -> str | None:
    """Why the ``lucene`` retriever cannot be built here (pyserini's Anserini jar, pyjnius, a Java
    runtime: what ``capo_envs.retrieval.lucene`` needs), or None when it can. Starts no JVM."""
    import importlib.util

    from .lucene import anserini_jar, java_home

    try:
        anserini_jar()
        home = java_home()
    except (ImportError, RuntimeError) as e:
        return str(e)
    if importlib.util.find_spec("jnius_config") is None:  # not jnius itself: importing it starts the JVM
        return "the lucene retriever needs pyjnius"
    if not (home / "bin" / "java").exists() and shutil.which("java") is None:
        return f"no java executable in {home}/bin or on PATH"
    return None


@dataclass(frozen=True)
class LibraryChoice:
    """What ``library="auto"`` builds and why; ``reason`` is empty for the plain default."""

    library: str  # "bm25s", "tantivy", "pisa" or "lucene" (pisa and lucene are retrievers of their own: open_retriever builds them)
    reason: str = ""


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def library_choice(
    n_passages: int,
    kernel: str = "auto",
    memory_bytes: int | None = None,
    *,
    analyzer: str | None = None,
    lucene: bool | None = None,
    pisa: bool | None = None,
) -> LibraryChoice:
    """The library ``library="auto"`` builds for ``n_passages`` (the rule: module docstring).

    ``memory_bytes``: memory free for the build, the passages already loaded (None: what
    ``available_memory_bytes`` reads now; no memory check if it cannot be read). ``lucene`` / ``pisa``:
    whether Lucene / PISA may be chosen (None: if ``lucene_unavailable`` / ``pisa_unavailable`` find it
    installed, asked only when it would be picked; ``BM25Retriever.build`` passes False for both, as it
    builds only bm25s and tantivy). ``analyzer`` None: each library's own default (bm25s:
    ``DEFAULT_ANALYZER``); an explicit one other than ``snowball`` rules tantivy out, one other than
    ``lucene`` rules PISA out. Raises ``MemoryError`` when nothing fits.
    """
    spec = analysis(analyzer or DEFAULT_ANALYZER)  # what bm25s would build
    tantivy_can = analyzer is None or spec.name == "snowball"  # tantivy's analysis is fixed, snowball-like
    pisa_can = spec.name == "lucene" and pisa is not False  # PISA ranks as Lucene only
    if memory_bytes is None:
        memory_bytes = available_memory_bytes()
    budget = None if memory_bytes is None else BUILD_MEMORY_SHARE * memory_bytes
    have = "" if memory_bytes is None else f"{_gb(budget)} usable ({BUILD_MEMORY_SHARE:.0%} of {_gb(memory_bytes)} available)"

    if not tantivy_can:
        fast = "bm25s"
    elif resolve_kernel(kernel, n_passages) == "numba" or n_passages <= SCIPY_MAX_PASSAGES:
        fast = "bm25s"
    else:
        fast = "tantivy"
    speed = "" if fast == "bm25s" else f"no numba kernel, {n_passages:,} > {SCIPY_MAX_PASSAGES:,} passages: tantivy is faster"
    if budget is None:
        return LibraryChoice(fast, speed)
    estimate = {library: build_memory_bytes(library, n_passages, spec.name) for library in LIBRARIES}
    if estimate[fast] <= budget:
        return LibraryChoice(fast, speed)
    need = f"{fast}'s build needs ~{_gb(estimate[fast])} for {n_passages:,} passages"
    why_not_pisa = None
    if pisa is False:
        why_not_pisa = "not tried: BM25Retriever.build makes only bm25s or tantivy"
    elif not pisa_can:
        why_not_pisa = f"it ranks as Lucene only, not with analyzer {spec.name!r}"
    if pisa_can and build_memory_bytes("pisa", n_passages) <= budget:
        why_not_pisa = None if pisa else pisa_unavailable()
        if why_not_pisa is None:
            return LibraryChoice("pisa", f"{need}, {have}: PISA streams its build through disk "
                                         f"(~{_gb(build_memory_bytes('pisa', n_passages))}), serves from disk and ranks as Lucene")
    if lucene is False:
        why_not_lucene = "not tried: BM25Retriever.build makes only bm25s or tantivy; open_retriever(\"bm25\") " \
            "switches to PISA or Lucene when installed"
    else:
        why_not_lucene = None if lucene else lucene_unavailable()
    if why_not_lucene is None:
        return LibraryChoice("lucene", f"{need}, {have}: Lucene (pyserini) builds with ~1 GB and serves from disk")
    tantivy_can = tantivy_can and fast != "tantivy"
    if tantivy_can and estimate["tantivy"] <= budget:
        return LibraryChoice("tantivy", f"{need}, {have}: tantivy's needs ~{_gb(estimate['tantivy'])}")
    also = f" (tantivy's ~{_gb(estimate['tantivy'])})" if tantivy_can else ""
    pisa_option = (f'library="pisa" (pip install --no-deps pyterrier-pisa==0.4.9 "tbb<=2020.3.254"; streams its build; '
                   f"here: {why_not_pisa or 'its build does not fit either'}); ")
    raise MemoryError(
        f"BM25 over {n_passages:,} passages will not fit in memory: {need}{also}, {have}. Options: {pisa_option}"
        f"retriever=\"lucene\" (pyserini + Java; builds with ~1 GB, serves from disk; here: {why_not_lucene}); "
        "a retrieval server on a machine with more memory (`capo serve-retriever`, then "
        "retriever=\"http://host:port/retrieve\"); more memory; or an explicit library=\"bm25s\"/\"tantivy\" to build anyway."
    )


def choose_library(
    n_passages: int,
    kernel: str = "auto",
    memory_bytes: int | None = None,
    *,
    analyzer: str | None = None,
    lucene: bool | None = None,
    pisa: bool | None = None,
) -> str:
    """The name of the library ``library="auto"`` builds (``library_choice(...).library``), logging one
    line with the reason when it is not bm25s."""
    choice = library_choice(n_passages, kernel, memory_bytes, analyzer=analyzer, lucene=lucene, pisa=pisa)
    if choice.library != DEFAULT_LIBRARY:
        logger.warning("BM25 library %s for %d passages: %s", choice.library, n_passages, choice.reason)
    return choice.library
