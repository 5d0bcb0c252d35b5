"""``capo serve papers`` against real Semantic Scholar clients: the PyPI ``semanticscholar`` client, sync and
async, unmodified and pointed at the server on 127.0.0.1 (``api_url=``), over its everyday calls; the Graph
API documentation's request examples sent with urllib; every documented field on every paper route; the
id forms and search filters; and malformed requests (never a 500)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

import pytest

from capo_envs.papers.authors import author_id
from capo_envs.papers.db import Paper, PaperDB
from capo_envs.papers.s2fields import (AUTHOR_FIELDS, BASE_PAPER_FIELDS, EMBEDDING_MODELS, LINK_FIELDS,
                                       PAPER_FIELDS, bulk_match)
from capo_envs.papers.server import make_server

VASWANI, SHAZEER = "Ashish Vaswani", "Noam Shazeer"
PAPERS = [
    Paper("1706.03762", "Attention Is All You Need", "The Transformer, based solely on attention mechanisms.", 2017,
          (VASWANI, SHAZEER), "2017-06-12", "cs.CL cs.LG"),
    Paper("1810.04805", "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
          "Masked language model pretraining of transformers.", 2018, ("Jacob Devlin", "Kenton Lee"), "2018-10-11",
          "cs.CL"),
    Paper("2005.14165", "Language Models are Few-Shot Learners", "GPT-3 and in-context learning of transformers.",
          2020, ("Tom Brown", SHAZEER), "2020-05-28", "cs.CL"),
    Paper("1701.06538", "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer",
          "Conditional computation with transformers and experts.", 2017, (SHAZEER, VASWANI), "2017-01-23",
          "cs.LG stat.ML"),
    Paper("cs/0112017", "An Old Paper on Parsing", "Statistical parsing.", 2001, ("Eugene Charniak",), "2001-12-10",
          "cs.CL"),
    Paper("1207.0580", "Quantum Walks on Graphs", "", 2012, ("Ada Lovelace",), "2012-07-03", "quant-ph hep-th"),
    # filler: more than one bulk page (1,000) of "graph" papers
    *[Paper(f"1901.{i:05d}", f"Graph filler number {i}", "graphs and more graphs", 2019, ("Filler Author",),
            f"2019-01-{i % 28 + 1:02d}", "math.CO") for i in range(1100)],
]
EDGES = [("1810.04805", "1706.03762"), ("2005.14165", "1706.03762"), ("2005.14165", "1810.04805"),
         ("1706.03762", "cs/0112017"), ("1706.03762", "1701.06538"), ("2005.14165", "1701.06538"),
         *[(f"1901.{i:05d}", "1207.0580") for i in range(30)], ("1901.00001", "1901.00000")]


@pytest.fixture(scope="module")
def server():
    srv = make_server(PaperDB.from_records(PAPERS, EDGES)).start_in_thread()
    assert srv.server_address[0] == "127.0.0.1"
    yield srv
    srv.shutdown()
    srv.db.close()


def request(server, path, body=None, **params):
    url = server.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def raw_get(server, path_and_query):
    """A GET of a URL written as the docs write it (spaces and all), quoted the way curl would send it."""
    quoted = urllib.parse.quote(path_and_query, safe="/?&=:,+*()|-\"'~.%")
    return request(server, quoted)


# --- the semanticscholar client ---------------------------------------------------------------------------
def _client_calls():
    """(name, call(client) -> None) for the sync client; each asserts what it got back."""
    from semanticscholar.SemanticScholarException import BadQueryParametersException, ObjectNotFoundException

    def get_paper(sch):
        paper = sch.get_paper("ARXIV:1706.03762")  # the client's default fields: every field, nested ones too
        assert paper.paperId == "1706.03762" and paper.title == "Attention Is All You Need"
        assert paper.externalIds["ArXiv"] == "1706.03762" and isinstance(paper.corpusId, int)
        assert [a.name for a in paper.authors] == [VASWANI, SHAZEER] and paper.authors[0].authorId
        assert {p.paperId for p in paper.citations} == {"1810.04805", "2005.14165"}
        assert {p.paperId for p in paper.references} == {"cs/0112017", "1701.06538"}
        assert paper.citationCount == 2 and paper.referenceCount == 2
        assert paper.publicationDate == datetime(2017, 6, 12) and paper.year == 2017
        assert "Attention Is All You Need" in paper.citationStyles["bibtex"]
        assert paper.fieldsOfStudy == ["Computer Science"] and paper.tldr is None and paper.embedding is None

    def get_paper_id_forms(sch):
        for paper_id in ("1706.03762v5", "URL:https://arxiv.org/abs/1706.03762", "DOI:10.48550/arXiv.1706.03762",
                         "arxiv:1706.03762", "URL:https://arxiv.org/pdf/1706.03762v2", "DOI:10.48550/ARXIV.1706.03762",
                         "URL:https://doi.org/10.48550/arXiv.1706.03762",
                         f"CorpusId:{sch.get_paper('1706.03762', fields=['corpusId']).corpusId}"):
            assert sch.get_paper(paper_id, fields=["title"]).title == "Attention Is All You Need", paper_id

    def get_paper_errors(sch):
        with pytest.raises(ObjectNotFoundException):
            sch.get_paper("9999.99999")
        with pytest.raises(BadQueryParametersException, match="Unrecognized or unsupported fields"):
            sch.get_paper("1706.03762", fields=["title", "nonsense"])

    def get_papers(sch):
        papers, missing = sch.get_papers(["ARXIV:1706.03762", "1810.04805", "CorpusId:999999", "9999.99999"],
                                         return_not_found=True)
        assert [p.paperId for p in papers] == ["1706.03762", "1810.04805"]
        assert missing == ["CorpusId:999999", "9999.99999"]

    def search_paper(sch):
        results = sch.search_paper("transformers", limit=2)
        assert results.total == 4 and len(results) == 2
        assert {p.paperId for p in results} == {"1706.03762", "1810.04805", "2005.14165", "1701.06538"}  # pages on

    def search_paper_filters(sch):
        results = sch.search_paper("transformers", year="2018-2020", fields_of_study=["Computer Science"],
                                   open_access_pdf=True, venue=["arXiv.org"], min_citation_count=1,
                                   publication_date_or_year="2018-01:2020-12-31")
        assert [p.paperId for p in results] == ["1810.04805"]
        assert list(sch.search_paper("transformers", venue=["Nature"])) == []

    def search_paper_bulk(sch):
        results = sch.search_paper("graph*", bulk=True, sort="citationCount:desc", fields=["title", "citationCount"])
        assert results.total == 1101 and len(results) == 1000  # one page of 1,000, then the token
        papers = list(results)
        assert len(papers) == 1101 and len({p.paperId for p in papers}) == 1101
        counts = [p.citationCount for p in papers]
        assert counts == sorted(counts, reverse=True) and papers[0].paperId == "1207.0580"

    def search_paper_match_title(sch):
        paper = sch.search_paper("attention is all you need", match_title=True, fields=["title", "year"])
        assert paper.paperId == "1706.03762" and paper.year == 2017 and paper.raw_data["matchScore"] > 90
        with pytest.raises(ObjectNotFoundException, match="Title match not found"):
            sch.search_paper("totalGarbageNonsense", match_title=True)

    def get_paper_citations(sch):
        citations = list(sch.get_paper_citations("1706.03762"))
        assert {c.paper.paperId for c in citations} == {"1810.04805", "2005.14165"}
        assert all(c.isInfluential is False and c.contexts == [] for c in citations)
        many = sch.get_paper_citations("1207.0580", limit=7)  # 30 citations: five pages of 7, one of 2
        assert len(list(many)) == 30

    def get_paper_references(sch):
        references = list(sch.get_paper_references("2005.14165"))
        assert [r.paper.paperId for r in references] == ["1810.04805", "1706.03762", "1701.06538"]  # newest first
        assert references[0].paper.authors[0].name == "Jacob Devlin"

    def get_paper_authors(sch):
        authors = list(sch.get_paper_authors("1706.03762"))
        assert [a.name for a in authors] == [VASWANI, SHAZEER]
        assert authors[1].paperCount == 3 and authors[1].hIndex == 2 and authors[1].citationCount == 4

    def get_author(sch):
        author = sch.get_author(author_id(VASWANI))
        assert author.name == VASWANI and author.paperCount == 2 and author.citationCount == 4 and author.hIndex == 2
        assert [p.paperId for p in author.papers] == ["1706.03762", "1701.06538"]
        assert author.affiliations == [] and author.homepage is None
        with pytest.raises(ObjectNotFoundException):
            sch.get_author("12345")

    def get_authors(sch):
        authors, missing = sch.get_authors([author_id(VASWANI), author_id(SHAZEER), "12345"], return_not_found=True)
        assert [a.name for a in authors] == [VASWANI, SHAZEER] and missing == ["12345"]

    def get_author_papers(sch):
        papers = list(sch.get_author_papers(author_id(SHAZEER), limit=2))
        assert [p.paperId for p in papers] == ["2005.14165", "1706.03762", "1701.06538"]
        assert list(sch.get_author_papers(author_id("Filler Author"), limit=1000))[-1].paperId == "1901.01092"  # oldest

    def search_author(sch):
        found = list(sch.search_author("shazeer"))
        assert [a.name for a in found] == [SHAZEER] and found[0].paperCount == 3
        assert list(sch.search_author("totalGarbageNonsense")) == []

    def get_autocomplete(sch):
        matches = sch.get_autocomplete("attention is a")
        assert [(m.id, m.title, m.authors_year) for m in matches] == [
            ("1706.03762", "Attention Is All You Need", "Vaswani et al., 2017")]
        assert [m.id for m in sch.get_autocomplete("Outrageou")] == ["1701.06538"]

    return [get_paper, get_paper_id_forms, get_paper_errors, get_papers, search_paper, search_paper_filters,
            search_paper_bulk, search_paper_match_title, get_paper_citations, get_paper_references,
            get_paper_authors, get_author, get_authors, get_author_papers, search_author, get_autocomplete]


CLIENT_CALLS = ["get_paper", "get_paper_id_forms", "get_paper_errors", "get_papers", "search_paper",
                "search_paper_filters", "search_paper_bulk", "search_paper_match_title", "get_paper_citations",
                "get_paper_references", "get_paper_authors", "get_author", "get_authors", "get_author_papers",
                "search_author", "get_autocomplete"]


@pytest.mark.parametrize("call", CLIENT_CALLS)
def test_semanticscholar_sync_client(server, call):
    semanticscholar = pytest.importorskip("semanticscholar")
    calls = {f.__name__: f for f in _client_calls()}
    calls[call](semanticscholar.SemanticScholar(api_url=server.url, timeout=20))


class _Synced:
    """The async client's coroutines run to completion, so that the same checks drive both clients;
    paginated results are iterated with ``async for`` (the async client's own paging)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        method = getattr(self._client, name)

        def call(*args, **kwargs):
            async def run():
                result = await method(*args, **kwargs)
                if type(result).__name__ == "PaginatedResults":
                    first_page = len(result.raw_data)
                    return _Collected(result, [item async for item in result], first_page)
                return result

            return asyncio.run(run())

        return call


class _Collected(list):
    def __init__(self, results, items, first_page):
        super().__init__(items)
        self.total = results.total
        self.first_page = first_page

    def __len__(self):  # what len() of the client's PaginatedResults says before paging on: the first page
        return self.first_page


@pytest.mark.parametrize("call", CLIENT_CALLS)
def test_semanticscholar_async_client(server, call):
    semanticscholar = pytest.importorskip("semanticscholar")
    calls = {f.__name__: f for f in _client_calls()}
    calls[call](_Synced(semanticscholar.AsyncSemanticScholar(api_url=server.url, timeout=20)))


# --- the Graph API documentation's examples, curl-style -----------------------------------------------------
def _doc_examples():
    """The request examples of the Graph API docs (api.semanticscholar.org/api-docs/graph), with this
    database's ids and words in place of S2's, and what the docs say comes back."""
    a, s = author_id(VASWANI), author_id(SHAZEER)

    def keys(*names):
        return lambda body: all(set(p) == {"paperId", *names} for p in body["data"])

    return [
        ("paper/search?query=transformers&offset=1&limit=2",
         lambda b: b["total"] == 4 and b["offset"] == 1 and b["next"] == 3 and len(b["data"]) == 2
         and keys("title")(b)),
        ("paper/search?query=transformers&fields=url,abstract,authors",
         lambda b: b["offset"] == 0 and "next" not in b and keys("url", "abstract", "authors")(b)
         and all(set(x) == {"authorId", "name"} for p in b["data"] for x in p["authors"])),
        ("paper/search?query=totalGarbageNonsense", lambda b: b == {"total": 0, "offset": 0, "data": []}),
        ("paper/search?query=transformers&year=2017-2023&openAccessPdf&fieldsOfStudy=Physics,Computer Science"
         "&fields=title,year,authors", lambda b: b["total"] == 4 and keys("title", "year", "authors")(b)),
        ("paper/search/bulk?query=graph -filler&fields=title", lambda b: [p["title"] for p in b["data"]]
         == ["Quantum Walks on Graphs"] and "token" not in b),
        ('paper/search/bulk?query="language model" | parsing&sort=publicationDate:asc&fields=publicationDate',
         lambda b: [p["paperId"] for p in b["data"]] == ["cs/0112017", "1810.04805", "2005.14165"]),
        ("paper/search/bulk?query=transformers&fields=venue,s2FieldsOfStudy&sort=citationCount:desc",
         lambda b: b["data"][0]["paperId"] == "1706.03762"
         and b["data"][0]["s2FieldsOfStudy"] == [{"category": "Computer Science", "source": "external"}]),
        ("paper/search/match?query=Attention Is All You Need",
         lambda b: len(b["data"]) == 1 and b["data"][0]["paperId"] == "1706.03762" and "matchScore" in b["data"][0]),
        ("paper/autocomplete?query=quantu", lambda b: b["matches"][0]["id"] == "1207.0580"),
        ("paper/1706.03762", lambda b: b == {"paperId": "1706.03762", "title": "Attention Is All You Need"}),
        ("paper/1706.03762?fields=url,year,authors", lambda b: set(b) == {"paperId", "url", "year", "authors"}),
        ("paper/1706.03762?fields=citations.authors", lambda b: set(b) == {"paperId", "citations"}
         and all(set(c) == {"paperId", "authors"} for c in b["citations"])
         and all(set(x) == {"authorId", "name"} for c in b["citations"] for x in c["authors"])),
        ("paper/1706.03762/authors",
         lambda b: b["offset"] == 0 and [x["name"] for x in b["data"]] == [VASWANI, SHAZEER]),
        ("paper/1706.03762/authors?fields=affiliations,papers&limit=1",
         lambda b: b["next"] == 1 and set(b["data"][0]) == {"authorId", "affiliations", "papers"}
         and all(set(p) == {"paperId", "title"} for p in b["data"][0]["papers"])),
        ("paper/1706.03762/authors?fields=url,papers.year,papers.authors&offset=1",
         lambda b: b["offset"] == 1 and "next" not in b and set(b["data"][0]) == {"authorId", "url", "papers"}
         and all(set(p) == {"paperId", "year", "authors"} for p in b["data"][0]["papers"])),
        ("paper/1207.0580/citations", lambda b: b["offset"] == 0 and "next" not in b and len(b["data"]) == 30
         and all(set(c) == {"citingPaper"} and set(c["citingPaper"]) == {"paperId", "title"} for c in b["data"])),
        ("paper/1207.0580/citations?fields=contexts,intents,isInfluential,abstract&offset=20&limit=5",
         lambda b: b["offset"] == 20 and b["next"] == 25 and len(b["data"]) == 5
         and all(set(c) == {"contexts", "intents", "isInfluential", "citingPaper"} for c in b["data"])
         and all(set(c["citingPaper"]) == {"paperId", "abstract"} for c in b["data"])),
        ("paper/1207.0580/citations?fields=authors&offset=25&limit=500",
         lambda b: len(b["data"]) == 5 and "next" not in b
         and all(set(c["citingPaper"]) == {"paperId", "authors"} for c in b["data"])),
        ("paper/2005.14165/references", lambda b: [r["citedPaper"]["paperId"] for r in b["data"]]
         == ["1810.04805", "1706.03762", "1701.06538"]),
        ("paper/2005.14165/references?fields=contexts,intents,isInfluential,abstract&offset=1&limit=1",
         lambda b: b["next"] == 2 and set(b["data"][0]["citedPaper"]) == {"paperId", "abstract"}),
        ("author/search?query=vaswani", lambda b: b["total"] == 1 and b["data"] == [{"authorId": a, "name": VASWANI}]),
        ("author/search?query=shazeer&fields=name,url,papers.title,papers.year&limit=5",
         lambda b: set(b["data"][0]) == {"authorId", "name", "url", "papers"} and len(b["data"][0]["papers"]) == 3
         and all(set(p) == {"paperId", "title", "year"} for p in b["data"][0]["papers"])),
        ("author/search?query=totalGarbageNonsense", lambda b: b == {"total": 0, "offset": 0, "data": []}),
        (f"author/{a}", lambda b: b == {"authorId": a, "name": VASWANI}),
        (f"author/{a}?fields=url,papers", lambda b: set(b) == {"authorId", "url", "papers"}
         and b["papers"] == [{"paperId": "1706.03762", "title": "Attention Is All You Need"},
                             {"paperId": "1701.06538", "title": PAPERS[3].title}]),
        (f"author/{a}?fields=url,papers.abstract,papers.authors",
         lambda b: all(set(p) == {"paperId", "abstract", "authors"} for p in b["papers"])),
        (f"author/{s}/papers", lambda b: b["offset"] == 0 and [p["paperId"] for p in b["data"]]
         == ["2005.14165", "1706.03762", "1701.06538"]),
        (f"author/{s}/papers?fields=url,year,authors&limit=2",
         lambda b: b["next"] == 2 and len(b["data"]) == 2 and keys("url", "year", "authors")(b)),
        (f"author/{s}/papers?fields=citations.authors&offset=2",
         lambda b: b["offset"] == 2 and len(b["data"]) == 1 and set(b["data"][0]) == {"paperId", "citations"}
         and {c["paperId"] for c in b["data"][0]["citations"]} == {"1706.03762", "2005.14165"}),
        ("POST paper/batch?fields=referenceCount,citationCount,title",
         {"ids": ["649def34f8be52c8b66281af98ae884c09aef38b", "ARXIV:1706.03762"]},
         lambda b: b[0] is None and b[1] == {"paperId": "1706.03762", "title": "Attention Is All You Need",
                                              "referenceCount": 2, "citationCount": 2}),
        ("POST paper/batch", {"ids": ["ARXIV:1810.04805", "2005.14165"]},
         lambda b: [set(p) for p in b] == [{"paperId", "title"}] * 2),
        ("POST paper/batch?fields=title,isOpenAccess,openAccessPdf,authors", {"ids": ["ARXIV:1706.03762"]},
         lambda b: b[0]["isOpenAccess"] is True and b[0]["openAccessPdf"]["url"] == "https://arxiv.org/pdf/1706.03762"),
        ("POST author/batch?fields=name,hIndex,citationCount", {"ids": [a, s]},
         lambda b: b == [{"authorId": a, "name": VASWANI, "hIndex": 2, "citationCount": 4},
                         {"authorId": s, "name": SHAZEER, "hIndex": 2, "citationCount": 4}]),
        ("POST author/batch", {"ids": [a, "1", s]},
         lambda b: b[1] is None and b[0] == {"authorId": a, "name": VASWANI}),
        ("POST author/batch?fields=url,name,paperCount,papers,papers.title,papers.openAccessPdf", {"ids": [s]},
         lambda b: b[0]["paperCount"] == 3
         and all(set(p) == {"paperId", "title", "openAccessPdf"} for p in b[0]["papers"])),
    ]


DOC_EXAMPLES = _doc_examples()


@pytest.mark.parametrize("example", DOC_EXAMPLES, ids=[e[0] for e in DOC_EXAMPLES])
def test_graph_api_doc_examples(server, example):
    target, check = example[0], example[-1]
    if target.startswith("POST "):
        path, _, query = target[len("POST ") :].partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        status, body = request(server, "/graph/v1/" + path, example[1], **params)
    else:
        status, body = raw_get(server, "/graph/v1/" + target)
    assert status == 200, body
    assert check(body), body


# --- fields ---------------------------------------------------------------------------------------------------
_NESTED = ([f"authors.{f}" for f in AUTHOR_FIELDS] + [f"citations.{f}" for f in BASE_PAPER_FIELDS]
           + [f"references.{f}" for f in BASE_PAPER_FIELDS] + [f"embedding.{m}" for m in EMBEDDING_MODELS])
ALL_PAPER_FIELDS = list(PAPER_FIELDS) + _NESTED
PAPER_ROUTES = ["/graph/v1/paper/1706.03762", "/graph/v1/paper/search?query=attention",
                "/graph/v1/paper/search/bulk?query=attention",
                "/graph/v1/paper/search/match?query=attention+is+all+you+need",
                "/graph/v1/paper/1706.03762/citations", "/graph/v1/paper/1706.03762/references",
                f"/graph/v1/author/{author_id(VASWANI)}/papers", "POST /graph/v1/paper/batch"]


def _fetch(server, route, fields):
    if route.startswith("POST "):
        return request(server, route[len("POST ") :], {"ids": ["1706.03762"]}, fields=fields)
    path, _, query = route.partition("?")
    return request(server, path, **dict(urllib.parse.parse_qsl(query)), fields=fields)


def _papers_of(route, body):
    if isinstance(body, list):
        return body
    if "data" not in body:
        return [body]
    return [item.get("citingPaper") or item.get("citedPaper") or item for item in body["data"]]


@pytest.mark.parametrize("route", PAPER_ROUTES)
def test_every_documented_paper_field_on_every_paper_route(server, route):
    status, body = _fetch(server, route, ",".join(ALL_PAPER_FIELDS))
    assert status == 200, body
    papers = _papers_of(route, body)
    assert papers and all(set(p) == set(PAPER_FIELDS) | {"matchScore"} & set(p) for p in papers)
    for name in PAPER_FIELDS:  # one at a time too
        status, body = _fetch(server, route, name)
        assert status == 200 and all(name in p for p in _papers_of(route, body)), (name, body)


def test_fields_without_data_come_back_empty_as_s2_answers_them(server):
    _, paper = request(server, "/graph/v1/paper/1207.0580", fields=",".join(PAPER_FIELDS))
    assert paper["abstract"] is None and paper["textAvailability"] == "none"  # no abstract in the database
    assert paper["tldr"] is None and paper["embedding"] is None and paper["publicationTypes"] is None
    assert paper["fieldsOfStudy"] == ["Physics"] and paper["references"] == [] and len(paper["citations"]) == 30
    assert paper["influentialCitationCount"] == 0 and paper["externalIds"]["CorpusId"] == paper["corpusId"]
    _, author = request(server, f"/graph/v1/author/{author_id('Ada Lovelace')}", fields=",".join(AUTHOR_FIELDS))
    assert author["externalIds"] == {} and author["affiliations"] == [] and author["normalizedAffiliations"] == []
    assert author["url"] is None and author["homepage"] is None and author["hIndex"] == 1


def test_nested_fields_pick_the_nested_objects_fields(server):
    _, body = request(server, "/graph/v1/paper/2005.14165",
                      fields="references.title,references.externalIds,authors.paperCount,citations")
    assert all(set(r) == {"paperId", "title", "externalIds"} for r in body["references"])
    assert body["references"][0]["externalIds"]["ArXiv"] == body["references"][0]["paperId"]
    assert [set(a) for a in body["authors"]] == [{"authorId", "name", "paperCount"}] * 2  # name is always there
    assert body["citations"] == []


@pytest.mark.parametrize("route, fields", [
    ("/graph/v1/paper/1706.03762", "title,creditCardNumber"),
    ("/graph/v1/paper/1706.03762", "authors.papers"),  # an author's papers are not a field of a paper's author
    ("/graph/v1/paper/1706.03762", "citations.citations"),
    ("/graph/v1/paper/1706.03762", "contexts"),  # a citation's field on a paper
    ("/graph/v1/paper/search?query=x", "title,garbage"),
    (f"/graph/v1/author/{author_id(VASWANI)}", "title"),
    ("/graph/v1/paper/1706.03762/authors", "papers.garbage"),
])
def test_unknown_fields_are_400_in_s2s_shape(server, route, fields):
    path, _, query = route.partition("?")
    status, body = request(server, path, **dict(urllib.parse.parse_qsl(query)), fields=fields)
    assert status == 400 and body["error"].startswith("Unrecognized or unsupported fields: [")
    assert body["error"].endswith("]") and fields.split(",")[-1] in body["error"]


def test_link_fields_are_accepted_on_links_only(server):
    status, body = request(server, "/graph/v1/paper/1706.03762/citations", fields=",".join(LINK_FIELDS) + ",title")
    assert status == 200 and body["data"][0]["contextsWithIntent"] == [] and body["data"][0]["intents"] == []


# --- search filters and bulk ---------------------------------------------------------------------------------
@pytest.mark.parametrize("params, expected", [
    ({"year": "2017"}, {"1706.03762", "1701.06538"}),
    ({"year": "2018-2020"}, {"1810.04805", "2005.14165"}),
    ({"year": "2018-"}, {"1810.04805", "2005.14165"}),
    ({"year": "-2017"}, {"1706.03762", "1701.06538"}),
    ({"publicationDateOrYear": "2017-06:2018"}, {"1706.03762", "1810.04805"}),
    ({"publicationDateOrYear": ":2017-03-01"}, {"1701.06538"}),
    ({"publicationDateOrYear": "2020-05-28"}, {"2005.14165"}),
    ({"minCitationCount": "2"}, {"1706.03762", "1701.06538"}),
    ({"fieldsOfStudy": "Mathematics"}, {"1701.06538"}),
    ({"fieldsOfStudy": "Medicine,Mathematics"}, {"1701.06538"}),
    ({"fieldsOfStudy": "computer science"}, {"1706.03762", "1810.04805", "2005.14165", "1701.06538"}),
    ({"venue": "arXiv.org,Nature"}, {"1706.03762", "1810.04805", "2005.14165", "1701.06538"}),
    ({"venue": "Nature"}, set()),
    ({"openAccessPdf": ""}, {"1706.03762", "1810.04805", "2005.14165", "1701.06538"}),
    ({"publicationTypes": "JournalArticle"}, set()),  # no paper here has a publication type
])
@pytest.mark.parametrize("route", ["/graph/v1/paper/search", "/graph/v1/paper/search/bulk"])
def test_search_filters(server, route, params, expected):
    status, body = request(server, route, query="transformers", **params)
    assert status == 200, body
    assert {p["paperId"] for p in body["data"]} == expected and body["total"] == len(expected)


def test_bulk_token_paging_and_sorts(server):
    status, first = request(server, "/graph/v1/paper/search/bulk", query="graph", fields="publicationDate")
    assert status == 200 and first["total"] == 1101 and len(first["data"]) == 1000 and first["token"]
    _, second = request(server, "/graph/v1/paper/search/bulk", query="graph", token=first["token"])
    assert len(second["data"]) == 101 and "token" not in second
    ids = [p["paperId"] for p in first["data"] + second["data"]]
    assert ids == sorted(ids) and len(set(ids)) == 1101  # default sort: paperId ascending
    _, newest = request(server, "/graph/v1/paper/search/bulk", query="graph", sort="publicationDate:desc",
                        fields="publicationDate")
    dates = [p["publicationDate"] for p in newest["data"]]
    assert dates == sorted(dates, reverse=True)
    _, everything = request(server, "/graph/v1/paper/search/bulk", year="-2012")  # no query: every paper
    assert {p["paperId"] for p in everything["data"]} == {"cs/0112017", "1207.0580"}


@pytest.mark.parametrize("query, positive, negative", [
    ("fish ladder", '"fish" AND "ladder"', None),
    ("fish -ladder", '"fish"', '"ladder"'),
    ("fish | ladder", '("fish" OR "ladder")', None),
    ('"fish ladder"', '"fish ladder"', None),
    ("fish*", '"fish"*', None),
    ("(fish ladder) | outflow", '(("fish" AND "ladder") OR "outflow")', None),
    ('"fish ladder"~3', 'NEAR("fish" "ladder", 3)', None),
    ("fishing~", '"fishing"', None),
    ("+fish +ladder", '"fish" AND "ladder"', None),
    ("", None, None),
])
def test_bulk_query_syntax(query, positive, negative):
    assert bulk_match(query) == (positive, negative)


# --- malformed input: 400s and 404s, never a 500 ----------------------------------------------------------------
@pytest.mark.parametrize("path, params", [
    ("/graph/v1/paper/search/bulk", {"token": "not-a-token"}),
    ("/graph/v1/paper/search/bulk", {"token": "Y2Fwby1idWxrOi0x"}),  # capo-bulk:-1
    ("/graph/v1/paper/search/bulk", {"sort": "title:asc"}),
    ("/graph/v1/paper/search/bulk", {"sort": "citationCount:up"}),
    ("/graph/v1/paper/search/bulk", {"query": '"unclosed'}),
    ("/graph/v1/paper/search/bulk", {"query": "x" * 5000 + " " + "y " * 100}),
    ("/graph/v1/paper/search/bulk", {"minCitationCount": "-1"}),
    ("/graph/v1/paper/search", {"query": "x", "fieldsOfStudy": "Astrology"}),
    ("/graph/v1/paper/search", {"query": "x", "minCitationCount": "many"}),
    ("/graph/v1/paper/search", {"query": "x", "year": "2020-2019-"}),
    ("/graph/v1/paper/search/match", {}),
    ("/graph/v1/paper/autocomplete", {}),
    ("/graph/v1/author/search", {}),
    ("/graph/v1/author/search", {"query": "x", "limit": "1001"}),
    ("/graph/v1/paper/1706.03762/authors", {"limit": "0"}),
    (f"/graph/v1/author/{author_id(VASWANI)}/papers", {"offset": "-3"}),
])
def test_bad_parameters_are_400(server, path, params):
    status, body = request(server, path, **params)
    assert status == 400 and body["error"], body


@pytest.mark.parametrize("path", [
    "/graph/v1/author/12345", "/graph/v1/author/not-a-number", "/graph/v1/author/12345/papers",
    "/graph/v1/author/" + "9" * 40, "/graph/v1/paper/CorpusId:abc", "/graph/v1/paper/CorpusId:" + "9" * 30,
    "/graph/v1/paper/DOI:10.1145/3292500", "/graph/v1/paper/PMID:19872477", "/graph/v1/paper/MAG:112218234",
    "/graph/v1/paper/URL:https://www.semanticscholar.org/paper/649def34f8be52c8b66281af98ae884c09aef38b",
    "/graph/v1/paper/649def34f8be52c8b66281af98ae884c09aef38b/authors", "/graph/v1/paper/search/nothing",
    "/graph/v1/author",
])
def test_unknown_ids_are_404(server, path):
    status, body = request(server, path)
    assert status == 404 and body["error"], body


@pytest.mark.parametrize("path, body", [
    ("/graph/v1/author/batch", {"ids": "1"}),
    ("/graph/v1/author/batch", {"ids": [1, 2]}),
    ("/graph/v1/author/batch", {"ids": ["1"] * 1001}),
    ("/graph/v1/paper/batch", {"ids": [None]}),
    ("/graph/v1/paper/batch", {"ids": ["x"] * 501}),
    ("/graph/v1/paper/batch", {}),
])
def test_bad_batches_are_400(server, path, body):
    status, answer = request(server, path, body)
    assert status == 400 and answer["error"]


def test_odd_ids_in_batches_are_null(server):
    ids = ["", " ", "CorpusId:", "CorpusId:-1", "DOI:", "URL:", "ARXIV:", "\ud800", "x" * 10_000, "CorpusId:1"]
    status, body = request(server, "/graph/v1/paper/batch", {"ids": ids})
    assert status == 200 and body[:-1] == [None] * (len(ids) - 1) and body[-1]["paperId"]
    status, body = request(server, "/graph/v1/author/batch", {"ids": ["", "-1", "1" * 50, "\ud800"]})
    assert status == 200 and body == [None] * 4


@pytest.mark.parametrize("query", ["'", '"', "(", ")", "*", "-", "|", "~", "+", "NOT", "AND", "OR", "NEAR", "a:b",
                                   "{title}", "^x", '"a" NOT', "\x00", "é*", "日本語", "%", "x" * 3000])
@pytest.mark.parametrize("route", ["/graph/v1/paper/search", "/graph/v1/paper/search/bulk",
                                   "/graph/v1/paper/search/match", "/graph/v1/paper/autocomplete",
                                   "/graph/v1/author/search"])
def test_odd_queries_never_500(server, route, query):
    status, body = request(server, route, query=query, fields="title" if "author" not in route else "name")
    assert status in (200, 400, 404), (status, body)


ODD_VALUES = ["", " ", ",", ".", "..", "authors.", ".name", "a" * 5000, "%FF", "\x00", "é", "title,,year",
              "citations.authors.name", "*", "all,*", "-1", "1e9", "9" * 40, "null", "[]", "{}", "2019-", ":", "::",
              "2019-13-45", "ARXIV:", "CorpusId:", "paperId:asc:desc", "citationCount:"]


@pytest.mark.parametrize("route", [
    "/graph/v1/paper/search?query=transformers", "/graph/v1/paper/search/bulk?query=graph",
    "/graph/v1/paper/search/match?query=attention", "/graph/v1/paper/autocomplete?query=att",
    "/graph/v1/paper/1706.03762", "/graph/v1/paper/1706.03762/citations", "/graph/v1/paper/1706.03762/authors",
    f"/graph/v1/author/{author_id(VASWANI)}", f"/graph/v1/author/{author_id(VASWANI)}/papers",
    "/graph/v1/author/search?query=noam",
])
def test_odd_parameter_values_never_500(server, route):
    path, _, query = route.partition("?")
    base = dict(urllib.parse.parse_qsl(query))
    for name in ("fields", "offset", "limit", "year", "publicationDateOrYear", "minCitationCount", "fieldsOfStudy",
                 "venue", "sort", "token", "publicationTypes", "openAccessPdf"):
        for value in ODD_VALUES:
            status, body = request(server, path, **{**base, name: value})
            assert status in (200, 400, 404), (name, value, status, body)
    for raw_id in ODD_VALUES:  # as a path segment
        quoted = urllib.parse.quote(raw_id, safe="")
        for template in ("/graph/v1/paper/{}", "/graph/v1/paper/{}/citations", "/graph/v1/author/{}/papers"):
            status, body = request(server, template.format(quoted))
            assert status in (200, 400, 404), (template, raw_id, status, body)
