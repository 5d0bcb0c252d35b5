"""No-grad scoring of a whole batch with an ``ActorCritic``: its old log-probs and values (``score``) and
the reference policy's log-probs (``reference_logp``), a few rows at a time. The per-token log-prob
arithmetic they rest on is in ``logprobs``."""

from __future__ import annotations

import weakref
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from .actor_critic import ActorCritic
from .logprobs import ModelOutput, evaluating, frozen_prefix_layers, same_leading_layers, scored_logp


def score(
    model: ActorCritic,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    need_values: bool,
    logp_mask: Tensor | None = None,
    micro_batch: int = 8,
) -> ModelOutput:
    """Old log-probs (and values) of a whole batch without autograd, ``micro_batch`` rows at a time."""
    parts = []
    with evaluating(model):
        for i in range(0, input_ids.shape[0], micro_batch):
            rows = slice(i, i + micro_batch)
            mask = logp_mask[rows] if logp_mask is not None else None
            parts.append(
                model(input_ids[rows], attention_mask[rows], need_values=need_values, logp_mask=mask)
            )
    return ModelOutput(
        logp=torch.cat([p.logp for p in parts]),
        values=torch.cat([p.values for p in parts]) if need_values else None,
    )


def reference_logp(
    model: ActorCritic,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    reference: nn.Module | None = None,
    logp_mask: Tensor | None = None,
    micro_batch: int = 8,
    temperature: float = 1.0,
    frozen_states: Tensor | None = None,
) -> Tensor:
    """``[R, S]`` log-probs under the reference policy (the initial checkpoint) at ``temperature``: a
    frozen ``reference`` model if given, else the actor with its LoRA adapters disabled (no second copy
    in memory).

    ``frozen_states`` ``[R, S, H]`` (``rollout.frozen_layers_from_rollout``): the states the rollout recorded
    entering the actor's first trainable layer. The reference's layers below it are the actor's frozen ones
    (LoRA trains only the later layers, before and after the warm start the reference was merged from; checked
    weight by weight once per reference), so only its later layers run: the pass costs what the update's
    forward does instead of a whole model's (measured on SynthHouse, 22 of SmolLM2's 30 layers skipped)."""
    if reference is None and not model.uses_lora:
        raise ValueError("reference_logp needs a reference model (load_reference) when the actor has no LoRA")
    scorer = reference if reference is not None else model.actor
    first_layer = frozen_prefix_layers(model.actor) if frozen_states is not None else None
    shared = first_layer is not None and (reference is None or _shares_frozen_layers(model.actor, reference, first_layer))
    if not shared:
        frozen_states = first_layer = None  # the whole reference runs
    with model.actor.disable_adapter() if reference is None else nullcontext():
        return scored_logp(scorer, input_ids, attention_mask, logp_mask=logp_mask, micro_batch=micro_batch,
                           temperature=temperature, frozen_states=frozen_states, first_layer=first_layer)


_SHARED_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # reference -> (layers, shared?)


def _shares_frozen_layers(actor: nn.Module, reference: nn.Module, layers: int) -> bool:
    """:func:`same_leading_layers`, computed once per reference (neither side's leading layers ever train)."""
    known = _SHARED_LAYERS.get(reference)
    if known is None or known[0] != layers:
        known = _SHARED_LAYERS[reference] = (layers, same_leading_layers(actor, reference, layers))
    return known[1]


__all__ = ["reference_logp", "score"]
