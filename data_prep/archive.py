"""Safe extraction of the zip and tar(.gz/.bz2/.xz) archives datasets are shipped in.

Every member is checked before anything is written: absolute paths, ``..`` components, links that
leave the destination and device files are refused, so a hostile or broken archive cannot write
outside its folder. Extraction goes to a temporary sibling folder that is renamed into place only
when complete, so ``dest`` either holds the whole archive or does not exist.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path


class UnsafeArchiveError(ValueError):
    """The archive has a member that would escape the destination or is not a plain file/folder."""


def _check_name(archive: Path, name: str) -> str:
    """Return the member's normalised relative path, or raise if it is absolute or climbs out."""
    unixy = name.replace("\\", "/")
    if unixy.startswith("/") or (len(unixy) > 1 and unixy[1] == ":"):
        raise UnsafeArchiveError(f"{archive}: member {name!r} has an absolute path")
    if ".." in unixy.split("/"):
        raise UnsafeArchiveError(f"{archive}: member {name!r} contains '..'")
    return posixpath.normpath(unixy)


def _check_symlink(archive: Path, name: str, target: str) -> None:
    """A symlink may only point inside the archive; its target resolves from the member's own folder."""
    if target.startswith("/") or (len(target) > 1 and target[1] == ":"):
        raise UnsafeArchiveError(f"{archive}: link {name!r} points to the absolute path {target!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target.replace("\\", "/")))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeArchiveError(f"{archive}: link {name!r} points outside the archive ({target!r})")


def check_zip(archive: Path, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        name = _check_name(archive, info.filename)
        mode = (info.external_attr >> 16) & 0xFFFF
        if stat.S_ISLNK(mode):
            # zipfile would write the link as a small text file; datasets never need links. (zipfile
            # writes every other member as a plain file or folder, so no device check is needed.)
            raise UnsafeArchiveError(f"{archive}: member {name!r} is a symlink; zip symlinks are refused")


def check_tar(archive: Path, tf: tarfile.TarFile) -> None:
    for member in tf.getmembers():
        name = _check_name(archive, member.name)
        if member.issym():
            _check_symlink(archive, name, member.linkname)
        elif member.islnk():  # hard-link targets are archive paths, so the name rules apply
            _check_name(archive, member.linkname)
        elif not (member.isfile() or member.isdir()):
            raise UnsafeArchiveError(f"{archive}: member {name!r} is a device, FIFO or other special file")


def extract(archive: str | Path, dest: str | Path) -> Path:
    """Extract ``archive`` (zip or tar, any compression) into the new folder ``dest``; return ``dest``."""
    archive, dest = Path(archive), Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; extraction needs a new folder")
    tmp = dest.with_name(f".{dest.name}.extracting-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                check_zip(archive, zf)
                zf.extractall(tmp)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive, "r:*") as tf:
                check_tar(archive, tf)
                if hasattr(tarfile, "data_filter"):  # a second guard where Python has it (3.10.12+)
                    tf.extractall(tmp, filter="data")
                else:
                    tf.extractall(tmp)
        else:
            raise ValueError(f"{archive} is neither a zip nor a tar archive")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
