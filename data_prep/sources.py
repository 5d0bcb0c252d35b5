"""A download (:class:`Remote`), how a mirror replaces its host, and :func:`fetch`; ``SOURCES``: the QA
datasets' downloads (the other domains keep their tables in their own modules).

``sha256``/``size`` are pinned only where a published record of them was found (see ``note``);
otherwise the sha256 is computed after download and recorded in the dataset's manifest.
``members`` pins official files inside an archive when their hashes are known.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from .download import download, gdrive_url, sha256_file

log = logging.getLogger(__name__)

MIRROR_ENV = "CAPO_DATA_MIRROR"


@dataclass(frozen=True)
class Remote:
    url: str
    filename: str  # the name in the download cache
    sha256: str | None = None
    size: int | None = None
    archive: bool = False  # extract it, then keep only the dataset's official files
    members: dict[str, str] = field(default_factory=dict)  # file name inside the archive -> sha256
    note: str = ""
    max_bytes: int | None = None  # without a pinned size: the most bytes a download may bring


SOURCES: dict[str, tuple[Remote, ...]] = {
    "hotpotqa": (
        Remote(
            "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json",
            "hotpot_train_v1.1.json",
            sha256="26650cf50234ef5fb2e664ed70bbecdfd87815e6bffc257e068efea5cf7cd316",
            size=566_426_227,
            note="size and sha256 as recorded by huggingface/datasets (datasets/hotpot_qa/dataset_infos.json)",
        ),
        Remote(
            "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
            "hotpot_dev_distractor_v1.json",
            sha256="4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea",
            size=46_320_117,
            note="size and sha256 as recorded by huggingface/datasets (datasets/hotpot_qa/dataset_infos.json)",
        ),
    ),
    "2wiki": (
        Remote(
            "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1",
            "data_ids_april7.zip",
            archive=True,
            note="Alab-NII/2wikimultihop README (update of April 7, 2021); no published checksum",
        ),
    ),
    "musique": (
        Remote(
            gdrive_url("1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h"),
            "musique_v1.0.zip",
            archive=True,
            members={
                "musique_ans_v1.0_dev.jsonl": "15fa63794d18a94ce12411aca6e2327e65b6e83b0b1490efab3f1962e48abf3b",
                "musique_ans_v1.0_train.jsonl": "83a75b1e11e4e9bb8f8308e72ac40ca617ae4431b3a0d955b61cab259248490a",
            },
            note="Drive id from StonyBrookNLP/musique download_data.sh; member sha256s as other projects "
            "recorded them (dev agreed by two, train by one); no published checksum of the zip",
        ),
    ),
    "wiki18": (
        Remote(
            "https://huggingface.co/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz",
            "wiki-18.jsonl.gz",
            note="Search-R1's retrieval corpus (https://github.com/PeterGriffinJin/Search-R1/blob/main/scripts/download.py); no checksum seen",
        ),
    ),
}


def mirrored(url: str, base_url: str | None = None) -> str:
    """``url`` with its scheme and host replaced by ``base_url`` (else ``$CAPO_DATA_MIRROR``), if set.

    The path and query are kept, so a mirror is a plain static file server holding each file at the
    same path as upstream, e.g. ``<mirror>/datasets/hotpot/hotpot_train_v1.1.json``.
    """
    base = base_url or os.environ.get(MIRROR_ENV)
    if not base:
        return url
    parts = urllib.parse.urlsplit(url)
    return base.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")


def fetch(remote: Remote, cache: Path, *, base_url: str | None, progress: bool, force: bool,
          pinned_in: str) -> tuple[dict, Path]:
    """Download ``remote`` into ``cache`` (resumed, checked against its pins) and return the manifest's
    record of it with the path. ``force`` fetches again even a complete earlier download (``--force``);
    ``pinned_in`` names the file that pins its sha256, for the record."""
    url = mirrored(remote.url, base_url)
    log.info("downloading %s", url)
    path = download(url, cache / remote.filename, sha256=remote.sha256, size=remote.size, progress=progress,
                    force=force, max_bytes=remote.max_bytes)
    record = {
        "url": url,
        "upstream_url": remote.url,
        "file": remote.filename,
        "bytes": path.stat().st_size,
        "sha256": remote.sha256 or sha256_file(path),
        "sha256_source": f"pinned in {pinned_in}, verified" if remote.sha256 else "computed after download",
    }
    return record, path
