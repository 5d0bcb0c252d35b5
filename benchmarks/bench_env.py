"""Env steps/s of every offline env with BM25 (target: >= 200 steps/s, so the env never bottlenecks training).

    python benchmarks/bench_env.py [--envs capo/SynthHop-v0|all] [--size small] [--episodes 300] [--samples]

Runs the expert (valid searches and answers), a policy of invalid actions and one of uncached (random)
searches side by side on each env, and prints steps/s for each and the ratio to the 200 steps/s target.

``--envs all``: capo/SynthHop-v0 plus every public id (HotpotQA, 2WikiMultihopQA, MuSiQue) whose data is
prepared in the data dir. ``--samples`` first prepares the public ones, with the project's ``data_prep``,
from the small official-format samples in ../shared/data (served over a local HTTP mirror exactly as
tests/test_public_envs.py does) into a temporary data dir: their corpora are the samples' paragraphs
only (thousands of passages, not millions), so the figures say what the env code costs, not what a
full-size corpus search costs (bench_bm25.py measures that).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

import capo_envs

TARGET = 200.0
SYNTH = "capo/SynthHop-v0"
PUBLIC = {"capo/HotpotQA-v0": "hotpotqa", "capo/2WikiMultihopQA-v0": "2wiki", "capo/MuSiQue-v0": "musique"}


def run(env, episodes: int, policy) -> tuple[int, float]:
    base = env.unwrapped
    steps, start = 0, time.perf_counter()
    for episode in range(episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(policy(base))
            steps += 1
            done = terminated or truncated
    return steps, time.perf_counter() - start


def prepare_samples(data_dir: Path) -> None:
    """Prepare hotpotqa, 2wiki and musique from ../shared/data's samples via a local mirror (the tests' way)."""
    import pytest

    root = Path(__file__).resolve().parents[1]  # the repo: data_prep is not an installed package
    sys.path[:0] = [str(root), str(root / "tests")]
    from fixtures_official import SHARED, FileServer, serve, shared_files

    from data_prep import prepare

    if not SHARED.is_dir():
        raise SystemExit(f"--samples needs {SHARED}")
    with pytest.MonkeyPatch.context() as mp, FileServer() as server, tempfile.TemporaryDirectory() as mirror:
        serve(server, shared_files(Path(mirror)), mp)
        for name in PUBLIC.values():
            start = time.perf_counter()
            prepare(name, data_dir=data_dir, base_url=server.url, progress=False)
            print(f"prepared {name} from the shared samples in {time.perf_counter() - start:.1f}s")


def passages(env) -> int | None:
    base = env.unwrapped
    if hasattr(base, "world"):
        return len(base.world.passages)
    retriever = getattr(base.retriever, "inner", base.retriever)  # under the LRU query cache
    return len(getattr(retriever, "passages", ())) or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=SYNTH, help="comma-separated ids, or 'all'")
    parser.add_argument("--size", default="small", help="SynthHop size")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--retriever", default="bm25")
    parser.add_argument("--samples", action="store_true", help="prepare the public envs from ../shared/data first")
    args = parser.parse_args()

    tmp = None
    if args.samples:
        tmp = tempfile.TemporaryDirectory(prefix="capo-bench-data-")
        os.environ["CAPO_DATA_DIR"] = tmp.name
        prepare_samples(Path(tmp.name))
    ids = [SYNTH, *PUBLIC] if args.envs == "all" else args.envs.split(",")
    policies = {
        "expert (search+answer)": lambda base: base.expert_action(),
        "invalid actions": lambda base: "no tags here",
        "uncached searches": lambda base: f"<search>{base.np_random.integers(1 << 30)} city founded</search>",
    }
    rows = []
    for env_id in ids:
        if env_id != SYNTH and not capo_envs.CATALOG[env_id].data_ready():
            print(f"note: skipping {env_id}: its data is not prepared ({capo_envs.CATALOG[env_id].prepare}, "
                  f"or pass --samples)")
            continue
        kwargs = {"size": args.size} if env_id == SYNTH else {"split": "dev"}
        start = time.perf_counter()
        env = gym.make(env_id, retriever=args.retriever, **kwargs)
        build = time.perf_counter() - start
        tasks = len(env.unwrapped.task_ids())
        label = f"{env_id} size={args.size}" if env_id == SYNTH else f"{env_id} split=dev"
        print(f"{label}: {passages(env)} passages, {tasks} tasks, env built in {build:.2f}s")
        for name, policy in policies.items():
            steps, seconds = run(env, args.episodes, policy)
            rate = steps / seconds
            rows.append((env_id, name, steps, seconds, rate))
            print(f"{name:>24}: {steps:6d} steps in {seconds:6.2f}s = {rate:9.1f} steps/s "
                  f"({rate / TARGET:.1f}x the {TARGET:.0f} steps/s target)")
        env.close()
    if len(ids) > 1:
        print(f"\n{'env':<26}{'policy':>24}{'steps/s':>10}{'x target':>10}")
        for env_id, name, _, _, rate in rows:
            print(f"{env_id:<26}{name:>24}{rate:>10.1f}{rate / TARGET:>9.1f}x")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
