"""``capo data prepare papers`` with bad arXiv metadata lines: each line is validated by type; a bad line
is skipped and counted (summary on stderr, counts and first line numbers in the manifest), never a crash.
A file with no valid record at all is one clear error. Also: a failed ``--force`` keeps the good dataset."""

from __future__ import annotations

import gzip
import json

import pytest

from data_prep import papers_arxiv
from data_prep.building import PrepareError
from data_prep.cli import data_main
from test_papers_prepare import ARXIV, fixtures, manifest, run  # noqa: F401 (fixtures)
from capo_envs.papers.db import PaperDB

BAD_LINES = [
    "[1, 2]",
    "null",
    '"a string"',
    "42",
    "{not json",
    json.dumps({"id": 2101.00009, "title": "a number id"}),
    json.dumps({"id": "2101.00010", "title": ["not", "a", "string"], "categories": "cs.CL"}),
    json.dumps({"id": "2101.00011", "title": "t", "categories": ["cs.CL"]}),
    json.dumps({"id": "2101.00012", "title": "t", "categories": "cs.CL", "versions": "v1"}),
    json.dumps({"id": "2101.00013", "title": "t", "categories": "cs.CL", "versions": [5]}),
    json.dumps({"id": "2101.00014", "title": "t", "categories": "cs.CL", "authors_parsed": "A. One"}),
    json.dumps({"id": "2101.00015", "title": "t", "categories": "cs.CL", "abstract": {"x": 1}}),
    json.dumps({"id": "2101.00016", "title": "t", "categories": "cs.CL", "update_date": 20240101}),
    json.dumps({"title": "no id at all", "categories": "cs.CL"}),
]


def serve_lines(fixtures, lines: list[str]) -> None:
    fixtures.files["/arxiv/snapshot.json.gz"] = gzip.compress(("\n".join(lines) + "\n").encode())


def test_bad_arxiv_lines_are_skipped_and_counted(fixtures, tmp_path, capsys, caplog):
    good = [json.dumps(r) for r in ARXIV]
    lines = good[:3] + BAD_LINES + good[3:] + ["", "   "]  # blank lines are not records
    serve_lines(fixtures, lines)
    assert run(fixtures, tmp_path) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    summary = caplog.text  # the log goes to stderr under the capo command
    assert f"skipped {len(BAD_LINES)} bad line(s) of {len(BAD_LINES) + len(ARXIV)}" in summary  # blank lines: not records
    assert "line 4" in summary
    files = manifest(tmp_path)["arxiv_metadata"]["files"]
    (record,) = files
    assert record["bad_lines"] == len(BAD_LINES) and record["records"] == len(ARXIV)
    assert record["first_bad_lines"][:3] == [4, 5, 6]
    assert set(record["bad_line_reasons"]) >= {"not a JSON object (list)", "not valid JSON",
                                              "title is not a string", "categories is not a string"}
    with PaperDB(tmp_path / "papers" / "papers.sqlite") as db:
        assert db.get("2101.00001") is not None and db.get("2101.00010") is None
    assert manifest(tmp_path)["counts"]["papers"] == 6  # the same papers as from the clean file


def test_a_file_of_only_bad_lines_is_one_clear_error(fixtures, tmp_path, capsys):
    serve_lines(fixtures, BAD_LINES)
    assert run(fixtures, tmp_path) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("capo data prepare papers: snapshot.json.gz: no valid arXiv record")
    assert "line 1" in line and not (tmp_path / "papers").exists()


def test_an_html_page_instead_of_the_file_is_one_clear_error(fixtures, tmp_path, capsys):
    fixtures.files["/arxiv/snapshot.json.gz"] = gzip.compress(b"<html><body>Rate limited</body></html>\n")
    assert run(fixtures, tmp_path) == 1
    assert "no valid arXiv record" in capsys.readouterr().err


def test_a_truncated_gzip_is_one_clear_error(fixtures, tmp_path, capsys):
    data = gzip.compress(("\n".join(json.dumps(r) for r in ARXIV) + "\n").encode())
    fixtures.files["/arxiv/snapshot.json.gz"] = data[: len(data) // 2]
    assert run(fixtures, tmp_path) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "snapshot.json.gz" in err.strip().splitlines()[-1]


def test_arxiv_record_problem_names_the_field():
    assert papers_arxiv.record_problem({"id": "2101.00001", "title": 3}) == "title is not a string"
    assert papers_arxiv.record_problem([1]) == "not a JSON object (list)"
    assert papers_arxiv.record_problem({"id": "2101.00001", "versions": [{"created": 5}]}) == \
        "versions[0].created is not a string"
    assert papers_arxiv.record_problem(ARXIV[0]) is None
    assert papers_arxiv.record_problem({**ARXIV[0], "comments": None, "doi": None}) is None  # nulls as Kaggle has


def test_a_failed_force_keeps_the_good_papers_dataset(fixtures, tmp_path, capsys):
    assert run(fixtures, tmp_path) == 0
    before = manifest(tmp_path)
    serve_lines(fixtures, BAD_LINES)
    assert run(fixtures, tmp_path, "--force") == 1
    assert "Traceback" not in capsys.readouterr().err
    assert manifest(tmp_path) == before
    assert data_main(["verify", "papers", "--data-dir", str(tmp_path)]) == 0
    assert not list(tmp_path.glob("papers.tmp-*"))


def test_parquet_without_pyarrow_is_a_prepare_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ModuleNotFoundError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(PrepareError, match="needs pyarrow"):
        list(papers_arxiv.read_records(tmp_path / "x.parquet"))
