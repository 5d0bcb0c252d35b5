"""The QA action protocol: ``search`` a query or ``answer`` (ending the episode), one action per turn.

``action_format="tags"`` is Search-R1's ``<search>query</search>`` / ``<answer>text</answer>``;
``"tool_call"`` is Hermes ``<tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>`` with the
answer still written as ``<answer>text</answer>``. The parsing is core's ``TagProtocol`` / ``ToolCallProtocol``.
"""

from __future__ import annotations

from ..core.protocol import ActionProtocol, ToolSpec, make_protocol

QA_TOOLS = (
    ToolSpec("search", "query", "search the knowledge base; you will see the top passages"),
    ToolSpec("answer", "answer", "give the final answer as a short phrase; this ends the episode"),
)


def make_qa_protocol(action_format: str = "tags") -> ActionProtocol:
    """The protocol of every QA env for ``action_format`` ("tags" or "tool_call")."""
    return make_protocol(action_format, QA_TOOLS)
