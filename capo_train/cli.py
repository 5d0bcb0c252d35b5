"""The ``capo`` command. Each subcommand imports only what it needs, so ``capo envs`` never loads torch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

# What `pip install "capo-gym[train]"` adds to the bare install; a command that needs one says so.
TRAIN_EXTRA_MODULES = {"torch", "transformers", "tokenizers", "peft", "accelerate", "safetensors", "gguf"}


def parse_key_values(pairs: Sequence[str]) -> dict[str, object]:
    """``["size=tiny", "k=3"]`` -> ``{"size": "tiny", "k": 3}``: values are read as YAML scalars."""
    from .config import load_yaml

    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected key=value, got {pair!r}")
        parsed[key] = load_yaml(value) if value else ""
    return parsed


def _cmd_envs(args: argparse.Namespace) -> int:
    import capo_envs

    rows = []
    for card in capo_envs.CATALOG.values():
        ready = card.data_ready()
        status = "ready" if ready else f"missing: run `{card.prepare}`"
        rows.append((card.id, card.data, status))
    widths = [max(len(r[i]) for r in rows + [("id", "data", "status")]) for i in range(3)]
    for row in [("id", "data", "status")] + rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if args.verbose:
        for card in capo_envs.CATALOG.values():
            print(f"\n{card.id}: {card.summary}\n  actions: {card.action_format}\n  reward: {card.reward}"
                  f"\n  metrics: {card.metrics}")
            if card.cpu_preset:  # what `capo train` uses when env.kwargs is null
                print(f"  cpu preset: {json.dumps(card.cpu_preset)} ({card.cpu_preset_why})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """Run the env's expert for a few episodes and print the transcripts. With ``--expert-skill`` < 1 it is
    the demonstrator a warm start clones at that ``sft.expert_skill`` (each step, with probability 1 - skill,
    the env's ``random_action``), so a recipe's demonstrator can be measured before training on it."""
    import random

    import gymnasium as gym

    import capo_envs  # noqa: F401  (registers the ids)

    from .demonstrator import demonstrator_action

    if not 0.0 <= args.expert_skill <= 1.0:
        print(f"--expert-skill must be in [0, 1], got {args.expert_skill}", file=sys.stderr)
        return 2
    env = gym.make(args.env, **parse_key_values(args.env_kwargs))
    base = env.unwrapped
    say = (lambda *_: None) if args.quiet else print
    tasks = f"{len(base.task_ids())} tasks" if callable(getattr(base, "task_ids", None)) else "tasks by reset seed"
    say(f"{args.env}: {tasks}")
    rng = random.Random(args.seed)  # the errors' draws, as sft.expert_trajectories makes them
    successes, steps = 0.0, 0
    for episode in range(args.episodes):
        obs, info = env.reset(seed=args.seed + episode)
        if episode == 0:  # the env contract publishes its instructions in the reset info (rollout.read_protocol)
            protocol = info.get("protocol")
            instructions = protocol.get("instructions") if isinstance(protocol, dict) else None
            say(f"--- instructions given to the model ---\n{instructions or '(none: the env publishes no protocol)'}")
        say(f"\n=== episode {episode} · task {info.get('task_id', f'seed {args.seed + episode}')} ===\n[obs] {obs}")
        done, acted = False, 0
        while not done:
            action = demonstrator_action(base, rng, args.expert_skill)
            if action is None and not acted:
                print("this env has no expert")
                return 1
            if action is None:  # the demonstrator gave up (as sft.expert_trajectories: its demonstration ends)
                say("[the demonstrator gives up: the demonstration ends here, counted as lost]")
                break
            obs, reward, terminated, truncated, info = env.step(action)
            steps, acted = steps + 1, acted + 1
            say(f"[act] {action}\n[obs] {obs[:400]}{'...' if len(obs) > 400 else ''}")
            done = terminated or truncated
        if done:
            metrics = info.get("metrics") or {}
            successes += metrics.get("success", metrics.get("em", reward))  # as rollout.py reads success
            say(f"reward={reward} terminated={terminated} truncated={truncated} metrics={metrics}")
    who = "expert" if args.expert_skill >= 1.0 else f"demonstrator (expert_skill {args.expert_skill:g})"
    print(f"{'' if args.quiet else chr(10)}{who} success over {args.episodes} episodes: "
          f"{successes / args.episodes:.2f}, {steps / args.episodes:.1f} steps an episode")
    env.close()
    return 0


def _train_config(args: argparse.Namespace):
    from .config import ConfigError, load_config

    overrides = list(args.overrides)
    for flag, key in (("algo", "algo"), ("env", "env.id"), ("model", "model.path"), ("out", "out_dir")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        return load_config(args.config, overrides)
    except ConfigError as e:
        raise SystemExit(f"capo: {e}") from None


def _cmd_train(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .trainer import train

    config = _train_config(args)
    if args.sft_only:
        config.iterations = 0
    try:
        summary = train(config, resume=args.resume, tag=f"capo {args.command}")
    except ConfigError as e:  # the env could not be built (checked before the model loads)
        raise SystemExit(f"capo: {e}") from None
    print("\n| " + " | ".join(summary) + " |\n|" + "---|" * len(summary))
    print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in summary.values()) + " |")
    print(f"\nlogs, checkpoint and learning curve in {config.out_dir}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from . import eval_cli

    if eval_cli.wants_report(args):  # panels, repeats, pass@k, recording, --reverify: capo_train/eval_panel.py
        return eval_cli.run(args, parse_key_values(args.env_kwargs))
    if args.checkpoint is None:
        raise SystemExit("capo eval: say which policy to evaluate: --checkpoint DIR")
    args.env, args.split = args.env or eval_cli.DEFAULT_ENV, args.split or eval_cli.DEFAULT_SPLIT
    from .config import ConfigError, EnvConfig, TrainConfig
    from .models import load_checkpoint
    from data_prep.progress import Progress
    from .evaluation import evaluate
    from .setup import make_envs

    # No key=value: the env's defaults as `capo train` uses them (env.kwargs null).
    config = TrainConfig(env=EnvConfig(id=args.env, kwargs=parse_key_values(args.env_kwargs) or None))
    config.env.eval_split = args.split
    try:
        envs = make_envs(config, args.split, min(args.episodes, 16))
    except ConfigError as e:  # before any checkpoint is loaded
        raise SystemExit(f"capo: {e}") from None
    model = backend = None
    try:
        if args.server:
            from .backends.openai import OpenAIBackend
            from .models import load_tokenizer

            # prompts are token ids, so the client still needs the served model's tokenizer
            checkpoint = _checkpoint_dir(args.checkpoint)
            tokenizer = load_tokenizer(checkpoint / "actor" if (checkpoint / "actor").is_dir() else checkpoint)
            backend = OpenAIBackend(args.server, args.served_model or args.checkpoint)
        else:
            model, tokenizer = load_checkpoint(_checkpoint_dir(args.checkpoint))
        progress = Progress("capo eval", file=sys.stderr)  # stdout is the JSON result
        print(json.dumps(evaluate(model, tokenizer, config, envs, args.episodes, backend=backend, progress=progress),
                         indent=2))
    finally:
        for env in envs:
            env.close()
    return 0


def _checkpoint_dir(path: str) -> Path:
    """The checkpoint folder, given it or the run folder that holds it as ``checkpoint/``."""
    checkpoint = Path(path)
    return checkpoint / "checkpoint" if (checkpoint / "checkpoint").is_dir() else checkpoint


def completion_server(args: argparse.Namespace):
    """The ``CompletionServer`` that ``capo serve`` runs: the checkpoint's actor behind ``HFBackend``,
    bound to ``--host``/``--port`` but not serving yet."""
    import torch

    from .backends.hf import HFBackend
    from .backends.server import CompletionServer
    from .models import load_checkpoint

    model, tokenizer = load_checkpoint(_checkpoint_dir(args.checkpoint))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    actor = model.actor.to(device).eval()
    try:
        return CompletionServer(
            HFBackend(actor, tokenizer), tokenizer, args.served_model_name or args.checkpoint, args.host, args.port,
            max_model_len=args.max_model_len, verbose=args.verbose,
        )
    except OSError as e:
        raise SystemExit(f"capo serve: cannot listen on {args.host}:{args.port}: {e}") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    """Serve a checkpoint over the OpenAI completions API until Ctrl-C or SIGTERM."""
    from capo_envs.core.http import serve_until_interrupted

    server = completion_server(args)
    serve_until_interrupted(server, f"serving {server.model_name!r} at {server.url} (POST /completions, GET /models)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .models import export_actor

    print(f"actor written to {export_actor(_checkpoint_dir(args.checkpoint), args.out)} (use it as model.path=...)")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    """Train every (env, algo, seed) cell not yet done, then print the comparison table."""
    import shlex

    from .compare import load_grid, markdown_table, run_grid
    from .config import ConfigError

    flags = {"algos": args.algos, "envs": args.envs, "seeds": args.seeds, "out_dir": args.out}
    try:
        grid = load_grid(args.grid, args.overrides, {k: v for k, v in flags.items() if v is not None})
    except ConfigError as e:
        raise SystemExit(f"capo: {e}") from None
    given = [f"--{name} {shlex.quote(str(value))}" for name, value in vars(args).items()
             if name in ("grid", "algos", "envs", "seeds", "out") and value is not None]
    try:
        command = " ".join(["capo compare", *given, *map(shlex.quote, args.overrides)])
        rows = run_grid(grid, command=command, jobs=args.jobs)
    except ConfigError as e:  # a cell started with other settings
        raise SystemExit(f"capo: {e}") from None
    out = Path(grid.out_dir)
    print("\n" + markdown_table(rows, grid) + "\n")
    print(f"results.csv, results.md, curves.png and grid.json in {out}; per-run logs in {out / 'runs'}")
    return 0


# Subcommands that were renamed: `capo OLD ...` exits 2 and names the new one, whatever its arguments.
RENAMED_COMMANDS = {"bench": "compare"}


def _renamed(old: str) -> int:
    print(f"capo {old}: renamed: use `capo {RENAMED_COMMANDS[old]}`", file=sys.stderr)
    return 2


def _cmd_view(args: argparse.Namespace) -> int:
    from .viewer import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capo", description="capo-gym: text envs for LLM agents and CAPO.")
    sub = parser.add_subparsers(dest="command", required=True)

    envs = sub.add_parser("envs", help="list every env id, the data it needs and whether it is present")
    envs.add_argument("-v", "--verbose", action="store_true", help="also print action format, reward, metrics and the CPU preset")
    envs.set_defaults(func=_cmd_envs)

    demo = sub.add_parser("demo", help="run an env's expert for a few episodes and print what it sees")
    demo.add_argument("--env", default="capo/SynthHop-v0")
    demo.add_argument("--episodes", type=int, default=3)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--expert-skill", type=float, default=1.0,
                      help="the warm start's demonstrator at this sft.expert_skill (default 1: the expert)")
    demo.add_argument("--quiet", action="store_true", help="print only the success and steps summary")
    demo.add_argument("env_kwargs", nargs="*", metavar="key=value", help="keyword arguments for gym.make")
    demo.set_defaults(func=_cmd_demo)

    for name, help_text in (
        ("train", "train a policy with CAPO or a baseline (no arguments: the embedded default run)"),
        ("sft", "only the warm start: behaviour-clone the env's expert and save the checkpoint"),
    ):
        train = sub.add_parser(name, help=help_text)
        train.add_argument("--config", help="a YAML file of config keys (see capo_train/config.py)")
        train.add_argument("--algo", help="capo, ppo, grpo, rloo, reinforce_pp, gspo, gigpo, ...")
        train.add_argument("--env", help="an env id, e.g. capo/SynthHop-v0, or module:Id (imports module first)")
        train.add_argument("--model", help="a local Hugging Face model dir, or 'smollm2'")
        train.add_argument("--out", help="output folder (checkpoint, logs, plots)")
        train.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
        train.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. rollout.episodes_per_batch=8")
        train.set_defaults(func=_cmd_train, sft_only=name == "sft")

    evaluate = sub.add_parser("eval", help="evaluate a policy (checkpoint, HF folder or server) on a pinned panel "
                              "or an env's held-out split: repeats, pass@k, per-task JSONL, --reverify")
    from .eval_cli import add_arguments as add_eval_arguments

    add_eval_arguments(evaluate)
    evaluate.set_defaults(func=_cmd_eval)

    serve = sub.add_parser("serve", help="serve a checkpoint over the OpenAI completions API (for OpenAIBackend); "
                           "`capo serve webshop|papers` serve those domains instead, `capo serve env ID` any env "
                           "(OpenEnv's protocol)")
    serve.add_argument("--checkpoint", required=True, help="a run folder or its checkpoint/")
    serve.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 to accept other machines")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", help="the name requests must give as model (default: --checkpoint)")
    serve.add_argument("--device", help="where the model runs (default: cuda when available, else cpu)")
    serve.add_argument("--max-model-len", type=int, help="refuse requests needing more positions (prompt + max_tokens; "
                       "default: the model config's max_position_embeddings, else 8192) and text prompts of more "
                       "than 32 characters per position")
    serve.add_argument("--verbose", action="store_true", help="log every request to stderr")
    serve.set_defaults(func=_cmd_serve)

    export = sub.add_parser("export", help="write a checkpoint's actor as a plain HF model folder (LoRA merged)")
    export.add_argument("--checkpoint", required=True, help="a run folder or its checkpoint/")
    export.add_argument("--out", required=True, help="the model folder to write")
    export.set_defaults(func=_cmd_export)

    compare = sub.add_parser("compare", help="train a grid of algorithms x envs x seeds and compare them")
    compare.add_argument("--grid", help="a YAML file of grid keys (see capo_train/compare.py: GridConfig)")
    compare.add_argument("--algos", help="comma-separated algorithm names (default: every registered one)")
    compare.add_argument("--envs", help="comma-separated env ids (default: capo/SynthHop-v0)")
    compare.add_argument("--seeds", help="comma-separated seeds (default: 0,1,2)")
    compare.add_argument("--out", help="grid folder: results.csv/.md, curves.png, runs/ (default: runs/compare)")
    compare.add_argument("--jobs", type=int, default=1,
                         help="cells trained at once, each in its own process with cpu_count/jobs threads (default 1)")
    compare.add_argument("overrides", nargs="*", metavar="key=value",
                         help="grid keys, e.g. iterations=4, or base.<train key>, e.g. base.model.path=DIR")
    compare.set_defaults(func=_cmd_compare)

    for old, new in RENAMED_COMMANDS.items():  # listed in the help; main() answers them before parsing
        sub.add_parser(old, help=f"renamed: use `capo {new}`", add_help=False)

    view = sub.add_parser("view", help="a local web page over run folders: curves, config, recorded episodes "
                          "with each action's credit, runs side by side, compare grids (--html OUT: static files)")
    from .viewer import add_arguments as add_view_arguments

    add_view_arguments(view)
    view.set_defaults(func=_cmd_view)

    # These two hand their arguments to modules with their own parsers.
    sub.add_parser("data", help="download and prepare datasets: capo data prepare|list|verify ...", add_help=False)
    sub.add_parser("serve-retriever", help="serve a corpus over Search-R1's POST /retrieve", add_help=False)
    return parser


# ``capo serve webshop|papers|env ...``: the domains' own servers and the env server (no torch), each with its
# own parser.
DOMAIN_SERVERS = {"webshop": "capo_envs.webshop.server", "papers": "capo_envs.papers.server",
                  "env": "capo_envs.remote.server"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "data":
        from data_prep.cli import data_main

        return data_main(argv[1:])
    if len(argv) >= 2 and argv[0] == "serve" and argv[1] in DOMAIN_SERVERS:
        import importlib

        return importlib.import_module(DOMAIN_SERVERS[argv[1]]).serve_main(argv[2:])
    if argv and argv[0] in RENAMED_COMMANDS:
        return _renamed(argv[0])
    if argv and argv[0] == "serve-retriever":
        from capo_envs.retrieval.server import serve_main

        return serve_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as e:
        if e.name not in TRAIN_EXTRA_MODULES:
            raise
        raise SystemExit(
            f"capo {args.command}: needs {e.name!r}, which the bare install leaves out; "
            "install the trainer's extra: pip install 'capo-gym[train]' (torch first, pinned, for a CPU build)"
        ) from None


if __name__ == "__main__":
    sys.exit(main())
