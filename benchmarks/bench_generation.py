"""Multi-turn rollout generation with and without KV-prefix reuse, side by side in one run.

    python benchmarks/bench_generation.py [--model smollm2|PATH] [--episodes 8] [--turns 4]

Simulates a concatenated-state rollout: each turn generates ``--new-tokens`` tokens for every episode,
then appends a fixed observation of ``--obs-tokens`` tokens, so the next prompt extends the previous
one. Prints seconds, tokens prefilled and the speed-up of reusing the previous turn's KV cache.
"""

from __future__ import annotations

import argparse
import time

import torch

from capo_train.backends.hf import HFBackend
from capo_train.models import load_actor
from capo_train.models import resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=450)
    parser.add_argument("--obs-tokens", type=int, default=80)
    parser.add_argument("--new-tokens", type=int, default=12)
    args = parser.parse_args()

    model, tokenizer = load_actor(resolve_model_path(args.model))
    rng = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    prompts = [torch.randint(100, vocab, (args.prompt_tokens,), generator=rng).tolist() for _ in range(args.episodes)]
    observations = [torch.randint(100, vocab, (args.obs_tokens,), generator=rng).tolist() for _ in range(args.episodes)]

    seconds = {}
    for reuse in (False, True):
        backend = HFBackend(model, tokenizer, batch_size=args.episodes, reuse_prefixes=reuse)
        current = prompts
        start = time.perf_counter()
        for turn in range(args.turns):
            gens = backend.generate(current, stop=[], max_new_tokens=args.new_tokens, seed=turn)
            current = [p + g.token_ids + o for p, g, o in zip(current, gens, observations)]
        seconds[reuse] = time.perf_counter() - start
        print(f"reuse_prefixes={reuse!s:<5}: {seconds[reuse]:6.1f} s, prefilled {backend.prefilled_tokens:6d} tokens, "
              f"reused {backend.reused_tokens:6d}")
    print(f"speed-up from prefix reuse: {seconds[False] / seconds[True]:.2f}x "
          f"({args.episodes} episodes x {args.turns} turns x {args.new_tokens} new tokens)")


if __name__ == "__main__":
    main()
