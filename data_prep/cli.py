"""``capo data prepare|list|verify``: the main ``capo`` command hands ``data ...`` to :func:`data_main`."""

from __future__ import annotations

import argparse
import logging
import sys

from capo_envs.core.paths import DataNotPreparedError

from .datasets import DATASETS, dataset_info, prepare, verify
from .download import DownloadError

# Domains whose data is not a QA corpus: each module has its own parser, ``prepare_main(argv) -> int``.
DOMAIN_PREPARERS = {"alfworld": "data_prep.alfworld", "webshop": "data_prep.webshop", "papers": "data_prep.papers"}


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
    p = sub.add_parser("list", help="show each dataset, whether it is prepared, where and how big")
    p.add_argument("--data-dir")
    p = sub.add_parser("verify", help="re-check the sha256 of every file in a dataset's manifest")
    p.add_argument("name", choices=DATASETS)
    p.add_argument("--data-dir")
    return parser


def data_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "prepare" and argv[1] in DOMAIN_PREPARERS:
        import importlib

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
        for name in DATASETS:
            info = dataset_info(name, args.data_dir)
            state = "prepared" if info["prepared"] else "not prepared"
            counts = ", ".join(f"{k} {v:,}" for k, v in info["counts"].items())
            print(f"{name:<9} {state:<13} {_size(info['bytes']):>10}  {info['path']}" + (f"  ({counts})" if counts else ""))
        return 0
    try:
        problems = verify(args.name, args.data_dir)
    except DataNotPreparedError as e:
        print(e, file=sys.stderr)
        return 1
    for line in problems:
        print(line)
    print(f"{args.name}: {'FAILED, ' + str(len(problems)) + ' problem(s)' if problems else 'all files match the manifest'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(data_main())
