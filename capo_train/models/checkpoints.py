"""Checkpoints: the models (``save_checkpoint`` / ``load_checkpoint`` / ``export_actor``) and a whole
training run (``save_run`` / ``load_run``: the models, the optimizers' state and the run's progress, written
atomically so a kill mid-save leaves the previous checkpoint intact)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .actor_critic import ActorCritic, SeparateCritic, SharedCritic, _prepare, load_actor, load_tokenizer

CHECKPOINT = "checkpoint"  # a run's checkpoint folder inside its out_dir
CHECKPOINT_META = "capo_models.json"
VALUE_HEAD_FILE = "value_head.safetensors"


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


# ----------------------------------------------------------------------------- a training run


@dataclass
class RunState:
    """A run's progress, saved with its checkpoint."""

    iteration: int = 0  # iterations completed
    sft_done: bool = False
    history: list = field(default_factory=list)  # the records logged so far (log.jsonl restarts from them)


def save_run(out_dir: Path, model: ActorCritic, tokenizer, optimizers: dict[str, torch.optim.Optimizer],
             state: RunState, config: dict) -> Path:
    """Write ``out_dir/checkpoint``: the models (:func:`save_checkpoint`), each optimizer's state, the run
    state and ``config`` (as ``config.json``). Written beside the old one, then swapped in: a kill mid-save
    leaves the previous checkpoint intact."""
    final = out_dir / CHECKPOINT
    tmp = out_dir / f".{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(tmp, model, tokenizer)
    torch.save({name: opt.state_dict() for name, opt in optimizers.items()}, tmp / "optimizers.pt")
    (tmp / "run_state.json").write_text(json.dumps(asdict(state)))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    old = out_dir / f".{CHECKPOINT}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_run(
    out_dir: Path, make_optimizers: Callable[[ActorCritic], dict[str, torch.optim.Optimizer]], *,
    dtype: torch.dtype = torch.float32,
) -> tuple[ActorCritic, Any, dict[str, torch.optim.Optimizer], RunState]:
    """What :func:`save_run` wrote: ``(model, tokenizer, optimizers, state)``, the optimizers built by
    ``make_optimizers(model)`` and given their saved state."""
    directory = out_dir / CHECKPOINT
    model, tokenizer = load_checkpoint(directory, dtype=dtype)
    optimizers = make_optimizers(model)
    saved = torch.load(directory / "optimizers.pt", weights_only=True)
    for name, opt in optimizers.items():
        opt.load_state_dict(saved[name])
    return model, tokenizer, optimizers, read_run_state(out_dir)


def read_run_state(out_dir: Path) -> RunState | None:
    """The progress saved with ``out_dir``'s checkpoint; None when there is no checkpoint."""
    path = Path(out_dir) / CHECKPOINT / "run_state.json"
    return RunState(**json.loads(path.read_text())) if path.is_file() else None


__all__ = [
    "CHECKPOINT",
    "RunState",
    "export_actor",
    "load_checkpoint",
    "load_run",
    "read_run_state",
    "save_checkpoint",
    "save_run",
]
