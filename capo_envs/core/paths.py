"""Where prepared data lives: ``$CAPO_DATA_DIR`` (default ``~/.cache/capo``), one folder per dataset."""

from __future__ import annotations

import os
from pathlib import Path


class DataNotPreparedError(FileNotFoundError):
    """Raised when an env needs data that ``capo data prepare`` has not built yet."""


def data_dir() -> Path:
    return Path(os.environ.get("CAPO_DATA_DIR") or Path.home() / ".cache" / "capo").expanduser()


def dataset_dir(name: str) -> Path:
    return data_dir() / name


def require(path: Path, what: str, command: str) -> Path:
    """Return ``path`` if it exists, else raise an error that names the command that builds it."""
    if not path.exists():
        raise DataNotPreparedError(f"{what} is not prepared (missing {path}). Run: {command}")
    return path


MANIFEST = "manifest.json"


def is_prepared(name: str, root: str | Path | None = None) -> bool:
    """``capo data prepare`` writes ``manifest.json`` last, so its presence means the dataset is complete.

    ``root``: the data folder (default ``$CAPO_DATA_DIR``)."""
    base = Path(root).expanduser() if root else data_dir()
    return (base / name / MANIFEST).is_file()
