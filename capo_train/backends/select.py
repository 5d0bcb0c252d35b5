"""Which backend samples the trainer's rollouts (``rollout.backend``), and keeping its weights current.

- ``hf`` (the default): a fresh :class:`HFBackend` on the actor each iteration. It generates with the very
  module the optimizer updates, so there is nothing to sync; a new one per rollout drops the prefix caches
  computed with the old weights.
- ``vllm``: one :class:`capo_train.backends.vllm.VLLMBackend` for the whole run, colocated on the GPU, built
  at the first RL iteration from the base checkpoint and loaded at once with the actor's current weights
  (the warm start, a resumed checkpoint, LoRA merged), then given the new weights after every optimizer
  update (:func:`sync_rollout_weights`). One training process only: vLLM's engine is in-process.

``backend_problem`` is what config validation asks, so ``rollout.backend=vllm`` on a machine without vLLM
or CUDA stops before any model is loaded. The trainer goes through :func:`rollout_backend` and
:func:`sync_rollout_weights` alone, so a GPU test can call them as the trainer does
(tests/test_rollout_backend.py).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ..errors import ConfigError
from ..models.smollm2 import resolve_model_path
from .base import GenerationBackend
from .hf import HFBackend

ROLLOUT_BACKENDS = ("hf", "vllm")


def backend_problem(name: str, device: str = "auto") -> str | None:
    """Why ``rollout.backend=name`` cannot run in this process, as a message naming the key; None when it
    can. Checks only what is cheap to know before loading anything: the package, CUDA, the process count."""
    if name not in ROLLOUT_BACKENDS:
        return f"rollout.backend must be one of {', '.join(map(repr, ROLLOUT_BACKENDS))}, got {name!r}"
    if name == "hf":
        return None
    if device == "cpu":
        return "rollout.backend=vllm needs a CUDA GPU, but device=cpu; use rollout.backend=hf"
    if importlib.util.find_spec("vllm") is None:
        return ("rollout.backend=vllm needs vLLM, which is not installed (pip install vllm: a CUDA build, "
                "never part of a CPU install); use rollout.backend=hf")
    import torch

    if not torch.cuda.is_available():
        return "rollout.backend=vllm needs a CUDA GPU, and torch sees none; use rollout.backend=hf"
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return ("rollout.backend=vllm runs in one training process (an in-process engine), not under "
                "torchrun / accelerate launch; past one GPU, see docs/scaleout.md (verl)")
    return None


def holds_weights(backend: Any) -> bool:
    """Whether ``backend`` generates from its own copy of the weights (vLLM), which must be synced."""
    return callable(getattr(backend, "sync_weights", None))


def rollout_backend(config, model, tokenizer, *, batch_size: int, vllm_backend: Any = None,
                    keep_features: bool = False) -> GenerationBackend:
    """The backend one RL iteration samples with. ``config``: the run's ``TrainConfig``; ``model``: its
    ``ActorCritic``; ``vllm_backend``: the vLLM backend an earlier iteration built (returned as it is, its weights
    already synced after that iteration's update), None at the first. ``keep_features``: an HF backend records
    the actor's hidden states for a shared critic (``Generation.features``)."""
    name = config.rollout.backend
    if name == "hf":
        return HFBackend(model.actor, tokenizer, batch_size=batch_size, keep_features=keep_features)
    if vllm_backend is not None:
        return vllm_backend
    problem = backend_problem(name, config.device)
    if problem is not None:  # validation has said so already; a config built in code may skip it
        raise ConfigError(problem)
    import torch

    from .vllm import VLLMBackend

    base = model.meta.get("base") or resolve_model_path(config.model.path)  # its weights are replaced below
    # vLLM checks at start-up that its share of the GPU is free; memory torch has cached but not in use counts
    # as taken, so hand it back first.
    torch.cuda.empty_cache()
    backend = VLLMBackend.from_pretrained(
        str(base), tokenizer, dtype=config.model.dtype,
        gpu_memory_utilization=config.rollout.vllm_gpu_memory_utilization, seed=config.seed,
        # a state and one action: the longest sequence a rollout asks for (vLLM would otherwise reserve the
        # model's whole context, which a small share of the GPU may not hold)
        max_model_len=config.rollout.max_prompt_tokens + config.rollout.max_action_tokens,
    )
    backend.sync_weights(model.actor)  # the actor as it is now: warm-started, resumed, LoRA merged
    return backend


def sync_rollout_weights(backend: Any, model) -> None:
    """After an optimizer update: the actor's new weights into a backend that holds its own copy (vLLM,
    LoRA adapters merged for the copy); nothing for one that generates with the actor itself (HF)."""
    if holds_weights(backend):
        backend.sync_weights(model.actor)
