"""``capo data prepare papers``, stage 2: the papers, from the CC0 arXiv metadata snapshot.

The snapshot is Kaggle's ``arxiv-metadata-oai-snapshot``, as the Hugging Face mirror
``librarian-bots/arxiv-metadata-snapshot`` serves it in Parquet at a pinned revision (the Parquet reader
needs the ``papers`` extra, pyarrow; JSON-lines copies, gzipped or not, need nothing). Kept: papers in the
chosen categories first submitted on or before the cut-off, and every gold paper of the queries whatever
its category or date.

Every record is checked by type first (:func:`record_problem`): a line that is not a JSON object, is not
valid JSON, or has a field of the wrong type is skipped and counted, with the first line numbers and the
reasons in the manifest and a summary on stderr. A file whose every record is bad (an HTML error page, the
wrong file) is an error naming its first bad line, as is a truncated or corrupt file.
"""

from __future__ import annotations

import datetime
import email.utils
import gzip
import json
import logging
import urllib.parse
import zlib
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from capo_envs.papers.db import Paper
from capo_envs.papers.ids import normalize_arxiv_id

from .building import PrepareError
from .download import download, forget, sha256_file
from .progress import progress_bar

log = logging.getLogger(__name__)
FIRST_BAD_LINES = 10  # how many bad line numbers the manifest keeps per file

ARXIV_REVISION = "f71b1fc22a4e90af5f8c32957b326f24c21ded88"
ARXIV_SHARDS = 8
ARXIV_URLS = tuple(
    f"https://huggingface.co/datasets/librarian-bots/arxiv-metadata-snapshot/resolve/{ARXIV_REVISION}/data/"
    f"train-{i:05d}-of-{ARXIV_SHARDS:05d}.parquet" for i in range(ARXIV_SHARDS)
)
DEFAULT_CATEGORIES = ("cs.", "stat.ML", "eess.")
DEFAULT_CUTOFF = "2024-09-30"  # covers the first submission of every RealScholarQuery gold paper


def read_snapshot(urls: Iterable[str], cache: Path, *, categories: tuple[str, ...], cutoff: str, gold: set[str],
                  progress: bool, force: bool = False) -> tuple[list[dict], dict[str, Paper]]:
    """Download each snapshot file (resumed) and keep its papers (:func:`keep_paper`), the first record of
    an id winning; returns the manifest's source records and the papers by arXiv id. Bad records are
    skipped and counted (:func:`record_problem`). ``force`` downloads even complete earlier files again."""
    sources, papers = [], {}
    for url in urls:
        name = Path(urllib.parse.urlsplit(url).path).name
        path = download(url, cache / name, progress=progress, force=force)
        good, bad, first_bad = 0, Counter(), []
        try:
            for line, record in progress_bar(read_records(path), f"arXiv metadata {name}", unit="rec",
                                             disable=not progress):
                problem = record_problem(record)
                paper = arxiv_paper(record) if problem is None else None
                if problem is None and paper is None:
                    problem = "id is not an arXiv id"
                if problem is not None:
                    bad[problem] += 1
                    if len(first_bad) < FIRST_BAD_LINES:
                        first_bad.append(line)
                    continue
                good += 1
                if paper.arxiv_id not in papers and keep_paper(paper, categories, cutoff, gold):
                    papers[paper.arxiv_id] = paper
        except PrepareError:
            forget(path)  # a truncated or corrupt file: the rerun fetches it again
            raise
        n_bad = sum(bad.values())
        reasons = "; ".join(f"{reason} ({n})" for reason, n in bad.most_common(4))
        if n_bad and not good:
            forget(path)
            raise PrepareError(f"{name}: no valid arXiv record; {n_bad:,} bad line(s), the first at line {first_bad[0]} "
                               f"({reasons}): not the arXiv metadata snapshot")
        if n_bad:
            log.warning("%s: skipped %d bad line(s) of %d (first: %s): %s", name, n_bad, n_bad + good,
                        ", ".join(f"line {n}" for n in first_bad[:5]), reasons)
        sources.append({"url": url, "file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path),
                        "records": good, "bad_lines": n_bad, "first_bad_lines": first_bad,
                        "bad_line_reasons": dict(bad.most_common())})
    return sources, papers


class _BadJSON:
    """Stands for a line that is not valid JSON, so it is counted like any other bad record."""


_TEXT_FIELDS = ("id", "title", "abstract", "authors", "categories", "submitter", "comments", "journal-ref", "doi",
                "report-no", "license")


def record_problem(record) -> str | None:
    """Why one record of the snapshot (Kaggle's schema) cannot be read, or None when it can: a JSON object
    with a string ``id``, the text fields strings or null, ``versions`` a list of objects with a string
    ``created``, ``authors_parsed`` a list of lists of strings, ``update_date`` a string or date."""
    if isinstance(record, _BadJSON):
        return "not valid JSON"
    if not isinstance(record, dict):
        return f"not a JSON object ({'null' if record is None else type(record).__name__})"
    if not isinstance(record.get("id"), str) or not record["id"].strip():
        return "id is missing or not a string"
    for key in _TEXT_FIELDS[1:]:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is not a string"
    versions = record.get("versions")
    if versions is not None:
        if not isinstance(versions, list):
            return "versions is not a list"
        for i, version in enumerate(versions):
            if not isinstance(version, dict):
                return f"versions[{i}] is not an object"
            if version.get("created") is not None and not isinstance(version["created"], str):
                return f"versions[{i}].created is not a string"
    parsed = record.get("authors_parsed")
    if parsed is not None and not (isinstance(parsed, list) and all(
            isinstance(parts, (list, tuple)) and all(isinstance(p, (str, type(None))) for p in parts)
            for parts in parsed)):
        return "authors_parsed is not a list of lists of strings"
    update = record.get("update_date")
    if update is not None and not isinstance(update, (str, datetime.date)):
        return "update_date is not a string or date"
    return None


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


def read_records(path: Path) -> Iterator[tuple[int, object]]:
    """(line or row number from 1, record) of a snapshot file: Parquet (needs pyarrow), or JSON lines
    (optionally gzipped; blank lines skipped, a line that is not JSON yields a :class:`_BadJSON`). A
    truncated or corrupt file raises :class:`PrepareError`."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ModuleNotFoundError:
            raise PrepareError('reading the arXiv snapshot in Parquet needs pyarrow: pip install "capo-gym[papers]"') from None
        try:
            row = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
                for record in batch.to_pylist():
                    row += 1
                    yield row, record
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise PrepareError(f"{path.name}: not a readable Parquet file ({error})") from None
        return
    opener = gzip.open if path.suffix == ".gz" else open
    line_no = 0
    try:
        with opener(path, "rt", encoding="utf-8", errors="strict") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield line_no, json.loads(line)
                except ValueError:
                    yield line_no, _BadJSON()
    except UnicodeDecodeError as error:
        raise PrepareError(f"{path.name}: not UTF-8 text after line {line_no} ({error.reason})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise PrepareError(f"{path.name}: truncated or corrupt after line {line_no} ({error or type(error).__name__});"
                           f" it will be downloaded again on the next run") from None


def keep_paper(paper: Paper, categories: tuple[str, ...], cutoff: str, gold: set[str]) -> bool:
    if paper.arxiv_id in gold:
        return True
    if paper.date and paper.date > cutoff:
        return False
    return any(c.startswith(categories) for c in paper.categories.split())
