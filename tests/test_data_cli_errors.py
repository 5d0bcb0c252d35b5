"""``capo data ...`` never ends in a Python traceback for bad input: every failure is one ``capo data ...: ...``
line on stderr with exit code 1 (130 for Ctrl-C)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep import domains
from data_prep.cli import data_main

ROOT = Path(__file__).resolve().parents[1]


def one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0]


@pytest.mark.parametrize("error", [TypeError("'NoneType' object is not subscriptable"), KeyError("asin"),
                                   AttributeError("'list' object has no attribute 'get'"), EOFError("truncated"),
                                   RuntimeError("line one\nline two")])
def test_an_unexpected_error_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, error):
    module = domains.domains()["wiki18"]

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(module, "prepare", broken)
    assert data_main(["prepare", "wiki18", "--data-dir", str(tmp_path), "--quiet"]) == 1
    line = one_line(capsys, "capo data prepare wiki18: ")
    assert type(error).__name__ in line or str(error).split("\n")[0] in line


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    module = domains.domains()["wiki18"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "prepare", interrupted)
    assert data_main(["prepare", "wiki18", "--data-dir", str(tmp_path), "--quiet"]) == 130
    assert "interrupted" in one_line(capsys, "capo data prepare wiki18: ")


def test_a_corrupt_manifest_reads_as_not_prepared(tmp_path, capsys):
    """A manifest that is not a JSON object (hand-edited, a disk error) does not crash list, verify or
    prepare: the folder reads as not prepared, and prepare rebuilds it."""
    for body in ("{not json", "[1, 2]", "null", "\xff"):
        folder = tmp_path / "wiki18"
        folder.mkdir(exist_ok=True)
        (folder / "manifest.json").write_text(body, encoding="latin-1")
        assert data_main(["list", "--data-dir", str(tmp_path)]) == 0
        assert "not prepared" in [line for line in capsys.readouterr().out.splitlines() if line.startswith("wiki18")][0]
        assert data_main(["verify", "wiki18", "--data-dir", str(tmp_path)]) == 1
        assert "wiki18 is not prepared" in one_line(capsys, "wiki18 is not prepared")
        assert not domains.is_prepared("wiki18", tmp_path)


def test_a_corrupt_manifest_does_not_stop_a_rebuild(tmp_path, monkeypatch, capsys):
    """Without --force, a folder whose manifest does not parse is rebuilt, not reported as prepared."""
    from data_prep import qa

    called = []
    monkeypatch.setattr(qa, "building", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("rebuilding")))
    (tmp_path / "wiki18").mkdir()
    (tmp_path / "wiki18" / "manifest.json").write_text("{broken")
    assert data_main(["prepare", "wiki18", "--data-dir", str(tmp_path), "--quiet"]) == 1
    assert "rebuilding" in one_line(capsys, "capo data prepare wiki18: ") and not called


def test_the_capo_command_prints_no_traceback(tmp_path):
    """End to end through ``python -m data_prep.cli``: a mirror that does not answer."""
    result = subprocess.run([sys.executable, "-m", "data_prep.cli", "prepare", "wiki18", "--data-dir", str(tmp_path),
                             "--mirror", "http://127.0.0.1:9", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={"PATH": "/usr/bin:/bin", "CAPO_DATA_DIR": str(tmp_path)})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("capo data prepare wiki18: ")
    assert json.dumps(result.stderr)  # printable
