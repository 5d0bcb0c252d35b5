"""``capo data prepare|list|verify``: the main ``capo`` command hands ``data ...`` to :func:`data_main`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from capo_envs.core.paths import MANIFEST, DataNotPreparedError

from .datasets import DATASETS, dataset_info, prepare, verify
from .download import DownloadError
from .manifest import folder_bytes, read_manifest, verify_files

# Domains whose data is not a QA corpus: each module has its own parser, ``prepare_main(argv) -> int``, and
# ``data_info(data_dir) -> list[dict]`` (one entry per folder it prepares: name, path, prepared, prepare, counts).
DOMAIN_PREPARERS = {"alfworld": "data_prep.alfworld", "webshop": "data_prep.webshop", "papers": "data_prep.papers"}


def _domain_info(name: str, data_dir: str | None) -> list[dict]:
    return importlib.import_module(DOMAIN_PREPARERS[name]).data_info(data_dir)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capo data", description="Download and index the QA datasets and corpora.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download a dataset and build its corpus and indexes")
    p.add_argument("name", choices=DATASETS + tuple(DOMAIN_PREPARERS),
                   help="a QA dataset, or a domain (each domain has its own options: capo data prepare NAME -h)")
    p.add_argument("--data-dir", help="default: $CAPO_DATA_DIR or ~/.cache/capo")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    p.add_argument("--dense", action="store_true", help="also build the dense index (needs the [dense] extra)")
    p.add_argument("--mirror", help="replace the download hosts with this base URL (or set $CAPO_DATA_MIRROR)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p = sub.add_parser("list", help="show each dataset and domain, whether it is prepared, where and how big")
    p.add_argument("--data-dir")
    p = sub.add_parser("verify", help="re-check the sha256 of every file in a dataset's or domain's manifest")
    p.add_argument("name", choices=DATASETS + tuple(DOMAIN_PREPARERS))
    p.add_argument("--data-dir")
    p.add_argument("--size", choices=("small", "full"), help="webshop only (default: every prepared size)")
    return parser


def data_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "prepare" and argv[1] in DOMAIN_PREPARERS:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        return importlib.import_module(DOMAIN_PREPARERS[argv[1]]).prepare_main(argv[2:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command == "prepare":
        retrievers = ("bm25", "dense") if args.dense else ("bm25",)
        try:
            prepare(args.name, data_dir=args.data_dir, force=args.force, retrievers=retrievers,
                    base_url=args.mirror, progress=not args.quiet)
        except (DownloadError, ValueError) as e:
            print(f"capo data prepare {args.name}: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "list":
        infos = [dataset_info(name, args.data_dir) for name in DATASETS]
        infos += [{**info, "bytes": folder_bytes(Path(info["path"]))}
                  for domain in DOMAIN_PREPARERS for info in _domain_info(domain, args.data_dir)]
        width = max(len(info["name"]) for info in infos)
        for info in infos:
            state = "prepared" if info["prepared"] else "not prepared"
            counts = ", ".join(f"{k} {v:,}" for k, v in info["counts"].items())
            print(f"{info['name']:<{width}} {state:<13} {_size(info['bytes']):>10}  {info['path']}"
                  + (f"  ({counts})" if counts else ""))
        return 0
    if args.size and args.name != "webshop":
        print(f"capo data verify: --size is for webshop only, not {args.name}", file=sys.stderr)
        return 2
    if args.name in DOMAIN_PREPARERS:
        return _verify_domain(args.name, args.data_dir, args.size)
    try:
        problems = verify(args.name, args.data_dir)
    except DataNotPreparedError as e:
        print(e, file=sys.stderr)
        return 1
    for line in problems:
        print(line)
    print(f"{args.name}: {'FAILED, ' + str(len(problems)) + ' problem(s)' if problems else 'all files match the manifest'}")
    return 1 if problems else 0


def _verify_domain(name: str, data_dir: str | None, size: str | None) -> int:
    """Like the QA datasets' verify, for each prepared folder of a domain (webshop: each size, or ``size``)."""
    infos = [info for info in _domain_info(name, data_dir) if size is None or info.get("size") == size]
    prepared = [info for info in infos if info["prepared"]]
    if not prepared:
        missing = " or ".join(str(Path(info["path"]) / MANIFEST) for info in infos)
        print(f"{name} is not prepared (no {missing}). Run: " + " or ".join(info["prepare"] for info in infos),
              file=sys.stderr)
        return 1
    failed = False
    for info in prepared:
        path = Path(info["path"])
        manifest = read_manifest(path)
        if not manifest.get("files"):
            # Nothing to re-hash: saying "all files match" would claim a check that did not happen.
            print(f"{info['name']}: NOT VERIFIED, its manifest ({path / MANIFEST}) records no file checksums")
            failed = True
            continue
        problems = verify_files(path, manifest)
        for line in problems:
            print(line)
        n = len(manifest["files"])
        print(f"{info['name']}: " + (f"FAILED, {len(problems)} problem(s)" if problems
                                     else f"all {n} file(s) recorded in the manifest match"))
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(data_main())
