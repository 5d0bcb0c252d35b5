"""Downloads (resume, verify, Drive's warning page) and safe archive extraction, against 127.0.0.1."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from data_prep import download as dl
from data_prep.archive import UnsafeArchiveError, extract
from data_prep.download import ChecksumError, DownloadError, download, drive_confirm_url, gdrive_url

from fixtures_official import FileServer, sha256_bytes

DATA = os.urandom(3 * dl.CHUNK + 12345)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(dl, "RETRY_BACKOFF_S", 0.0)


def test_plain_download_verifies_and_renames(tmp_path):
    with FileServer() as server:
        url = server.add("/f.bin", DATA)
        dest = download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), size=len(DATA), progress=False)
    assert dest.read_bytes() == DATA
    assert not (tmp_path / "f.bin.part").exists()


def test_dropped_connection_is_resumed_with_a_range_request(tmp_path):
    with FileServer() as server:
        url = server.add("/f.bin", DATA, drop_after=dl.CHUNK + 7)
        dest = download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False)
        assert server.ranges("/f.bin") == [f"bytes={dl.CHUNK + 7}-"]
    assert dest.read_bytes() == DATA


def test_interrupted_download_leaves_a_part_that_a_rerun_resumes(tmp_path):
    with FileServer() as server:
        url = server.add("/f.bin", DATA, drop_after=1000)
        with pytest.raises(DownloadError, match="rerun to resume"):
            download(url, tmp_path / "f.bin", retries=0, progress=False)
        assert (tmp_path / "f.bin.part").stat().st_size == 1000
        assert not (tmp_path / "f.bin").exists()
        download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False)
        assert server.ranges("/f.bin") == ["bytes=1000-"]
    assert (tmp_path / "f.bin").read_bytes() == DATA


def test_server_that_ignores_range_restarts_from_zero(tmp_path):
    (tmp_path / "f.bin.part").write_bytes(b"stale prefix")
    with FileServer() as server:
        url = server.add("/f.bin", DATA, ignore_range=True)
        download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False)
        assert server.ranges("/f.bin") == ["bytes=12-"]
    assert (tmp_path / "f.bin").read_bytes() == DATA


def test_complete_part_gets_416_and_is_verified(tmp_path):
    (tmp_path / "f.bin.part").write_bytes(DATA)
    with FileServer() as server:
        url = server.add("/f.bin", DATA)
        download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False)
    assert (tmp_path / "f.bin").read_bytes() == DATA


def test_checksum_mismatch_deletes_everything(tmp_path):
    with FileServer() as server:
        url = server.add("/f.bin", DATA[:-1] + b"X")
        with pytest.raises(ChecksumError, match="sha256"):
            download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_size_mismatch_is_a_checksum_error(tmp_path):
    with FileServer() as server:
        url = server.add("/f.bin", DATA)
        with pytest.raises(ChecksumError, match="size"):
            download(url, tmp_path / "f.bin", size=len(DATA) + 1, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_existing_matching_file_is_not_downloaded_again(tmp_path):
    (tmp_path / "f.bin").write_bytes(DATA)
    with FileServer() as server:
        url = server.add("/f.bin", DATA)
        download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False)
        assert server.requests == []


def test_body_without_length_cut_short_is_resumed_not_cached(tmp_path):
    # No Content-Length: a dropped connection looks like the end of the file. The Range probe from the
    # last byte gets 206 (there is more), so the download resumes (the 206 tells the total length).
    with FileServer() as server:
        url = server.add("/f.zip", DATA, no_length=True, drop_after=1000)
        dest = download(url, tmp_path / "f.zip", progress=False)
        assert server.ranges("/f.zip") == ["bytes=1000-", "bytes=1000-"]  # the probe, then the resume
    assert dest.read_bytes() == DATA
    assert json.loads((tmp_path / "f.zip.complete").read_text())["bytes"] == len(DATA)


def test_cached_download_without_a_completeness_record_is_fetched_again(tmp_path):
    # What an older version left after a cut body without Content-Length: a truncated file, no pins.
    (tmp_path / "f.zip").write_bytes(DATA[:1000])
    with FileServer() as server:
        url = server.add("/f.zip", DATA, no_length=True)
        download(url, tmp_path / "f.zip", progress=False)
        assert (tmp_path / "f.zip").read_bytes() == DATA
        assert server.requests == [("/f.zip", None), ("/f.zip", f"bytes={len(DATA)}-")]  # 416: that was all
        server.requests.clear()
        download(url, tmp_path / "f.zip", progress=False)  # now recorded as complete: kept
        assert server.requests == []
        (tmp_path / "f.zip").write_bytes(DATA[:-1])  # damaged later: the size no longer matches the record
        download(url, tmp_path / "f.zip", progress=False)
    assert (tmp_path / "f.zip").read_bytes() == DATA


def test_unverifiable_download_is_used_but_fetched_again_next_time(tmp_path):
    # No length and no Range support: nothing shows the file is complete, so it is never cached as such.
    with FileServer() as server:
        url = server.add("/f.zip", DATA, no_length=True, ignore_range=True)
        download(url, tmp_path / "f.zip", progress=False)
        assert (tmp_path / "f.zip").read_bytes() == DATA and not (tmp_path / "f.zip.complete").exists()
        server.requests.clear()
        download(url, tmp_path / "f.zip", progress=False)
        assert [p for p, _ in server.requests][:1] == ["/f.zip"]


def test_force_always_fetches_again(tmp_path):
    with FileServer() as server:
        url = server.add("/f.bin", DATA)
        download(url, tmp_path / "f.bin", progress=False)
        (tmp_path / "f.bin.part").write_bytes(b"junk")
        server.requests.clear()
        download(url, tmp_path / "f.bin", progress=False, force=True)
        assert server.requests == [("/f.bin", None)]  # from byte 0: the .part went too
        server.requests.clear()
        download(url, tmp_path / "f.bin", sha256=sha256_bytes(DATA), progress=False, force=True)
        assert server.requests == [("/f.bin", None)]
    assert (tmp_path / "f.bin").read_bytes() == DATA


def test_progress_off_a_terminal_is_lines(tmp_path, capsys):
    with FileServer() as server:
        url = server.add("/f.bin", DATA)
        download(url, tmp_path / "f.bin", progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[-1].startswith("[capo data] f.bin 3.0 MiB/3.0 MiB (")

def test_http_404_is_a_clear_error(tmp_path):
    with FileServer() as server, pytest.raises(DownloadError, match="404"):
        download(server.url + "/missing", tmp_path / "x", progress=False)


def test_google_drive_warning_page_is_confirmed(tmp_path, monkeypatch):
    file_id = "1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h"
    with FileServer(drive={file_id: DATA}) as server:
        url = gdrive_url(file_id).replace("https://drive.google.com", server.url)
        download(url, tmp_path / "m.zip", sha256=sha256_bytes(DATA), progress=False)
        paths = [p.split("?")[0] for p, _ in server.requests]
    assert paths == ["/uc", "/download"]
    assert (tmp_path / "m.zip").read_bytes() == DATA


def test_html_without_a_confirm_form_is_refused(tmp_path):
    with FileServer() as server:
        url = server.add("/f.zip", b"<html>Too many users have viewed or downloaded this file (quota)</html>",
                         content_type="text/html")
        with pytest.raises(DownloadError, match="quota"):
            download(url, tmp_path / "f.zip", progress=False)
    assert not (tmp_path / "f.zip").exists()


def test_drive_confirm_url_from_an_old_style_link():
    html = '<a id="uc-download-link" href="/uc?export=download&amp;confirm=AbCd&amp;id=XYZ">Download anyway</a>'
    assert drive_confirm_url("https://drive.google.com/uc?id=XYZ", html) == (
        "https://drive.google.com/uc?export=download&confirm=AbCd&id=XYZ"
    )


# --- archives -----------------------------------------------------------------------------------------


def _tar(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_zip_and_tar_extract(tmp_path):
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("data/x.json", "[]")
    assert (extract(z, tmp_path / "z") / "data" / "x.json").read_text() == "[]"
    t = _tar(tmp_path / "a.tar.gz", (_info("d/y.txt"), b"hi"), (_info("d/link", tarfile.SYMTYPE, "y.txt"), None))
    out = extract(t, tmp_path / "t")
    assert (out / "d" / "y.txt").read_text() == "hi" and (out / "d" / "link").is_symlink()


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "ok/../../evil.txt", "..\\evil.txt"])
def test_zip_path_traversal_is_rejected(tmp_path, name):
    z = tmp_path / "bad.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("fine.txt", "ok")
        zf.writestr(zipfile.ZipInfo(name), "evil")
    with pytest.raises(UnsafeArchiveError):
        extract(z, tmp_path / "out" / "x")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bad.zip", "out"]


def test_zip_symlink_is_rejected(tmp_path):
    z = tmp_path / "bad.zip"
    info = zipfile.ZipInfo("link")
    info.external_attr = (0o120777) << 16
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="symlink"):
        extract(z, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "member",
    [
        (_info("../evil.txt"), b"x"),
        (_info("/tmp/evil.txt"), b"x"),
        (_info("link", tarfile.SYMTYPE, "../../etc/passwd"), None),
        (_info("link", tarfile.SYMTYPE, "/etc/passwd"), None),
        (_info("d/link", tarfile.SYMTYPE, "../../outside"), None),
        (_info("hard", tarfile.LNKTYPE, "../outside"), None),
        (_info("dev", tarfile.CHRTYPE), None),
        (_info("fifo", tarfile.FIFOTYPE), None),
    ],
    ids=["dotdot", "absolute", "symlink-up", "symlink-abs", "symlink-nested-up", "hardlink-up", "chardev", "fifo"],
)
def test_malicious_tar_is_rejected(tmp_path, member):
    t = _tar(tmp_path / "bad.tar.gz", (_info("fine.txt"), b"ok"), member)
    with pytest.raises(UnsafeArchiveError):
        extract(t, tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz"]


def test_not_an_archive(tmp_path):
    (tmp_path / "f").write_text("hello")
    with pytest.raises(ValueError, match="neither"):
        extract(tmp_path / "f", tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
