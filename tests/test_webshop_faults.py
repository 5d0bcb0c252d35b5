"""``capo data prepare webshop`` probed as an attacker and a careless user would, against 127.0.0.1: short
and truncated files, wrong checksums, malformed JSON and records, huge files, an interrupted run and its
rerun, and ``--force`` with a bad mirror. Every failure is one ``capo data prepare webshop: ...`` line."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

pytest.importorskip("thefuzz")

from data_prep import download as dl
from data_prep import sources
from data_prep import webshop as prep
from data_prep.cli import data_main
from fixtures_official import FileServer
from test_webshop_prepare import no_backoff, release, serve_release  # noqa: F401 (fixtures)


def drive_id(key: str, size: str = "small") -> str:
    return prep.WEBSHOP_SOURCES[size][key].url.split("id=")[1]


def run(tmp_path, server, *extra) -> int:
    return data_main(["prepare", "webshop", "--size", "small", "--data-dir", str(tmp_path), "--mirror", server.url,
                      "--quiet", *extra])  # fmt: skip


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("capo data prepare webshop: ")
    return last


def unpin(monkeypatch, *keys):
    """The Drive files have no published checksum: serve them unpinned, as the real ones are."""
    table = dict(prep.WEBSHOP_SOURCES["small"])
    for key in keys:
        table[key] = dataclasses.replace(table[key], sha256=None, size=None)
    monkeypatch.setitem(prep.WEBSHOP_SOURCES, "small", table)


def assert_prepared_and_verified(tmp_path, manifest_before):
    assert json.loads((tmp_path / "webshop-small" / "manifest.json").read_text()) == manifest_before
    assert data_main(["verify", "webshop", "--data-dir", str(tmp_path), "--size", "small"]) == 0
    assert not list(tmp_path.glob("webshop-small.*"))


# --- --force with a bad mirror ----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["wrong checksum", "server down", "malformed products"])
def test_a_failed_force_keeps_the_good_dataset(tmp_path, monkeypatch, release, capsys, fault):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        assert run(tmp_path, server) == 0
        before = json.loads((tmp_path / "webshop-small" / "manifest.json").read_text())
        if fault == "wrong checksum":
            server.drive[drive_id("attributes")] = b"{}"
        elif fault == "server down":
            server.drive.clear()
        else:
            serve_release(server, "small", {**files, "products": b"[1, 2"}, monkeypatch)
        assert run(tmp_path, server, "--force") == 1
    one_line_error(capsys)
    assert_prepared_and_verified(tmp_path, before)


# --- short, truncated and wrong files ---------------------------------------------------------------------


def test_a_short_pinned_file_is_refused_by_its_pin(tmp_path, monkeypatch, release, capsys):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        server.drive[drive_id("attributes")] = files["attributes"][:-100]
        assert run(tmp_path, server) == 1
    assert "downloaded file has size" in one_line_error(capsys)
    assert not (tmp_path / "webshop-small").exists()


def test_a_truncated_unpinned_products_file_is_refused(tmp_path, monkeypatch, release, capsys):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", {**files, "products": files["products"][: len(files["products"]) // 2]}, monkeypatch)
        unpin(monkeypatch, "products")
        assert run(tmp_path, server) == 1
        assert "items_shuffle_1000.json: truncated or invalid JSON" in one_line_error(capsys)
        assert not (tmp_path / "webshop-small").exists()
        cache = tmp_path / ".downloads" / "webshop-small"
        assert not (cache / "items_shuffle_1000.json").exists()  # dropped: the rerun fetches it again
        assert (cache / "items_ins_v2_1000.json").is_file()  # the good files stay cached
        server.drive[drive_id("products")] = files["products"]  # the mirror is fixed
        requests = len(server.requests)
        assert run(tmp_path, server) == 0
        assert len([r for r in server.requests[requests:] if r[0].startswith("/download")]) == 1


@pytest.mark.parametrize("key, body, message", [
    ("attributes", b"[]", "items_ins_v2_1000.json: expected a JSON object"),
    ("attributes", b'{"B0": ', "items_ins_v2_1000.json: not valid JSON"),
    ("attributes", b"\xff\xfe junk", "items_ins_v2_1000.json: not valid JSON"),
    ("human", b"null", "items_human_ins.json: expected a JSON object"),
    ("human", b'{"B0": 7}', "items_human_ins.json: expected a JSON object"),
    ("products", b'{"asin": "B0"}', "items_shuffle_1000.json: expected a JSON array"),
    ("products", b"<html>quota exceeded</html>", "items_shuffle_1000.json: expected a JSON array"),
    ("products", b"[1, null, \"x\", [2]]", "items_shuffle_1000.json holds no usable product"),
])  # fmt: skip
def test_malformed_files_are_one_line_errors(tmp_path, monkeypatch, release, capsys, key, body, message):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", {**files, key: body}, monkeypatch)
        assert run(tmp_path, server) == 1
    assert message in one_line_error(capsys)
    assert not (tmp_path / "webshop-small").exists() and not list(tmp_path.glob("webshop-small.*"))


def test_malformed_records_are_skipped_and_counted(tmp_path, monkeypatch, release, capsys, caplog):
    """Records that are not objects or have wrong-typed fields are skipped, counted in the manifest and
    summarised on stderr; the good ones are built as usual."""
    raw, attrs, files = release
    bad = [1, None, "x", {"asin": 5, "name": "n"}, {**raw[0], "asin": "BADNAME001", "name": None},
           {**raw[1], "asin": "BADPRICE01", "pricing": 12}, {**raw[2], "asin": "BADOPTS001", "customization_options": "x"},
           {**raw[3], "asin": "BADOPTS002", "customization_options": {"color": [{"value": 3}]}},
           {**raw[4], "asin": "BADPRICE02", "pricing": "$"}, {**raw[5], "asin": "BADQUERY01", "query": ["q"]}]
    attributes = {**attrs, "BADATTR001": "not an object", "BADATTR002": {"attributes": "x", "instruction": 5}}
    human = json.loads(files["human"])
    human[raw[6]["asin"]] = [7, {"instruction": None, "instruction_attributes": "x"}]
    good = {**files, "products": json.dumps(raw + bad).encode(), "attributes": json.dumps(attributes).encode(),
            "human": json.dumps(human).encode()}
    with FileServer() as server:
        serve_release(server, "small", good, monkeypatch)
        assert run(tmp_path, server) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert "skipped 10 malformed product record(s)" in caplog.text  # the log goes to stderr under the capo command
    counts = json.loads((tmp_path / "webshop-small" / "manifest.json").read_text())["counts"]
    assert counts["products"] == 150 and counts["malformed_products"] == 10
    assert counts["malformed_attribute_entries"] == 2 and counts["malformed_human_records"] == 2


def test_a_product_with_too_many_option_combinations_is_refused(tmp_path, monkeypatch, release, capsys):
    """Synthetic goals are one per combination of option values: 12 options of 10 values would be 10**12
    goals (the build would never end), so a product over the cap is an error naming it."""
    raw, attrs, files = release
    asin = next(a for a, e in attrs.items() if e.get("instruction"))
    product = next(p for p in raw if p["asin"] == asin)
    product["customization_options"] = {f"opt{i}": [{"value": f"v{j}", "image": None} for j in range(10)]
                                        for i in range(12)}
    with FileServer() as server:
        serve_release(server, "small", {**files, "products": json.dumps(raw).encode()}, monkeypatch)
        assert run(tmp_path, server) == 1
    line = one_line_error(capsys)
    assert asin in line and "1,000,000,000,000 option combinations" in line


# --- huge files -------------------------------------------------------------------------------------------


def test_a_file_larger_than_its_cap_is_refused_before_it_fills_the_disk(tmp_path, monkeypatch, release, capsys):
    raw, attrs, files = release
    huge = b"[" + b" " * (3 << 20) + b"]"
    with FileServer() as server:
        serve_release(server, "small", {**files, "products": huge}, monkeypatch)
        table = dict(prep.WEBSHOP_SOURCES["small"])
        table["products"] = dataclasses.replace(table["products"], sha256=None, size=None, max_bytes=1 << 20)
        monkeypatch.setitem(prep.WEBSHOP_SOURCES, "small", table)
        assert run(tmp_path, server) == 1
    assert "more than the cap of 1,048,576 bytes" in one_line_error(capsys)
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in leftovers) <= 2 << 20


def test_a_body_without_length_is_cut_at_the_cap(tmp_path):
    with FileServer() as server:
        url = server.add("/big.json", b"x" * (3 << 20), no_length=True)
        with pytest.raises(dl.DownloadError, match="more than the cap of 1,048,576 bytes"):
            dl.download(url, tmp_path / "big.json", max_bytes=1 << 20, progress=False)
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) <= (1 << 20) + dl.CHUNK


def test_a_pinned_size_caps_the_stream(tmp_path):
    """A server sending more than the pinned size is cut off there, not after it has sent everything."""
    with FileServer() as server:
        url = server.add("/big.json", b"x" * (3 << 20), no_length=True)
        with pytest.raises(dl.ChecksumError):
            dl.download(url, tmp_path / "big.json", size=1000, progress=False)
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) <= dl.CHUNK


def test_every_webshop_download_has_a_cap():
    for size, table in prep.WEBSHOP_SOURCES.items():
        for key, remote in table.items():
            assert remote.size is not None or remote.max_bytes, (size, key)


def test_a_single_huge_json_record_is_refused(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"asin": "' + "x" * 5000 + '"}]')
    with pytest.raises(prep.PrepareError, match="a record of more than 1,000 characters"):
        list(prep.iter_json_array(path, chunk_chars=64, max_record_chars=1000))


# --- an interrupted run, then a rerun ---------------------------------------------------------------------


def test_an_interrupted_download_resumes_on_the_rerun(tmp_path, monkeypatch, release, capsys):
    raw, attrs, files = release
    monkeypatch.setattr(sources, "download", functools.partial(dl.download, retries=0))
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        products = drive_id("products")
        data = server.drive.pop(products)
        server.add("/download-products", data, drop_after=len(data) // 3)
        table = dict(prep.WEBSHOP_SOURCES["small"])
        table["products"] = dataclasses.replace(table["products"], url="https://example.org/download-products")
        monkeypatch.setitem(prep.WEBSHOP_SOURCES, "small", table)
        assert run(tmp_path, server) == 1
        assert "rerun to resume" in one_line_error(capsys)
        assert not (tmp_path / "webshop-small").exists()
        part = tmp_path / ".downloads" / "webshop-small" / "items_shuffle_1000.json.part"
        assert part.stat().st_size == len(data) // 3
        assert run(tmp_path, server) == 0
        assert server.ranges("/download-products") == [f"bytes={len(data) // 3}-"]
    assert (tmp_path / "webshop-small" / "manifest.json").is_file()


def test_ctrl_c_during_the_build_keeps_the_downloads_for_the_rerun(tmp_path, monkeypatch, release, capsys):
    raw, attrs, files = release
    real_build = prep.build

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        monkeypatch.setattr(prep, "build", interrupted)
        assert run(tmp_path, server) == 130
        assert "interrupted" in capsys.readouterr().err
        assert not (tmp_path / "webshop-small").exists() and not list(tmp_path.glob("webshop-small.*"))
        requests = len(server.requests)
        monkeypatch.setattr(prep, "build", real_build)
        assert run(tmp_path, server) == 0
        downloads = [r for r in server.requests[requests:] if not r[0].startswith("/princeton")]
        assert downloads == []  # the finished downloads were kept and reused
