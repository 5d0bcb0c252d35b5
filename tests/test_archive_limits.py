"""Extraction caps: total size, member size, member count and compression ratio, enforced on the bytes
actually decompressed (headers can lie), for zip and tar archives."""

from __future__ import annotations

import io
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from data_prep.archive import DEFAULT_LIMITS, ArchiveError, ArchiveLimitError, ArchiveLimits, extract


def _bomb_zip(path: Path, size: int, name: str = "json_2.1.1/bomb.json") -> Path:
    """One member of ``size`` zero bytes, deflated (a ratio of about 1000)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open(name, "w", force_zip64=True) as out:
        chunk = b"\0" * (1 << 20)
        for _ in range(size // len(chunk)):
            out.write(chunk)
    return path


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_zip_bomb_is_refused_by_the_default_ratio_cap(tmp_path):
    z = _bomb_zip(tmp_path / "bomb.zip", 64 << 20)
    assert z.stat().st_size < 200_000
    with pytest.raises(ArchiveLimitError, match=r"compression ratio") as error:
        extract(z, tmp_path / "out")
    message = str(error.value)
    assert "bomb.json" in message and f"{DEFAULT_LIMITS.max_ratio:g}" in message
    assert _leftovers(tmp_path) == ["bomb.zip"]


def test_every_cap_names_itself_and_the_numbers(tmp_path):
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for i in range(5):
            zf.writestr(f"d/{i}.txt", b"x" * 1000)
    cases = [
        (ArchiveLimits(max_members=3), r"more than 3 members"),
        (ArchiveLimits(max_member_bytes=500), r"member 'd/0.txt'.* 1,000 bytes.*cap of 500"),
        (ArchiveLimits(max_total_bytes=2500), r"more than 2,500 bytes in all"),
    ]
    for limits, pattern in cases:
        with pytest.raises(ArchiveLimitError, match=pattern):
            extract(z, tmp_path / "out", limits=limits)
        assert _leftovers(tmp_path) == ["a.zip"]
    assert len(list(extract(z, tmp_path / "ok", limits=ArchiveLimits(max_members=5)).rglob("*.txt"))) == 5


def _patch_declared_size(data: bytes, declared: int) -> bytes:
    """Rewrite the uncompressed size in the local header and the central directory of a one-member zip."""
    out = bytearray(data)
    local = out.index(b"PK\x03\x04")
    struct.pack_into("<I", out, local + 22, declared)
    central = out.index(b"PK\x01\x02")
    struct.pack_into("<I", out, central + 24, declared)
    return bytes(out)


def test_a_member_larger_than_its_header_says_is_caught_while_streaming(tmp_path):
    """The header declares 1,000 bytes (under every cap, ratio 1): the check of the declared sizes passes,
    the stream gives more, and the extraction stops without keeping anything."""
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("big.bin", b"y" * 200_000)
    lying = tmp_path / "lying.zip"
    lying.write_bytes(_patch_declared_size(plain.read_bytes(), 1000))
    with pytest.raises(ArchiveError):
        extract(lying, tmp_path / "out", limits=ArchiveLimits(max_member_bytes=100_000))
    assert _leftovers(tmp_path) == ["lying.zip", "plain.zip"]


def test_streamed_bytes_are_counted_not_the_declared_ones(tmp_path, monkeypatch):
    """Even if the zip reader handed over more bytes than declared, the streamed count is what is capped."""
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("a.bin", b"z" * 10_000)
    real_open = zipfile.ZipFile.open

    def generous_open(self, name, *args, **kwargs):
        inner = real_open(self, name, *args, **kwargs)
        return io.BytesIO(inner.read() * 50)  # 500,000 bytes behind a header of 10,000

    monkeypatch.setattr(zipfile.ZipFile, "open", generous_open)
    with pytest.raises(ArchiveLimitError, match=r"more bytes than its header declares|cap of 100,000"):
        extract(z, tmp_path / "out", limits=ArchiveLimits(max_member_bytes=100_000))
    assert _leftovers(tmp_path) == ["a.zip"]


def test_a_tar_gz_bomb_is_refused(tmp_path):
    t = tmp_path / "bomb.tar.gz"
    with tarfile.open(t, "w:gz") as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 64 << 20
        tf.addfile(info, io.BytesIO(b"\0" * info.size))
    with pytest.raises(ArchiveLimitError, match="compression ratio"):
        extract(t, tmp_path / "out")
    assert _leftovers(tmp_path) == ["bomb.tar.gz"]


def test_tar_member_count_and_size_caps(tmp_path):
    t = tmp_path / "a.tar"
    with tarfile.open(t, "w") as tf:
        for i in range(4):
            info = tarfile.TarInfo(f"d/{i}.txt")
            info.size = 2000
            tf.addfile(info, io.BytesIO(b"q" * 2000))
    with pytest.raises(ArchiveLimitError, match="more than 2 members"):
        extract(t, tmp_path / "out", limits=ArchiveLimits(max_members=2))
    with pytest.raises(ArchiveLimitError, match="cap of 1,000"):
        extract(t, tmp_path / "out", limits=ArchiveLimits(max_member_bytes=1000))
    with pytest.raises(ArchiveLimitError, match="more than 5,000 bytes in all"):
        extract(t, tmp_path / "out", limits=ArchiveLimits(max_total_bytes=5000))
    assert _leftovers(tmp_path) == ["a.tar"]
    assert len(list(extract(t, tmp_path / "ok").rglob("*.txt"))) == 4


def test_a_corrupt_zip_member_is_an_archive_error_naming_it(tmp_path):
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("d/x.json", b"0123456789" * 100)
    data = bytearray(z.read_bytes())
    data[40] ^= 0xFF
    z.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match=r"'d/x.json' fails its CRC check"):
        extract(z, tmp_path / "out")
    assert _leftovers(tmp_path) == ["a.zip"]


def test_a_truncated_tar_gz_is_an_archive_error(tmp_path):
    t = tmp_path / "a.tar.gz"
    with tarfile.open(t, "w:gz") as tf:
        info = tarfile.TarInfo("x.bin")
        info.size = 100_000
        tf.addfile(info, io.BytesIO(bytes(range(256)) * 390 + b"x" * 160))
    t.write_bytes(t.read_bytes()[:-200])
    with pytest.raises(ArchiveError):
        extract(t, tmp_path / "out")
    assert _leftovers(tmp_path) == ["a.tar.gz"]


def test_the_default_caps_fit_the_real_releases():
    """ALFWorld's json_2.1.1_json.zip: 72 MB holding about 1.8 GB of traj_data.json (about 24x each, the
    real file in ../shared compresses 23.9x); the PDDL and game archives are smaller; WebShop ships no archive."""
    assert DEFAULT_LIMITS.max_ratio >= 5 * 24
    assert DEFAULT_LIMITS.max_total_bytes >= 4 * 1_800_000_000
    assert DEFAULT_LIMITS.max_members >= 10 * 12_000
    assert DEFAULT_LIMITS.max_ratio < 1000  # a deflate bomb reaches about 1000x
