"""``capo data prepare papers`` against a local 127.0.0.1 server holding fixture files in each source's schema:
PaSa's query files, the arXiv metadata snapshot (Kaggle's JSON schema), the OpenAlex snapshot (manifest and
gzipped ``works`` parts), the OpenAlex API (cursor paging) and the Semantic Scholar datasets API."""

from __future__ import annotations

import gzip
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import data_prep.papers as prep
from data_prep.cli import data_main
from data_prep.papers_citations import OPENALEX_ARXIV_SOURCE
from capo_envs.papers.db import PaperDB
from capo_envs.papers.env import QUERY_FILES, load_queries
from data_prep.sources import Remote

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pasa"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/pasa is absent")


# --- fixtures in each source's schema -------------------------------------------------------------------------
def query_line(qid, question, ids, published="20240101"):
    return json.dumps({"question": question, "answer": [f"Title of {i}" for i in ids], "answer_arxiv_id": ids,
                       "source_meta": {"published_time": published}, "qid": qid})


QUERIES = {
    "dev": "\n".join([query_line("AutoScholarQuery_dev_0", "Which works use sparse attention?", ["2101.00001", "2101.00002v2"]),
                      query_line("AutoScholarQuery_dev_1", "Old parsing papers?", ["cs/0112017"])]) + "\n",
    "test": query_line("AutoScholarQuery_test_0", "Robot learning?", ["2301.00005"]) + "\n",
    "realscholar": query_line("RealScholarQuery_0", "Anything on solitons?", ["solv-int/9901001", "2409.99999"]) + "\n",
    "train": query_line("AutoScholarQuery_train_0", "Which works use sparse attention?", ["2101.00001"]) + "\n",
}


def arxiv_record(arxiv_id, title, categories, created, abstract="An abstract.", authors="A. One and B. Two"):
    """One line of Kaggle's arxiv-metadata-oai-snapshot.json."""
    return {"id": arxiv_id, "submitter": "X", "authors": authors, "title": title, "comments": None,
            "journal-ref": None, "doi": None, "report-no": None, "categories": categories, "license": None,
            "abstract": f"  {abstract}\n", "versions": [{"version": "v1", "created": created}],
            "update_date": "2024-01-01", "authors_parsed": [[a.split(". ")[1], a.split(". ")[0] + ".", ""]
                                                            for a in authors.split(" and ")]}


ARXIV = [
    arxiv_record("2101.00001", "Sparse attention", "cs.CL cs.LG", "Fri, 1 Jan 2021 10:00:00 GMT"),
    arxiv_record("2101.00002", "Sparse attention again", "cs.LG", "Sat, 2 Jan 2021 10:00:00 GMT"),
    arxiv_record("2101.00003", "A physics paper", "hep-th", "Sat, 2 Jan 2021 10:00:00 GMT"),  # dropped: category
    arxiv_record("2301.00005", "Robots", "cs.RO", "Sun, 1 Jan 2023 10:00:00 GMT"),
    arxiv_record("2410.00001", "Too late", "cs.CL", "Tue, 1 Oct 2024 10:00:00 GMT"),  # dropped: after the cut-off
    arxiv_record("cs/0112017", "Old parsing", "cs.CL", "Mon, 10 Dec 2001 10:00:00 GMT"),
    arxiv_record("solv-int/9901001", "Solitons", "solv-int nlin.SI", "Tue, 5 Jan 1999 10:00:00 GMT"),  # gold: forced
    arxiv_record("2201.00009", "Stats", "stat.ML math.ST", "Sat, 1 Jan 2022 10:00:00 GMT"),
]


def openalex_work(wid, arxiv_id, refs, via="doi"):
    """An OpenAlex ``works`` record, arXiv identified by arXiv's DOI or by an arXiv location."""
    record = {"id": f"https://openalex.org/{wid}", "doi": None, "ids": {"openalex": f"https://openalex.org/{wid}"},
              "locations": [], "referenced_works": [f"https://openalex.org/{r}" for r in refs], "title": "t"}
    if arxiv_id and via == "doi":
        record["doi"] = f"https://doi.org/10.48550/arxiv.{arxiv_id}"
    elif arxiv_id:
        record["locations"] = [{"source": {"id": f"https://openalex.org/{OPENALEX_ARXIV_SOURCE}"},
                                "landing_page_url": f"http://arxiv.org/abs/{arxiv_id}v1", "pdf_url": None}]
    return record


WORKS = [
    [openalex_work("W1", "2101.00001", ["W9", "W5"]), openalex_work("W2", "2101.00002", ["W1", "W7"], via="location")],
    [openalex_work("W5", "cs/0112017", []), openalex_work("W7", None, ["W1"]),  # W7: not arXiv
     openalex_work("W8", "2301.00005", ["W2", "W5", "W3"]), openalex_work("W3", "2101.00003", [])],  # W3: not kept
]
EXPECTED_EDGES = {("2101.00001", "cs/0112017"), ("2101.00002", "2101.00001"), ("2301.00005", "2101.00002"),
                  ("2301.00005", "cs/0112017")}


def gz_lines(rows) -> bytes:
    return gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())


class Fixtures:
    """A 127.0.0.1 server: static files by path, plus the OpenAlex and S2 API routes."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.s2_key_seen: list[str | None] = []

    def __enter__(self):
        fixtures = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                fixtures.requests.append(self.path)
                path, _, query = self.path.partition("?")
                params = dict(urllib.parse.parse_qsl(query))
                if path == "/api/works":
                    return self._json(fixtures.openalex_page(params))
                if path.startswith("/s2/dataset/"):
                    fixtures.s2_key_seen.append(self.headers.get("x-api-key"))
                    if self.headers.get("x-api-key") != "s2-secret":
                        return self._send(403, b'{"message": "Forbidden"}')
                    name = path.rsplit("/", 1)[-1]
                    return self._json({"name": name, "files": [self.base + f"/s2files/{name}-{i}.gz" for i in range(2)]})
                if path not in fixtures.files:
                    return self._send(404, b"not found")
                self._send(200, fixtures.files[path])

            @property
            def base(self):
                return fixtures.url

            def _json(self, obj):
                self._send(200, json.dumps(obj).encode())

            def _send(self, code, body):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def openalex_page(self, params):
        assert params["filter"] == f"locations.source.id:{OPENALEX_ARXIV_SOURCE}" and params["api_key"] == "oa-key"
        page = {"*": 0, "c1": 1}.get(params["cursor"])
        if page is None or page >= len(WORKS):
            return {"meta": {"next_cursor": None}, "results": []}
        return {"meta": {"next_cursor": "c1" if page == 0 else "c2"}, "results": WORKS[page]}


@pytest.fixture
def fixtures(monkeypatch):
    with Fixtures() as server:
        for split, text in QUERIES.items():
            remote = prep.QUERY_REMOTES[split]
            path = urllib.parse.urlsplit(remote.url).path
            server.files[path] = text.encode()
            monkeypatch.setitem(prep.QUERY_REMOTES, split, Remote(remote.url, remote.filename))  # unpinned bytes
        server.files["/arxiv/snapshot.json.gz"] = gz_lines(ARXIV)
        server.files["/openalex/data/works/manifest"] = json.dumps({"entries": [
            {"url": f"s3://openalex/data/works/updated_date=2024-01-0{i}/part_000.gz",
             "meta": {"content_length": len(gz_lines(part)), "record_count": len(part)}}
            for i, part in enumerate(WORKS)]}).encode()
        for i, part in enumerate(WORKS):
            server.files[f"/openalex/data/works/updated_date=2024-01-0{i}/part_000.gz"] = gz_lines(part)
        s2_papers = [{"corpusid": 100 + i, "externalids": {"ArXiv": r["id"], "DOI": None}, "title": r["title"]}
                     for i, r in enumerate(ARXIV)] + [{"corpusid": 999, "externalids": {"ArXiv": None}}]
        server.files["/s2files/papers-0.gz"] = gz_lines(s2_papers[:4])
        server.files["/s2files/papers-1.gz"] = gz_lines(s2_papers[4:])
        ids = {r["id"]: 100 + i for i, r in enumerate(ARXIV)}
        cites = [{"citingcorpusid": ids[a], "citedcorpusid": ids[b], "isinfluential": False} for a, b in EXPECTED_EDGES]
        cites += [{"citingcorpusid": 999, "citedcorpusid": ids["2101.00001"]},
                  {"citingcorpusid": ids["2101.00003"], "citedcorpusid": ids["2101.00001"]}]
        server.files["/s2files/citations-0.gz"] = gz_lines(cites[:3])
        server.files["/s2files/citations-1.gz"] = gz_lines(cites[3:])
        yield server


def run(fixtures, tmp_path, *extra):
    argv = ["--data-dir", str(tmp_path), "--quiet", "--mirror", fixtures.url,
            "--arxiv-url", fixtures.url + "/arxiv/snapshot.json.gz", *extra]
    return data_main(["prepare", "papers", *argv])


def manifest(tmp_path):
    return json.loads((tmp_path / "papers" / "manifest.json").read_text())


def test_prepare_without_citations(fixtures, tmp_path):
    assert run(fixtures, tmp_path) == 0
    root = tmp_path / "papers"
    with PaperDB(root / "papers.sqlite") as db:
        ids = {r[0] for r in db._rows("SELECT arxiv_id FROM papers")}
        assert ids == {"2101.00001", "2101.00002", "2301.00005", "cs/0112017", "solv-int/9901001", "2201.00009"}
        paper = db.get("2101.00001")
        assert paper.date == "2021-01-01" and paper.year == 2021 and paper.authors == ("A. One", "B. Two")
        assert paper.abstract == "An abstract." and db.meta()["citations"] == "none"
    assert len(load_queries(root / "queries" / QUERY_FILES["dev"])) == 2
    m = manifest(tmp_path)
    assert m["counts"]["papers"] == 6 and m["counts"]["edges"] == 0 and m["citations"] == {"source": "none"}
    gold = m["coverage"]["gold"]
    assert gold["dev"]["present_share"] == 1.0 and gold["realscholar"]["present_share"] == 0.5  # 2409.99999 absent
    assert gold["dev"]["with_references_share"] == 0.0
    assert set(m["files"]) == {"papers.sqlite", *(f"queries/{QUERY_FILES[s]}" for s in QUERY_FILES)}
    assert all(len(f["sha256"]) == 64 for f in m["files"].values())
    assert not list(tmp_path.glob("papers.tmp-*"))


def test_openalex_snapshot_parts_are_streamed_and_deleted(fixtures, tmp_path):
    assert run(fixtures, tmp_path, "--citations", "openalex-snapshot",
               "--openalex-manifest", fixtures.url + "/openalex/data/works/manifest",
               "--openalex-s3", fixtures.url + "/openalex/") == 0
    with PaperDB(tmp_path / "papers" / "papers.sqlite") as db:
        edges = {(a.arxiv_id, b.arxiv_id) for a in map(db.get, ["2101.00001", "2101.00002", "2301.00005"])
                 for b in db.references(a.arxiv_id)}
    assert edges == EXPECTED_EDGES
    m = manifest(tmp_path)
    assert m["citations"]["parts"] == 2 and m["counts"]["edges"] == 4
    assert m["coverage"]["gold"]["dev"]["with_references_share"] == pytest.approx(2 / 3)
    cache = tmp_path / ".downloads" / "papers"
    assert not list(cache.glob("openalex-part-*.gz"))  # each part deleted once extracted
    fixtures.requests.clear()
    assert run(fixtures, tmp_path, "--force", "--citations", "openalex-snapshot",
               "--openalex-manifest", fixtures.url + "/openalex/data/works/manifest",
               "--openalex-s3", fixtures.url + "/openalex/") == 0
    assert not any("part_000.gz" in r for r in fixtures.requests)  # a rerun reuses the extracts
    assert manifest(tmp_path)["citations"]["parts_resumed"] == 2


def test_openalex_api_pages_with_a_cursor(fixtures, tmp_path, monkeypatch):
    assert run(fixtures, tmp_path, "--citations", "openalex-api") == 1  # no key: a clear error
    monkeypatch.setenv("OPENALEX_API_KEY", "oa-key")
    assert run(fixtures, tmp_path, "--citations", "openalex-api", "--openalex-api", fixtures.url + "/api/works") == 0
    m = manifest(tmp_path)
    assert m["citations"]["complete"] and m["citations"]["pages"] == 3 and m["counts"]["edges"] == 4
    assert "oa-key" not in json.dumps(m)


def test_s2_datasets_with_a_key(fixtures, tmp_path):
    assert run(fixtures, tmp_path, "--citations", "s2-datasets", "--s2-api", fixtures.url + "/s2/dataset",
               "--s2-key", "wrong") == 1
    assert run(fixtures, tmp_path, "--citations", "s2-datasets", "--s2-api", fixtures.url + "/s2/dataset",
               "--s2-key", "s2-secret") == 0
    with PaperDB(tmp_path / "papers" / "papers.sqlite") as db:
        assert [p.arxiv_id for p in db.references("2301.00005")] == ["2101.00002", "cs/0112017"]
        assert db.count_links("2101.00001", "citations") == 1  # the edges from 999 and 2101.00003 are outside
    assert manifest(tmp_path)["counts"]["edges"] == 4


def test_already_prepared_is_kept(fixtures, tmp_path):
    assert run(fixtures, tmp_path) == 0
    before = (tmp_path / "papers" / "manifest.json").stat().st_mtime_ns
    assert run(fixtures, tmp_path) == 0
    assert (tmp_path / "papers" / "manifest.json").stat().st_mtime_ns == before


def test_queries_from_a_local_folder(fixtures, tmp_path):
    local = tmp_path / "pasa"
    for split, text in QUERIES.items():
        (local / QUERY_FILES[split]).parent.mkdir(parents=True, exist_ok=True)
        (local / QUERY_FILES[split]).write_text(text)
    assert run(fixtures, tmp_path / "out", "--queries-from", str(local), "--splits", "dev") == 0
    assert manifest(tmp_path / "out")["queries"]["dev"]["from"].endswith("dev.jsonl")


@pytest.mark.shared
@needs_shared
def test_real_query_files_through_the_pinned_sources(tmp_path, monkeypatch):
    """The real files, served at the pinned CAPO paths, pass the pinned sha256 and feed the coverage."""
    with Fixtures() as server:
        for split in ("dev", "test", "realscholar"):
            server.files[urllib.parse.urlsplit(prep.QUERY_REMOTES[split].url).path] = (SHARED / QUERY_FILES[split]).read_bytes()
        gold = {g for s in ("dev", "test", "realscholar") for t in load_queries(SHARED / QUERY_FILES[s]) for g in t.gold}
        records = [arxiv_record(g, f"Paper {g}", "hep-th", "Mon, 1 Jan 2024 10:00:00 GMT") for g in sorted(gold)[::2]]
        server.files["/arxiv/real.json.gz"] = gz_lines(records)
        argv = ["--data-dir", str(tmp_path), "--quiet", "--mirror", server.url, "--splits", "dev", "test",
                "realscholar", "--arxiv-url", server.url + "/arxiv/real.json.gz"]
        assert data_main(["prepare", "papers", *argv]) == 0
    m = manifest(tmp_path)
    assert all(m["queries"][s]["pinned"] for s in ("dev", "test", "realscholar"))
    share = m["coverage"]["gold"]["realscholar"]["present_share"]
    assert 0.3 < share < 0.7 and m["counts"]["gold_papers_forced"] == len(records)  # every other gold id served


def test_parquet_shards_in_the_hf_mirrors_schema(fixtures, tmp_path):
    """The Hugging Face mirror serves the same columns as Parquet (versions and authors_parsed nested)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.Table.from_pylist(ARXIV)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    path = urllib.parse.urlsplit(prep.ARXIV_URLS[0]).path
    fixtures.files[path] = sink.getvalue().to_pybytes()
    for other in prep.ARXIV_URLS[1:]:  # the other shards: empty tables of the same schema
        empty = pa.BufferOutputStream()
        pq.write_table(table.slice(0, 0), empty)
        fixtures.files[urllib.parse.urlsplit(other).path] = empty.getvalue().to_pybytes()
    argv = ["--data-dir", str(tmp_path), "--quiet", "--mirror", fixtures.url]
    assert data_main(["prepare", "papers", *argv]) == 0
    with PaperDB(tmp_path / "papers" / "papers.sqlite") as db:
        assert len(db) == 6 and db.get("2101.00001").authors == ("A. One", "B. Two")
    assert manifest(tmp_path)["arxiv_metadata"]["revision"] == prep.ARXIV_REVISION
