"""The paper-search action protocol: up to ``max_calls`` search/expand calls in one action, or a stop.

The CAPO flow lets one model turn hold several tool calls ("You support parallel tool calling", at most 5
executed); capo's QA protocols take exactly one. These subclasses reuse the core protocols' scanning and
argument checks and only add the multi-call rule:

* ``tags``: ``<search>query</search>``, ``<expand>paper id</expand>`` (up to ``max_calls`` of them), or
  ``<stop></stop>`` alone;
* ``tool_call``: Hermes ``<tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>`` blocks,
  or ``<stop></stop>``.

A malformed call makes the whole action invalid (nothing runs; the feedback names the call). Calls past
``max_calls`` are dropped, as in the CAPO flow; the action records how many. With several calls allowed,
generation must not stop at the first closing tag, so the stop strings are only ``</stop>`` (the action
ends at the model's end of turn); with ``max_calls=1`` they are every closing tag, as in the QA envs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..core.protocol import Action, ParseResult, TagProtocol, ToolCallProtocol, ToolSpec, _scan_tags

SEARCH = ToolSpec("search", "query", "search the paper database; shows the top 10 papers (id, title, year, "
                                      "authors, abstract) and adds the relevant ones to your pool")
EXPAND = ToolSpec("expand", "paper_id", "add the papers that cite, and are cited by, a paper of your pool "
                                        "(give its arXiv id)")
# paper_handles="pool": papers are named by their pool handle (P1, P2, ...) instead of their arXiv id.
EXPAND_BY_HANDLE = ToolSpec("expand", "paper_id", "add the papers that cite, and are cited by, a paper of your "
                                                  "pool (give its handle, such as P1)")
STOP = ToolSpec("stop", "reason", "end the search when your pool holds what the query asks for")
PAPER_TOOLS = (SEARCH, EXPAND, STOP)


def _paper_tools(by_handle: bool) -> tuple[ToolSpec, ...]:
    return (SEARCH, EXPAND_BY_HANDLE, STOP) if by_handle else PAPER_TOOLS


DEFAULT_MAX_CALLS = 5


@dataclass(frozen=True)
class MultiAction(Action):
    """One action of several calls (``calls``; one call: ``name``/``args`` are that call's), or a stop.

    ``to_dict`` keeps ``info["action"]``'s shape: ``{"name": str, "args": {str: str}}``; several calls are
    named ``"search+expand"`` with arguments numbered ``"1.query"``, ``"2.paper_id"``."""

    calls: tuple[Action, ...] = ()
    dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        if len(self.calls) <= 1:
            return super().to_dict()
        args = {f"{i}.{k}": v for i, call in enumerate(self.calls, 1) for k, v in call.args.items()}
        return {"name": "+".join(c.name for c in self.calls), "args": args}


def _combine(calls: list[Action], dropped: int) -> ParseResult:
    if len(calls) == 1:
        return ParseResult(MultiAction(calls[0].name, dict(calls[0].args), calls=tuple(calls), dropped=dropped))
    return ParseResult(MultiAction("+".join(c.name for c in calls), {}, calls=tuple(calls), dropped=dropped))


STOP_ACTION = MultiAction("stop", {}, calls=())


class _MultiCall:
    """What both formats share: the call cap, the stop rule, and the instructions' wording."""

    max_calls: int
    stop_without_call: bool

    def _finish(self, calls: list[ParseResult]) -> ParseResult:
        for i, result in enumerate(calls, 1):
            if not result.valid:
                where = f"call {i}: " if len(calls) > 1 else ""
                return ParseResult(None, where + (result.error or "invalid call"))
        kept = [r.action for r in calls[: self.max_calls]]
        return _combine(kept, len(calls) - len(kept))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.max_calls == 1:
            return self._single_stop_strings
        return ("</stop>",)

    def _calls_line(self) -> str:
        if self.max_calls == 1:
            return "Make exactly one call per turn."
        return f"You may make up to {self.max_calls} calls in one turn (more are ignored)."


class PaperTagProtocol(_MultiCall, TagProtocol):
    name = "tags"

    def __init__(self, *, max_calls: int = DEFAULT_MAX_CALLS, stop_without_call: bool = False,
                 by_handle: bool = False, **kwargs: Any):
        super().__init__(_paper_tools(by_handle), **kwargs)
        self.max_calls, self.stop_without_call = max_calls, stop_without_call
        self.expand_tool = self.tools["expand"]
        self._id_name = "handle" if by_handle else "arXiv id"

    @property
    def _single_stop_strings(self) -> tuple[str, ...]:
        return TagProtocol.stop_strings.fget(self)

    def _parse_text(self, text: str) -> ParseResult:
        spans, error = _scan_tags(text, list(self.tools))
        if error:
            return ParseResult(None, error)
        if not spans:
            return ParseResult(STOP_ACTION) if self.stop_without_call else ParseResult(None, "no action found")
        if any(s.tag == "stop" for s in spans):
            if len(spans) > 1:
                return ParseResult(None, "<stop> must be the only tag of its turn")
            return ParseResult(STOP_ACTION)
        return self._finish([self._make_action(s.tag, s.content) for s in spans])

    @property
    def format_hint(self) -> str:
        return (f"Reply with one or more <search>query</search> or <expand>{self._id_name}</expand> tags, "
                "or <stop></stop> alone to finish.")

    @property
    def instructions(self) -> str:
        return "\n".join([
            "You may reason first. Then act with tags:",
            f"<search>query</search>: {SEARCH.description}.",
            f"<expand>{self._id_name}</expand>: {self.expand_tool.description}.",
            f"<stop></stop>: {STOP.description}; it must be alone.",
            self._calls_line() + " Do not repeat a query or expand a paper twice: that costs a penalty.",
        ])


class PaperToolCallProtocol(_MultiCall, ToolCallProtocol):
    name = "tool_call"

    def __init__(self, *, max_calls: int = DEFAULT_MAX_CALLS, stop_without_call: bool = False,
                 by_handle: bool = False, **kwargs: Any):
        super().__init__(_paper_tools(by_handle), final="stop", **kwargs)
        self.max_calls, self.stop_without_call = max_calls, stop_without_call
        self.expand_tool = self.tools["expand"]

    @property
    def _single_stop_strings(self) -> tuple[str, ...]:
        return ToolCallProtocol.stop_strings.fget(self)

    def _parse_text(self, text: str) -> ParseResult:
        spans, error = _scan_tags(text, ["tool_call", "stop"])
        if error:
            return ParseResult(None, error)
        if not spans:
            if self.stop_without_call:  # the CAPO flow: a turn without a tool call ends the episode
                return ParseResult(STOP_ACTION)
            return ParseResult(None, "no <tool_call> or <stop> found")
        if any(s.tag == "stop" for s in spans):
            if len(spans) > 1:
                return ParseResult(None, "<stop> must be alone, without tool calls")
            return ParseResult(STOP_ACTION)
        # Each body goes through the core parser, which checks the JSON, the tool and its argument.
        return self._finish([ToolCallProtocol._parse_text(self, f"<tool_call>{s.content}</tool_call>")
                             for s in spans])

    def render(self, action: Action) -> str:
        if action.name == "stop":
            return "<stop></stop>"
        calls = action.calls if isinstance(action, MultiAction) and action.calls else (action,)
        return "".join(ToolCallProtocol.render(self, c) for c in calls)

    @property
    def format_hint(self) -> str:
        return ('Reply with one or more <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call> '
                'or <tool_call>{"name": "expand", "arguments": {"paper_id": "..."}}</tool_call>, '
                "or <stop></stop> alone to finish.")

    @property
    def instructions(self) -> str:
        lines = ["You may reason first. Then make tool calls:"]
        for tool in (SEARCH, self.expand_tool):
            example = json.dumps({"name": tool.name, "arguments": {tool.arg: "..."}})
            lines.append(f"<tool_call>{example}</tool_call>: {tool.description}.")
        lines.append(f"Or <stop></stop> alone: {STOP.description}.")
        lines.append(self._calls_line() + " Do not repeat a query or expand a paper twice: that costs a penalty.")
        return "\n".join(lines)


def render_calls(protocol: Any, calls: list[Action]) -> str:
    """The text of an action made of ``calls`` (experts), in either format."""
    if not calls:
        return "<stop></stop>"
    if isinstance(protocol, PaperToolCallProtocol):
        return protocol.render(MultiAction(calls[0].name, dict(calls[0].args), calls=tuple(calls)))
    return "".join(TagProtocol.render(protocol, c) for c in calls)


def make_paper_protocol(kind: str, **kwargs: Any):
    if kind == "tags":
        return PaperTagProtocol(**kwargs)
    if kind == "tool_call":
        return PaperToolCallProtocol(**kwargs)
    raise ValueError(f"unknown action format {kind!r}; choose 'tags' or 'tool_call'")
