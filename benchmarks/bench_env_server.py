"""``capo serve env`` under load: many concurrent sessions, each stepping its own env, from one asyncio client.

    python benchmarks/bench_env_server.py                      # 256 sessions of capo/SynthHop-v0, 20 steps each
    python benchmarks/bench_env_server.py --sessions 64 --env capo/SynthChain-v0 --kwargs '{"k": 8}'

The server runs as `capo serve env` in its own process (the client's event loop does not share its GIL); every
session connects and resets first (untimed: each session's env is made then), then all step at once,
``--steps`` actions each (the env's expert's, fetched before the timed part, else a search), resetting when an
episode ends. A step's latency is from sending the action to its answer, while the other sessions step too.
Prints sessions, steps, errors, steps/s, and p50/p99/max step latency in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capo_envs.remote.client import AsyncSession  # noqa: E402

READY: set[int] = set()  # sessions connected and reset


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def session(url: str, seed: int, steps: int, start: asyncio.Event, latencies: list[float],
                  errors: list[str]) -> int:
    done_steps = 0
    try:
        async with AsyncSession(url) as env:
            await env.reset(seed=seed)
            READY.add(seed)
            await start.wait()
            for _ in range(steps):
                action = await env.call("expert_action")
                sent = time.perf_counter()
                result = await env.step(action or "<search>anything</search>")
                latencies.append(time.perf_counter() - sent)
                done_steps += 1
                if result["done"]:
                    await env.reset(seed=seed + 1_000_000 * done_steps)
    except Exception as e:  # noqa: BLE001 - counted and shown
        errors.append(f"session {seed}: {type(e).__name__}: {e}")
    return done_steps


async def run(url: str, sessions: int, steps: int) -> dict:
    start = asyncio.Event()
    latencies: list[float] = []
    errors: list[str] = []
    tasks = [asyncio.create_task(session(url, seed, steps, start, latencies, errors)) for seed in range(sessions)]
    t0 = time.perf_counter()
    while len(READY) < sessions and not all(t.done() for t in tasks):  # every session connected and reset
        await asyncio.sleep(0.05)
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    start.set()
    stepped = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t1
    return {"sessions": sessions, "steps": sum(stepped), "errors": len(errors), "first_errors": errors[:3],
            "setup_s": round(setup, 2), "wall_s": round(wall, 2), "steps_per_s": round(sum(stepped) / wall, 1),
            "p50_ms": round(1000 * percentile(latencies, 0.50), 2) if latencies else None,
            "p99_ms": round(1000 * percentile(latencies, 0.99), 2) if latencies else None,
            "max_ms": round(1000 * max(latencies), 2) if latencies else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="capo/SynthHop-v0")
    parser.add_argument("--kwargs", default="{}", help="the served env's kwargs (JSON)")
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="actions per session")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "capo_train.cli", "serve", "env", args.env, "--kwargs", args.kwargs,
                               "--port", str(port), "--max-sessions", str(args.sessions)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        print(server.stdout.readline().strip(), flush=True)
        result = asyncio.run(run(f"http://127.0.0.1:{port}", args.sessions, args.steps))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    result = {"env": args.env, "kwargs": json.loads(args.kwargs), **result, "cpus": os.cpu_count()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
