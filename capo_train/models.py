"""Actor, critic and reference models for the trainer: loading, one forward pass, checkpoints.

Shapes: ``R`` rows (one env step each: state tokens then action tokens), ``S`` padded sequence length,
``H`` hidden size, ``V`` vocabulary size, ``N`` selected token positions.

Alignment used everywhere (the algorithms in ``capo_train.algorithms`` slice these by the response mask):

- ``logp[:, s] = log p(input_ids[:, s] | input_ids[:, :s])``, read from the logits at position ``s - 1``;
  ``logp[:, 0] = 0``, and so is every position that was not scored (padding, or outside ``logp_mask``).
- ``entropy[:, s]``: entropy of that same next-token distribution (same alignment, same zeros).
- ``values[:, s]``: V of the prefix ending at token ``s`` (read at position ``s``). CAPO's action-boundary
  value is ``values[r, last state token]`` (spec §1.2); token-level PPO reads the action positions.

Rows may be padded on both sides (prompt left-padded, response right-padded): position ids are rebuilt
from the attention mask, exactly as ``generate`` does, so training log-probs match rollout log-probs.

Critic options (spec §1.2 says "separate LLM initialised from the actor checkpoint"):

- ``SeparateCritic``: its own backbone loaded from the actor's checkpoint + ``ValueHead`` (the paper's).
- ``SharedCritic``: a ``ValueHead`` on the actor's final hidden states, so one forward pass gives logits
  and values (half the memory and time; the trainer's default on CPU). With ``detach_backbone=True``
  (default) the head reads detached features: the value loss trains the head only and cannot perturb the
  policy, so the critic-then-actor update order of §1.7 keeps its meaning. With ``False`` the value loss
  also reaches the backbone; the trainer must then step the actor's optimizer on the sum of both losses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

LOGP_CHUNK = 512  # token positions per lm_head chunk: 512 x 49152 float32 logits = 100 MB for SmolLM2
CHECKPOINT_META = "capo_models.json"
VALUE_HEAD_FILE = "value_head.safetensors"


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


@dataclass
class ModelOutput:
    """All ``[R, S]``; see the module docstring for the alignment."""

    logp: Tensor | None = None
    entropy: Tensor | None = None
    values: Tensor | None = None


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
    """Frozen copy of the initial checkpoint for the KL term (spec §1.8). Load it only when the KL
    coefficient is non-zero and the actor has no LoRA (with LoRA, ``reference_logp`` disables the adapters
    instead of holding a second copy)."""
    model, _ = load_actor(path, dtype=dtype)
    return model.eval().requires_grad_(False)


# ----------------------------------------------------------------------------- heads and critics


class ValueHead(nn.Module):
    """Scalar value per position: ``Linear(H, 1)`` on final hidden states ``[R, S, H]`` -> ``[R, S]``.

    Small initial weights and zero bias make initial values ~0, so the first critic targets (returns)
    are not swamped by a random offset. Computed in float32 whatever the backbone dtype.
    """

    def __init__(self, hidden_size: int, init_std: float = 1e-3):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.linear.weight, std=init_std)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.float()).squeeze(-1)


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


# ----------------------------------------------------------------------------- log-probs


def position_ids(attention_mask: Tensor) -> Tensor:
    """``[R, S]`` positions counted over real tokens only (as ``generate`` does for left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _causal_lm(model: nn.Module) -> nn.Module:
    """The transformers model under an optional peft wrapper (LoRA layers are injected in place, so
    calling its submodules still runs the adapters)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def final_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``[R, S, H]`` last hidden states of a causal LM (after its final norm), without the LM head."""
    decoder = _causal_lm(model).get_decoder()
    out = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
    )
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
    time but runs the head's forward twice (measured: +60 % head time on 2 CPU cores).

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
    ) -> ModelOutput:
        """``input_ids``/``attention_mask`` ``[R, S]`` -> ``ModelOutput`` of ``[R, S]`` tensors.

        ``need_logp=False`` is the critic-only pass: a separate critic skips the actor entirely; a shared
        critic with a detached backbone runs the backbone without autograd. ``logp_mask``, ``chunk``,
        ``recompute`` and ``temperature``: see ``lm_logp``.
        """
        out = ModelOutput()
        hidden = None
        if need_logp:
            out.logp, out.entropy, hidden = lm_logp(
                self.actor,
                input_ids,
                attention_mask,
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
                        hidden = final_hidden(self.actor, input_ids, attention_mask)
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
) -> Tensor:
    """``[R, S]`` log-probs under the reference policy (the initial checkpoint) at ``temperature``: a
    frozen ``reference`` model if given, else the actor with its LoRA adapters disabled (no second copy
    in memory)."""
    if reference is None and not model.uses_lora:
        raise ValueError("reference_logp needs a reference model (load_reference) when the actor has no LoRA")
    scorer = reference if reference is not None else model.actor
    parts = []
    with evaluating(scorer), model.actor.disable_adapter() if reference is None else nullcontext():
        for i in range(0, input_ids.shape[0], micro_batch):
            rows = slice(i, i + micro_batch)
            mask = logp_mask[rows] if logp_mask is not None else None
            parts.append(lm_logp(scorer, input_ids[rows], attention_mask[rows], logp_mask=mask, temperature=temperature)[0])
    return torch.cat(parts)


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(directory: str | Path, model: ActorCritic, tokenizer) -> None:
    """Write the actor (full weights, or LoRA adapters only), the critic (value head, plus the separate
    backbone or its adapters) and the tokenizer as safetensors into ``directory``. Making the write
    atomic (temp dir + rename) is the trainer's job.

    Layout: ``actor/`` (HF or peft folder + tokenizer), ``critic/`` (separate backbone),
    ``value_head.safetensors``, ``capo_models.json`` (how to rebuild).
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.actor.save_pretrained(directory / "actor")
    tokenizer.save_pretrained(directory / "actor")
    if isinstance(model.critic, SeparateCritic):
        model.critic.backbone.save_pretrained(directory / "critic")
    if model.critic is not None:
        head = {k: v.detach().contiguous() for k, v in model.critic.head.state_dict().items()}
        save_file(head, directory / VALUE_HEAD_FILE)
    (directory / CHECKPOINT_META).write_text(json.dumps(model.meta, indent=2))


def load_checkpoint(
    directory: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    gradient_checkpointing: bool = False,
):
    """Rebuild what ``save_checkpoint`` wrote (LoRA checkpoints also need their base model at the
    recorded ``base`` path). Adapters stay trainable so training can resume. Returns ``(ActorCritic,
    tokenizer)``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = json.loads((directory / CHECKPOINT_META).read_text())
    lora = meta["lora"]
    if lora is None:
        actor, tokenizer = load_actor(
            directory / "actor", dtype=dtype, gradient_checkpointing=gradient_checkpointing
        )
    else:
        from peft import PeftModel

        base, _ = load_actor(meta["base"], dtype=dtype, gradient_checkpointing=gradient_checkpointing)
        actor = PeftModel.from_pretrained(base, directory / "actor", is_trainable=True)
        tokenizer = load_tokenizer(directory / "actor")
    critic = None
    if meta["critic"] == "shared":
        critic = SharedCritic(actor.config.hidden_size, detach_backbone=meta["detach_backbone"])
    elif meta["critic"] == "separate":
        if lora is None:
            critic = SeparateCritic.from_pretrained(
                directory / "critic", dtype=dtype, gradient_checkpointing=gradient_checkpointing
            )
        else:
            from peft import PeftModel
            from transformers import AutoModel

            backbone = _prepare(
                AutoModel.from_pretrained(meta["base"], dtype=dtype, local_files_only=True),
                gradient_checkpointing,
            )
            critic = SeparateCritic(
                PeftModel.from_pretrained(backbone, directory / "critic", is_trainable=True)
            )
    if critic is not None:
        critic.head.load_state_dict(load_file(directory / VALUE_HEAD_FILE))
    return ActorCritic(actor, critic, meta=meta), tokenizer


def export_actor(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Write a checkpoint's actor as a plain Hugging Face model folder (LoRA adapters merged into the
    base weights) plus its tokenizer: what ``model.path`` or any HF tool loads. A warm start exported
    once can then seed every run of a benchmark grid (``sft.episodes=0``)."""
    model, tokenizer = load_checkpoint(checkpoint)
    actor = model.actor.merge_and_unload() if model.uses_lora else model.actor
    out_dir = Path(out_dir)
    actor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# ----------------------------------------------------------------------------- tiny test models


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
