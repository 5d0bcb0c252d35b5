"""`capo view` at scale, and the screenshots in docs/images.

    # 10,000 recorded episodes (200 iterations x 50, 4 actions each; capo_train.viewer.synthetic): disk per
    # 1,000 episodes, and page-load / filter / episode-open times in headless Chromium (median of --repeats)
    python benchmarks/bench_viewer.py scale

    # two tiny real runs (a 2-layer Llama warm-started on SynthChain k=4, then 20 iterations of capo and of
    # grpo), their disk per 1,000 recorded episodes, and PNGs of the run, episode and side-by-side views
    OMP_NUM_THREADS=1 python benchmarks/bench_viewer.py demo --out runs/viewer-demo --screenshots docs/images

Page load = from the navigation to the page saying it has rendered (``body[data-ready]``), measured by
the DevTools client; ``in-page`` = ``performance.now()`` at that moment (from navigation start).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capo_train.viewer.chromium import Chromium, find_chromium  # noqa: E402
from capo_train.viewer.data import discover  # noqa: E402
from capo_train.viewer.server import make_server  # noqa: E402
from capo_train.viewer.site import Site  # noqa: E402


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def disk_line(run: Path) -> str:
    """Bytes per 1,000 recorded episodes, training (with credit) and held-out (without) apart."""
    parts = []
    for label, pattern in (("training", "iter-*.jsonl"), ("held-out", "eval-*.jsonl")):
        files = list((run / "episodes").glob(pattern))
        n = sum(len(p.read_text().splitlines()) for p in files)
        size = sum(p.stat().st_size for p in files)
        if n:
            parts.append(f"{n} {label} episodes, {size / 1e6:.2f} MB -> {size / n * 1000 / 1e6:.2f} MB per 1,000")
    return f"{run.name}: " + "; ".join(parts)


def measure_pages(runs: list[Path], repeats: int, width: int = 1280, height: int = 900) -> dict:
    site = Site(*discover(runs))
    sizes = {path: len(site.get(path)[0]) for path in ("data/site.js", "data/run-0.js")}
    times: dict[str, list[float]] = {}
    with make_server(site).start_in_thread() as server, Chromium(width=width, height=height) as browser:
        for _ in range(repeats):
            t = browser.open(server.url + "/#/run/0", ready="run")
            times.setdefault("run page load (s)", []).append(t)
            times.setdefault("run page load, in-page (s)", []).append(browser.evaluate("CAPO.readyAt") / 1000)
            times.setdefault("filter: succeeded, with invalid actions (s)", []).append(
                browser.go("#/run/0?succ=1&inv=1", ready="run"))
            times.setdefault("filter: one iteration (s)", []).append(browser.go("#/run/0?it=100", ready="run"))
            times.setdefault("open an episode (s)", []).append(browser.go("#/run/0/ep/150/7", ready="run"))
            times.setdefault("back to the list, page 20 (s)", []).append(browser.go("#/run/0?page=20", ready="run"))
            if len(runs) > 1:
                times.setdefault("side by side, two runs (s)", []).append(browser.go("#/compare/0/1", ready="compare"))
            # a fresh navigation next round: the data scripts are loaded again (Cache-Control: no-store)
            browser.call("Page.navigate", session=True, url="about:blank")
        rows = browser.evaluate("document.querySelectorAll('tr.episode').length")
    return {"bytes": sizes, "times": {k: (v[0], statistics.median(v)) for k, v in times.items()}, "rows_shown": rows}


def cmd_scale(args) -> None:
    from capo_train.viewer.synthetic import synthetic_run

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        runs = [synthetic_run(Path(tmp) / f"run{i}", iterations=args.iterations, episodes=args.episodes, seed=i)
                for i in range(2)]
        print(f"generated 2 runs of {args.iterations * args.episodes} episodes in {time.perf_counter() - start:.1f} s")
        print(disk_line(runs[0]))
        result = measure_pages(runs, args.repeats)
        print(f"data/run-0.js (the episode index and curves): {result['bytes']['data/run-0.js'] / 1e6:.2f} MB")
        print(f"{'':48s} {'first':>7s} {'median of ' + str(args.repeats):>12s}")
        for name, (first, median) in result["times"].items():
            print(f"{name:48s} {first:7.3f} {median:12.3f}")
        start = time.perf_counter()
        out = Site(*discover(runs)).export(Path(tmp) / "site")
        print(f"static export of both runs: {time.perf_counter() - start:.1f} s, {folder_bytes(out) / 1e6:.1f} MB")
        with Chromium() as browser:
            t = browser.open(out.joinpath("index.html").as_uri() + "#/run/0", ready="run")
            print(f"static export, run page load from disk: {t:.3f} s")


DEMO = ["env.id=capo/SynthChain-v0", "env.kwargs={k: 4, expert_skill: 0.5}", "model.lora=false",
        "rollout.episodes_per_batch=16", "rollout.max_action_tokens=24", "optim.minibatch_rows=8",
        "log_tensorboard=false"]


def warm_start(out: Path) -> Path:
    """tests/test_learning.py's recipe on 4 doors: a 2-layer Llama behaviour-cloned on a demonstrator that is
    right half the time, so RL starts from valid actions and partial success."""
    from capo_train.config import load_config
    from capo_train.models import export_actor, make_tiny_llama
    from capo_train.trainer import train

    if (out / "warm").exists():
        return out / "warm"
    model, tokenizer = make_tiny_llama(hidden_size=64, num_layers=2, seed=0)
    model.save_pretrained(out / "init")
    tokenizer.save_pretrained(out / "init")
    config = load_config(None, [f"model.path={out / 'init'}", f"out_dir={out / 'sft'}", *DEMO, "sft.episodes=128",
                                "sft.epochs=6", "optim.actor_lr=1e-3", "eval_every=0"])
    config.iterations = 0
    start = time.perf_counter()
    train(config, progress=False)
    print(f"warm start in {time.perf_counter() - start:.0f} s")
    return export_actor(out / "sft" / "checkpoint", out / "warm")


def train_demo(out: Path, algo: str, model_dir: Path, *extra: str) -> Path:
    from capo_train.config import load_config
    from capo_train.trainer import train

    if (out / algo / "summary.json").exists():  # trained by an earlier call: only the screenshots again
        return out / algo
    config = load_config(None, [f"model.path={model_dir}", f"out_dir={out / algo}", f"algo={algo}", *DEMO,
                                "iterations=20", "sft.episodes=0", "eval_every=10", "eval_episodes=32",
                                "record_every=5", "record_episodes=16", *extra])
    start = time.perf_counter()
    train(config, progress=False)
    print(f"trained {algo} in {time.perf_counter() - start:.0f} s")
    return out / algo


def cmd_demo(args) -> None:
    out = Path(args.out)
    model_dir = warm_start(out)
    runs = [train_demo(out, "capo", model_dir, "optim.actor_lr=1e-3"),
            train_demo(out, "grpo", model_dir, "optim.actor_lr=3e-4", "rollout.group_size=4")]
    for run in runs:
        print(disk_line(run))
    if args.screenshots:
        shots = Path(args.screenshots)
        shots.mkdir(parents=True, exist_ok=True)
        site = Site(*discover(runs))
        last = sorted((runs[0] / "episodes").glob("iter-*.jsonl"))[-1]
        iteration = int(last.stem.split("-")[1])
        recorded = [json.loads(line) for line in last.read_text().splitlines()]
        # the most telling episode to show: one with an invalid action and a clipped one, if there is one
        episode = max(recorded, key=lambda e: (e["invalid_actions"] > 0, any(a.get("clipped") for a in e["actions"])))
        with make_server(site).start_in_thread() as server, Chromium(width=1200, height=800) as browser:
            browser.open(server.url + "/#/run/0", ready="run")
            browser.screenshot(shots / "viewer-run.png", full_height=True, max_height=1300)
            browser.go(f"#/run/0/ep/{iteration}/{episode['episode']}", ready="run")
            browser.screenshot(shots / "viewer-episode.png", full_height=True, max_height=1300)
            browser.go(f"#/compare/0/1?it={iteration}", ready="compare")
            browser.screenshot(shots / "viewer-compare.png", full_height=True, max_height=1300)
        for png in sorted(shots.glob("viewer-*.png")):
            shrink(png)
            print(f"{png}: {png.stat().st_size / 1e3:.0f} kB")


def shrink(png: Path) -> None:
    """A 256-colour palette PNG (the pages are flat colours and text): a few times smaller, same look."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    small.save(png, optimize=True)


def main() -> None:
    if find_chromium() is None:
        raise SystemExit("needs Debian's chromium (apt-get install chromium)")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    scale = sub.add_parser("scale")
    scale.add_argument("--iterations", type=int, default=200)
    scale.add_argument("--episodes", type=int, default=50)
    scale.add_argument("--repeats", type=int, default=3)
    scale.set_defaults(func=cmd_scale)
    demo = sub.add_parser("demo")
    demo.add_argument("--out", default="runs/viewer-demo")
    demo.add_argument("--screenshots")
    demo.set_defaults(func=cmd_demo)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
