"""The diagnostic envs' action protocols: core's tag and Hermes tool-call formats, plus the env's rules.

Each env passes its own tools (``<go>door</go>``, ``<pick>n</pick>`` / ``<write>text</write>``,
``<answer>n</answer>``). The env sets two hooks on its protocol: ``illegal`` (why a well-formed action is not
legal now: ``ActionProtocol.parse`` rejects it like a malformed one) and ``cue`` (the next decision's cue,
appended to the format feedback, so an invalid action still shows what comes next).
"""

from __future__ import annotations

from typing import Callable

from ..core.protocol import TagProtocol, ToolCallProtocol


class _EnvRules:
    """Mixed into a protocol class: appends the env's ``cue()`` to the format feedback."""

    cue: Callable[[], str]

    def feedback(self, error: str) -> str:
        text = super().feedback(error)
        cue = self.cue()
        return f"{text}\n{cue}" if cue else text


class RuledTagProtocol(_EnvRules, TagProtocol):
    pass


class RuledToolCallProtocol(_EnvRules, ToolCallProtocol):
    pass


RULED_PROTOCOLS = {"tags": RuledTagProtocol, "tool_call": RuledToolCallProtocol}
