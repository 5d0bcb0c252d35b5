"""``prepare`` end to end against a local mirror serving files in the official release formats."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from capo_envs.qa.datasets import load_split
from capo_envs.retrieval import open_retriever
from capo_envs.retrieval.base import read_corpus
from data_prep import data_info, is_prepared, prepare, verify
from data_prep import qa as prep
from data_prep import download as dl
from data_prep import sources
from data_prep.archive import UnsafeArchiveError
from data_prep.cli import data_main
from data_prep.download import ChecksumError, DownloadError
from data_prep.manifest import MANIFEST

from fixtures_official import (
    HOTPOT_UNIQUE_PASSAGES,
    MUSIQUE_UNIQUE_PASSAGES,
    SHARED,
    TWOWIKI_UNIQUE_PASSAGES,
    WIKI18,
    FileServer,
    hotpot_records,
    serve,
    shared_files,
    sha256_bytes,
    write_2wiki_zip,
    write_hotpotqa,
    write_musique_zip,
    write_wiki18_gz,
    zip_bytes,
)

def fixture_files(tmp: Path) -> dict[str, dict[str, bytes]]:
    """Per dataset: upstream URL path -> bytes, written in the official formats."""
    tmp.mkdir(parents=True, exist_ok=True)
    hotpot = write_hotpotqa(tmp / "hotpot")
    return {
        "hotpotqa": {"/datasets/hotpot/" + p.name: p.read_bytes() for p in hotpot.values()},
        "2wiki": {"/s/ms2m13252h6xubs/data_ids_april7.zip": write_2wiki_zip(tmp / "2wiki.zip").read_bytes()},
        "musique": {"/uc": write_musique_zip(tmp / "musique.zip").read_bytes()},
        "wiki18": {"/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz":
                   write_wiki18_gz(tmp / "wiki-18.jsonl.gz").read_bytes()},
    }


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(dl, "RETRY_BACKOFF_S", 0.0)
    monkeypatch.delenv("CAPO_DATA_MIRROR", raising=False)


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    with FileServer() as server:
        serve(server, fixture_files(tmp_path / "fixtures"), monkeypatch)
        yield server


def _leftovers(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if p.name != ".downloads") if data_dir.exists() else []


@pytest.mark.parametrize(
    "name, counts",
    [
        ("hotpotqa", {"train": 2, "dev": 2, "passages": HOTPOT_UNIQUE_PASSAGES}),
        ("2wiki", {"train": 2, "dev": 1, "passages": TWOWIKI_UNIQUE_PASSAGES}),
        ("musique", {"train": 2, "dev": 1, "passages": MUSIQUE_UNIQUE_PASSAGES}),
        ("wiki18", {"passages": len(WIKI18)}),
    ],
)
def test_prepare_end_to_end(tmp_path, mirror, name, counts):
    data = tmp_path / "data"
    root = prepare(name, data_dir=data, base_url=mirror.url, progress=False)
    assert root == data / name and is_prepared(name, data)
    assert _leftovers(data) == [name] and not (data / ".downloads" / name).exists()
    manifest = json.loads((root / MANIFEST).read_text())
    assert manifest["counts"] == counts
    assert manifest["sources"][0]["url"].startswith(mirror.url)
    assert "corpus.jsonl" in manifest["files"] and any(f.startswith("index/bm25/") for f in manifest["files"])
    passages = list(read_corpus(root / "corpus.jsonl"))
    assert [p.id for p in passages] == [str(i) for i in range(counts["passages"])]
    for split in ("train", "dev"):
        if split in counts:
            assert len(load_split(name, split, data_dir=data)) == counts[split]
    with open_retriever("bm25", index_dir=root / "index" / "bm25") as retriever:
        first = passages[0]
        assert retriever.search([first.title + " " + first.text], k=1)[0][0].id == first.id
    assert verify(name, data) == []


def test_prepared_contents(tmp_path, mirror):
    data = tmp_path / "data"
    prepare("2wiki", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert sorted(p.name for p in (data / "2wiki" / "raw").iterdir()) == ["dev.json", "id_aliases.json", "train.json"]
    assert load_split("2wiki", "dev", data_dir=data)[0].answers == (
        "United States", "USA", "United States of America", "American")
    prepare("musique", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert [p.split("?")[0] for p, _ in mirror.requests if "uc" in p or "download" in p] == ["/uc", "/download"]
    assert sorted(p.name for p in (data / "musique" / "raw").iterdir()) == [
        "musique_ans_v1.0_dev.jsonl", "musique_ans_v1.0_train.jsonl"]
    prepare("wiki18", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert next(read_corpus(data / "wiki18" / "corpus.jsonl")).title == "Evan Morris"


def test_prepare_twice_is_a_noop_unless_forced(tmp_path, mirror):
    data = tmp_path / "data"
    prepare("hotpotqa", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    created = json.loads((data / "hotpotqa" / MANIFEST).read_text())["created"]
    seen = len(mirror.requests)
    prepare("hotpotqa", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert len(mirror.requests) == seen
    (data / "hotpotqa" / "stale.txt").write_text("from the old build")
    prepare("hotpotqa", data_dir=data, base_url=mirror.url, progress=False, retrievers=(), force=True)
    assert len(mirror.requests) == seen + 2
    assert not (data / "hotpotqa" / "stale.txt").exists() and _leftovers(data) == ["hotpotqa"]
    assert json.loads((data / "hotpotqa" / MANIFEST).read_text())["created"] >= created


def test_mirror_from_environment(tmp_path, mirror, monkeypatch):
    monkeypatch.setenv("CAPO_DATA_MIRROR", mirror.url)
    prepare("wiki18", data_dir=tmp_path / "data", progress=False, retrievers=())
    assert is_prepared("wiki18", tmp_path / "data")


def test_dropped_connection_resumes_with_range_and_checksum_holds(tmp_path, mirror):
    path = "/datasets/hotpot/hotpot_train_v1.1.json"
    mirror.files[path].drop_after = 100
    prepare("hotpotqa", data_dir=tmp_path / "data", base_url=mirror.url, progress=False, retrievers=())
    assert mirror.ranges(path) == ["bytes=100-"]
    manifest = json.loads((tmp_path / "data" / "hotpotqa" / MANIFEST).read_text())
    assert manifest["files"]["raw/hotpot_train_v1.1.json"]["sha256"] == sha256_bytes(mirror.files[path].data)


def test_failed_prepare_keeps_finished_downloads_for_the_rerun(tmp_path, mirror):
    data = tmp_path / "data"
    dev = mirror.files.pop("/datasets/hotpot/hotpot_dev_distractor_v1.json")
    with pytest.raises(DownloadError, match="404"):
        prepare("hotpotqa", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert _leftovers(data) == [] and (data / ".downloads" / "hotpotqa" / "hotpot_train_v1.1.json").exists()
    mirror.files["/datasets/hotpot/hotpot_dev_distractor_v1.json"] = dev
    mirror.requests.clear()
    prepare("hotpotqa", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert [p for p, _ in mirror.requests] == ["/datasets/hotpot/hotpot_dev_distractor_v1.json"]


def test_corrupted_download_leaves_no_dataset_and_no_file(tmp_path, mirror):
    data = tmp_path / "data"
    served = mirror.files["/datasets/hotpot/hotpot_dev_distractor_v1.json"]
    served.data = served.data[:-2] + b"]]"
    with pytest.raises(ChecksumError):
        prepare("hotpotqa", data_dir=data, base_url=mirror.url, progress=False)
    assert _leftovers(data) == [] and not is_prepared("hotpotqa", data)
    assert not list((data / ".downloads" / "hotpotqa").glob("hotpot_dev*"))


TWOWIKI_ZIP = "/s/ms2m13252h6xubs/data_ids_april7.zip"


@pytest.fixture
def unpinned_2wiki(mirror, monkeypatch):
    """2wiki as upstream publishes it: no checksum or size, served here without Content-Length."""
    (remote,) = sources.SOURCES["2wiki"]
    monkeypatch.setitem(sources.SOURCES, "2wiki", (dataclasses.replace(remote, sha256=None, size=None),))
    mirror.files[TWOWIKI_ZIP].no_length = True
    return mirror.files[TWOWIKI_ZIP]


def _prepare_2wiki(data: Path, mirror, *flags: str) -> int:
    return data_main(["prepare", "2wiki", "--data-dir", str(data), "--mirror", mirror.url, "--quiet", *flags])


def test_cut_download_without_length_is_not_cached_as_complete(tmp_path, mirror, unpinned_2wiki):
    unpinned_2wiki.drop_after = 100  # the body simply ends early: nothing in HTTP says it was cut
    assert _prepare_2wiki(tmp_path / "data", mirror) == 0
    assert load_split("2wiki", "dev", data_dir=tmp_path / "data")[0].answers[0] == "United States"


def test_truncated_download_cached_by_an_older_version_is_fetched_again(tmp_path, mirror, unpinned_2wiki, capsys):
    cache = tmp_path / "data" / ".downloads" / "2wiki"
    cache.mkdir(parents=True)
    (cache / "data_ids_april7.zip").write_bytes(unpinned_2wiki.data[:100])  # what the old code kept
    assert _prepare_2wiki(tmp_path / "data", mirror) == 0, capsys.readouterr().err
    assert is_prepared("2wiki", tmp_path / "data")


def test_a_refused_archive_is_fetched_again_on_the_rerun(tmp_path, mirror, unpinned_2wiki, capsys):
    """A download complete as far as HTTP can tell but refused by the extractor is dropped from the cache,
    so the rerun fetches it again (it used to be reused, and refused, until --force)."""
    good, unpinned_2wiki.data = unpinned_2wiki.data, b"<not a zip: the mirror had a bad copy>"
    unpinned_2wiki.no_length = False  # complete as far as HTTP can tell
    assert _prepare_2wiki(tmp_path / "data", mirror) == 1
    assert "neither" in capsys.readouterr().err
    assert not list((tmp_path / "data" / ".downloads" / "2wiki").glob("data_ids_april7.zip*"))
    unpinned_2wiki.data = good
    mirror.requests.clear()
    assert _prepare_2wiki(tmp_path / "data", mirror) == 0
    assert [p.split("?")[0] for p, _ in mirror.requests] == [TWOWIKI_ZIP]
    mirror.requests.clear()
    assert _prepare_2wiki(tmp_path / "data", mirror, "--force") == 0  # --force downloads again
    assert [p.split("?")[0] for p, _ in mirror.requests] == [TWOWIKI_ZIP]
    assert is_prepared("2wiki", tmp_path / "data")


def test_ctrl_c_during_build_leaves_no_dataset(tmp_path, mirror, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_build_contents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare("wiki18", data_dir=tmp_path / "data", base_url=mirror.url, progress=False)
    assert _leftovers(tmp_path / "data") == []


def test_abandoned_build_of_a_dead_process_is_removed(tmp_path, mirror):
    data = tmp_path / "data"
    (data / "wiki18.tmp-999999999").mkdir(parents=True)
    prepare("wiki18", data_dir=data, base_url=mirror.url, progress=False, retrievers=())
    assert _leftovers(data) == ["wiki18"]


def test_path_traversal_archive_is_rejected(tmp_path, mirror, monkeypatch):
    evil = zip_bytes({"data_ids_april7/dev.json": b"[]", "../../evil.txt": b"pwned"})
    mirror.files["/s/ms2m13252h6xubs/data_ids_april7.zip"].data = evil
    (remote,) = sources.SOURCES["2wiki"]
    monkeypatch.setitem(sources.SOURCES, "2wiki", (dataclasses.replace(remote, sha256=sha256_bytes(evil), size=len(evil)),))
    with pytest.raises(UnsafeArchiveError):
        prepare("2wiki", data_dir=tmp_path / "data", base_url=mirror.url, progress=False)
    assert _leftovers(tmp_path / "data") == []
    assert not [p for p in tmp_path.rglob("evil.txt")]


def test_malformed_official_file_fails_prepare(tmp_path, mirror, monkeypatch):
    records = hotpot_records("dev")
    del records[1]["question"]
    bad = json.dumps(records).encode()
    mirror.files["/datasets/hotpot/hotpot_dev_distractor_v1.json"].data = bad
    train, dev = sources.SOURCES["hotpotqa"]
    monkeypatch.setitem(sources.SOURCES, "hotpotqa", (train, dataclasses.replace(dev, sha256=sha256_bytes(bad), size=len(bad))))
    with pytest.raises(ValueError, match=r"hotpot_dev_distractor_v1.json: record 1: missing field 'question'"):
        prepare("hotpotqa", data_dir=tmp_path / "data", base_url=mirror.url, progress=False)
    assert _leftovers(tmp_path / "data") == []


def test_archive_member_pin_is_checked(tmp_path, mirror, monkeypatch):
    (remote,) = sources.SOURCES["musique"]
    monkeypatch.setitem(sources.SOURCES, "musique", (dataclasses.replace(remote, members={"musique_ans_v1.0_dev.jsonl": "0" * 64}),))
    with pytest.raises(ValueError, match="musique_ans_v1.0_dev.jsonl has sha256"):
        prepare("musique", data_dir=tmp_path / "data", base_url=mirror.url, progress=False)
    assert _leftovers(tmp_path / "data") == []


def test_cli_prepare_list_verify(tmp_path, mirror, capsys):
    data = str(tmp_path / "data")
    assert data_main(["verify", "wiki18", "--data-dir", data]) == 1
    assert data_main(["prepare", "wiki18", "--data-dir", data, "--mirror", mirror.url, "--quiet"]) == 0
    capsys.readouterr()
    assert data_main(["list", "--data-dir", data]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert any(line.startswith("wiki18") and " prepared " in line for line in listing)
    assert any(line.startswith("musique") and "not prepared" in line for line in listing)
    assert data_main(["verify", "wiki18", "--data-dir", data]) == 0
    with open(Path(data) / "wiki18" / "corpus.jsonl", "a") as f:
        f.write('{"id": "x", "title": "t", "text": "tampered"}\n')
    assert data_main(["verify", "wiki18", "--data-dir", data]) == 1
    assert "changed: corpus.jsonl" in capsys.readouterr().out
    assert data_info("wiki18", data)[0]["counts"] == {"passages": len(WIKI18)}


def test_cli_reports_download_errors(tmp_path, mirror, capsys):
    mirror.files.clear()
    assert data_main(["prepare", "hotpotqa", "--data-dir", str(tmp_path), "--mirror", mirror.url, "--quiet"]) == 1
    assert "404" in capsys.readouterr().err


def test_source_table_is_complete():
    assert set(sources.SOURCES) == {"hotpotqa", "2wiki", "musique", "wiki18"}
    for remote in sum(sources.SOURCES.values(), ()):
        assert remote.url.startswith(("http://", "https://")) and remote.filename
        assert remote.sha256 is None or len(remote.sha256) == 64
    assert sources.mirrored("https://drive.google.com/uc?export=download&id=X", "http://m:1/") == (
        "http://m:1/uc?export=download&id=X")


# --- the real samples of ../shared/data, served as the official releases ---------------------------------


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")
def test_real_samples_prepare_end_to_end(tmp_path, monkeypatch):
    data = tmp_path / "data"
    expected = {
        "hotpotqa": {"train": 100, "dev": 53, "passages": 1515},
        "2wiki": {"train": 2, "dev": 2, "passages": 20},
        "musique": {"train": 100, "dev": 100, "passages": 3722},
        "wiki18": {"passages": 1000},
    }
    with FileServer() as server:
        serve(server, shared_files(tmp_path), monkeypatch)
        for name, counts in expected.items():
            prepare(name, data_dir=data, base_url=server.url, progress=False)
            assert json.loads((data / name / MANIFEST).read_text())["counts"] == counts
    assert load_split("hotpotqa", "dev", data_dir=data)[0].id == "5a8b57f25542995d1e6f1371"
    evan = next(read_corpus(data / "wiki18" / "corpus.jsonl"))
    assert (evan.id, evan.title) == ("0", "Evan Morris") and evan.text.startswith("Evan Morris Evan L. Morris")
    assert os.listdir(data / ".downloads") == []
