"""Tiny models for tests and benchmarks: a byte-level tokenizer with SmolLM2's ChatML specials and a
randomly initialised Llama over it. Nothing is downloaded; each builds in well under a second."""

from __future__ import annotations

import torch


def make_tiny_tokenizer():
    """Byte-level tokenizer built in memory (no files): 256 byte tokens + ChatML specials, with a minimal
    chat template, so tests exercise the same code paths as SmolLM2 (whose pad token is its EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    byte_chars = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return chatml_tokenizer(backend)


CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokenizer(backend, **kwargs):
    """A ``tokenizers`` backend as a left-padding HF tokenizer with SmolLM2's ChatML specials (pad = eos)
    and a minimal ChatML template."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        padding_side="left",
        **kwargs,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def make_tiny_llama(*, hidden_size: int = 32, num_layers: int = 2, seed: int = 0, tokenizer=None):
    """A randomly initialised 2-layer ``LlamaForCausalLM`` over ``make_tiny_tokenizer()``'s vocabulary,
    for tests: trains, generates, saves and reloads in well under a second. Returns ``(model, tokenizer)``;
    ``model.save_pretrained(d); tokenizer.save_pretrained(d)`` makes ``d`` loadable by ``load_actor``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or make_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,  # as SmolLM2
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config), tokenizer


__all__ = ["CHATML_TEMPLATE", "chatml_tokenizer", "make_tiny_llama", "make_tiny_tokenizer"]
