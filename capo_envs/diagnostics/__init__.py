"""Diagnostic envs: tiny generated tasks, each isolating one property an RL algorithm for LLM agents must
handle (credit assignment over many actions, actions of very different lengths, an invalid-action trap).
See docs/diagnostics.md."""

from .engine import DiagnosticEnv
from .envs import SynthChainEnv, SynthLengthEnv, SynthTrapEnv

__all__ = ["DiagnosticEnv", "SynthChainEnv", "SynthLengthEnv", "SynthTrapEnv"]
