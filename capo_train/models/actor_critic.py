"""Actor, critic and reference models: loading (local folders only), LoRA, and the ``ActorCritic`` module
whose one forward gives the per-token log-probs and values the trainer needs (alignment: ``logprobs``).

Critic options (the authors' code initialises a separate critic LLM from the actor's checkpoint:
``critic.model.path=$MODEL_PATH`` in the AgentR1/CAPO launch scripts):

- ``SeparateCritic``: its own backbone loaded from the actor's checkpoint + ``ValueHead`` (the authors').
- ``SharedCritic``: a ``ValueHead`` on the actor's final hidden states, so one forward pass gives logits
  and values (half the memory and time; the trainer's default on CPU). With ``detach_backbone=True``
  (default) the head reads detached features: the value loss trains the head only and cannot perturb the
  policy, so the authors' critic-then-actor update order keeps its meaning. With ``False`` the value loss
  also reaches the backbone; the trainer must then step the actor's optimizer on the sum of both losses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .logprobs import LOGP_CHUNK, ModelOutput, final_hidden, lm_logp, position_ids


@dataclass
class LoraSettings:
    """peft LoRA on every attention and MLP projection of a Llama-style model.

    ``last_layers``: adapt only the last N decoder layers (0 = all). Backward then stops at the first
    adapted layer, which on CPU roughly halves the cost of an update for N = a quarter of the layers.
    """

    r: int = 16
    last_layers: int = 0
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )


# ----------------------------------------------------------------------------- loading


def _lora(model: nn.Module, lora: LoraSettings, task_type: str | None) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type=task_type,
        layers_to_transform=_last_layers(model, lora.last_layers),
    )
    return get_peft_model(model, config)


def _last_layers(model: nn.Module, n: int) -> list[int] | None:
    if n <= 0:
        return None
    total = model.config.num_hidden_layers
    return list(range(max(total - n, 0), total))


def _prepare(model: nn.Module, gradient_checkpointing: bool) -> nn.Module:
    model.config.use_cache = False  # training forwards never reuse a KV cache; generate() passes its own
    if gradient_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad, so it also works with frozen
        # embeddings under LoRA. (transformers 5 renamed the method; 4.x has only the old name.)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def load_tokenizer(path: str | Path):
    """Tokenizer set up for batched generation: left padding, and a pad token (EOS when the model has
    none, as SmolLM2 does; attention masks keep pad and EOS apart)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_actor(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    lora: LoraSettings | None = None,
    gradient_checkpointing: bool = False,
):
    """Load a Hugging Face causal LM and its tokenizer from a local folder (or a hub id already in the
    cache: nothing is ever downloaded). With ``lora`` only the adapters are trainable.

    Returns ``(model, tokenizer)``.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    if getattr(model.config, "final_logit_softcapping", None):
        raise NotImplementedError(
            "models that transform logits after lm_head (softcapping) are not supported"
        )
    model.config.pad_token_id = tokenizer.pad_token_id
    model = _prepare(model, gradient_checkpointing)
    if lora is not None:
        model = _lora(model, lora, task_type="CAUSAL_LM")
    return model, tokenizer


def load_reference(path: str | Path, *, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Frozen copy of the initial checkpoint for the KL term (the authors' reference model). Load it only
    when the KL coefficient is non-zero and the actor has no LoRA (with LoRA, ``reference_logp`` disables
    the adapters instead of holding a second copy)."""
    model, _ = load_actor(path, dtype=dtype)
    return model.eval().requires_grad_(False)


# ----------------------------------------------------------------------------- heads and critics


class ValueHead(nn.Module):
    """Scalar value per position: ``Linear(H, 1)`` on final hidden states ``[R, S, H]`` -> ``[R, S]``.

    Small initial weights and zero bias make initial values ~0, so the first critic targets (returns)
    are not swamped by a random offset. Computed in float32 whatever the backbone dtype, and whatever dtype the
    head's own weights were cast to (``model.to(torch.bfloat16)`` casts them with the rest).
    """

    def __init__(self, hidden_size: int, init_std: float = 1e-3):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.linear.weight, std=init_std)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        weight, bias = self.linear.weight, self.linear.bias
        return F.linear(hidden.float(), weight.float(), bias.float()).squeeze(-1)


class SharedCritic(nn.Module):
    """Value head on the actor's own final hidden states (see the module docstring for ``detach_backbone``)."""

    def __init__(self, hidden_size: int, *, detach_backbone: bool = True):
        super().__init__()
        self.head = ValueHead(hidden_size)
        self.detach_backbone = detach_backbone

    def forward(self, actor_hidden: Tensor) -> Tensor:
        return self.head(actor_hidden.detach() if self.detach_backbone else actor_hidden)


class SeparateCritic(nn.Module):
    """Own backbone (no LM head) initialised from the actor's checkpoint, plus a ``ValueHead``."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(backbone.config.hidden_size)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
    ) -> SeparateCritic:
        from transformers import AutoModel

        backbone = _prepare(
            AutoModel.from_pretrained(path, dtype=dtype, local_files_only=True), gradient_checkpointing
        )
        if lora is not None:
            backbone = _lora(backbone, lora, task_type=None)
        return cls(backbone)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
        )
        return self.head(out.last_hidden_state)



# ----------------------------------------------------------------------------- actor-critic


class ActorCritic(nn.Module):
    """Actor (causal LM, optionally peft-LoRA) + optional critic, behind one ``forward``.

    ``meta`` records how the pair was built (base checkpoint, LoRA, critic kind) so ``save_checkpoint``
    can write what ``load_checkpoint`` needs to rebuild it.
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: SharedCritic | SeparateCritic | None = None,
        *,
        meta: dict | None = None,
    ):
        super().__init__()
        self.actor = actor
        self.critic = critic
        self.meta = meta or {}

    @property
    def uses_lora(self) -> bool:
        return hasattr(self.actor, "disable_adapter")

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.actor.parameters() if p.requires_grad)

    def critic_parameters(self) -> Iterator[nn.Parameter]:
        """The critic optimizer's parameters (a shared critic's are its head only: with
        ``detach_backbone=False`` the backbone still belongs to the actor optimizer)."""
        return (
            (p for p in self.critic.parameters() if p.requires_grad) if self.critic is not None else iter(())
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        *,
        need_values: bool,
        need_logp: bool = True,
        need_entropy: bool = False,
        logp_mask: Tensor | None = None,
        chunk: int = LOGP_CHUNK,
        recompute: bool = False,
        temperature: float = 1.0,
        frozen_states: Tensor | None = None,
    ) -> ModelOutput:
        """``input_ids``/``attention_mask`` ``[R, S]`` -> ``ModelOutput`` of ``[R, S]`` tensors.

        ``need_logp=False`` is the critic-only pass: a separate critic skips the actor entirely; a shared
        critic with a detached backbone runs the backbone without autograd. ``logp_mask``, ``chunk``,
        ``recompute`` and ``temperature``: see ``lm_logp``. ``frozen_states`` ``[R, S, H]``: the actor's
        hidden states entering its first trainable layer, recorded by the rollout (``final_hidden``); the
        actor then runs only its trainable layers (a separate critic still runs its whole backbone).
        """
        out = ModelOutput()
        hidden = None
        if need_logp:
            if frozen_states is not None:
                hidden = final_hidden(self.actor, input_ids, attention_mask, frozen_states)
            out.logp, out.entropy, hidden = lm_logp(
                self.actor,
                input_ids,
                attention_mask,
                hidden=hidden,
                logp_mask=logp_mask,
                need_entropy=need_entropy,
                chunk=chunk,
                recompute=recompute,
                temperature=temperature,
            )
        if need_values:
            if self.critic is None:
                raise ValueError("values requested from an ActorCritic built without a critic")
            if isinstance(self.critic, SeparateCritic):
                out.values = self.critic(input_ids, attention_mask)
            else:
                if hidden is None:
                    with torch.set_grad_enabled(torch.is_grad_enabled() and not self.critic.detach_backbone):
                        hidden = final_hidden(self.actor, input_ids, attention_mask, frozen_states)
                out.values = self.critic(hidden)
        return out


def build_actor_critic(
    path: str | Path,
    *,
    critic: str | None = "shared",
    detach_backbone: bool = True,
    dtype: torch.dtype = torch.float32,
    lora: LoraSettings | None = None,
    gradient_checkpointing: bool = False,
):
    """Actor from ``path`` plus a critic (``"shared"``, ``"separate"`` from the same checkpoint, or None
    for critic-free methods such as GRPO). A separate critic gets LoRA too when the actor has it.

    Returns ``(ActorCritic, tokenizer)``.
    """
    if critic not in ("shared", "separate", None):
        raise ValueError(f"critic must be 'shared', 'separate' or None, not {critic!r}")
    actor, tokenizer = load_actor(path, dtype=dtype, lora=lora, gradient_checkpointing=gradient_checkpointing)
    if critic == "shared":
        head = SharedCritic(actor.config.hidden_size, detach_backbone=detach_backbone)
    elif critic == "separate":
        head = SeparateCritic.from_pretrained(
            path, dtype=dtype, lora=lora, gradient_checkpointing=gradient_checkpointing
        )
    else:
        head = None
    meta = {
        "base": str(path),
        "critic": critic,
        "detach_backbone": detach_backbone,
        "lora": asdict(lora) if lora is not None else None,
    }
    return ActorCritic(actor, head, meta=meta), tokenizer



__all__ = [
    "ActorCritic",
    "LoraSettings",
    "SeparateCritic",
    "SharedCritic",
    "ValueHead",
    "build_actor_critic",
    "load_actor",
    "load_reference",
    "load_tokenizer",
]
