"""Query parameters of the Semantic Scholar Graph API, for ``capo serve papers`` (server.py): bounded whole
numbers, the ``year`` / ``publicationDateOrYear`` spans, the search filters (as a Python test and as SQL),
bulk search's continuation tokens, and the text forms a paper is shown in (BibTeX, "Author et al., year")."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from ..core.http import RequestError, brief
from .authors import clean_name
from .db import Paper, PaperDB
from .s2fields import fields_of_study, fields_of_study_sql, parse_fields_of_study

ARXIV_VENUES = ("arxiv.org", "arxiv", "arxiv (cornell university)")
_YEAR = re.compile(r"^(\d{4})?(-)?(\d{4})?$")
_DATE_OR_YEAR = re.compile(r"^(\d{4}(?:-\d{2}(?:-\d{2})?)?)?(:)?(\d{4}(?:-\d{2}(?:-\d{2})?)?)?$")
WORD = re.compile(r"\w+")


def int_param(params: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{name} must be a whole number, got {brief(raw)}")
    value = int(raw)
    if not low <= value <= high:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{name} must be between {low} and {high}, got {value}")
    return value


def _pad(date: str, filler: str) -> str:
    """``2019`` / ``2019-03`` -> a bound comparable with ISO dates: ``filler`` "-00-00" (low) or "-99-99"."""
    return date + filler[len(date) - 4 :]


def date_bounds(params: dict[str, str]) -> tuple[str | None, str | None]:
    """``year`` (2019, 2016-2020, 2010-, -2015) and ``publicationDateOrYear`` (2019-03-05, :2015-01,
    2016-03-05:2020-06-06) as inclusive bounds comparable with ISO dates; the tighter of the two wins."""
    lows: list[str] = []
    highs: list[str] = []
    year = params.get("year")
    if year is not None and year.strip():
        match = _YEAR.match(year.strip())
        if not match or not (match.group(1) or match.group(3)) or (match.group(3) and not match.group(2)):
            raise RequestError(HTTPStatus.BAD_REQUEST,
                               f"year must look like 2019, 2016-2020, 2010- or -2015, got {brief(year)}")
        first, dash, last = match.groups()
        if first:
            lows.append(_pad(first, "-00-00"))
        end = last if dash else first
        if end:
            highs.append(_pad(end, "-99-99"))
    span = params.get("publicationDateOrYear")
    if span is not None and span.strip():
        match = _DATE_OR_YEAR.match(span.strip())
        if not match or not (match.group(1) or match.group(3)) or (match.group(3) and not match.group(2)):
            raise RequestError(HTTPStatus.BAD_REQUEST, "publicationDateOrYear must look like 2019-03-05, "
                                                       f"2016-03-05:2020-06-06 or :2015-01, got {brief(span)}")
        first, colon, last = match.groups()
        if first:
            lows.append(_pad(first, "-00-00"))
        end = last if colon else first
        if end:
            highs.append(_pad(end, "-99-99"))
    return (max(lows) if lows else None), (min(highs) if highs else None)


@dataclass
class Filters:
    """The search filters S2 documents, as a Python test (relevance search, match) and as SQL (bulk)."""

    low: str | None = None
    high: str | None = None
    min_citations: int | None = None
    fields_of_study: list[str] | None = None
    venue_ok: bool = True  # every paper here is on arXiv: a venue filter keeps all of them or none
    types_ok: bool = True  # no paper here has publicationTypes: a publicationTypes filter keeps none

    @classmethod
    def from_params(cls, params: dict[str, str]) -> Filters:
        low, high = date_bounds(params)
        out = cls(low, high)
        if params.get("minCitationCount", "").strip():
            out.min_citations = int_param({"minCitationCount": params["minCitationCount"].strip()},
                                           "minCitationCount", 0, 0, 10**9)
        if params.get("fieldsOfStudy", "").strip():
            out.fields_of_study = parse_fields_of_study(params["fieldsOfStudy"])
        venues = [v.strip().lower() for v in params.get("venue", "").split(",") if v.strip()]
        out.venue_ok = not venues or any(v in ARXIV_VENUES for v in venues)
        out.types_ok = not [t for t in params.get("publicationTypes", "").split(",") if t.strip()]
        # openAccessPdf (present, with or without a value): every arXiv paper has a public PDF; nothing to drop
        return out

    @property
    def drops_all(self) -> bool:
        return not self.venue_ok or not self.types_ok

    @property
    def needs_post_filter(self) -> bool:
        """Whether a relevance search must filter its ranked window (an upper date bound alone is pushed down)."""
        return bool(self.low or self.min_citations or self.fields_of_study)

    def accepts(self, paper: Paper, db: PaperDB) -> bool:
        if self.low and paper.date < self.low:
            return False
        if self.high and paper.date > self.high:
            return False
        if self.fields_of_study and not set(fields_of_study(paper.categories) or ()) & set(self.fields_of_study):
            return False
        if self.min_citations and db.count_links(paper.arxiv_id, "citations") < self.min_citations:
            return False
        return True

    def sql(self) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if self.drops_all:
            where.append("0")
        if self.low:
            where.append("p.date >= ?")
            params.append(self.low)
        if self.high:
            where.append("p.date <= ?")
            params.append(self.high)
        if self.fields_of_study:
            clause, more = fields_of_study_sql(self.fields_of_study)
            where.append(clause)
            params += more
        if self.min_citations:
            where.append("(SELECT count(*) FROM edges e WHERE e.cited = p.rowid) >= ?")
            params.append(self.min_citations)
        return where, params


def bulk_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"capo-bulk:{offset}".encode()).decode().rstrip("=")


def bulk_offset(token: str) -> int:
    try:
        text = base64.urlsafe_b64decode(token.strip() + "=" * (-len(token.strip()) % 4)).decode()
        tag, _, number = text.partition(":")
        if tag == "capo-bulk" and number.isascii() and number.isdigit() and len(number) <= 9:
            return int(number)
    except (ValueError, UnicodeDecodeError):
        pass
    raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid continuation token {brief(token)}")


def bibtex(paper: Paper) -> str:
    first = (paper.authors[0].split() or ["Anon"])[-1] if paper.authors else "Anon"
    title_word = next((w for w in WORD.findall(paper.title) if len(w) > 3), "paper")
    key = re.sub(r"\W", "", f"{first}{paper.year or ''}{title_word.title()}") or "paper"
    lines = [f"@Article{{{key},"]
    if paper.authors:
        lines.append(f" author = {{{' and '.join(paper.authors)}}},")
    lines += [" journal = {ArXiv},", f" title = {{{paper.title}}},", f" volume = {{abs/{paper.arxiv_id}}},"]
    if paper.year:
        lines.append(f" year = {{{paper.year}}}")
    return "\n".join(lines) + "\n}\n"


def authors_year(paper: Paper) -> str:
    names = [n for n in (clean_name(a) for a in paper.authors) if n]
    who = (names[0].split()[-1] + (" et al." if len(names) > 1 else "")) if names else ""
    return ", ".join(part for part in (who, str(paper.year or "")) if part)


def title_key(text: str) -> str:
    return " ".join(WORD.findall(text.lower()))
