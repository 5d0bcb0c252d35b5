"""``capo data prepare|list|verify``: the main ``capo`` command hands ``data ...`` to :func:`data_main`.

Every dataset name goes through the table of ``data_prep.domains``; a domain's own options of
``capo data prepare NAME`` come from its ``add_arguments`` (``capo data prepare NAME -h``).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path

from capo_envs.core.paths import MANIFEST

from .building import PrepareError
from .domains import check_folder, domains, not_prepared_message
from .download import DownloadError
from .manifest import folder_bytes, read_manifest

# The options of ``capo data prepare NAME`` every domain has; the others are keywords of its ``prepare``.
COMMON = ("command", "name", "data_dir", "force", "mirror", "quiet")
# What bad input, a bad mirror or a full disk raise: their message is the whole story. Anything else is
# reported with its type too (a bug, or a failure nobody anticipated), still on one line;
# $CAPO_DATA_TRACEBACK=1 prints the traceback as well.
EXPECTED = (DownloadError, PrepareError, ValueError, OSError)
log = logging.getLogger(__name__)


def error_line(error: BaseException) -> str:
    """``error`` as one line: its message, with its type when it is not one of the EXPECTED failures."""
    text = re.sub(r"\s*\n\s*", " ", str(error)).strip()
    if isinstance(error, EXPECTED) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _fail(command: str, error: BaseException) -> int:
    if isinstance(error, KeyboardInterrupt):
        print(f"{command}: interrupted; run the same command again to resume (finished downloads are kept)",
              file=sys.stderr)
        return 130
    if os.environ.get("CAPO_DATA_TRACEBACK"):
        log.error("traceback", exc_info=error)
    print(f"{command}: {error_line(error)}", file=sys.stderr)
    return 1


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _sizes() -> dict[str, tuple[str, ...]]:
    """Names whose domain prepares several sizes -> the sizes (``capo data verify --size``)."""
    return {name: tuple(module.SIZES) for name, module in domains().items() if hasattr(module, "SIZES")}


def _parser() -> argparse.ArgumentParser:
    table = domains()
    parser = argparse.ArgumentParser(prog="capo data", description="Download and build the datasets of each domain.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download a dataset and build its folder (corpus, indexes, database)")
    names = p.add_subparsers(dest="name", required=True, metavar="NAME",
                             help=f"one of {', '.join(table)} (its own options: capo data prepare NAME -h)")
    for name, module in table.items():
        summary = (module.__doc__ or "").strip().split("\n\n")[0]
        q = names.add_parser(name, description=summary, help=summary.split(": ", 1)[-1].split("\n")[0])
        q.add_argument("--data-dir", help="default: $CAPO_DATA_DIR or ~/.cache/capo")
        q.add_argument("--force", action="store_true", help="download and rebuild even if already prepared")
        q.add_argument("--mirror", help="replace the download hosts with this base URL (or set $CAPO_DATA_MIRROR)")
        q.add_argument("--quiet", action="store_true", help="no progress bars")
        module.add_arguments(q)
    p = sub.add_parser("list", help="show each dataset, whether it is prepared, where and how big")
    p.add_argument("--data-dir")
    p = sub.add_parser("verify", help="re-check the sha256 of every file in a dataset's manifest")
    p.add_argument("name", choices=tuple(table))
    p.add_argument("--data-dir")
    sizes = _sizes()
    p.add_argument("--size", choices=sorted({s for choices in sizes.values() for s in choices}),
                   help=f"{', '.join(sizes)} only: the folder of this size (default: every prepared size)")
    return parser


def data_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "prepare":
            return _prepare(args)
        if args.command == "list":
            return _list(args.data_dir)
        return _verify(args.name, args.data_dir, args.size)
    except (Exception, KeyboardInterrupt) as error:  # a one-line error, never a traceback
        return _fail(f"capo data {args.command}", error)


def _prepare(args: argparse.Namespace) -> int:
    module = domains()[args.name]
    options = {k: v for k, v in vars(args).items() if k not in COMMON}
    try:
        path = module.prepare(args.name, data_dir=args.data_dir, force=args.force, base_url=args.mirror,
                              progress=not args.quiet, **options)
    except (Exception, KeyboardInterrupt) as error:
        return _fail(f"capo data prepare {args.name}", error)
    for info in module.data_info(args.name, args.data_dir):
        if Path(info["path"]) == Path(path):
            print(f"{info['name']} prepared in {path}" + (f" ({_counts(info)})" if info["counts"] else ""))
    return 0


def _counts(info: dict) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in info["counts"].items())


def _list(data_dir: str | None) -> int:
    infos = [{**info, "bytes": folder_bytes(Path(info["path"]))}
             for name, module in domains().items() for info in module.data_info(name, data_dir)]
    width = max(len(info["name"]) for info in infos)
    for info in infos:
        state = "prepared" if info["prepared"] else "not prepared"
        print(f"{info['name']:<{width}} {state:<13} {_size(info['bytes']):>10}  {info['path']}"
              + (f"  ({_counts(info)})" if info["counts"] else ""))
    return 0


def _verify(name: str, data_dir: str | None, size: str | None) -> int:
    """Each prepared folder of ``name`` (webshop: each size, or ``size``): its files against its manifest."""
    sizes = _sizes()
    if size and name not in sizes:
        print(f"capo data verify: --size is for {', '.join(sizes)} only, not {name}", file=sys.stderr)
        return 2
    infos = [info for info in domains()[name].data_info(name, data_dir) if size is None or info.get("size") == size]
    prepared = [info for info in infos if info["prepared"]]
    if not prepared:
        print(not_prepared_message(name, infos), file=sys.stderr)
        return 1
    failed = False
    for info in prepared:
        problems = check_folder(info)
        if problems is None:
            # Nothing to re-hash: saying "all files match" would claim a check that did not happen.
            print(f"{info['name']}: NOT VERIFIED, its manifest ({Path(info['path']) / MANIFEST}) records no file checksums")
            failed = True
            continue
        for line in problems:
            print(line)
        n = len(read_manifest(Path(info["path"]))["files"])
        print(f"{info['name']}: " + (f"FAILED, {len(problems)} problem(s)" if problems
                                     else f"all {n} file(s) recorded in the manifest match"))
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(data_main())
