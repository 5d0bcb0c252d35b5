"""The served env's action protocol, as a remote env publishes it: its description (instructions, stop strings,
tools) is the server's, and ``parse`` asks the server's parser, so a trainer reading ``env.unwrapped.protocol``
gets the same answers as from the env itself."""

from __future__ import annotations

from typing import Any, Callable

from ..core.protocol import ActionProtocol, ParseResult, ToolSpec, Action


class RemoteProtocol(ActionProtocol):
    """``describe()``, ``instructions`` and ``stop_strings`` are the served protocol's; ``parse(text)`` runs
    ``ask("parse", text)`` (the owning env's connection, or, in a copy pickled away from it, a connection of its
    own opened by ``connect``) and never raises: a server that cannot be reached is an invalid parse."""

    def __init__(self, description: dict[str, Any] | None, url: str, ask: Callable[[str, list], Any] | None = None):
        self.description = dict(description or {})
        self.name = str(self.description.get("name") or "remote")
        tools = [ToolSpec(str(t), "", "") for t in self.description.get("tools") or () if t] or [ToolSpec("act", "", "")]
        super().__init__(tools, max_action_chars=int(self.description.get("max_action_chars") or 16_384))
        self.url = url
        self._ask = ask
        self._own = None  # a connection of this protocol's own, when it has no env to ask through

    @property
    def instructions(self) -> str:
        return str(self.description.get("instructions") or "")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple(self.description.get("stop_strings") or ())

    @property
    def format_hint(self) -> str:
        return ""

    def describe(self) -> dict[str, Any]:
        return dict(self.description)

    def render(self, action: Action) -> str:
        raise NotImplementedError("a remote protocol cannot render actions; ask the env's expert_action()")

    def parse(self, action: Any) -> ParseResult:
        try:
            value = self._ask_server(action)
            parsed = value.get("action")
            if parsed is not None:
                return ParseResult(Action(str(parsed["name"]), dict(parsed.get("args") or {})))
            return ParseResult(None, str(value.get("error") or "invalid action"))
        except Exception as e:  # noqa: BLE001 - parse never raises
            return ParseResult(None, f"the remote parser could not be asked ({type(e).__name__}: {e})")

    def _ask_server(self, action: Any) -> dict:
        if self._ask is not None:
            return self._ask("parse", [action])
        if self._own is None:
            from .client import SyncSession

            self._own = SyncSession(self.url)
        return self._own.call("parse", [action])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ask"] = state["_own"] = None  # a connection does not travel; the copy opens its own
        return state
