"""Semantic Scholar Graph API objects from the local database, for ``capo serve papers``: a paper or an
author with the ``fields`` asked for (nested ones included), what the database has no data for left empty
as S2 leaves it (null, [] or {})."""

from __future__ import annotations

from typing import Any, Callable

from .authors import AuthorIndex, author_id, clean_name
from .db import _COLUMNS, Paper, PaperDB, _row_to_paper
from .s2fields import DEFAULT_AUTHOR, DEFAULT_PAPER, Fields, fields_of_study
from .s2params import bibtex

MAX_NESTED = 9999  # S2: nested citations/references hold at most the most recent 10,000


def by_rowid(db: PaperDB, rowids: list[int]) -> list[Paper]:
    """Papers by row id, in the order given (unknown ones left out)."""
    out: dict[int, Paper] = {}
    for start in range(0, len(rowids), 500):
        chunk = rowids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for row in db._rows(f"SELECT p.rowid, {_COLUMNS} FROM papers p WHERE p.rowid IN ({marks})", chunk):
            out[row[0]] = _row_to_paper(row[1:])
    return [out[r] for r in rowids if r in out]

def author_object(db: PaperDB, authors: AuthorIndex, author: int | str, fields: Fields) -> dict:
    """An author (an index in the author index, or a name from a paper's author list) with ``fields``."""
    name = authors.name(author) if isinstance(author, int) else author
    out: dict[str, Any] = {"authorId": author_id(name)}  # S2 always returns authorId

    def index() -> int | None:
        return author if isinstance(author, int) else authors.by_name(name)

    for field in fields.names:
        if field == "authorId":
            continue
        if field == "name":
            out["name"] = name
        elif field in ("externalIds",):
            out[field] = {}
        elif field in ("affiliations", "normalizedAffiliations"):
            out[field] = []
        elif field in ("url", "homepage"):
            out[field] = None  # no S2 author page or homepage for a local author
        elif field in ("paperCount", "citationCount", "hIndex", "papers"):
            k = index()
            if k is None:
                out[field] = [] if field == "papers" else 0
            elif field == "paperCount":
                out[field] = authors.paper_count(k)
            elif field == "papers":
                sub = fields.sub("papers", DEFAULT_PAPER)
                rowids = [int(r) for r in authors.paper_rowids(k)[:MAX_NESTED]]
                out[field] = [paper_object(db, authors, p, sub) for p in by_rowid(db, rowids)]
            else:
                citations, h_index = authors.stats(k)
                out[field] = citations if field == "citationCount" else h_index
    return out


def paper_object(db: PaperDB, authors: AuthorIndex, paper: Paper, fields: Fields) -> dict:
    arxiv_id = paper.arxiv_id
    corpus: list[int | None] = []

    def corpus_id() -> int | None:
        if not corpus:
            corpus.append(db._rowid(arxiv_id))
        return corpus[0]

    fos = fields_of_study(paper.categories) if ("fieldsOfStudy" in fields or "s2FieldsOfStudy" in fields) else None
    values: dict[str, Callable[[], Any]] = {
        "corpusId": corpus_id,
        "externalIds": lambda: {"ArXiv": arxiv_id, "DOI": f"10.48550/arXiv.{arxiv_id}", "CorpusId": corpus_id()},
        "url": lambda: f"https://arxiv.org/abs/{arxiv_id}",
        "title": lambda: paper.title,
        "abstract": lambda: paper.abstract or None,
        "venue": lambda: "arXiv.org",
        "publicationVenue": lambda: {"id": None, "name": "arXiv.org", "type": "repository",
                                     "alternate_names": ["ArXiv"], "url": "https://arxiv.org"},
        "year": lambda: paper.year,
        "referenceCount": lambda: db.count_links(arxiv_id, "references"),
        "citationCount": lambda: db.count_links(arxiv_id, "citations"),
        "influentialCitationCount": lambda: 0,
        "isOpenAccess": lambda: True,
        "openAccessPdf": lambda: {"url": f"https://arxiv.org/pdf/{arxiv_id}", "status": "GREEN",
                                  "license": None, "disclaimer": None},
        "fieldsOfStudy": lambda: fos,
        "s2FieldsOfStudy": lambda: [{"category": f, "source": "external"} for f in fos or ()],
        "publicationTypes": lambda: None,
        "publicationDate": lambda: paper.date or None,
        "journal": lambda: {"name": "ArXiv", "volume": f"abs/{arxiv_id}"},
        "citationStyles": lambda: {"bibtex": bibtex(paper)},
        "embedding": lambda: None,  # no SPECTER vectors here
        "tldr": lambda: None,
        "textAvailability": lambda: "abstract" if paper.abstract else "none",
    }
    out: dict[str, Any] = {"paperId": arxiv_id}  # S2 always returns paperId
    for name in fields.names:
        if name == "paperId":
            continue
        if name == "authors":
            sub = fields.sub("authors", DEFAULT_AUTHOR)
            if "name" not in sub:
                sub.names.insert(0, "name")  # S2: a paper's authors always have authorId and name
            out[name] = [author_object(db, authors, n, sub) for n in (clean_name(a) for a in paper.authors) if n]
        elif name in ("citations", "references"):
            sub = fields.sub(name, DEFAULT_PAPER)
            linked = (db.citations if name == "citations" else db.references)(arxiv_id, MAX_NESTED)
            out[name] = [paper_object(db, authors, p, sub) for p in linked]
        else:
            out[name] = values[name]()
    return out
