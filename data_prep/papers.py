"""``capo data prepare papers``: PaSa's queries, an arXiv paper database and its citation edges.

Stages, each resumable (downloads go to ``$CAPO_DATA_DIR/.downloads/papers/`` and resume with Range
requests; per-part extracts of the citation sources are kept there until the build succeeds):

1. **Queries**: AutoScholarQuery train/dev/test and RealScholarQuery test, PaSa's files as the CAPO
   repository vendors them at a pinned commit (dev, test and RealScholarQuery sha256-pinned), or a local
   folder in the same layout (``--queries-from``).
2. **Papers**: the CC0 arXiv metadata snapshot (Kaggle's ``arxiv-metadata-oai-snapshot``, as the Hugging
   Face mirror ``librarian-bots/arxiv-metadata-snapshot`` serves it in Parquet at a pinned revision; the
   Parquet reader needs the ``papers`` extra, pyarrow; JSON-lines copies need nothing). Kept: papers in
   the chosen categories (default ``cs.*``, ``stat.ML``, ``eess.*``) first submitted on or before the
   cut-off (default 2024-09-30, which covers every RealScholarQuery gold paper), and every gold paper
   whatever its category or date.
3. **Citations** (``--citations``): ``none``; ``openalex-snapshot`` (CC0, no key: the ``works`` partitions
   listed by the snapshot's manifest, streamed one at a time, each deleted once its arXiv works are
   extracted); ``openalex-api`` (the user's key, ``$OPENALEX_API_KEY``: cursor-paged works of the arXiv
   source); ``s2-datasets`` (the user's key, ``$S2_API_KEY``: the Semantic Scholar ``papers`` and
   ``citations`` datasets, the source the CAPO authors' service was built from). Only edges whose two ends
   are in the database are kept.
4. **Database**: ``papers.sqlite`` (``capo_envs.papers.db``), then ``manifest.json`` last, with the sources,
   their hashes and the coverage figures (share of gold papers present, share with references).
"""

from __future__ import annotations

import argparse
import email.utils
import gzip
import json
import logging
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from capo_envs.core.paths import data_dir as default_data_dir
from capo_envs.core.paths import is_prepared
from capo_envs.papers.db import Paper, PaperDB, build_database
from capo_envs.papers.ids import normalize_arxiv_id
from capo_envs.papers.real import DATASET, DB_FILE, QUERY_FILES, load_queries
from capo_train.progress import progress_bar  # tqdm and the standard library only (no torch)

from .datasets import building
from .download import USER_AGENT, DownloadError, download, sha256_file
from .manifest import read_manifest, write_manifest
from .sources import Remote, mirrored

log = logging.getLogger(__name__)

CAPO_COMMIT = "35685311fbfc5d43905c38ff67a578b607c37af8"
_CAPO_RAW = f"https://raw.githubusercontent.com/AgentR1/CAPO/{CAPO_COMMIT}/recipe/paper_search/inference/datasets"
QUERY_REMOTES: dict[str, Remote] = {
    "dev": Remote(f"{_CAPO_RAW}/AutoScholarQuery/dev.jsonl", "AutoScholarQuery-dev.jsonl",
                  sha256="d211a33f8171bd847331a34b0b4ea98e3ce06f2b1d64ff3f35b633407cb1d082", size=450_875,
                  note="sha256 of the byte-identical copy in ../shared/data/pasa"),
    "test": Remote(f"{_CAPO_RAW}/AutoScholarQuery/test.jsonl", "AutoScholarQuery-test.jsonl",
                   sha256="7d8c7f59b289a54912c38cf204d16dbfec14ca35de850b9978b4051ad43a8b36", size=438_997,
                   note="sha256 of the byte-identical copy in ../shared/data/pasa"),
    "realscholar": Remote(f"{_CAPO_RAW}/RealScholarQuery/test.jsonl", "RealScholarQuery-test.jsonl",
                          sha256="b3b570411ce2399ce4ea145ba9b2d3d0048b248030edeeb44ba95a7e9dc575c2", size=84_709,
                          note="sha256 of the byte-identical copy in ../shared/data/pasa"),
    "train": Remote(f"{_CAPO_RAW}/AutoScholarQuery/train.jsonl", "AutoScholarQuery-train.jsonl",
                    note="33,551 queries; no published checksum"),
}
ARXIV_REVISION = "f71b1fc22a4e90af5f8c32957b326f24c21ded88"
ARXIV_SHARDS = 8
ARXIV_URLS = tuple(
    f"https://huggingface.co/datasets/librarian-bots/arxiv-metadata-snapshot/resolve/{ARXIV_REVISION}/data/"
    f"train-{i:05d}-of-{ARXIV_SHARDS:05d}.parquet" for i in range(ARXIV_SHARDS)
)
DEFAULT_CATEGORIES = ("cs.", "stat.ML", "eess.")
DEFAULT_CUTOFF = "2024-09-30"
OPENALEX_MANIFEST = "https://openalex.s3.amazonaws.com/data/works/manifest"
OPENALEX_S3_HTTP = "https://openalex.s3.amazonaws.com/"
OPENALEX_API = "https://api.openalex.org/works"
OPENALEX_ARXIV_SOURCE = "S4306400194"  # "arXiv (Cornell University)" in OpenAlex
S2_DATASETS_API = "https://api.semanticscholar.org/datasets/v1/release/latest/dataset"
CITATION_SOURCES = ("none", "openalex-snapshot", "openalex-api", "s2-datasets")
API_RETRIES, API_BACKOFF_S = 4, 1.0


# --- stage 1: queries ---------------------------------------------------------------------------------------
def fetch_queries(out: Path, cache: Path, *, base_url: str | None, local: Path | None, progress: bool,
                  splits: Iterable[str]) -> dict[str, dict]:
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
        path = download(url, cache / remote.filename, sha256=remote.sha256, size=remote.size, progress=progress)
        shutil.copyfile(path, dest)
        records[split] = {"file": QUERY_FILES[split], "url": url, "upstream_url": remote.url,
                          "sha256": sha256_file(dest), "pinned": remote.sha256 is not None}
    return records


# --- stage 2: arXiv metadata ----------------------------------------------------------------------------------
def _first_version_date(record: dict) -> str:
    """ISO date of the first version (``versions[0].created``, RFC 2822), else ``update_date``."""
    versions = record.get("versions")
    if isinstance(versions, list) and versions:
        first = versions[0]
        created = first.get("created") if isinstance(first, dict) else None
        if isinstance(created, str):
            try:
                return email.utils.parsedate_to_datetime(created).date().isoformat()
            except (TypeError, ValueError):
                pass
    update = record.get("update_date")
    return str(update)[:10] if update else ""


def _authors(record: dict) -> tuple[str, ...]:
    parsed = record.get("authors_parsed")
    if isinstance(parsed, list) and parsed:
        names = []
        for parts in parsed:
            if isinstance(parts, (list, tuple)) and parts:
                last, first = str(parts[0]).strip(), str(parts[1]).strip() if len(parts) > 1 else ""
                names.append(f"{first} {last}".strip())
        return tuple(n for n in names if n)
    raw = record.get("authors") or ""
    return tuple(a.strip() for a in str(raw).replace(" and ", ", ").split(",") if a.strip())


def arxiv_paper(record: dict) -> Paper | None:
    """One record of the arXiv metadata snapshot (Kaggle's schema) as a :class:`Paper`."""
    arxiv_id = normalize_arxiv_id(str(record.get("id") or ""))
    if arxiv_id is None:
        return None
    date = _first_version_date(record)
    return Paper(
        arxiv_id=arxiv_id,
        title=" ".join(str(record.get("title") or "").split()),
        abstract=" ".join(str(record.get("abstract") or "").split()),
        year=int(date[:4]) if date[:4].isdigit() else None,
        authors=_authors(record),
        date=date,
        categories=str(record.get("categories") or ""),
    )


def read_records(path: Path) -> Iterator[dict]:
    """Rows of a snapshot file: Parquet (needs pyarrow), or JSON lines (optionally gzipped)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ModuleNotFoundError:
            raise SystemExit('reading the arXiv snapshot in Parquet needs pyarrow: pip install "capo-gym[papers]"') from None
        for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
            yield from batch.to_pylist()
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def keep_paper(paper: Paper, categories: tuple[str, ...], cutoff: str, gold: set[str]) -> bool:
    if paper.arxiv_id in gold:
        return True
    if paper.date and paper.date > cutoff:
        return False
    return any(c.startswith(categories) for c in paper.categories.split())


# --- stage 3: citation sources -----------------------------------------------------------------------------
@dataclass
class Work:
    """A citing work, as every source reduces it: its own key, its arXiv id, and the keys it cites."""

    key: str
    arxiv_id: str | None
    cites: list[str]


def openalex_work(record: dict) -> Work:
    """An OpenAlex work: ``id`` W-number; arXiv id from arXiv's DOI (10.48550/arXiv.<id>) or an arXiv
    location; ``referenced_works`` as W-numbers."""
    key = str(record.get("id") or "").rsplit("/", 1)[-1]
    arxiv_id = None
    dois = [record.get("doi"), (record.get("ids") or {}).get("doi")]
    for doi in dois:
        if isinstance(doi, str) and "10.48550/arxiv." in doi.lower():
            arxiv_id = normalize_arxiv_id(doi[doi.lower().index("10.48550/arxiv.") + len("10.48550/arxiv.") :])
            if arxiv_id:
                break
    if arxiv_id is None:
        for location in record.get("locations") or []:
            if not isinstance(location, dict):
                continue
            for url_key in ("landing_page_url", "pdf_url"):
                arxiv_id = normalize_arxiv_id(location.get(url_key) or "")
                if arxiv_id:
                    break
            if arxiv_id:
                break
    cites = [str(w).rsplit("/", 1)[-1] for w in record.get("referenced_works") or [] if w]
    return Work(key, arxiv_id, cites)


def _write_extract(path: Path, works: Iterable[Work]) -> int:
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for work in works:
            if work.arxiv_id:
                f.write(json.dumps([work.key, work.arxiv_id, work.cites]) + "\n")
                n += 1
    os.replace(tmp, path)  # an extract exists only once complete: a rerun skips it
    return n


def _read_extracts(folder: Path) -> Iterator[Work]:
    for path in sorted(folder.glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, arxiv_id, cites = json.loads(line)
                yield Work(key, arxiv_id, cites)


def edges_from_extracts(folder: Path, corpus: set[str]) -> list[tuple[str, str]]:
    """Resolve cited keys to arXiv ids through the extracts themselves; keep in-corpus pairs only."""
    arxiv_of: dict[str, str] = {}
    for work in _read_extracts(folder):
        if work.arxiv_id in corpus:
            arxiv_of[work.key] = work.arxiv_id
    edges = set()
    for work in _read_extracts(folder):
        if work.arxiv_id not in corpus:
            continue
        for key in work.cites:
            cited = arxiv_of.get(key)
            if cited and cited != work.arxiv_id:
                edges.add((work.arxiv_id, cited))
    return sorted(edges)


def _get_json(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> Any:
    """GET a JSON document, retrying 429 and 5xx with backoff (API rate limits)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    for attempt in range(API_RETRIES + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            if (e.code == 429 or e.code >= 500) and attempt < API_RETRIES:
                time.sleep(API_BACKOFF_S * 2**attempt)
                continue
            raise DownloadError(f"{_redact(url)}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            if attempt < API_RETRIES:
                time.sleep(API_BACKOFF_S * 2**attempt)
                continue
            raise DownloadError(f"{_redact(url)}: {e}") from None
    raise AssertionError("unreachable")


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = [(k, "***" if k in ("api_key", "key") else v) for k, v in urllib.parse.parse_qsl(parts.query)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _stream_parts(urls: list[tuple[str, int | None]], cache: Path, extracts: Path, reader, progress: bool,
                  label: str) -> dict:
    """Download each part, extract its arXiv works to ``extracts``, delete the part: disk stays small."""
    extracts.mkdir(parents=True, exist_ok=True)
    done = skipped = 0
    for i, (url, size) in enumerate(progress_bar(urls, f"{label} parts", unit="part", disable=not progress)):
        target = extracts / f"{i:06d}.jsonl"
        if target.exists():
            skipped += 1
            continue
        part = download(url, cache / f"{label}-part-{i:06d}.gz", size=size, progress=progress)
        with gzip.open(part, "rt", encoding="utf-8") as f:
            _write_extract(target, (reader(json.loads(line)) for line in f if line.strip()))
        part.unlink()
        part.with_name(part.name + ".complete").unlink(missing_ok=True)
        done += 1
        log.info("%s: part %d/%d extracted", label, i + 1, len(urls))
    return {"parts": len(urls), "parts_fetched": done, "parts_resumed": skipped}


def openalex_snapshot(cache: Path, *, manifest_url: str, s3_http: str, max_parts: int | None, progress: bool) -> dict:
    """The OpenAlex snapshot's ``works`` partitions (JSON lines, gzipped), listed by its manifest."""
    manifest = _get_json(manifest_url)
    entries = manifest.get("entries") or []
    urls = []
    for entry in entries[:max_parts] if max_parts else entries:
        url = str(entry["url"])
        if url.startswith("s3://openalex/"):
            url = s3_http.rstrip("/") + "/" + url[len("s3://openalex/") :]
        urls.append((url, (entry.get("meta") or {}).get("content_length")))
    stats = _stream_parts(urls, cache, cache / "openalex-snapshot", openalex_work, progress, "openalex")
    return {"source": "openalex-snapshot", "manifest": manifest_url, **stats}


def openalex_api(cache: Path, *, api_url: str, key: str, max_pages: int | None, progress: bool) -> dict:
    """Cursor-paged ``/works`` of the arXiv source, 200 a page; each page's extract is kept, and the cursor
    saved, so an interrupted run resumes where it stopped."""
    folder = cache / "openalex-api"
    folder.mkdir(parents=True, exist_ok=True)
    state_path = folder / "cursor.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"cursor": "*", "page": 0}
    while state["cursor"] and (max_pages is None or state["page"] < max_pages):
        params = {"filter": f"locations.source.id:{OPENALEX_ARXIV_SOURCE}", "per-page": "200",
                  "cursor": state["cursor"], "select": "id,doi,ids,locations,referenced_works", "api_key": key}
        page = _get_json(api_url + "?" + urllib.parse.urlencode(params))
        results = page.get("results") or []
        _write_extract(folder / f"{state['page']:06d}.jsonl", (openalex_work(r) for r in results))
        next_cursor = (page.get("meta") or {}).get("next_cursor")
        state = {"cursor": next_cursor if results else None, "page": state["page"] + 1}
        state_path.write_text(json.dumps(state))
        if progress and state["page"] % 50 == 0:
            log.info("openalex-api: %d pages", state["page"])
    return {"source": "openalex-api", "api": api_url, "pages": state["page"], "complete": state["cursor"] is None}


def s2_datasets(cache: Path, corpus: set[str], *, api_url: str, key: str, max_files: int | None,
                progress: bool) -> list[tuple[str, str]] | dict:
    """The Semantic Scholar ``papers`` dataset maps corpus ids to arXiv ids; its ``citations`` dataset
    (``citingcorpusid``, ``citedcorpusid``) gives the edges. Both are lists of gzipped JSON-lines files."""
    headers = {"x-api-key": key}
    folder = cache / "s2"
    stats: dict[str, Any] = {"source": "s2-datasets", "api": api_url}

    def files(name: str) -> list[tuple[str, None]]:
        listing = _get_json(f"{api_url.rstrip('/')}/{name}", headers=headers)
        return [(str(u), None) for u in (listing.get("files") or [])][:max_files]

    def paper_reader(record: dict) -> Work:
        arxiv_id = normalize_arxiv_id(str(((record.get("externalids") or {}).get("ArXiv")) or ""))
        return Work(str(record.get("corpusid")), arxiv_id if arxiv_id in corpus else None, [])

    def citation_reader(record: dict) -> Work:
        return Work(str(record.get("citingcorpusid")), "edge", [str(record.get("citedcorpusid"))])

    stats["papers"] = _stream_parts(files("papers"), cache, folder / "papers", paper_reader, progress, "s2-papers")
    arxiv_of = {w.key: w.arxiv_id for w in _read_extracts(folder / "papers")}
    # Keep only citations between two mapped papers while streaming: the full file is billions of rows.
    citations_folder = folder / "citations"

    def citation_filter(record: dict) -> Work:
        work = citation_reader(record)
        citing, cited = arxiv_of.get(work.key), arxiv_of.get(work.cites[0])
        return Work(work.key, citing if citing and cited else None, [cited] if cited else [])

    stats["citations"] = _stream_parts(files("citations"), cache, citations_folder, citation_filter, progress,
                                       "s2-citations")
    edges = {(w.arxiv_id, c) for w in _read_extracts(citations_folder) for c in w.cites if c != w.arxiv_id}
    stats["edges"] = sorted(edges)
    return stats


# --- stage 4: coverage and the manifest ----------------------------------------------------------------------
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


def prepare(args: argparse.Namespace) -> Path:
    root = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    final = root / DATASET
    if is_prepared(DATASET, root) and not args.force:
        log.info("papers is already prepared in %s (use --force to rebuild)", final)
        return final
    cache = root / ".downloads" / DATASET
    progress = not args.quiet
    with building(root, DATASET) as build:
        cache.mkdir(parents=True, exist_ok=True)
        log.info("papers: queries")
        local = Path(args.queries_from).expanduser() if args.queries_from else None
        query_sources = fetch_queries(build / "queries", cache, base_url=args.mirror, local=local, progress=progress,
                                      splits=args.splits)
        query_files = {s: build / "queries" / QUERY_FILES[s] for s in query_sources}
        gold = {g for path in query_files.values() for task in load_queries(path) for g in task.gold}

        log.info("papers: arXiv metadata")
        arxiv_sources, papers = [], {}
        for url in args.arxiv_url or [mirrored(u, args.mirror) for u in ARXIV_URLS]:
            name = Path(urllib.parse.urlsplit(url).path).name
            path = download(url, cache / "arxiv" / name, progress=progress)
            arxiv_sources.append({"url": url, "file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)})
            for record in progress_bar(read_records(path), f"arXiv metadata {name}", unit="rec", disable=not progress):
                paper = arxiv_paper(record)
                if paper and paper.arxiv_id not in papers and keep_paper(paper, args.categories, args.cutoff, gold):
                    papers[paper.arxiv_id] = paper
        corpus = set(papers)
        log.info("papers: %d papers kept", len(corpus))

        log.info("papers: citations from %s", args.citations)
        edges: list[tuple[str, str]] = []
        if args.citations == "openalex-snapshot":
            citation_stats = openalex_snapshot(cache, manifest_url=args.openalex_manifest, s3_http=args.openalex_s3,
                                               max_parts=args.max_parts, progress=progress)
            edges = edges_from_extracts(cache / "openalex-snapshot", corpus)
        elif args.citations == "openalex-api":
            key = args.openalex_key or os.environ.get("OPENALEX_API_KEY")
            if not key:
                raise ValueError("--citations openalex-api needs a key: --openalex-key or $OPENALEX_API_KEY")
            citation_stats = openalex_api(cache, api_url=args.openalex_api, key=key, max_pages=args.max_parts,
                                          progress=progress)
            edges = edges_from_extracts(cache / "openalex-api", corpus)
        elif args.citations == "s2-datasets":
            key = args.s2_key or os.environ.get("S2_API_KEY")
            if not key:
                raise ValueError("--citations s2-datasets needs a key: --s2-key or $S2_API_KEY")
            citation_stats = s2_datasets(cache, corpus, api_url=args.s2_api, key=key, max_files=args.max_parts,
                                         progress=progress)
            edges = citation_stats.pop("edges")
        else:
            citation_stats = {"source": "none"}

        log.info("papers: building the database (%d papers, %d edges)", len(papers), len(edges))
        report = build_database(build / DB_FILE, papers.values(), edges,
                                meta={"cutoff": args.cutoff, "citations": args.citations})
        with PaperDB(build / DB_FILE) as db:
            cover = coverage(db, query_files)
            with_refs = db._rows("SELECT count(DISTINCT citing) FROM edges")[0][0]
        manifest = {
            "name": DATASET,
            "format": 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cutoff": args.cutoff,
            "categories": list(args.categories),
            "queries": query_sources,
            "arxiv_metadata": {"revision": ARXIV_REVISION if not args.arxiv_url else None, "files": arxiv_sources,
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


def data_info(data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: the folder :func:`prepare` writes, with its paper and edge counts."""
    path = (Path(data_dir).expanduser() if data_dir else default_data_dir()) / DATASET
    manifest = read_manifest(path)
    counts = (manifest or {}).get("counts", {})
    return [{"name": DATASET, "path": path, "prepared": manifest is not None, "prepare": "capo data prepare papers",
             "counts": {k: counts[k] for k in ("papers", "edges") if k in counts}}]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capo data prepare papers", description="Download PaSa's queries and the "
                                "arXiv metadata snapshot, add citation edges, and build the paper database.")
    p.add_argument("--data-dir", help="default: $CAPO_DATA_DIR or ~/.cache/capo")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    p.add_argument("--mirror", help="replace the download hosts with this base URL (or set $CAPO_DATA_MIRROR)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
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
    return p


def prepare_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        prepare(args)
    except (DownloadError, ValueError) as e:
        print(f"capo data prepare papers: {e}", file=sys.stderr)
        return 1
    return 0
