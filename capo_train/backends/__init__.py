"""Generation backends: :class:`GenerationBackend` (the interface), :class:`HFBackend` (Hugging Face, in
process), :class:`OpenAIBackend` (an OpenAI-compatible server: vLLM, or ``capo serve``)."""

from .base import Generation, GenerationBackend
from .hf import HFBackend
from .openai import OpenAIBackend, OpenAIBackendError

__all__ = ["Generation", "GenerationBackend", "HFBackend", "OpenAIBackend", "OpenAIBackendError"]
