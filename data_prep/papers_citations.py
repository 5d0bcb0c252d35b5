"""``capo data prepare papers``, stage 3: citation edges between the papers of the database.

``--citations``: ``none``; ``openalex-snapshot`` (CC0, no key: the ``works`` partitions listed by the
snapshot's manifest, streamed one at a time, each deleted once its arXiv works are extracted);
``openalex-api`` (the user's key, ``$OPENALEX_API_KEY``: cursor-paged works of the arXiv source);
``s2-datasets`` (the user's key, ``$S2_API_KEY``: the Semantic Scholar ``papers`` and ``citations``
datasets, the source the CAPO authors' paper-search service was built from). Every source is reduced to
:class:`Work` records kept as per-part extracts in the download cache, so an interrupted run resumes; only
edges whose two ends are in the database are kept.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from capo_envs.papers.ids import normalize_arxiv_id

from .download import USER_AGENT, DownloadError, download
from .progress import progress_bar

log = logging.getLogger(__name__)

OPENALEX_MANIFEST = "https://openalex.s3.amazonaws.com/data/works/manifest"
OPENALEX_S3_HTTP = "https://openalex.s3.amazonaws.com/"
OPENALEX_API = "https://api.openalex.org/works"
OPENALEX_ARXIV_SOURCE = "S4306400194"  # "arXiv (Cornell University)" in OpenAlex
S2_DATASETS_API = "https://api.semanticscholar.org/datasets/v1/release/latest/dataset"
CITATION_SOURCES = ("none", "openalex-snapshot", "openalex-api", "s2-datasets")
API_RETRIES, API_BACKOFF_S = 4, 1.0


def citation_edges(source: str, cache: Path, corpus: set[str], *, openalex_manifest: str = OPENALEX_MANIFEST,
                   openalex_s3: str = OPENALEX_S3_HTTP, openalex_api_url: str = OPENALEX_API,
                   openalex_key: str | None = None, s2_api: str = S2_DATASETS_API, s2_key: str | None = None,
                   max_parts: int | None = None, progress: bool = True) -> tuple[dict, list[tuple[str, str]]]:
    """The (citing, cited) arXiv id pairs of ``corpus`` from ``source`` (one of ``CITATION_SOURCES``), with
    the manifest's record of the source. A key not given is read from ``$OPENALEX_API_KEY`` / ``$S2_API_KEY``."""
    if source == "openalex-snapshot":
        stats = openalex_snapshot(cache, manifest_url=openalex_manifest, s3_http=openalex_s3, max_parts=max_parts,
                                  progress=progress)
        return stats, edges_from_extracts(cache / "openalex-snapshot", corpus)
    if source == "openalex-api":
        key = openalex_key or os.environ.get("OPENALEX_API_KEY")
        if not key:
            raise ValueError("--citations openalex-api needs a key: --openalex-key or $OPENALEX_API_KEY")
        stats = openalex_api(cache, api_url=openalex_api_url, key=key, max_pages=max_parts, progress=progress)
        return stats, edges_from_extracts(cache / "openalex-api", corpus)
    if source == "s2-datasets":
        key = s2_key or os.environ.get("S2_API_KEY")
        if not key:
            raise ValueError("--citations s2-datasets needs a key: --s2-key or $S2_API_KEY")
        stats = s2_datasets(cache, corpus, api_url=s2_api, key=key, max_files=max_parts, progress=progress)
        return stats, stats.pop("edges")
    if source == "none":
        return {"source": "none"}, []
    raise ValueError(f"unknown citation source {source!r}; choose one of {CITATION_SOURCES}")


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
                progress: bool) -> dict:
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
