"""``capo view RUN_DIR [RUN_DIR ...]``: a local web page over run folders (curves, config, recorded episodes
with each action's value, advantage, ratio and clip decision, two runs side by side, a ``capo compare`` grid as
a table), or ``--html OUT``: the same pages as static files. No torch, no internet: the page is plain
JavaScript, CSS and SVG shipped in ``static/``. docs/viewer.md describes the pages."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capo view", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run folders (capo train --out), capo compare grid folders, or folders holding runs")
    parser.add_argument("--html", metavar="OUT", help="write the pages as static files to OUT instead of serving")
    parser.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 to let other machines see the pages")
    parser.add_argument("--port", type=int, default=0, help="default 0: a free port (printed)")


def run(args: argparse.Namespace) -> int:
    from .data import discover
    from .site import Site

    try:
        runs, grids = discover(args.run_dirs)
    except FileNotFoundError as e:
        raise SystemExit(f"capo view: {e}") from None
    if not runs:
        raise SystemExit(f"capo view: no run found in {' '.join(args.run_dirs)} (a run folder holds log.jsonl)")
    site = Site(runs, grids)
    if args.html:
        out = site.export(args.html)
        print(f"{len(runs)} run(s) written to {out}/index.html")
        return 0
    from capo_envs.core.http import serve_until_interrupted

    from .server import make_server

    try:
        server = make_server(site, args.host, args.port)
    except OSError as e:
        raise SystemExit(f"capo view: cannot listen on {args.host}:{args.port}: {e}") from None
    serve_until_interrupted(server, f"capo view: {len(runs)} run(s) at {server.url}/ (Ctrl-C to stop)")
    return 0


def view_main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(view_main())
