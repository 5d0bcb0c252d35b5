"""Rollout generation tokens/s: our batched HFBackend against Hugging Face ``model.generate``, side by side.

    python benchmarks/bench_generate_vs_hf.py [--model smollm2|tiny|PATH] [--prompts 8] \
        [--prompt-tokens 128] [--new-tokens 64] [--rounds 2] [--threads 1]

Same model, same prompts (``--prompts`` prompts of ``--prompt-tokens`` random ordinary tokens), same
number of new tokens, plain sampling at temperature 1.0 (no top-k, no top-p). Three systems:

- ours: ``capo_train.backends.hf.HFBackend`` with all prompts in one batch (``--batch-size``), as the
  rollout uses it; it also records the log-prob of every sampled token (the old log-probs of the update).
- HF one at a time: ``model.generate`` called once per prompt, no batching: the plain loop a user writes.
- HF batched: ``model.generate`` on all prompts at once (left-padded, with an attention mask).

The HF baselines return token ids only (no scores), which is what they cost at their cheapest; getting
per-token log-probs from them would add ``output_scores`` or a scoring pass. Every sequence generates
exactly ``--new-tokens`` tokens on every side (EOS is ignored: ``min_new_tokens`` for HF, an empty EOS
set for ours), so all three do the same work whatever they sample. Each round runs the three systems
one after the other, in a rotating order; the first (warm-up) round is dropped and ratios are medians of
per-round paired ratios. A new backend is built every round, so no KV prefix is reused.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from capo_train.backends.hf import HFBackend
from capo_train.models import load_actor, make_tiny_llama
from capo_train.models import resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny (make_tiny_llama) or a local HF folder")
    parser.add_argument("--hidden", type=int, default=256, help="tiny model hidden size")
    parser.add_argument("--layers", type=int, default=4, help="tiny model layers")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=0, help="our backend's batch size (0: all prompts)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up round)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from transformers import GenerationConfig

    if args.model == "tiny":
        model, tokenizer = make_tiny_llama(hidden_size=args.hidden, num_layers=args.layers, seed=args.seed)
        tokenizer.padding_side = "left"
        model.config.pad_token_id = tokenizer.pad_token_id
        what = f"tiny llama (hidden {args.hidden}, {args.layers} layers)"
    else:
        model, tokenizer = load_actor(resolve_model_path(args.model))
        what = args.model
    model.eval()
    g = torch.Generator().manual_seed(args.seed)
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    prompts = ordinary[torch.randint(len(ordinary), (args.prompts, args.prompt_tokens), generator=g)]  # [n, P]
    n, new = args.prompts, args.new_tokens
    sampling = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {what}, {params / 1e6:.1f}M parameters; {n} prompts x {args.prompt_tokens} tokens, {new} new "
          f"tokens each, T=1.0; torch {torch.__version__} ({torch.get_num_threads()} threads)")

    def ours(seed: int) -> int:
        backend = HFBackend(model, tokenizer, batch_size=args.batch_size or n)
        backend.eos_ids = frozenset()  # exactly `new` tokens per sequence, as min_new_tokens does for HF
        gens = backend.generate(prompts.tolist(), stop=[], max_new_tokens=new, seed=seed)
        return sum(len(x.token_ids) for x in gens)

    @torch.inference_mode()
    def hf_single(seed: int) -> int:
        torch.manual_seed(seed)
        total = 0
        for p in prompts:
            out = model.generate(p[None], attention_mask=torch.ones_like(p[None]), generation_config=sampling)
            total += out.shape[1] - p.shape[0]
        return total

    @torch.inference_mode()
    def hf_batched(seed: int) -> int:
        torch.manual_seed(seed)
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=sampling)
        return (out.shape[1] - prompts.shape[1]) * n

    systems = {"ours HFBackend (batched)": ours, "HF generate, one at a time": hf_single,
               "HF generate, batched": hf_batched}
    names = list(systems)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds + 1):
        for name in names[r % 3:] + names[: r % 3]:
            start = time.perf_counter()
            tokens = systems[name](args.seed + r)
            elapsed = time.perf_counter() - start
            assert tokens == n * new, f"{name}: {tokens} tokens, expected {n * new}"
            if r:  # round 0 warms up
                seconds[name].append(elapsed)

    base = seconds["HF generate, one at a time"]
    print(f"\n{'system':<30}{'seconds':>9}{'tokens/s':>10}{'vs HF one at a time':>21}")
    for name in names:
        s = statistics.median(seconds[name])
        ratio = statistics.median(b / x for b, x in zip(base, seconds[name]))
        print(f"{name:<30}{s:>9.2f}{n * new / s:>10.1f}{ratio:>20.2f}x")
    print(f"{n * new} new tokens per round; seconds are medians of {args.rounds} rounds, prefill included")


if __name__ == "__main__":
    main()
