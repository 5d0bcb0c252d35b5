"""Action protocols: how a model is told to act, where one action ends, and how its text becomes an action.

An env owns one protocol and publishes it (``env.unwrapped.protocol``, and ``info["protocol"]`` on reset), so
a trainer can build prompts, stop generation and read feedback without knowing the env.

Parsing is linear in the length of the text (one pass over the tags, no backtracking regex), so a hostile
100k-character action costs microseconds, and it never raises on any Python object: it returns
``ParseResult`` with either an ``Action`` or a human-readable ``error`` that the env sends back as feedback.
"""

from __future__ import annotations

import json
import re
import reprlib
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

DEFAULT_MAX_ACTION_CHARS = 16_384
DEFAULT_MAX_ARG_CHARS = 2_048


@dataclass(frozen=True)
class ToolSpec:
    """One kind of action: its name, its single text argument, and what it does (shown to the model)."""

    name: str
    arg: str
    description: str


@dataclass(frozen=True)
class Action:
    """A parsed action: the tool's name and its arguments, all strings."""

    name: str
    args: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": dict(self.args)}


@dataclass(frozen=True)
class ParseResult:
    action: Action | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.action is not None


def as_text(obj: Any) -> str | None:
    """``obj`` as a plain ``str`` if it is a string (a ``str`` subclass such as ``numpy.str_`` included), else None.

    Only the object's real type is trusted (``isinstance`` also believes a spoofed ``__class__``), and a
    subclass is copied to an exact ``str`` without calling any method it overrides (``__str__``, ``__len__``,
    ``find``, ``__getitem__`` ...), so whatever the parser does next runs on plain, well-behaved text.
    """
    if type(obj) is str:
        return obj
    if issubclass(type(obj), str):
        return str.__getitem__(obj, slice(None))  # the C-level slice copies a subclass into an exact str
    return None


def type_name(obj: Any) -> str:
    """The name of ``obj``'s type, read past any metaclass that overrides ``__name__``."""
    try:
        return type.__dict__["__name__"].__get__(type(obj))
    except Exception:
        return "object"


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 80


def safe_repr(obj: Any) -> str:
    """A short ``repr`` for logs and transcripts that never raises (a huge int's or a hostile object's ``repr``
    does) and never grows with the object (a million-element list gives a few dozen characters)."""
    try:
        return _SHORT_REPR.repr(obj)
    except Exception:
        return f"<{type_name(obj)} object>"


def clean_text(text: str) -> str:
    """Drop control and unassigned characters (keeping newlines and tabs) and surrounding whitespace."""
    if text.isprintable():
        return text.strip()
    kept = (c for c in text if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cs", "Cn"))
    return "".join(kept).strip()


def _strip_think(text: str) -> str:
    """Remove complete ``<think>...</think>`` blocks: reasoning may quote tags without acting."""
    if "<think>" not in text:
        return text
    out, pos = [], 0
    while True:
        start = text.find("<think>", pos)
        if start < 0:
            break
        end = text.find("</think>", start)
        if end < 0:
            break
        out.append(text[pos:start])
        pos = end + len("</think>")
    out.append(text[pos:])
    return "".join(out)


@dataclass(frozen=True)
class _Span:
    tag: str
    content: str


def _scan_tags(text: str, tags: Sequence[str]) -> tuple[list[_Span], str | None]:
    """Find complete ``<tag>content</tag>`` spans in one left-to-right pass.

    Returns the spans and the first structural error (nested or mismatched tags, an unclosed tag).
    A stray closing tag with nothing open is reasoning text and is ignored.
    """
    pattern = re.compile("<(/?)(" + "|".join(re.escape(t) for t in tags) + ")>")
    spans: list[_Span] = []
    open_tag: str | None = None
    open_end = 0
    for m in pattern.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            if open_tag is not None:
                return spans, f"<{tag}> was opened inside <{open_tag}>; tags cannot be nested"
            open_tag, open_end = tag, m.end()
        elif open_tag is None:
            continue
        elif tag != open_tag:
            return spans, f"<{open_tag}> was closed by </{tag}>"
        else:
            spans.append(_Span(tag, text[open_end : m.start()]))
            open_tag = None
    if open_tag is not None and not spans:
        return spans, f"<{open_tag}> is never closed; end it with </{open_tag}>"
    return spans, None


class ActionProtocol:
    """Base class: subclasses define ``instructions``, ``stop_strings``, ``parse`` and ``render``.

    ``illegal``: set by an env whose legal actions depend on its state (a door that does not exist, a button
    not on the page): given a well-formed action, the reason it is not possible now, or None. ``parse`` then
    rejects such an action like a malformed one.
    """

    name: str = "protocol"
    illegal: Callable[[Action], str | None] | None = None

    def __init__(
        self,
        tools: Sequence[ToolSpec],
        *,
        max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
        max_arg_chars: int = DEFAULT_MAX_ARG_CHARS,
    ):
        if not tools:
            raise ValueError("a protocol needs at least one tool")
        if any(not t.name for t in tools):  # "" names the missing action in ``info["action"]``
            raise ValueError("every tool needs a non-empty name")
        self.tools = {t.name: t for t in tools}
        self.max_action_chars = max_action_chars
        self.max_arg_chars = max_arg_chars

    # --- what subclasses provide -------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        raise NotImplementedError

    @property
    def stop_strings(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _parse_text(self, text: str) -> ParseResult:
        raise NotImplementedError

    def render(self, action: Action) -> str:
        """The text a perfect model would write for ``action`` (used by experts and demonstrations)."""
        raise NotImplementedError

    # --- shared behaviour --------------------------------------------------------------------------
    def parse(self, action: Any) -> ParseResult:
        text = as_text(action)
        if text is None:
            return ParseResult(None, f"an action must be a str, got {type_name(action)}")
        if len(text) > self.max_action_chars:
            return ParseResult(
                None, f"the action has {len(text)} characters; the limit is {self.max_action_chars}"
            )
        result = self._parse_text(_strip_think(text))
        if result.valid and self.illegal is not None:
            error = self.illegal(result.action)
            if error:
                return ParseResult(None, error)
        return result

    def feedback(self, error: str) -> str:
        """The observation returned for an invalid action: what went wrong and the expected format."""
        return f"Invalid action: {error}.\n{self.format_hint}"

    @property
    def format_hint(self) -> str:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Everything a trainer needs, as plain data (picklable, JSON-serialisable)."""
        return {
            "name": self.name,
            "instructions": self.instructions,
            "stop_strings": list(self.stop_strings),
            "tools": [t.name for t in self.tools.values()],
            "max_action_chars": self.max_action_chars,
        }

    def _make_action(self, name: str, raw_arg: Any) -> ParseResult:
        tool = self.tools[name]
        if not isinstance(raw_arg, str):
            return ParseResult(None, f'"{tool.arg}" of {name} must be a string')
        arg = clean_text(raw_arg)
        if not arg:
            return ParseResult(None, f"{name} needs a non-empty {tool.arg}")
        if len(arg) > self.max_arg_chars:
            return ParseResult(
                None, f"the {tool.arg} of {name} has {len(arg)} characters; the limit is {self.max_arg_chars}"
            )
        return ParseResult(Action(name, {tool.arg: arg}))


class TagProtocol(ActionProtocol):
    """Search-R1's format: free reasoning, then exactly one ``<tool>argument</tool>``."""

    name = "tags"

    def _parse_text(self, text: str) -> ParseResult:
        spans, error = _scan_tags(text, list(self.tools))
        if error:
            return ParseResult(None, error)
        if not spans:
            return ParseResult(None, "no action found")
        if len(spans) > 1:
            return ParseResult(None, f"found {len(spans)} actions; give exactly one per turn")
        return self._make_action(spans[0].tag, spans[0].content)

    def render(self, action: Action) -> str:
        tool = self.tools[action.name]
        return f"<{tool.name}>{action.args[tool.arg]}</{tool.name}>"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple(f"</{name}>" for name in self.tools)

    @property
    def format_hint(self) -> str:
        forms = " or ".join(f"<{t.name}>{t.arg}</{t.name}>" for t in self.tools.values())
        return f"Reply with exactly one of {forms}, after any reasoning."

    @property
    def instructions(self) -> str:
        lines = [
            "You may reason first. Then act with exactly one of these tags, and stop after it:",
        ]
        lines += [f"<{t.name}>{t.arg}</{t.name}>: {t.description}" for t in self.tools.values()]
        return "\n".join(lines)


def decode_tool_call(body: str, tools: Sequence[ToolSpec]) -> tuple[str, Any] | str:
    """A Hermes ``<tool_call>`` body, ``{"name": ..., "arguments": {...}}``, as ``(tool name, its argument's
    value)`` for one of ``tools``, or the reason it is not one (a str)."""
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or an int over Python's 4300-digit limit
        return "the <tool_call> body is not valid JSON"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call must be a JSON object with a string "name"'
    by_name = {tool.name: tool for tool in tools}
    name = call["name"]
    if name not in by_name:
        return f"unknown tool {name[:50]!r}; the tools are {list(by_name)}"
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some chat templates double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return '"arguments" must be a JSON object'
    arg_name = by_name[name].arg
    if arg_name not in arguments:
        return f'{name} needs the argument "{arg_name}"'
    return name, arguments[arg_name]


class ToolCallProtocol(ActionProtocol):
    """Hermes/Qwen function calling: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    The final tool (``final``, by default ``answer``) is written as ``<answer>text</answer>``, as in the
    CAPO paper's recipes, where finishing means replying without a tool call.
    """

    name = "tool_call"

    def __init__(self, tools: Sequence[ToolSpec], *, final: str = "answer", **kwargs: Any):
        super().__init__(tools, **kwargs)
        if final not in self.tools:
            raise ValueError(f"final tool {final!r} is not among {list(self.tools)}")
        self.final = final

    def _parse_text(self, text: str) -> ParseResult:
        spans, error = _scan_tags(text, ["tool_call", self.final])
        if error:
            return ParseResult(None, error)
        if not spans:
            return ParseResult(None, "no <tool_call> or <answer> found")
        if len(spans) > 1:
            return ParseResult(None, f"found {len(spans)} calls; give exactly one per turn")
        span = spans[0]
        if span.tag == self.final:
            return self._make_action(self.final, span.content)
        decoded = decode_tool_call(span.content, [t for name, t in self.tools.items() if name != self.final])
        if isinstance(decoded, str):
            return ParseResult(None, decoded)
        return self._make_action(*decoded)

    def render(self, action: Action) -> str:
        tool = self.tools[action.name]
        if action.name == self.final:
            return f"<{tool.name}>{action.args[tool.arg]}</{tool.name}>"
        body = json.dumps({"name": tool.name, "arguments": {tool.arg: action.args[tool.arg]}}, ensure_ascii=False)
        return f"<tool_call>{body}</tool_call>"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ("</tool_call>", f"</{self.final}>")

    @property
    def format_hint(self) -> str:
        call = next(t for t in self.tools.values() if t.name != self.final)
        return (
            f'Reply with exactly one <tool_call>{{"name": "{call.name}", "arguments": {{"{call.arg}": "..."}}}}'
            f"</tool_call>, or <{self.final}>...</{self.final}> to finish."
        )

    @property
    def instructions(self) -> str:
        lines = ["You may reason first. Then make exactly one tool call and stop after it:"]
        for t in self.tools.values():
            if t.name == self.final:
                continue
            example = json.dumps({"name": t.name, "arguments": {t.arg: "..."}})
            lines.append(f"<tool_call>{example}</tool_call>: {t.description}")
        final = self.tools[self.final]
        lines.append(f"Or finish with <{final.name}>{final.arg}</{final.name}>: {final.description}")
        return "\n".join(lines)


PROTOCOLS = {"tags": TagProtocol, "tool_call": ToolCallProtocol}


def make_protocol(kind: str, tools: Sequence[ToolSpec], **kwargs: Any) -> ActionProtocol:
    try:
        cls = PROTOCOLS[kind]
    except KeyError:
        raise ValueError(f"unknown action format {kind!r}; choose one of {sorted(PROTOCOLS)}") from None
    return cls(tools, **kwargs)
