"""What every domain's ``prepare`` shares: the data root, the all-or-nothing build folder, the error for
files that are not what a build expects, and the package versions a manifest records."""

from __future__ import annotations

import os
import platform
import shutil
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Iterator

from capo_envs.core.paths import data_dir as default_data_dir


class PrepareError(RuntimeError):
    """The downloaded files are not what the build expects (a changed upstream release, a corrupt file)."""


class BadFileError(PrepareError):
    """One downloaded file (``path``) is unreadable or of the wrong shape: the preparer deletes it from the
    download cache, so the rerun fetches it again instead of refusing the same bytes."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


def data_root(data_dir: str | Path | None) -> Path:
    """``data_dir``, else ``$CAPO_DATA_DIR`` or ``~/.cache/capo``."""
    return Path(data_dir).expanduser() if data_dir else default_data_dir()


def versions() -> dict[str, str]:
    """Python's version and those of the packages that shape a build, for the manifest."""
    found = {"python": platform.python_version()}
    for package in ("capo-gym", "bm25s", "tantivy", "faiss-cpu", "torch", "transformers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


@contextmanager
def building(root: Path, name: str) -> Iterator[Path]:
    """A fresh, empty ``<root>/<name>.tmp-<pid>`` to build a dataset in. When the block ends normally it
    replaces ``<root>/<name>`` (:func:`_swap_into_place`); on any error (Ctrl-C included) it is deleted, so
    a failed or interrupted run never leaves a half-written dataset. Builds abandoned by killed processes
    are removed first."""
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(root, name)
    build = root / f"{name}.tmp-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    try:
        yield build
        _swap_into_place(build, root / name)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise


def link_or_copy(src: Path, dest: Path) -> None:
    """A hard link keeps a download in its cache (for a rerun) without a second copy on disk."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _swap_into_place(build: Path, final: Path) -> None:
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(build, final)
    shutil.rmtree(old, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned_builds(root: Path, name: str) -> None:
    """Delete ``<name>.tmp-<pid>`` / ``.old-<pid>`` folders left by processes that were killed."""
    for path in list(root.glob(f"{name}.tmp-*")) + list(root.glob(f"{name}.old-*")):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
