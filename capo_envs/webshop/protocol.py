"""WebShop's action format: ``search[keywords]`` or ``click[value]``, as in the original text env.

``plain`` (default): the reply holds exactly one action, whose argument ends at the first ']' (generation
stops there); text around it (reasoning) is ignored, as the original's regex ignores what follows. ``tags``: the action sits in ``<action>...</action>`` (verl-agent's wrapping), so
reasoning may contain brackets. The argument is lower-cased, as the original's ``step`` does.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..core.env import choice_knob
from ..core.protocol import Action, ActionProtocol, ParseResult, ToolSpec, _scan_tags, _strip_think, clean_text

ACTION_START = re.compile(r"(search|click)\[", re.IGNORECASE)
FORMATS = ("plain", "tags")
TOOLS = (
    ToolSpec("search", "keywords", "search the shop for products"),
    ToolSpec("click", "value", "click a button, a product ID or an option value on the page"),
)


class WebShopProtocol(ActionProtocol):
    def __init__(self, tools, *, action_format: str = "plain", **kwargs: Any):
        choice_knob("action_format", action_format, FORMATS)
        super().__init__(tools, **kwargs)
        self.name = action_format
        self.action_format = action_format
        # Set by the env: the current page's text (and, as ``illegal``, why a well-formed action does nothing
        # on that page: ActionProtocol.parse applies it).
        self.page: Callable[[], str] = lambda: ""

    def _parse_text(self, text: str) -> ParseResult:
        if self.action_format == "tags":
            spans, error = _scan_tags(text, ["action"])
            if error:
                return ParseResult(None, error)
            if len(spans) != 1:
                return ParseResult(None, "no <action> found" if not spans else f"found {len(spans)} actions; give one")
            text = spans[0].content
        return self._parse_plain(_strip_think(text).strip())

    def _parse_plain(self, text: str) -> ParseResult:
        starts = list(ACTION_START.finditer(text))
        if not starts:
            return ParseResult(None, "no action found; write search[keywords] or click[value]")
        if len(starts) > 1:
            return ParseResult(None, f"found {len(starts)} actions; give exactly one")
        start = starts[0]
        close = text.find("]", start.end())
        if close < 0:
            return ParseResult(None, f"{start.group(1).lower()}[ is never closed with ]")
        name = start.group(1).lower()
        result = self._make_action(name, text[start.end() : close])
        if result.valid:
            arg_name = self.tools[name].arg
            result = ParseResult(Action(name, {arg_name: result.action.args[arg_name].lower()}))
        return result

    def render(self, action: Action) -> str:
        text = f"{action.name}[{action.args[self.tools[action.name].arg]}]"
        return f"<action>{text}</action>" if self.action_format == "tags" else text

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ("</action>",) if self.action_format == "tags" else ("]",)

    @property
    def format_hint(self) -> str:
        if self.action_format == "tags":
            return "Reply with exactly one <action>search[keywords]</action> or <action>click[value]</action>."
        return "End your reply with exactly one search[keywords] or click[value]."

    @property
    def instructions(self) -> str:
        body = (
            "You are shopping on WebShop to buy the product the instruction describes. Pages are shown as text "
            "segments separated by [SEP]. Act with search[keywords] to search, or click[value] to click a "
            "button, a product ID or an option value shown on the page (lower case is fine). Clicking "
            "Buy Now buys the product with the options you clicked and ends the episode."
        )
        return f"{body}\n{self.format_hint}"

    def feedback(self, error: str) -> str:
        """The original returns the same page after an invalid action: so does this, after the reason."""
        page = self.page()
        text = f"Invalid action: {clean_text(error)}.\n{self.format_hint}"
        return f"{text}\n{page}" if page else text
