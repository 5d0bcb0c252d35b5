"""The Semantic Scholar Graph API's request grammar, for ``capo serve papers``: the ``fields`` parameter
(nested fields included), fields of study from arXiv categories, and ``/paper/search/bulk``'s boolean
query syntax compiled to FTS5.

Field names are the Graph API's (its OpenAPI schemas ``FullPaper``, ``BasePaper``, ``AuthorInPaper``,
``AuthorWithPapers``, ``Citation``): every documented name is accepted; what the local database has no
data for is answered the way S2 answers a paper without that data (null, [] or {}), never with a 400.
An unknown name is a 400 with S2's message, ``Unrecognized or unsupported fields: [a, b]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from http import HTTPStatus

from ..core.http import RequestError, brief

# BasePaper: what a nested paper (citations.*, references.*, papers.*) may hold.
BASE_PAPER_FIELDS = (
    "paperId", "corpusId", "externalIds", "url", "title", "abstract", "venue", "publicationVenue", "year",
    "referenceCount", "citationCount", "influentialCitationCount", "isOpenAccess", "openAccessPdf",
    "fieldsOfStudy", "s2FieldsOfStudy", "publicationTypes", "publicationDate", "journal", "citationStyles",
    "authors",
)  # fmt: skip
# FullPaper: a paper at the top of an answer.
PAPER_FIELDS = BASE_PAPER_FIELDS + ("citations", "references", "embedding", "tldr", "textAvailability")
# ``*``/``all`` (this server's shorthand, not S2's): every field but the nested lists and the embedding.
STAR_PAPER_FIELDS = tuple(f for f in PAPER_FIELDS if f not in ("citations", "references", "embedding"))
EMBEDDING_MODELS = ("specter_v1", "specter_v2")
AUTHOR_FIELDS = ("authorId", "externalIds", "url", "name", "affiliations", "homepage", "paperCount",
                 "citationCount", "hIndex", "normalizedAffiliations")
AUTHOR_WITH_PAPERS_FIELDS = AUTHOR_FIELDS + ("papers",)
LINK_FIELDS = ("contexts", "intents", "contextsWithIntent", "isInfluential")

DEFAULT_PAPER = ("paperId", "title")
DEFAULT_AUTHOR = ("authorId", "name")


@dataclass
class Fields:
    """A parsed ``fields``: top-level names in request order, and for a nested one (``authors``,
    ``citations``, ``references``, ``papers``, ``embedding``) the sub-fields asked for (empty: its defaults)."""

    names: list[str] = field(default_factory=list)
    nested: dict[str, list[str]] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def add(self, name: str, sub: str | None = None) -> None:
        if name not in self.names:
            self.names.append(name)
        if sub is not None:
            subs = self.nested.setdefault(name, [])
            if sub not in subs:
                subs.append(sub)

    def sub(self, name: str, default: tuple[str, ...]) -> "Fields":
        """The sub-fields of ``name`` as a Fields (``default`` when none was named)."""
        return Fields(list(self.nested.get(name) or default))

    def without(self, drop: tuple[str, ...]) -> "Fields":
        return Fields([n for n in self.names if n not in drop], {k: v for k, v in self.nested.items() if k not in drop})


def _nested_ok(kind: str, name: str, sub: str) -> bool:
    """Whether ``name.sub`` is a field of an object of ``kind`` ("paper", "author" or "link")."""
    if kind in ("paper", "link"):
        if name == "authors":
            return sub in AUTHOR_FIELDS
        if name in ("citations", "references"):
            return sub in BASE_PAPER_FIELDS
        if name == "embedding":
            return sub in EMBEDDING_MODELS
        return False
    if kind == "author":
        return name == "papers" and sub in BASE_PAPER_FIELDS
    return False


def parse_fields(raw: str | None, kind: str = "paper") -> Fields:
    """S2's ``fields`` for an object of ``kind``: "paper" (a paper route), "link" (citations and references:
    the link's own fields plus the paper's), or "author". ``name.sub`` asks for a nested field (and the
    nested object); ``*``/``all`` give every non-nested field. Unknown names: a 400 listing them."""
    out = Fields()
    if raw is None or not raw.strip():
        for name in DEFAULT_AUTHOR if kind == "author" else DEFAULT_PAPER:
            out.add(name)
        return out
    top = {"paper": PAPER_FIELDS, "link": PAPER_FIELDS + LINK_FIELDS, "author": AUTHOR_WITH_PAPERS_FIELDS}[kind]
    star = {"paper": STAR_PAPER_FIELDS, "link": STAR_PAPER_FIELDS + LINK_FIELDS, "author": AUTHOR_FIELDS}[kind]
    unknown: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        if item in ("*", "all"):
            for name in star:
                out.add(name)
            continue
        name, dot, sub = item.partition(".")
        if name not in top or (dot and not _nested_ok(kind, name, sub)):
            unknown.append(item)
        else:
            out.add(name, sub if dot else None)
    if unknown:
        shown = ", ".join(brief(u)[1:-1] for u in unknown[:20]) + (", ..." if len(unknown) > 20 else "")
        raise RequestError(HTTPStatus.BAD_REQUEST, f"Unrecognized or unsupported fields: [{shown}]")
    if not out.names:
        for name in DEFAULT_AUTHOR if kind == "author" else DEFAULT_PAPER:
            out.add(name)
    return out


# --- fields of study -------------------------------------------------------------------------------------
# S2's fieldsOfStudy from arXiv's archives (the part of a category before the dot). A prefix ending in "-"
# matches every archive that starts with it (hep-th, hep-ph, ...).
FIELD_ARCHIVES: dict[str, tuple[str, ...]] = {
    "Computer Science": ("cs",),
    "Mathematics": ("math", "stat"),
    "Physics": ("physics", "astro-ph", "cond-mat", "gr-qc", "hep-", "math-ph", "nlin", "nucl-", "quant-ph"),
    "Biology": ("q-bio",),
    "Economics": ("q-fin", "econ"),
    "Engineering": ("eess",),
}
S2_FIELDS_OF_STUDY = (
    "Computer Science", "Medicine", "Chemistry", "Biology", "Materials Science", "Physics", "Geology",
    "Psychology", "Art", "History", "Geography", "Sociology", "Business", "Political Science", "Economics",
    "Philosophy", "Mathematics", "Engineering", "Environmental Science", "Agricultural and Food Sciences",
    "Education", "Law", "Linguistics",
)  # fmt: skip


def _archive_matches(category: str, prefix: str) -> bool:
    archive = category.split(".")[0]
    return archive.startswith(prefix) if prefix.endswith("-") else archive == prefix


def fields_of_study(categories: str) -> list[str] | None:
    """``"cs.LG stat.ML"`` -> ``["Computer Science", "Mathematics"]``; None when no category maps."""
    cats = categories.split()
    found = [name for name, prefixes in FIELD_ARCHIVES.items()
             if any(_archive_matches(c, p) for c in cats for p in prefixes)]
    return found or None


def fields_of_study_sql(names: list[str], column: str = "p.categories") -> tuple[str, list[str]]:
    """An SQL condition true when ``column`` (space-separated categories) maps to any of ``names`` (the same
    rule as :func:`fields_of_study`), and its parameters; ``"0"`` when none of them can match."""
    clauses: list[str] = []
    params: list[str] = []
    for name in names:
        for prefix in FIELD_ARCHIVES.get(name, ()):
            if prefix.endswith("-"):
                clauses.append(f"(' ' || {column}) LIKE ?")
                params.append(f"% {prefix}%")
            else:
                clauses.append(f"((' ' || {column} || ' ') LIKE ? OR (' ' || {column}) LIKE ?)")
                params += [f"% {prefix} %", f"% {prefix}.%"]
    return ("(" + " OR ".join(clauses) + ")" if clauses else "0"), params


def parse_fields_of_study(raw: str) -> list[str]:
    """``fieldsOfStudy=Physics,computer science`` -> canonical names (case-insensitive); 400 for an unknown one."""
    by_lower = {n.lower(): n for n in S2_FIELDS_OF_STUDY}
    out: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        if item.lower() not in by_lower:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"Unrecognized fieldsOfStudy: {brief(item)}; "
                                                       f"S2's are {', '.join(S2_FIELDS_OF_STUDY)}")
        out.append(by_lower[item.lower()])
    return out


# --- bulk search's query syntax ----------------------------------------------------------------------------
# S2's /paper/search/bulk: terms are AND-ed; ``|`` is OR, ``+`` AND, ``-term`` excludes, ``"a phrase"``,
# ``prefix*``, ``( )`` groups; ``word~N`` (fuzzy) is matched exactly and ``"a phrase"~N`` within N words.
_BULK_TOKEN = re.compile(r'\s*(?:(\()|(\))|(\|)|(\+)|(-)?"([^"]*)"(?:~(\d+))?|(-)?([^\s()|"+]+))')
MAX_BULK_TERMS = 64


class _BulkParser:
    def __init__(self, query: str):
        self.tokens: list[tuple[str, str, int | None, bool]] = []  # (kind, text, slop, negated)
        pos = 0
        while pos < len(query):
            m = _BULK_TOKEN.match(query, pos)
            if not m or m.end() == pos:
                if query[pos:].strip() == "":
                    break
                raise RequestError(HTTPStatus.BAD_REQUEST, f"cannot parse the query near {brief(query[pos:pos + 20])}")
            pos = m.end()
            lp, rp, bar, plus, neg_phrase, phrase, slop, neg_word, word = m.groups()
            if lp:
                self.tokens.append(("(", "", None, False))
            elif rp:
                self.tokens.append((")", "", None, False))
            elif bar:
                self.tokens.append(("|", "", None, False))
            elif plus:
                continue  # AND is the default
            elif phrase is not None:
                self.tokens.append(("phrase", phrase, int(slop) if slop else None, bool(neg_phrase)))
            elif word is not None:
                self.tokens.append(("word", word, None, bool(neg_word)))
        if sum(t[0] in ("word", "phrase") for t in self.tokens) > MAX_BULK_TERMS:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"a bulk query may hold at most {MAX_BULK_TERMS} terms")
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def parse_or(self) -> tuple[str | None, list[str]]:
        """An OR of conjunctions -> (positive FTS5 expression or None, FTS5 expressions to exclude)."""
        parts = [self.parse_and()]
        while self.peek() == "|":
            self.i += 1
            parts.append(self.parse_and())
        if len(parts) == 1:
            return parts[0]
        exprs = []
        for positive, negatives in parts:
            if positive is None:
                continue  # "a | -b" cannot be expressed in FTS5; the negated side is dropped
            exprs.append(f"({positive} NOT ({' OR '.join(negatives)}))" if negatives else positive)
        return ("(" + " OR ".join(exprs) + ")" if exprs else None), []

    def parse_and(self) -> tuple[str | None, list[str]]:
        positives: list[str] = []
        negatives: list[str] = []
        while self.peek() not in (None, "|", ")"):
            kind, text, slop, negated = self.tokens[self.i]
            self.i += 1
            if kind == "(":
                positive, inner_negatives = self.parse_or()
                if self.peek() == ")":
                    self.i += 1
                if positive is not None:
                    positives.append(f"({positive} NOT ({' OR '.join(inner_negatives)}))" if inner_negatives
                                     else f"({positive})" if " " in positive and not positive.startswith("(")
                                     else positive)
                negatives += [] if positive is not None else inner_negatives
                continue
            term = _fts_term(kind, text, slop)
            if term is None:
                continue
            (negatives if negated else positives).append(term)
        return (" AND ".join(positives) if positives else None), negatives


def _fts_term(kind: str, text: str, slop: int | None) -> str | None:
    if kind == "phrase":
        words = re.findall(r"\w+", text)
        if not words:
            return None
        if slop is not None and len(words) > 1:
            return "NEAR(" + " ".join(f'"{w}"' for w in words) + f", {min(slop, 100)})"
        return '"' + " ".join(words) + '"'
    prefix = text.endswith("*")
    text = re.sub(r"~\d*$", "", text.rstrip("*"))
    words = re.findall(r"\w+", text)
    if not words:
        return None
    return '"' + " ".join(words) + '"' + ("*" if prefix else "")


def bulk_match(query: str) -> tuple[str | None, str | None]:
    """A bulk query -> (FTS5 expression papers must match or None for all papers, FTS5 expression of
    papers to exclude or None). Both None: the query holds no term (every paper matches)."""
    parser = _BulkParser(query)
    positive, negatives = parser.parse_or()
    while parser.peek() is not None:  # a stray ")" or "|": read on and AND the rest
        parser.i += 1
        more, more_negatives = parser.parse_or()
        positive = more if positive is None else (positive if more is None else f"{positive} AND {more}")
        negatives += more_negatives
    return positive, (" OR ".join(negatives) if negatives else None)
