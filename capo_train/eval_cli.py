"""The arguments of ``capo eval`` and the panel/repeat/reverify paths (``capo_train/cli.py`` dispatches here).

Without any of ``--panel``, ``--repeats``, ``--temperature``, ``--out``, ``--per-task`` and ``--record``,
``capo eval`` is the trainer's held-out evaluation and prints its ``eval/*`` keys, as before; with one of
them it prints the report of :mod:`capo_train.eval_panel`. ``--panels`` lists the panels and their pinned
hashes; ``--reverify RUN_DIR`` replays a recorded evaluation (:mod:`capo_train.reverify`).
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_ENV, DEFAULT_SPLIT = "capo/SynthHop-v0", "test"
REPORT_FLAGS = ("panel", "repeats", "temperature", "out", "per_task", "record")


def add_arguments(evaluate: argparse.ArgumentParser) -> None:
    evaluate.add_argument("--checkpoint",
                          help="the policy: a run folder, its checkpoint/, or a Hugging Face model folder; with "
                          "--server, the folder its tokenizer is read from")
    evaluate.add_argument("--server", help="generate through an OpenAI-compatible server instead, e.g. "
                          "http://127.0.0.1:8000/v1 (`capo serve`, or vLLM)")
    evaluate.add_argument("--served-model", help="the model name the server knows (default: --checkpoint)")
    evaluate.add_argument("--panel", help="a pinned evaluation panel, e.g. synthchain-k4-dev-200 (`capo eval "
                          "--panels` lists them); refuses data that does not match its hash")
    evaluate.add_argument("--panels", action="store_true", help="list the panels with their pinned hashes and exit")
    evaluate.add_argument("--env", help=f"without --panel: the env id (default {DEFAULT_ENV})")
    evaluate.add_argument("--split", help=f"without --panel: the held-out split (default {DEFAULT_SPLIT})")
    evaluate.add_argument("--episodes", type=int, default=100, help="without --panel: how many held-out tasks")
    evaluate.add_argument("--repeats", type=int, default=None,
                          help="episodes per task (default 1); pass@k is reported for k = 1, 2, 4, ..., repeats")
    evaluate.add_argument("--temperature", type=float, default=None,
                          help="sampling temperature; 0 is greedy (default: greedy with 1 repeat, 1.0 with more)")
    evaluate.add_argument("--seed", type=int, default=0, help="the seed of the reset and sampling seeds")
    evaluate.add_argument("--out", help="write the result JSON here (default with --record: DIR/eval_result.json)")
    evaluate.add_argument("--per-task", help="write per-task results as JSONL here (default with --record: "
                          "DIR/per_task.jsonl)")
    evaluate.add_argument("--record", metavar="DIR", help="also write the episodes to DIR/episodes/ for capo view "
                          "and DIR/replay.jsonl for --reverify")
    evaluate.add_argument("--reverify", metavar="RUN_DIR", help="replay RUN_DIR/replay.jsonl's actions in a fresh "
                          "env and report every episode whose rewards, metrics or observations differ")
    evaluate.add_argument("env_kwargs", nargs="*", metavar="key=value", help="without --panel: kwargs for gym.make")


def wants_report(args: argparse.Namespace) -> bool:
    return args.panels or args.reverify is not None or any(
        getattr(args, flag) not in (None, False) for flag in REPORT_FLAGS)


def run(args: argparse.Namespace, env_kwargs: dict) -> int:
    if args.panels:
        return list_panels()
    if args.reverify is not None:
        return reverify(args)
    from data_prep.progress import Progress

    from .eval_panel import EvalError, EvalRequest, run_eval

    if args.panel and (env_kwargs or args.env is not None or args.split is not None):
        raise SystemExit(f"capo eval: --panel {args.panel} fixes the env, split and kwargs; drop --env, --split "
                         "and key=value")
    args.env, args.split = args.env or DEFAULT_ENV, args.split or DEFAULT_SPLIT
    request = EvalRequest(policy=args.checkpoint, server=args.server, served_model=args.served_model,
                          panel=args.panel, env_id=args.env, split=args.split, env_kwargs=env_kwargs or None,
                          episodes=args.episodes, repeats=1 if args.repeats is None else args.repeats,
                          temperature=args.temperature, seed=args.seed, record=args.record, out=args.out,
                          per_task=args.per_task)
    from .backends.openai import OpenAIBackendError

    try:
        result = run_eval(request, Progress("capo eval", file=sys.stderr))  # stdout is the JSON result
    except (EvalError, OpenAIBackendError) as e:  # a server that refuses a request says why, in a sentence
        raise SystemExit(f"capo eval: {e}") from None
    print(json.dumps(result, indent=2))
    return 0


def list_panels() -> int:
    from capo_envs.core.panels import PANELS

    rows = [(p.name, p.env_id, f"{p.split} {p.size}", p.pinned_hash or "not pinned yet", p.about)
            for p in PANELS.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
    return 0


def reverify(args: argparse.Namespace) -> int:
    """Exit 0 when every episode replays as recorded, 1 when some differ (the report says which)."""
    from .reverify import ReplayError, describe
    from .reverify import reverify as replay

    try:
        report = replay(args.reverify)
    except ReplayError as e:
        raise SystemExit(f"capo eval --reverify: {e}") from None
    print(describe(report), file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 1 if report["differing_episodes"] else 0
