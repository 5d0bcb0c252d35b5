"""The ids the diagnostics domain registers: three generated tasks, each isolating one property an RL
algorithm for LLM agents must handle (docs/diagnostics.md)."""

from __future__ import annotations

from ..core.registry import EnvCard

_GENERATED = "none (generated from a seed in seconds)"

CARDS: tuple[EnvCard, ...] = (
    EnvCard(
        id="capo/SynthChain-v0",
        entry_point="capo_envs.diagnostics.env:SynthChainEnv",
        cpu_preset={"k": 4, "expert_skill": 0.0},
        cpu_preset_why="4 decisions, and a demonstrator that picks random doors: the warm start teaches the "
                       "action format and nothing of the task",
        summary="diagnostic: k door choices (k=1..16), each cued by its observation, rewarded only at the end",
        data=_GENERATED,
        action_format="<go>left</go> | <go>right</go> (choices=2..4 doors)",
        reward="at the last step: the fraction of right doors (reward='fraction') or 1 if all were right ('all')",
        metrics="success, correct_fraction",
    ),
    EnvCard(
        id="capo/SynthLength-v0",
        entry_point="capo_envs.diagnostics.env:SynthLengthEnv",
        summary="diagnostic: a 3-token <pick> then a long <write> (long_words=1..64) of the picked record",
        data=_GENERATED,
        action_format="<pick>n</pick> then <write>text</write> (or Hermes <tool_call> for the pick)",
        reward="at the end: token F1 of the write against the right record (reward='f1'), or exact match",
        metrics="success, pick_correct, write_f1",
    ),
    EnvCard(
        id="capo/SynthTrap-v0",
        entry_point="capo_envs.diagnostics.env:SynthTrapEnv",
        summary="diagnostic: report shown codes while a malformed 'ANSWER: n' shortcut tempts (temptation=0..1)",
        data=_GENERATED,
        action_format="<answer>n</answer>; the shortcut is an invalid action",
        reward="1/steps per code reported right in the valid format, minus invalid_penalty per invalid action",
        metrics="success, correct_fraction, invalid_rate, shortcut_rate",
    ),
)
