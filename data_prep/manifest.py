"""``manifest.json``: what a prepared dataset holds, with checksums. Its presence marks completion."""

from __future__ import annotations

import json
import os
from pathlib import Path

from capo_envs.core.paths import MANIFEST

from .download import sha256_file

FORMAT = 1


def file_records(root: Path) -> dict[str, dict]:
    """sha256 and size of every file under ``root`` except the manifest, keyed by relative path."""
    records = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        records[path.relative_to(root).as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return records


def folder_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (0 when it does not exist): what ``capo data list`` shows."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def write_manifest(root: Path, manifest: dict) -> Path:
    """Write atomically (temp file + rename), so a reader never sees half a manifest."""
    path = root / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_manifest(root: Path) -> dict | None:
    """The manifest of ``root``, or None when there is none or it is not a JSON object (a damaged or
    hand-edited one): such a folder reads as not prepared, and ``capo data prepare`` rebuilds it."""
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


def is_complete(root: Path) -> bool:
    """Whether ``root`` holds a prepared dataset: a readable manifest (written last)."""
    return read_manifest(root) is not None


def verify_files(root: Path, manifest: dict) -> list[str]:
    """Re-hash every file the manifest lists; returns one line per missing or changed file."""
    problems = []
    files = manifest.get("files", {})
    for rel, expected in (files.items() if isinstance(files, dict) else ()):
        path = root / rel
        if not isinstance(expected, dict) or not {"bytes", "sha256"} <= set(expected):
            problems.append(f"unreadable record: {rel}")
        elif not path.is_file():
            problems.append(f"missing: {rel}")
        elif path.stat().st_size != expected["bytes"] or sha256_file(path) != expected["sha256"]:
            problems.append(f"changed: {rel}")
    return problems
