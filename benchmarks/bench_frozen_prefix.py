"""The update's actor pass (forward + backward, log-probs and shared-critic values) with and without the
frozen layers' recorded output (``rollout.frozen_layers_from_rollout``), on a tiny random Llama with LoRA
on its last layers: a sanity check that skipping the frozen layers is faster, not a measurement of a real
model (run the trainer on SmolLM2 for that). Prints one JSON line: median seconds of each over ``--repeats``.

    nice -n 19 python benchmarks/bench_frozen_prefix.py --layers 8 --lora-last 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from capo_train.models import LoraSettings, build_actor_critic, make_tiny_llama
from capo_train.models.logprobs import _causal_lm, frozen_prefix_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--lora-last", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per row")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as path:
        base, tokenizer = make_tiny_llama(hidden_size=args.hidden, num_layers=args.layers, seed=0)
        base.save_pretrained(path)
        tokenizer.save_pretrained(path)
        model, _ = build_actor_critic(path, critic="shared", lora=LoraSettings(r=8, alpha=16, last_layers=args.lora_last))
    k = frozen_prefix_layers(model.actor)
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (args.rows, args.tokens))
    mask = torch.ones_like(ids)
    logp_mask = torch.zeros_like(ids, dtype=torch.bool)
    logp_mask[:, args.tokens // 2 :] = True  # the second half: action tokens

    # the states the rollout would record: the first trainable layer's input in a plain forward
    seen = {}
    layer = _causal_lm(model.actor).get_decoder().layers[k]
    hook = layer.register_forward_pre_hook(lambda m, a, kw: seen.update(x=a[0] if a else kw["hidden_states"]),
                                           with_kwargs=True)
    with torch.no_grad():
        model.actor(input_ids=ids, attention_mask=mask)
    hook.remove()
    states = seen["x"].detach()

    def step(frozen_states):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        out = model(ids, mask, need_values=True, logp_mask=logp_mask, frozen_states=frozen_states)
        (out.logp.sum() + out.values.sum()).backward()
        return time.perf_counter() - start, out.logp.detach()

    model.train()
    times = {"full": [], "frozen_states": []}
    for i in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, s in (("full", None), ("frozen_states", states)):
            seconds, logp = step(s)
            if i:
                times[name].append(seconds)
    gap = (step(None)[1] - step(states)[1]).abs().max().item()
    full, cut = statistics.median(times["full"]), statistics.median(times["frozen_states"])
    print(json.dumps({"layers": args.layers, "frozen_layers": k, "hidden": args.hidden, "rows": args.rows,
                      "tokens": args.tokens, "repeats": args.repeats, "full_s": round(full, 5),
                      "frozen_states_s": round(cut, 5), "speedup": round(full / cut, 2), "max_logp_gap": gap}))


if __name__ == "__main__":
    main()
