"""``capo data prepare papers``: PaSa's queries, an arXiv paper database and its citation edges.

Stages, each resumable (downloads go to ``$CAPO_DATA_DIR/.downloads/papers/`` and resume with Range
requests; per-part extracts of the citation sources are kept there until the build succeeds):

1. **Queries**: AutoScholarQuery train/dev/test and RealScholarQuery test, PaSa's files as the CAPO
   repository vendors them at a pinned commit (dev, test and RealScholarQuery sha256-pinned), or a local
   folder in the same layout (``--queries-from``). Here.
2. **Papers** (``papers_arxiv.py``): the CC0 arXiv metadata snapshot at a pinned revision, papers of the
   chosen categories (default ``cs.*``, ``stat.ML``, ``eess.*``) first submitted on or before the cut-off
   (default 2024-09-30), and every gold paper whatever its category or date.
3. **Citations** (``papers_citations.py``, ``--citations``): none, the OpenAlex snapshot or API, or the
   Semantic Scholar datasets; only edges whose two ends are in the database are kept.
4. **Database**: ``papers.sqlite`` (``capo_envs.papers.db``), then ``manifest.json`` last, with the sources,
   their hashes and the coverage figures (share of gold papers present, share with references). Here.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path
from typing import Iterable, Sequence

from capo_envs.papers.db import PaperDB, build_database
from capo_envs.papers.env import DATASET, DB_FILE, QUERY_FILES, load_queries

from .building import building, data_root
from .download import download, sha256_file
from .manifest import is_complete, read_manifest, write_manifest
from .papers_arxiv import ARXIV_REVISION, ARXIV_SHARDS, ARXIV_URLS, DEFAULT_CATEGORIES, DEFAULT_CUTOFF, read_snapshot
from .papers_citations import (
    CITATION_SOURCES, OPENALEX_API, OPENALEX_MANIFEST, OPENALEX_S3_HTTP, S2_DATASETS_API, citation_edges,
)  # fmt: skip
from .sources import Remote, mirrored

log = logging.getLogger(__name__)

DATASETS = (DATASET,)
_PINNED = "sha256 of this file at the pinned commit"
CAPO_COMMIT = "35685311fbfc5d43905c38ff67a578b607c37af8"
_CAPO_RAW = f"https://raw.githubusercontent.com/AgentR1/CAPO/{CAPO_COMMIT}/recipe/paper_search/inference/datasets"
QUERY_REMOTES: dict[str, Remote] = {
    "dev": Remote(f"{_CAPO_RAW}/AutoScholarQuery/dev.jsonl", "AutoScholarQuery-dev.jsonl",
                  sha256="d211a33f8171bd847331a34b0b4ea98e3ce06f2b1d64ff3f35b633407cb1d082", size=450_875,
                  note=_PINNED),
    "test": Remote(f"{_CAPO_RAW}/AutoScholarQuery/test.jsonl", "AutoScholarQuery-test.jsonl",
                   sha256="7d8c7f59b289a54912c38cf204d16dbfec14ca35de850b9978b4051ad43a8b36", size=438_997,
                   note=_PINNED),
    "realscholar": Remote(f"{_CAPO_RAW}/RealScholarQuery/test.jsonl", "RealScholarQuery-test.jsonl",
                          sha256="b3b570411ce2399ce4ea145ba9b2d3d0048b248030edeeb44ba95a7e9dc575c2", size=84_709,
                          note=_PINNED),
    "train": Remote(f"{_CAPO_RAW}/AutoScholarQuery/train.jsonl", "AutoScholarQuery-train.jsonl",
                    note="33,551 queries; no published checksum"),
}


# --- stage 1: queries ---------------------------------------------------------------------------------------
def fetch_queries(out: Path, cache: Path, *, base_url: str | None, local: Path | None, progress: bool,
                  splits: Iterable[str], force: bool = False) -> dict[str, dict]:
    """Write each split's file under ``out`` in PaSa's layout; returns a source record per split."""
    records = {}
    for split in splits:
        remote = QUERY_REMOTES[split]
        dest = out / QUERY_FILES[split]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if local is not None:
            source = local / QUERY_FILES[split]
            if not source.is_file():
                log.warning("queries: %s is missing from %s; skipped", QUERY_FILES[split], local)
                continue
            shutil.copyfile(source, dest)
            records[split] = {"file": QUERY_FILES[split], "from": str(source), "sha256": sha256_file(dest)}
            continue
        url = mirrored(remote.url, base_url)
        path = download(url, cache / remote.filename, sha256=remote.sha256, size=remote.size, progress=progress,
                        force=force)
        shutil.copyfile(path, dest)
        records[split] = {"file": QUERY_FILES[split], "url": url, "upstream_url": remote.url,
                          "sha256": sha256_file(dest), "pinned": remote.sha256 is not None}
    return records


def coverage(db: PaperDB, query_files: dict[str, Path]) -> dict[str, dict]:
    """Per query split: gold papers present in the database, and present with at least one reference or
    any citation link (what an expand can reach from them)."""
    out = {}
    for split, path in query_files.items():
        gold = {g for task in load_queries(path) for g in task.gold}
        present = [g for g in gold if db.get(g) is not None]
        with_refs = [g for g in present if db.count_links(g, "references")]
        linked = [g for g in present if db.count_links(g, "references") or db.count_links(g, "citations")]
        n = len(gold) or 1
        out[split] = {"gold_papers": len(gold), "present": len(present), "present_share": len(present) / n,
                      "with_references_share": len(with_refs) / n, "with_any_link_share": len(linked) / n}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``capo data prepare papers`` beyond the common ones; each is a keyword of :func:`prepare`."""
    p = parser
    p.add_argument("--queries-from", help="a local folder in PaSa's layout (AutoScholarQuery/dev.jsonl, ...) "
                                          "instead of the download")
    p.add_argument("--splits", nargs="+", default=list(QUERY_FILES), choices=list(QUERY_FILES),
                   help="which query files to fetch (default: all)")
    p.add_argument("--arxiv-url", action="append",
                   help="an arXiv metadata file (Parquet or JSON lines, .gz allowed; repeatable) instead of the "
                        f"pinned snapshot ({ARXIV_SHARDS} Parquet shards, about 2.2 GB)")
    p.add_argument("--categories", type=lambda s: tuple(c for c in s.split(",") if c), default=DEFAULT_CATEGORIES,
                   help="comma-separated arXiv categories or prefixes (default: cs.,stat.ML,eess.)")
    p.add_argument("--cutoff", default=DEFAULT_CUTOFF, help="drop papers first submitted after this date")
    p.add_argument("--citations", choices=CITATION_SOURCES, default="none",
                   help="where citation edges come from (openalex-snapshot: no key, about 330 GB streamed; "
                        "openalex-api: $OPENALEX_API_KEY; s2-datasets: $S2_API_KEY)")
    p.add_argument("--openalex-key", help="default: $OPENALEX_API_KEY")
    p.add_argument("--s2-key", help="default: $S2_API_KEY")
    p.add_argument("--openalex-manifest", default=OPENALEX_MANIFEST)
    p.add_argument("--openalex-s3", default=OPENALEX_S3_HTTP, help="the HTTP base that replaces s3://openalex/")
    p.add_argument("--openalex-api", default=OPENALEX_API)
    p.add_argument("--s2-api", default=S2_DATASETS_API)
    p.add_argument("--max-parts", type=int, help="stop after this many snapshot parts, API pages or S2 files "
                                                 "(a partial, quick build)")


def prepare(
    name: str = DATASET,
    *,
    data_dir: str | Path | None = None,
    force: bool = False,
    base_url: str | None = None,
    progress: bool = True,
    queries_from: str | Path | None = None,
    splits: Iterable[str] = tuple(QUERY_FILES),
    arxiv_url: Sequence[str] | None = None,
    categories: tuple[str, ...] = DEFAULT_CATEGORIES,
    cutoff: str = DEFAULT_CUTOFF,
    citations: str = "none",
    openalex_key: str | None = None,
    s2_key: str | None = None,
    openalex_manifest: str = OPENALEX_MANIFEST,
    openalex_s3: str = OPENALEX_S3_HTTP,
    openalex_api: str = OPENALEX_API,
    s2_api: str = S2_DATASETS_API,
    max_parts: int | None = None,
) -> Path:
    """Build ``<data_dir>/papers/`` (stages in the module docstring) and return it; a prepared folder is left
    alone unless ``force``. ``arxiv_url``: snapshot files to read instead of the pinned shards."""
    if name != DATASET:
        raise KeyError(f"unknown dataset {name!r}; known: {DATASET}")
    root = data_root(data_dir)
    final = root / DATASET
    if is_complete(final) and not force:
        log.info("papers is already prepared in %s (use --force to rebuild)", final)
        return final
    cache = root / ".downloads" / DATASET
    with building(root, DATASET) as build:
        cache.mkdir(parents=True, exist_ok=True)
        log.info("papers: queries")
        local = Path(queries_from).expanduser() if queries_from else None
        query_sources = fetch_queries(build / "queries", cache, base_url=base_url, local=local, progress=progress,
                                      splits=splits, force=force)
        query_files = {s: build / "queries" / QUERY_FILES[s] for s in query_sources}
        gold = {g for path in query_files.values() for task in load_queries(path) for g in task.gold}

        log.info("papers: arXiv metadata")
        arxiv_sources, papers = read_snapshot(arxiv_url or [mirrored(u, base_url) for u in ARXIV_URLS],
                                              cache / "arxiv", categories=categories, cutoff=cutoff, gold=gold,
                                              progress=progress, force=force)
        corpus = set(papers)
        log.info("papers: %d papers kept", len(corpus))

        log.info("papers: citations from %s", citations)
        citation_stats, edges = citation_edges(
            citations, cache, corpus, openalex_manifest=openalex_manifest, openalex_s3=openalex_s3,
            openalex_api_url=openalex_api, openalex_key=openalex_key, s2_api=s2_api, s2_key=s2_key,
            max_parts=max_parts, progress=progress)  # fmt: skip

        log.info("papers: building the database (%d papers, %d edges)", len(papers), len(edges))
        report = build_database(build / DB_FILE, papers.values(), edges, meta={"cutoff": cutoff, "citations": citations})
        with PaperDB(build / DB_FILE) as db:
            cover = coverage(db, query_files)
            with_refs = db._rows("SELECT count(DISTINCT citing) FROM edges")[0][0]
        manifest = {
            "name": DATASET,
            "format": 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cutoff": cutoff,
            "categories": list(categories),
            "queries": query_sources,
            "arxiv_metadata": {"revision": ARXIV_REVISION if not arxiv_url else None, "files": arxiv_sources,
                               "licence": "CC0-1.0"},
            "citations": citation_stats,
            "counts": {"papers": report.papers, "edges": report.edges, "gold_papers_forced": len(gold & corpus),
                       "papers_with_references": with_refs},
            "coverage": {"papers_with_references_share": with_refs / max(1, report.papers), "gold": cover},
            "files": {rel: {"sha256": sha256_file(build / rel), "bytes": (build / rel).stat().st_size}
                      for rel in [DB_FILE, *(f"queries/{QUERY_FILES[s]}" for s in query_files)]},
        }
        write_manifest(build, manifest)
    log.info("papers: prepared in %s (%d papers, %d edges)", final, report.papers, report.edges)
    return final


def data_info(name: str = DATASET, data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: the folder :func:`prepare` writes, with its paper and edge counts."""
    path = data_root(data_dir) / DATASET
    manifest = read_manifest(path)
    counts = (manifest or {}).get("counts", {})
    return [{"name": DATASET, "path": path, "prepared": manifest is not None, "prepare": "capo data prepare papers",
             "counts": {k: counts[k] for k in ("papers", "edges") if k in counts}}]
