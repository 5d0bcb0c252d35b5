"""``capo data list`` and ``capo data verify`` for the domains (alfworld, webshop, papers), not only the QA sets."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

from data_prep.cli import data_main
from data_prep.manifest import file_records, read_manifest, write_manifest

from fixtures_official import FileServer
from test_alfworld_data import pinned_to, release_archives


def listing(capsys, *argv: str) -> dict[str, str]:
    capsys.readouterr()
    assert data_main(["list", *argv]) == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_alfworld_prepared_by_the_real_preparer_is_listed_and_verified(tmp_path, capsys):
    data = str(tmp_path / "data")
    with FileServer() as server:
        for url, body in release_archives().items():
            server.add(urllib.parse.urlsplit(url).path, body)
        with pinned_to(server):
            assert data_main(["prepare", "alfworld", "--data-dir", data, "--mirror", server.url, "--quiet"]) == 0
    line = listing(capsys, "--data-dir", data)["alfworld"]
    assert " prepared " in line and str(Path(data) / "alfworld") in line
    assert "(train games 2, valid_seen games 1, valid_unseen games 0)" in line

    assert data_main(["verify", "alfworld", "--data-dir", data]) == 0
    assert "alfworld: all 3 file(s) recorded in the manifest match" in capsys.readouterr().out
    flip_one_byte(Path(data) / "alfworld" / "raw" / "json_2.1.1_pddl.zip")
    assert data_main(["verify", "alfworld", "--data-dir", data]) == 1
    out = capsys.readouterr().out
    assert "changed: raw/json_2.1.1_pddl.zip" in out and "alfworld: FAILED, 1 problem(s)" in out


def test_webshop_prepared_by_the_real_preparer_is_listed_and_verified(tmp_path, monkeypatch, capsys):
    pytest.importorskip("thefuzz")
    from capo_envs.webshop.world import generate_catalog
    from test_webshop_prepare import official_files, serve_release

    raw, attrs = generate_catalog(seed=7, num_products=40)
    with FileServer() as server:
        serve_release(server, "small", official_files(raw, attrs), monkeypatch)
        assert data_main(["prepare", "webshop", "--size", "small", "--data-dir", str(tmp_path),
                          "--mirror", server.url, "--quiet"]) == 0  # fmt: skip
    lines = listing(capsys, "--data-dir", str(tmp_path))
    assert " prepared " in lines["webshop-small"] and str(tmp_path / "webshop-small") in lines["webshop-small"]
    assert "products 40" in lines["webshop-small"]
    assert "not prepared" in lines["webshop"]  # the full size has its own folder

    assert data_main(["verify", "webshop", "--data-dir", str(tmp_path)]) == 0  # every prepared size
    assert data_main(["verify", "webshop", "--size", "full", "--data-dir", str(tmp_path)]) == 1
    assert "capo data prepare webshop --size full" in capsys.readouterr().err
    flip_one_byte(tmp_path / "webshop-small" / "goals_human.json")
    assert data_main(["verify", "webshop", "--size", "small", "--data-dir", str(tmp_path)]) == 1
    assert "changed: goals_human.json" in capsys.readouterr().out


def write_papers_folder(root: Path) -> Path:
    """The layout and manifest records ``capo data prepare papers`` writes, without the downloads."""
    folder = root / "papers"
    (folder / "queries").mkdir(parents=True)
    (folder / "papers.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)))
    (folder / "queries" / "AutoScholarQuery-dev.jsonl").write_text('{"question": "q"}\n')
    write_manifest(folder, {"name": "papers", "format": 1, "counts": {"papers": 1234, "edges": 5},
                            "files": file_records(folder)})
    return folder


def test_papers_folder_is_listed_with_counts_and_verified(tmp_path, capsys):
    folder = write_papers_folder(tmp_path)
    line = listing(capsys, "--data-dir", str(tmp_path))["papers"]
    assert " prepared " in line and str(folder) in line and "(papers 1,234, edges 5)" in line
    assert data_main(["verify", "papers", "--data-dir", str(tmp_path)]) == 0
    flip_one_byte(folder / "papers.sqlite")
    assert data_main(["verify", "papers", "--data-dir", str(tmp_path)]) == 1
    assert "changed: papers.sqlite" in capsys.readouterr().out


def test_the_default_folder_follows_capo_data_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    write_papers_folder(tmp_path)
    lines = listing(capsys)
    assert " prepared " in lines["papers"] and str(tmp_path / "papers") in lines["papers"]
    assert str(tmp_path / "alfworld") in lines["alfworld"] and "not prepared" in lines["alfworld"]
    assert data_main(["verify", "papers"]) == 0


@pytest.mark.parametrize("name, folder", [("alfworld", "alfworld"), ("webshop", "webshop-small"), ("papers", "papers")])
def test_verify_a_missing_domain_says_how_to_prepare_it(tmp_path, capsys, name, folder):
    assert data_main(["verify", name, "--data-dir", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert f"{name} is not prepared" in err and str(tmp_path / "empty" / folder / "manifest.json") in err
    assert f"capo data prepare {name}" in err


def test_a_manifest_without_checksums_is_not_reported_as_verified(tmp_path, capsys):
    folder = write_papers_folder(tmp_path)
    manifest = read_manifest(folder)
    del manifest["files"]
    write_manifest(folder, manifest)
    assert data_main(["verify", "papers", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "NOT VERIFIED" in out and "match" not in out


def test_size_is_refused_outside_webshop(tmp_path, capsys):
    assert data_main(["verify", "alfworld", "--size", "small", "--data-dir", str(tmp_path)]) == 2
    assert "--size is for webshop only" in capsys.readouterr().err


def test_every_domain_module_has_the_same_entry_points():
    """``data_prep.domains``: each module has DATASETS, add_arguments, prepare and data_info, and every name
    of ``capo data prepare`` is one of theirs."""
    import argparse
    import importlib
    import inspect

    from data_prep.domains import MODULES, domains

    names = []
    for path in MODULES:
        module = importlib.import_module(path)
        assert module.DATASETS and callable(module.add_arguments) and callable(module.data_info)
        keywords = inspect.signature(module.prepare).parameters
        assert {"data_dir", "force", "base_url", "progress"} <= set(keywords)
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        options = {a.dest for a in parser._actions if a.dest != "help"}
        assert options <= set(keywords), f"{path}: options that are no keyword of prepare: {options - set(keywords)}"
        for name in module.DATASETS:
            info = module.data_info(name, "/nonexistent")
            assert info and all({"name", "path", "prepared", "prepare", "counts"} <= set(i) for i in info)
        names += module.DATASETS
    assert list(domains()) == names == ["hotpotqa", "2wiki", "musique", "wiki18", "alfworld", "webshop", "papers"]


def test_prepare_help_lists_every_dataset_and_a_domain_its_own_options(capsys):
    with pytest.raises(SystemExit):
        data_main(["prepare", "-h"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("hotpotqa", "wiki18", "alfworld", "webshop", "papers"))
    with pytest.raises(SystemExit):
        data_main(["prepare", "webshop", "-h"])
    out = capsys.readouterr().out
    assert "--size" in out and "--price-seed" in out and "--lucene" in out and "--data-dir" in out
