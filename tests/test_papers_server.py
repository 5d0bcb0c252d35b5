"""``capo serve papers``: the Semantic Scholar Graph API shapes over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from capo_envs.papers.db import Paper, PaperDB
from capo_envs.papers.server import make_server, serve_main

PAPERS = [
    Paper("1706.03762", "Attention Is All You Need", "The Transformer, based solely on attention.", 2017,
          ("A. Vaswani", "N. Shazeer"), "2017-06-12", "cs.CL"),
    Paper("1810.04805", "BERT: Pre-training of Deep Bidirectional Transformers", "Masked language model "
          "pretraining of transformers.", 2018, ("J. Devlin",), "2018-10-11", "cs.CL"),
    Paper("2005.14165", "Language Models are Few-Shot Learners", "GPT-3 and in-context learning of transformers.",
          2020, ("T. Brown",), "2020-05-28", "cs.CL"),
    Paper("cs/0112017", "An Old Paper on Parsing", "Statistical parsing.", 2001, ("E. Charniak",), "2001-12-10", "cs.CL"),
    *[Paper(f"2101.{i:05d}", f"Transformers study {i}", "transformers again", 2021, (), f"2021-01-{i + 1:02d}")
      for i in range(25)],
]
EDGES = [("1810.04805", "1706.03762"), ("2005.14165", "1706.03762"), ("2005.14165", "1810.04805"),
         ("1706.03762", "cs/0112017"), *[(f"2101.{i:05d}", "1706.03762") for i in range(25)]]


@pytest.fixture(scope="module")
def server():
    srv = make_server(PaperDB.from_records(PAPERS, EDGES)).start_in_thread()
    assert srv.server_address[0] == "127.0.0.1"
    yield srv
    srv.shutdown()
    srv.db.close()


def get(server, path, **params):
    url = server.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_search_shape_fields_and_paging(server):
    status, body = get(server, "/graph/v1/paper/search", query="transformers", limit=10,
                       fields="title,abstract,year,authors,externalIds")
    assert status == 200 and set(body) == {"total", "offset", "next", "data"}
    assert body["total"] == 28 and body["offset"] == 0 and body["next"] == 10 and len(body["data"]) == 10
    paper = body["data"][0]
    assert set(paper) == {"paperId", "title", "abstract", "year", "authors", "externalIds"}
    assert paper["externalIds"]["ArXiv"] == paper["paperId"]
    assert all(set(a) == {"authorId", "name"} for p in body["data"] for a in p["authors"])
    _, last = get(server, "/graph/v1/paper/search", query="transformers", offset=20, limit=10)
    assert "next" not in last and len(last["data"]) == 8  # S2 omits next on the last page
    _, plain = get(server, "/graph/v1/paper/search", query="attention")
    assert set(plain["data"][0]) == {"paperId", "title"}  # S2's default fields
    _, everything = get(server, "/paper/search", query="attention", fields="*")  # Lewen/CAPO path, no prefix
    assert {"citationCount", "referenceCount", "publicationDate", "url", "venue"} <= set(everything["data"][0])


def test_search_year_filters(server):
    _, body = get(server, "/graph/v1/paper/search", query="transformers", year="-2018", fields="year", limit=100)
    assert {p["year"] for p in body["data"]} == {2017, 2018}
    _, body = get(server, "/graph/v1/paper/search", query="transformers", year="2020-", fields="year", limit=100)
    assert {p["year"] for p in body["data"]} == {2020, 2021} and body["total"] == 26
    _, body = get(server, "/graph/v1/paper/search", query="transformers", publicationDateOrYear=":2018-10-10")
    assert [p["paperId"] for p in body["data"]] == ["1706.03762"]


@pytest.mark.parametrize("paper_id", ["1706.03762", "1706.03762v5", "ARXIV:1706.03762", "arXiv:1706.03762v1",
                                      "ARXIV%3A1706.03762"])
def test_paper_by_any_id_form(server, paper_id):
    status, body = get(server, f"/graph/v1/paper/{paper_id}", fields="title,externalIds,citationCount")
    assert status == 200 and body["title"] == "Attention Is All You Need" and body["paperId"] == "1706.03762"
    assert body["citationCount"] == 27 and body["externalIds"]["DOI"] == "10.48550/arXiv.1706.03762"


def test_old_style_ids_with_a_slash_or_encoded(server):
    for path in ("/graph/v1/paper/cs/0112017", "/graph/v1/paper/cs%2F0112017", "/graph/v1/paper/ARXIV:cs/0112017v1"):
        status, body = get(server, path)
        assert status == 200 and body == {"paperId": "cs/0112017", "title": "An Old Paper on Parsing"}
    status, body = get(server, "/graph/v1/paper/cs/0112017/citations")
    assert status == 200 and body["data"] == [{"citingPaper": {"paperId": "1706.03762", "title": "Attention Is All You Need"}}]


def test_citations_and_references(server):
    status, body = get(server, "/graph/v1/paper/1706.03762/citations", limit=20, fields="title,abstract,externalIds")
    assert status == 200 and body["offset"] == 0 and body["next"] == 20 and body["total"] == 27
    assert len(body["data"]) == 20
    assert all(set(item) == {"citingPaper"} for item in body["data"])
    assert body["data"][0]["citingPaper"]["paperId"] == "2101.00024"  # newest first
    status, body = get(server, "/graph/v1/paper/2005.14165/references", limit=99, fields="title,contexts,isInfluential")
    assert [i["citedPaper"]["paperId"] for i in body["data"]] == ["1810.04805", "1706.03762"]
    assert body["data"][0]["contexts"] == [] and body["data"][0]["isInfluential"] is False and "next" not in body
    _, page = get(server, "/graph/v1/paper/1706.03762/citations", offset=25, limit=10)
    assert len(page["data"]) == 2 and "next" not in page


def test_citations_next_is_exact(server):
    _, body = get(server, "/graph/v1/paper/1706.03762/citations", limit=27)
    assert len(body["data"]) == 27 and "next" not in body


@pytest.mark.parametrize("path", ["/graph/v1/paper/9999.99999", "/graph/v1/paper/not-an-id",
                                  "/graph/v1/paper/9999.99999/citations", "/graph/v1/paper/CorpusId:99999/references",
                                  "/graph/v1/nothing", "/graph/v1/paper/"])
def test_unknown_ids_are_404(server, path):
    status, body = get(server, path)
    assert status == 404 and body["error"] and body["detail"] == body["error"]


@pytest.mark.parametrize("path, params", [
    ("/graph/v1/paper/search", {}),
    ("/graph/v1/paper/search", {"query": "  "}),
    ("/graph/v1/paper/search", {"query": "x", "limit": "0"}),
    ("/graph/v1/paper/search", {"query": "x", "limit": "101"}),
    ("/graph/v1/paper/search", {"query": "x", "limit": "ten"}),
    ("/graph/v1/paper/search", {"query": "x", "offset": "-1"}),
    ("/graph/v1/paper/search", {"query": "x", "offset": "995", "limit": "10"}),
    ("/graph/v1/paper/search", {"query": "x", "fields": "title,nonsense"}),
    ("/graph/v1/paper/search", {"query": "x", "year": "20x9"}),
    ("/graph/v1/paper/search", {"query": "x", "year": "20192020"}),
    ("/graph/v1/paper/search", {"query": "x", "publicationDateOrYear": "yesterday"}),
    ("/graph/v1/paper/1706.03762/citations", {"limit": "1001"}),
    ("/graph/v1/paper/1706.03762", {"fields": "contexts"}),  # a citation field on a paper
])
def test_bad_parameters_are_400(server, path, params):
    status, body = get(server, path, **params)
    assert status == 400 and body["error"]


def test_batch(server):
    request = urllib.request.Request(server.url + "/graph/v1/paper/batch?fields=title",
                                     data=json.dumps({"ids": ["ARXIV:1810.04805", "9999.99999"]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.loads(response.read())
    assert body == [{"paperId": "1810.04805", "title": "BERT: Pre-training of Deep Bidirectional Transformers"}, None]


def capo_client_parse(payload, key=None):
    """What the CAPO authors' PaperSearchClient reads (recipe/paper_search/utils.py, paraphrased)."""
    data = payload.get("data") if isinstance(payload.get("data"), list) else []
    out = []
    for item in data:
        record = item.get(key) if key else item
        arxiv_id = record.get("arxiv_id") or (record.get("externalIds") or {}).get("ArXiv")
        out.append({"paper_id": arxiv_id or record.get("paperId") or record.get("paper_id"),
                    "title": record.get("title"), "abstract": record.get("abstract"),
                    "authors": [a["name"] for a in record.get("authors") or []], "year": record.get("year")})
    return out


def test_the_capo_client_requests_work_unchanged(server):
    fields = "title,abstract,year,authors,externalIds"
    _, body = get(server, "/paper/search", query="transformers", limit=10, fields=fields, year="-2024")
    found = capo_client_parse(body)
    assert len(found) == 10 and all(p["paper_id"] and p["title"] and p["year"] for p in found)
    _, cites = get(server, f"/paper/{found[0]['paper_id']}/citations", limit=30, fields=fields)
    _, refs = get(server, "/paper/2005.14165/references", limit=99, fields=fields)
    assert [p["paper_id"] for p in capo_client_parse(refs, "citedPaper")] == ["1810.04805", "1706.03762"]
    assert isinstance(capo_client_parse(cites, "citingPaper"), list)


def test_serve_main_synth_in_a_subprocess():
    code = ("import sys; sys.argv = ['capo']\n"
            "from capo_train.cli import main\n"
            "raise SystemExit(main(['serve', 'papers', '--synth', 'tiny', '--port', '0']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        banner = proc.stdout.readline()
        assert banner.startswith("serving 2000 papers at http://127.0.0.1:"), banner + proc.stderr.read()
        base = banner.split(" at ")[1].split()[0]
        with urllib.request.urlopen(base + "/paper/search?query=speech+recognition&fields=title", timeout=10) as r:
            body = json.loads(r.read())
        assert body["data"] and body["total"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_main_without_a_database(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    assert serve_main([]) == 2
    assert "capo data prepare papers" in capsys.readouterr().err
    assert serve_main(["--db", str(tmp_path / "none.sqlite")]) == 2
