"""A tiny causal LM for CPU experiments on ``capo/SynthHop-v0``: a BPE tokenizer trained on the SynthHop
world's own text and a randomly initialised ``LlamaForCausalLM``, saved as a Hugging Face folder that
``capo_train.models.load_actor`` loads (so ``capo sft``/``capo train model.path=DIR model.lora=false``).

The tokenizer: byte-level BPE (a vocabulary of 8192 by default) over the world's passages, the train split's
questions and expert actions, and the protocol instructions; ChatML specials with SmolLM2's roles
(``<|im_start|>`` bos, ``<|im_end|>`` eos = pad, left padding) and a ChatML chat template. A space before
a capital or a digit is its own token, so a name has the same ids in a question, a passage and a query
(with 8192 tokens most name words are one token), and the protocol's tags and its whole instructions are
one token each (an episode's packed row is ~230 tokens instead of ~400). The model ("small" preset):
4 layers, hidden 128, 1.84M parameters of which 1.05M are the tied embeddings.

Recipe (torch on one thread, ``OMP_NUM_THREADS=1``; why: docs/results/learning.md, "The tiny SynthHop LM"):

    OMP_NUM_THREADS=1 python -m capo_train.models.tiny_lm --out runs/tiny-lm
    OMP_NUM_THREADS=1 capo sft model.path=runs/tiny-lm model.lora=false \
        sft.episodes=1000 sft.epochs=6 sft.minibatch_rows=8 sft.lr=3e-3 sft.warmup_frac=0.05 \
        sft.lr_schedule=cosine sft.length_buckets=true sft.state_loss_coef=1.0 \
        env.kwargs="{size: small, k: 1, max_passage_chars: 200, question_kinds: [bridge-2, comparison]}" \
        out_dir=runs/tiny-sft
    OMP_NUM_THREADS=1 capo train model.path=runs/tiny-sft/checkpoint/actor model.lora=false sft.episodes=0 \
        env.kwargs="{size: small, k: 1, max_passage_chars: 200, question_kinds: [bridge-2, comparison]}" ...

``sft.state_loss_coef`` trains the model on the state tokens it reads too (a model from scratch must learn
to copy names from the question into its queries); ``--pretrain-steps`` adds next-token training on the
world's passages before cloning. What the recipe reaches, and what did not help, is in
docs/results/learning.md ("The tiny SynthHop LM").
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # unk, bos, eos (= pad), as SmolLM2
# A space before a capital letter or a digit is a token of its own, so a name or number is tokenised the
# same wherever it stands: "Vrugard" in "<search>Vrugard</search>" and in "born in Vrugard." give the same
# ids, and copying an entity from an observation into a query is a plain token copy. Lower-case words keep
# their leading space (" the", " of"), as in GPT-2's byte-level BPE.
SPLIT_BEFORE_NAMES = r" (?=[A-Z0-9])"
OBSERVATION_TAGS = ("<information>", "</information>")
TINY_LM_META = "tiny_lm.json"

# Model shapes. "small" is the recommended CPU model (see the recipe above); "tiny" is for unit tests.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"vocab_size": 384, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
             "intermediate_size": 64},
    "small": {"vocab_size": 8192, "hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
              "intermediate_size": 384},
}  # fmt: skip


# ----------------------------------------------------------------------------- tokenizer


def world_texts(world_seed: int = 0, size: str = "small") -> Iterator[str]:
    """The text a SynthHop agent reads and writes: every passage as an observation shows it, the train
    split's questions and expert actions, and the env's protocol instructions (both action formats).

    Dev and test questions are left out: the tokenizer never sees a held-out question (their entities
    are in the passages anyway)."""
    from capo_envs.core.protocol import Action, make_protocol
    from capo_envs.qa.env import NO_ANSWER, format_passages
    from capo_envs.qa.protocol import QA_TOOLS
    from capo_envs.retrieval.base import Hit
    from capo_envs.qa.world import build_world

    protocols = [make_protocol(kind, QA_TOOLS) for kind in ("tags", "tool_call")]
    for protocol in protocols:
        yield protocol.instructions
    world = build_world(world_seed, size)
    for passage in world.passages:
        hit = Hit(passage.id, passage.title, passage.text, 0.0)
        yield format_passages([hit], None)
    tags = protocols[0]
    for task in world.splits["train"]:
        yield "system\nuser\nassistant"  # the ChatML roles, as frequent as the turns that name them
        yield f"Question: {task.question}"
        for query in task.expert_queries:
            yield tags.render(Action("search", {"query": query}))
        yield tags.render(Action("answer", {"answer": task.answers[0]}))
        yield f"Your answer: {task.answers[0]}"
    yield tags.render(Action("answer", {"answer": NO_ANSWER}))
    yield "No passages found."


def protocol_tokens() -> list[str]:
    """Fixed protocol text that becomes one token each: the action and observation tags, and the whole
    instructions of each action format (a constant system prompt that would otherwise be a hundred
    tokens of every state, read and re-read by every forward pass)."""
    from capo_envs.core.protocol import make_protocol
    from capo_envs.qa.protocol import QA_TOOLS

    tokens = [f"<{t.name}>" for t in QA_TOOLS] + [f"</{t.name}>" for t in QA_TOOLS] + list(OBSERVATION_TAGS)
    return tokens + [make_protocol(kind, QA_TOOLS).instructions for kind in ("tags", "tool_call")]


def train_tokenizer(texts: Sequence[str], vocab_size: int = 8192, added: Sequence[str] = ()):
    """Byte-level BPE over ``texts`` with ChatML specials, pad = eos (as SmolLM2), left padding; each
    string of ``added`` is then one (non-special) token wherever it occurs in a text.

    Deterministic: the trainer breaks ties between equally frequent merges by token ids, which are
    assigned in a fixed order (specials, then the 256 byte characters sorted)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from .tiny import chatml_tokenizer

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_BEFORE_NAMES), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])  # fmt: skip
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer=trainer)
    backend.add_tokens([AddedToken(text, normalized=False) for text in added])
    return chatml_tokenizer(backend, model_max_length=2048)


# ----------------------------------------------------------------------------- model


def make_model(
    tokenizer,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int = 2048,
    seed: int = 0,
):
    """A randomly initialised ``LlamaForCausalLM`` over ``tokenizer``'s vocabulary (tied embeddings, as
    SmolLM2); the global torch RNG is left as it was."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10_000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


# ----------------------------------------------------------------------------- pretraining


def corpus_chats(world_seed: int = 0, size: str = "small") -> list[list[dict[str, str]]]:
    """What the model reads before behaviour cloning, as chats: every passage of the world (the env's
    knowledge base, which any agent may search) as an observation shows it, untruncated, in a user turn;
    and every train question after the protocol's instructions, answered by the expert's first search.
    Dev and test questions are never read."""
    from capo_envs.core.protocol import Action, make_protocol
    from capo_envs.qa.env import format_passages
    from capo_envs.qa.protocol import QA_TOOLS
    from capo_envs.retrieval.base import Hit
    from capo_envs.qa.world import build_world

    world = build_world(world_seed, size)
    chats = [[{"role": "user", "content": format_passages([Hit(p.id, p.title, p.text, 0.0)], None)}]
             for p in world.passages]  # fmt: skip
    tags = make_protocol("tags", QA_TOOLS)
    for task in world.splits["train"]:
        first = tags.render(Action("search", {"query": task.expert_queries[0]}))
        chats.append([{"role": "system", "content": tags.instructions},
                      {"role": "user", "content": f"Question: {task.question}"},
                      {"role": "assistant", "content": first}])  # fmt: skip
    return chats


def pretrain(
    model,
    tokenizer,
    chats: Sequence[list[dict[str, str]]],
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    warmup_frac: float = 0.05,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> list[float]:
    """Next-token training on every token of ``chats`` (templated): ``steps`` AdamW steps on
    ``batch_size`` chats drawn at random, linear warm-up then cosine decay. Returns each step's loss.

    Reading passages, in which every name of the world recurs, together with questions whose first search
    copies a name out of the question, is what teaches a model trained from scratch to copy a name it
    has never produced; behaviour cloning alone does not (see the module docstring)."""
    import random

    import torch

    from ..sft import lr_factor

    rows = [list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)) for chat in chats]
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    pad = tokenizer.pad_token_id
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(steps):
            batch = rng.sample(rows, min(batch_size, len(rows)))
            S = max(len(r) for r in batch)
            ids = torch.full((len(batch), S), pad, dtype=torch.long)
            mask = torch.zeros(len(batch), S, dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
            labels = ids.masked_fill(mask == 0, -100)
            for group in optimizer.param_groups:
                group["lr"] = lr * lr_factor(step, steps, warmup_frac, "cosine")
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    model.eval()
    return losses


def build_tiny_lm(
    out_dir: str | Path,
    *,
    world_seed: int = 0,
    size: str = "small",
    model: str = "small",
    vocab_size: int | None = None,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    protocol: bool = True,
    pretrain_steps: int = 0,
    pretrain_batch: int = 16,
    pretrain_lr: float = 3e-3,
) -> Path:
    """Train the tokenizer on SynthHop world ``(world_seed, size)``, build the model, save both to
    ``out_dir``; returns ``out_dir``.

    ``model`` names a preset of ``MODEL_PRESETS``; any shape argument given overrides it (``vocab_size``
    counts the BPE vocabulary; ``protocol`` adds the ``protocol_tokens()`` on top). Same arguments, same
    files (tokenizer and weights), whatever the process.
    """
    if model not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {model!r}; choose one of {sorted(MODEL_PRESETS)}")
    given = {"vocab_size": vocab_size, "hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
             "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size}  # fmt: skip
    shape = {**MODEL_PRESETS[model], **{k: v for k, v in given.items() if v is not None}}
    tokenizer = train_tokenizer(
        list(world_texts(world_seed, size)), shape.pop("vocab_size"), protocol_tokens() if protocol else ()
    )
    lm = make_model(tokenizer, max_position_embeddings=max_position_embeddings, seed=seed, **shape)
    losses: list[float] = []
    start = time.perf_counter()
    if pretrain_steps > 0:
        chats = corpus_chats(world_seed, size)
        losses = pretrain(
            lm, tokenizer, chats, steps=pretrain_steps, batch_size=pretrain_batch, lr=pretrain_lr, seed=seed
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {
        "world_seed": world_seed,
        "world_size": size,
        "vocab_size": len(tokenizer),
        **shape,
        "max_position_embeddings": max_position_embeddings,
        "seed": seed,
        "protocol_tokens": protocol,
        "pretrain": {"steps": pretrain_steps, "batch": pretrain_batch, "lr": pretrain_lr,
                     "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
                     "seconds": round(time.perf_counter() - start, 1) if losses else 0.0},
        "parameters": sum(p.numel() for p in lm.parameters()),
    }
    (out / TINY_LM_META).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m capo_train.models.tiny_lm", description="Build a tiny SynthHop LM folder for CPU runs."
    )
    parser.add_argument("--out", required=True, help="folder to write (config, weights, tokenizer)")
    parser.add_argument("--world-seed", type=int, default=0, help="SynthHop world whose text trains the tokenizer")
    parser.add_argument("--size", default="small", help="SynthHop world size: tiny, small, medium, large")
    parser.add_argument("--model", default="small", choices=sorted(MODEL_PRESETS), help="model shape preset")
    for name in ("vocab-size", "hidden-size", "num-layers", "num-heads", "num-kv-heads", "intermediate-size"):
        parser.add_argument(f"--{name}", type=int, default=None, help="override the preset")
    parser.add_argument("--max-position-embeddings", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--no-protocol-tokens", action="store_true", help="tokenise tags and instructions as text")
    parser.add_argument("--pretrain-steps", type=int, default=0, help="next-token steps on the world's passages")
    parser.add_argument("--pretrain-batch", type=int, default=16)
    parser.add_argument("--pretrain-lr", type=float, default=3e-3)
    args = parser.parse_args(argv)
    out = build_tiny_lm(
        args.out, world_seed=args.world_seed, size=args.size, model=args.model, vocab_size=args.vocab_size,
        hidden_size=args.hidden_size, num_layers=args.num_layers, num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads, intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings, seed=args.seed, protocol=not args.no_protocol_tokens,
        pretrain_steps=args.pretrain_steps, pretrain_batch=args.pretrain_batch, pretrain_lr=args.pretrain_lr,
    )  # fmt: skip
    meta = json.loads((out / TINY_LM_META).read_text())
    print(f"wrote {out}: {meta['parameters']:,} parameters, vocabulary {meta['vocab_size']}")
    if meta["pretrain"]["steps"]:
        p = meta["pretrain"]
        print(f"pretrained {p['steps']} steps in {p['seconds']} s: loss {p['loss_first']:.3f} -> {p['loss_last']:.3f}")  # noqa: E501
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
