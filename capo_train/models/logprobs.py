"""Per-token log-probs of a causal LM, with gradient (the update) or without (``scored_logp``).

Shapes: ``R`` model-input rows (one per action in the per_action layout, one per trajectory in the packed
layout: ``capo_train.rows``), ``S`` padded row length, ``H`` hidden size, ``V`` vocabulary size, ``N``
scored token positions.

Alignment used everywhere (``rows.gather_actions`` turns these ``[R, S]`` tensors into per-action ``[A, L]``):

- ``logp[:, s] = log p(input_ids[:, s] | input_ids[:, :s])``, read from the logits at position ``s - 1``;
  ``logp[:, 0] = 0``, and so is every position that was not scored (padding, or outside ``logp_mask``).
- ``entropy[:, s]``: entropy of that same next-token distribution (same alignment, same zeros).
- ``values[:, s]``: V of the prefix ending at token ``s`` (read at position ``s``). CAPO's action-boundary
  value is ``values[r, last state token]`` (CAPO paper, Fig. 2(b)); token-level PPO reads the action
  positions.

Rows may be padded on both sides (prompt left-padded, response right-padded): position ids are rebuilt
from the attention mask, exactly as ``generate`` does, so training log-probs match rollout log-probs.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

LOGP_CHUNK = 512  # token positions per lm_head chunk: 512 x 49152 float32 logits = 100 MB for SmolLM2


@dataclass
class ModelOutput:
    """All ``[R, S]``; see the module docstring for the alignment."""

    logp: Tensor | None = None
    entropy: Tensor | None = None
    values: Tensor | None = None


# ----------------------------------------------------------------------------- log-probs


def position_ids(attention_mask: Tensor) -> Tensor:
    """``[R, S]`` positions counted over real tokens only (as ``generate`` does for left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _causal_lm(model: nn.Module) -> nn.Module:
    """The transformers model under an optional peft wrapper (LoRA layers are injected in place, so
    calling its submodules still runs the adapters)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def final_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                 frozen_states: Tensor | None = None, first_layer: int | None = None) -> Tensor:
    """``[R, S, H]`` last hidden states of a causal LM (after its final norm), without the LM head.

    ``frozen_states`` ``[R, S, H]``: the hidden states entering the first trainable decoder layer, as the
    rollout recorded them (:func:`frozen_prefix_layers`); only the trainable layers then run. ``first_layer``
    says which layer they enter when ``model`` is not the actor (the KL reference, whose layers below it are
    the actor's frozen ones: :func:`same_leading_layers`); None: the model's own first trainable layer."""
    decoder = _causal_lm(model).get_decoder()
    if frozen_states is not None:
        return _trainable_layers_hidden(decoder, frozen_states, attention_mask, first_layer)
    out = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
    )
    return out.last_hidden_state


# Decoders whose forward feeds ``inputs_embeds`` to the first layer unchanged (no embedding scale, as Gemma
# has) and runs ``self.layers`` in order with one mask and one rotary embedding for all: for them the
# decoder's own forward, given the frozen layers' output as ``inputs_embeds`` and only the trainable
# layers, is the second half of a full forward. Only Llama (SmolLM2) is tested (tests/test_frozen_prefix.py).
FROZEN_PREFIX_MODEL_TYPES = ("llama",)


def frozen_prefix_layers(model: nn.Module) -> int | None:
    """How many leading decoder layers of ``model`` (a causal LM, optionally peft-wrapped) nothing trains:
    LoRA on the last N layers (``model.lora_last_layers``) freezes the others, so their output for a token
    sequence is the same in the rollout and in the update, and the update may start from the rollout's
    record of it (``rollout.frozen_layers_from_rollout``). None when that does not hold: no frozen layer
    (LoRA everywhere), trainable embeddings, an untested architecture, or dropout in the attention (whose
    train-mode output would differ from the rollout's eval-mode one)."""
    inner = _causal_lm(model)
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in FROZEN_PREFIX_MODEL_TYPES or getattr(config, "attention_dropout", 0):
        return None
    decoder = inner.get_decoder()
    if any(p.requires_grad for p in decoder.embed_tokens.parameters()):
        return None
    for i, layer in enumerate(decoder.layers):
        if any(p.requires_grad for p in layer.parameters()):
            return i or None
    return None  # nothing trainable in the decoder


def same_leading_layers(model: nn.Module, other: nn.Module, count: int) -> bool:
    """Whether the embeddings and the first ``count`` decoder layers of two causal LMs hold equal weights: then
    states recorded entering layer ``count`` of one are those of the other (the KL reference merged from a
    warm start whose LoRA trained only the later layers)."""
    a, b = _causal_lm(model).get_decoder(), _causal_lm(other).get_decoder()
    if len(a.layers) != len(b.layers) or type(a) is not type(b):
        return False
    modules = [(a.embed_tokens, b.embed_tokens)] + [(a.layers[i], b.layers[i]) for i in range(count)]
    for mine, theirs in modules:
        ours, their = dict(mine.named_parameters()), dict(theirs.named_parameters())
        # peft names the wrapped weights `base_layer.weight`; the merged reference names them `weight`
        ours = {n.replace("base_layer.", ""): p for n, p in ours.items() if "lora_" not in n}
        if ours.keys() != their.keys() or any(not torch.equal(p, their[n]) for n, p in ours.items()):
            return False
    return True


def _trainable_layers_hidden(decoder: nn.Module, frozen_states: Tensor, attention_mask: Tensor,
                             first_layer: int | None = None) -> Tensor:
    """The decoder's forward from its first trainable layer (or ``first_layer``) on: the decoder runs with
    ``layers`` cut to the later ones and the frozen layers' output as ``inputs_embeds``, so that the causal mask,
    positions, rotary embeddings and gradient checkpointing are the decoder's own, not a copy of them."""
    k = frozen_prefix_layers(decoder) if first_layer is None else first_layer
    if k is None:
        raise ValueError("frozen_states given, but the model has no frozen leading layers (frozen_prefix_layers)")
    if frozen_states.shape[:2] != attention_mask.shape:
        raise ValueError(f"frozen_states {tuple(frozen_states.shape)} do not match the rows {tuple(attention_mask.shape)}")
    layers = decoder.layers
    decoder.layers = nn.ModuleList(list(layers)[k:])  # restored below; the parameters stay where they are
    try:
        out = decoder(inputs_embeds=frozen_states, attention_mask=attention_mask,
                      position_ids=position_ids(attention_mask))
    finally:
        decoder.layers = layers
    return out.last_hidden_state


def _scored_positions(attention_mask: Tensor, logp_mask: Tensor | None) -> Tensor:
    """``[R, S]`` bool: positions ``s >= 1`` whose token and predecessor are both real (a first token
    after left padding has no context), intersected with ``logp_mask``."""
    real = attention_mask.bool()
    scored = torch.zeros_like(real)
    scored[:, 1:] = real[:, 1:] & real[:, :-1]
    return scored & logp_mask.bool() if logp_mask is not None else scored


def _token_logp(
    lm_head: nn.Module, hidden: Tensor, targets: Tensor, need_entropy: bool, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``hidden [N, H]``, ``targets [N]`` -> ``logp [N]``, ``entropy [N]`` (zeros unless asked), under
    ``softmax(logits / temperature)``."""
    logits = lm_head(hidden).float()  # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(-1)  # [N]
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not need_entropy:
        return logp, torch.zeros_like(logp)
    entropy = lse - (logits.softmax(-1) * logits).sum(-1)
    return logp, entropy


def lm_logp(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    hidden: Tensor | None = None,
    logp_mask: Tensor | None = None,
    need_entropy: bool = False,
    chunk: int = LOGP_CHUNK,
    recompute: bool = False,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Per-token log-probs of a causal LM (``[R, S]``, aligned as in the module docstring), under
    ``softmax(logits / temperature)``: the distribution a rollout at that temperature sampled from, so
    that the ratio to its recorded log-probs is 1 before any update.

    The ``[R, S, V]`` logits are never materialised: the LM head runs on at most ``chunk`` scored
    positions at a time, and only on scored positions. Pass ``logp_mask`` = the response mask to skip the
    prompt: on SmolLM2 the 49k-vocab head costs as much as a third of the whole forward+backward.
    Under autograd each chunk's float32 logits stay alive for backward (4 bytes x V per scored token,
    200 KB on SmolLM2); ``recompute=True`` checkpoints each chunk instead, which keeps one chunk alive at a
    time but runs the head's forward twice.

    Returns ``(logp, entropy or None, hidden [R, S, H])``; pass ``hidden`` to reuse a backbone pass.
    """
    if hidden is None:
        hidden = final_hidden(model, input_ids, attention_mask)
    lm_head = _causal_lm(model).get_output_embeddings()
    scored = _scored_positions(attention_mask, logp_mask)  # [R, S]
    h = hidden[:, :-1][scored[:, 1:]]  # [N, H]: position s-1 predicts token s
    targets = input_ids[scored]  # [N]
    pieces = []
    for i in range(0, h.shape[0], chunk):
        args = (lm_head, h[i : i + chunk], targets[i : i + chunk], need_entropy, temperature)
        if recompute and torch.is_grad_enabled() and h.requires_grad:
            pieces.append(checkpoint(_token_logp, *args, use_reentrant=False))
        else:
            pieces.append(_token_logp(*args))
    logp_flat = torch.cat([p[0] for p in pieces]) if pieces else h.new_zeros(0, dtype=torch.float32)
    logp = torch.zeros(scored.shape, dtype=torch.float32, device=hidden.device).masked_scatter(
        scored, logp_flat
    )
    entropy = None
    if need_entropy:
        ent_flat = torch.cat([p[1] for p in pieces]) if pieces else logp_flat
        entropy = torch.zeros_like(logp).masked_scatter(scored, ent_flat)
    return logp, entropy, hidden


# ----------------------------------------------------------------------------- no-grad scoring


@contextmanager
def evaluating(module: nn.Module):
    """``eval()`` + ``no_grad`` for the duration, restoring the previous train/eval mode after."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield module
    finally:
        module.train(was_training)


@torch.no_grad()
def scored_logp(
    scorer: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    logp_mask: Tensor | None = None,
    micro_batch: int = 8,
    temperature: float = 1.0,
    frozen_states: Tensor | None = None,
    first_layer: int | None = None,
) -> Tensor:
    """``[R, S]`` log-probs of ``scorer`` (a causal LM) in eval mode, without gradient, ``micro_batch`` rows
    at a time: the reference policy's (``scoring.reference_logp``), or the actor's own when the trainer
    recomputes the rollout's old log-probs (``rollout.recompute_logprobs``). ``frozen_states`` ``[R, S, H]``
    and ``first_layer``: as :func:`final_hidden`, only the layers from ``first_layer`` on run."""
    parts = []
    with evaluating(scorer):
        for i in range(0, input_ids.shape[0], micro_batch):
            rows = slice(i, i + micro_batch)
            mask = logp_mask[rows] if logp_mask is not None else None
            states = frozen_states[rows] if frozen_states is not None else None
            hidden = final_hidden(scorer, input_ids[rows], attention_mask[rows], states, first_layer)
            parts.append(lm_logp(scorer, input_ids[rows], attention_mask[rows], hidden=hidden, logp_mask=mask,
                                 temperature=temperature)[0])
    return torch.cat(parts)


__all__ = ["LOGP_CHUNK", "ModelOutput", "evaluating", "final_hidden", "frozen_prefix_layers", "lm_logp", "position_ids",
           "same_leading_layers", "scored_logp"]
