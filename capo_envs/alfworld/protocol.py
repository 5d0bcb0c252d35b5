"""The ALFWorld action formats: ``<action>command</action>`` (verl-agent/GiGPO's tag), or the CAPO authors'
tool call ``<tool_call>{"name": "env_step", "arguments": {"command": ...}}</tool_call>``
(their ``recipe/alfworld``). One command per turn; there is no final answer tool, since the
game ends when it is won.
"""

from __future__ import annotations

import json

from ..core.env import choice_knob
from ..core.protocol import ActionProtocol, ParseResult, TagProtocol, ToolSpec, _scan_tags, decode_tool_call

ACTION_TOOL = ToolSpec("action", "command", "send one admissible command to the game, e.g. go to fridge 1")
STEP_TOOL = ToolSpec("env_step", "command", "send one admissible command to the game, e.g. go to fridge 1")
ACTION_FORMATS = ("tags", "tool_call")


class StepCallProtocol(ActionProtocol):
    """Hermes tool calls with one tool and no final answer: ``<tool_call>{"name": "env_step", ...}</tool_call>``."""

    name = "tool_call"

    def _parse_text(self, text: str) -> ParseResult:
        spans, error = _scan_tags(text, ["tool_call"])
        if error:
            return ParseResult(None, error)
        if not spans:
            return ParseResult(None, "no <tool_call> found")
        if len(spans) > 1:
            return ParseResult(None, f"found {len(spans)} calls; give exactly one per turn")
        decoded = decode_tool_call(spans[0].content, list(self.tools.values()))
        if isinstance(decoded, str):
            return ParseResult(None, decoded)
        return self._make_action(*decoded)

    def render(self, action) -> str:
        tool = self.tools[action.name]
        body = json.dumps({"name": tool.name, "arguments": {tool.arg: action.args[tool.arg]}}, ensure_ascii=False)
        return f"<tool_call>{body}</tool_call>"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ("</tool_call>",)

    @property
    def format_hint(self) -> str:
        tool = next(iter(self.tools.values()))
        return f'Reply with exactly one <tool_call>{{"name": "{tool.name}", "arguments": {{"{tool.arg}": "..."}}}}</tool_call>.'

    @property
    def instructions(self) -> str:
        tool = next(iter(self.tools.values()))
        example = json.dumps({"name": tool.name, "arguments": {tool.arg: "..."}})
        return (
            "You are in a household. Pick exactly one admissible command per turn. You may reason first. "
            f"Then make exactly one tool call and stop after it:\n<tool_call>{example}</tool_call>: {tool.description}"
        )


class ActionTagProtocol(TagProtocol):
    name = "tags"

    @property
    def instructions(self) -> str:
        return "You are in a household. Pick exactly one admissible command per turn.\n" + super().instructions


def make_protocol(action_format: str) -> ActionProtocol:
    choice_knob("action_format", action_format, ACTION_FORMATS)
    if action_format == "tags":
        return ActionTagProtocol([ACTION_TOOL])
    return StepCallProtocol([STEP_TOOL])
