"""Generation backends: :class:`GenerationBackend` (the interface), :class:`HFBackend` (Hugging Face)."""

from .base import Generation, GenerationBackend
from .hf import HFBackend

__all__ = ["Generation", "GenerationBackend", "HFBackend"]
