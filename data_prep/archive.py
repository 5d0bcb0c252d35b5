"""Safe extraction of the zip and tar(.gz/.bz2/.xz) archives datasets are shipped in.

Every member is checked before it is written: absolute paths, ``..`` components, links that leave the
destination and device files are refused, so a hostile or broken archive cannot write outside its folder.
Caps (:class:`ArchiveLimits`) bound the member count, each member's size, the total size and the
compression ratio, so a zip bomb cannot fill the disk: the declared sizes are checked first, then the
bytes actually decompressed are counted while they are written (a header can lie). Extraction goes to a
temporary sibling folder that is renamed into place only when complete, so ``dest`` either holds the
whole archive or does not exist.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20


class ArchiveError(ValueError):
    """The archive cannot be extracted as it is: corrupt, truncated, hostile or over a cap."""


class UnsafeArchiveError(ArchiveError):
    """The archive has a member that would escape the destination or is not a plain file/folder."""


class ArchiveLimitError(ArchiveError):
    """The archive exceeds one of the caps of :class:`ArchiveLimits` (a zip bomb, or the wrong file)."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps on what one archive may unpack to. The defaults leave a wide margin over the real releases:
    ALFWorld's json_2.1.1_json.zip is 72 MB holding under 2 GB in tens of thousands of files, each JSON member
    compressing about 24x (a real traj_data.json: 23.9x); its PDDL and game archives are smaller (35-45 MB);
    MuSiQue's and 2Wiki's zips hold JSON of a few hundred MB (5-10x); WebShop ships no archive. A deflate
    bomb reaches about 1000x.

    ``max_ratio`` applies to each member of more than ``ratio_floor`` bytes (a small file of repeated bytes
    may compress far better without being a threat) and to the archive as a whole once it has unpacked more
    than ``ratio_floor`` bytes."""

    max_total_bytes: int = 16 << 30  # 16 GiB
    max_member_bytes: int = 4 << 30  # 4 GiB
    max_members: int = 500_000
    max_ratio: float = 200.0
    ratio_floor: int = 4 << 20  # 4 MiB


DEFAULT_LIMITS = ArchiveLimits()


def _n(value: int) -> str:
    return f"{value:,}"


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


def check_zip_member(archive: Path, info: zipfile.ZipInfo) -> str:
    name = _check_name(archive, info.filename)
    mode = (info.external_attr >> 16) & 0xFFFF
    if stat.S_ISLNK(mode):
        # zipfile would write the link as a small text file; datasets never need links. (zipfile
        # writes every other member as a plain file or folder, so no device check is needed.)
        raise UnsafeArchiveError(f"{archive}: member {name!r} is a symlink; zip symlinks are refused")
    return name


def check_zip(archive: Path, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        check_zip_member(archive, info)


def check_tar_member(archive: Path, member: tarfile.TarInfo) -> str:
    name = _check_name(archive, member.name)
    if member.issym():
        _check_symlink(archive, name, member.linkname)
    elif member.islnk():  # hard-link targets are archive paths, so the name rules apply
        _check_name(archive, member.linkname)
    elif not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"{archive}: member {name!r} is a device, FIFO or other special file")
    return name


def check_tar(archive: Path, tf: tarfile.TarFile) -> None:
    for member in tf.getmembers():
        check_tar_member(archive, member)


class _Budget:
    """Counts members and bytes against the caps; every check raises :class:`ArchiveLimitError`."""

    def __init__(self, archive: Path, limits: ArchiveLimits) -> None:
        self.archive, self.limits = archive, limits
        self.members = self.total = 0
        self.archive_bytes = max(archive.stat().st_size, 1)

    def member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise ArchiveLimitError(f"{self.archive.name}: more than {_n(self.limits.max_members)} members "
                                    f"(the cap on the member count)")

    def declared(self, name: str, size: int, compressed: int | None) -> None:
        """The sizes a header declares, before anything of the member is written."""
        self._member_size(name, size, "declares")
        if self.total + size > self.limits.max_total_bytes:
            raise ArchiveLimitError(f"{self.archive.name}: the members declare more than "
                                    f"{_n(self.limits.max_total_bytes)} bytes in all (the cap on the total size)")
        if compressed is not None:
            self._member_ratio(name, size, compressed, "declares")

    def written(self, name: str, member_bytes: int, declared: int, compressed: int | None, chunk: int) -> None:
        """After each chunk streamed to disk: the member's bytes so far and the archive's."""
        self.total += chunk
        if member_bytes > declared:
            raise ArchiveLimitError(f"{self.archive.name}: member {name!r} unpacks to more bytes than its header "
                                    f"declares ({_n(member_bytes)} so far, declared {_n(declared)})")
        self._member_size(name, member_bytes, "unpacks to")
        if self.total > self.limits.max_total_bytes:
            raise ArchiveLimitError(f"{self.archive.name}: unpacks to more than {_n(self.limits.max_total_bytes)} "
                                    f"bytes in all (the cap on the total size)")
        if compressed is not None:
            self._member_ratio(name, member_bytes, compressed, "unpacks to")
        self.stream(self.total)

    def stream(self, unpacked: int) -> None:
        """The whole archive's ratio: ``unpacked`` bytes (a tar: its decompressed stream) from the file."""
        ratio = unpacked / self.archive_bytes
        if unpacked > self.limits.ratio_floor and ratio > self.limits.max_ratio:
            raise ArchiveLimitError(f"{self.archive.name}: {_n(self.archive_bytes)} bytes unpack to more than "
                                    f"{_n(unpacked)} (compression ratio {ratio:.0f}, over the cap of "
                                    f"{self.limits.max_ratio:g}): a zip bomb or not the expected archive")

    def _member_size(self, name: str, size: int, verb: str) -> None:
        if size > self.limits.max_member_bytes:
            raise ArchiveLimitError(f"{self.archive.name}: member {name!r} {verb} {_n(size)} bytes, over the cap of "
                                    f"{_n(self.limits.max_member_bytes)} bytes per member")

    def _member_ratio(self, name: str, size: int, compressed: int, verb: str) -> None:
        ratio = size / max(compressed, 1)
        if size > self.limits.ratio_floor and ratio > self.limits.max_ratio:
            raise ArchiveLimitError(f"{self.archive.name}: member {name!r} {verb} {_n(size)} bytes from "
                                    f"{_n(compressed)} (compression ratio {ratio:.0f}, over the cap of "
                                    f"{self.limits.max_ratio:g}): a zip bomb or not the expected archive")


def _target(root: Path, name: str) -> Path:
    target = root / name
    if os.path.commonpath([root, target.resolve()]) != str(root):  # e.g. through a link extracted earlier
        raise UnsafeArchiveError(f"member {name!r} would be written outside the destination")
    return target


def _copy(source: BinaryIO, target: Path, budget: _Budget, name: str, declared: int, compressed: int | None) -> None:
    written = 0
    with open(target, "wb") as out:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            budget.written(name, written, declared, compressed, len(chunk))
            out.write(chunk)


def _extract_zip(archive: Path, zf: zipfile.ZipFile, root: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(archive, limits)
    infos = zf.infolist()
    for info in infos:  # every name and declared size before anything is written
        budget.member()
        check_zip_member(archive, info)
    declared_total = 0
    for info in infos:
        budget.declared(info.filename, info.file_size, info.compress_size)
        declared_total += info.file_size
        if declared_total > limits.max_total_bytes:
            raise ArchiveLimitError(f"{archive.name}: the members declare more than {_n(limits.max_total_bytes)} "
                                    f"bytes in all (the cap on the total size)")
    for info in infos:
        name = check_zip_member(archive, info)
        target = _target(root, name)
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with zf.open(info) as source:
                _copy(source, target, budget, info.filename, info.file_size, info.compress_size)
        except zipfile.BadZipFile as error:
            if "CRC" in str(error):
                raise ArchiveError(f"{archive.name}: member {info.filename!r} fails its CRC check (the archive is "
                                   f"corrupt; delete it and rerun)") from None
            raise ArchiveError(f"{archive.name}: member {info.filename!r} is damaged ({error}): the archive is "
                               f"corrupt; delete it and rerun") from None
        except (zlib.error, EOFError, NotImplementedError) as error:
            raise ArchiveError(f"{archive.name}: member {info.filename!r} cannot be decompressed ({error})") from None


def _extract_tar(archive: Path, tf: tarfile.TarFile, root: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(archive, limits)
    links = []
    while True:
        member = tf.next()  # reads the stream up to this header only
        if member is None:
            break
        budget.stream(tf.offset)
        budget.member()
        name = check_tar_member(archive, member)
        target = _target(root, name)
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif member.isfile():
            budget.declared(member.name, member.size, None)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tf.extractfile(member)
            assert source is not None
            with source:
                _copy(source, target, budget, member.name, member.size, None)
        else:
            links.append(member)  # made once every file is in place
    for member in links:
        target = _target(root, _check_name(archive, member.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        if member.issym():
            os.symlink(member.linkname, target)
        else:
            source = _target(root, _check_name(archive, member.linkname))
            if not source.is_file():
                raise UnsafeArchiveError(f"{archive}: hard link {member.name!r} points to {member.linkname!r}, "
                                         f"which is not a file of the archive")
            os.link(source, target)


def extract(archive: str | Path, dest: str | Path, *, limits: ArchiveLimits = DEFAULT_LIMITS) -> Path:
    """Extract ``archive`` (zip or tar, any compression) into the new folder ``dest``; return ``dest``.

    Raises :class:`ArchiveError` (a ``ValueError``) when the archive is corrupt, hostile or over a cap of
    ``limits``; nothing is left behind then."""
    archive, dest = Path(archive), Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; extraction needs a new folder")
    tmp = dest.with_name(f".{dest.name}.extracting-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    root = tmp.resolve()
    try:
        if zipfile.is_zipfile(archive):
            try:
                with zipfile.ZipFile(archive) as zf:
                    _extract_zip(archive, zf, root, limits)
            except zipfile.BadZipFile as error:
                raise ArchiveError(f"{archive.name} is not a valid zip archive ({error})") from None
        elif tarfile.is_tarfile(archive):
            try:
                with tarfile.open(archive, "r:*") as tf:
                    _extract_tar(archive, tf, root, limits)
            except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
                if isinstance(error, OSError) and error.errno is not None:
                    raise  # a disk error, not the archive's
                raise ArchiveError(f"{archive.name} is a truncated or corrupt tar archive ({error})") from None
        else:
            raise ArchiveError(f"{archive} is neither a zip nor a tar archive")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
