"""capo envs in other trainers' hands: TRL's ``GRPOTrainer`` (:mod:`capo_envs.integrations.trl`) and
verifiers' multi-turn envs (:mod:`capo_envs.integrations.verifiers`). Each of those modules imports its
library itself; this package imports neither, nor torch, so ``import capo_envs`` never loads them.

What both need from an env is here: making it on a split, its actions as named one-argument tools, the text
an action becomes, and the episode's reward and success as the trainer contract defines them (README, "The
environment contract").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

# The one tool a plain env (no protocol with named tools) gets: the action text itself.
RAW_TOOL = "act"


@dataclass(frozen=True)
class EnvTool:
    """One action of an env as a tool: ``name(arg: str)``, described by ``description``."""

    name: str
    arg: str
    description: str


def make_env(env_id: str, kwargs: dict | None = None, split: str | None = None) -> gym.Env:
    """``gym.make(env_id, **kwargs)``, on ``split`` when the env takes one; a ``module:Id`` imports the module
    first. Raises ``ValueError`` naming the id when the env cannot be made, so a wrong id or kwarg is one
    clear line rather than a registry traceback."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env_id must be a registered id or 'module:Id', got {env_id!r}")
    kwargs = dict(kwargs or {})
    if "split" in kwargs:
        raise ValueError("pass split= on its own, not inside the env kwargs")
    import capo_envs  # noqa: F401  (registers the capo/* ids)

    module, _, _ = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        name = env_id.rpartition(":")[2]
        if split is not None and _takes_split(name):
            kwargs["split"] = split
        return gym.make(name, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure to build becomes one message naming the env
        raise ValueError(f"cannot make env {env_id!r} with {kwargs}: {type(e).__name__}: {e}") from e


def _takes_split(env_id: str) -> bool:
    from ..remote.server import takes_split  # the server's own test, so both agree on which envs have splits

    return takes_split(env_id, {})


def env_tools(env: gym.Env) -> list[EnvTool]:
    """The env's actions as tools, from its protocol (``env.unwrapped.protocol.tools``: a name, one text
    argument and a description each), or the single tool ``act(text)`` when it has none with named
    arguments (a plain Gymnasium env, or ``capo/Remote-v0``, whose protocol names tools but not their
    arguments)."""
    protocol = getattr(env.unwrapped, "protocol", None)
    specs = list(getattr(protocol, "tools", {}).values()) if protocol is not None else []
    tools = [EnvTool(s.name, s.arg, s.description) for s in specs
             if str(s.name).isidentifier() and str(s.arg).isidentifier()]
    if tools and len(tools) == len(specs) and _renders(protocol, tools[0]):
        return tools
    instructions = str(getattr(protocol, "instructions", "") or "")
    description = "send one action to the environment, written as its instructions say"
    return [EnvTool(RAW_TOOL, "text", f"{description}:\n{instructions}" if instructions else description)]


def _renders(protocol: Any, tool: EnvTool) -> bool:
    """Whether the protocol can write an action as text (a remote one cannot: its parser is the server's)."""
    from ..core.protocol import Action

    try:
        return isinstance(protocol.render(Action(tool.name, {tool.arg: "x"})), str)
    except Exception:  # noqa: BLE001 - NotImplementedError for remote protocols, anything for foreign ones
        return False


def action_text(env: gym.Env, tool: EnvTool, value: Any) -> Any:
    """What ``env.step`` gets for the tool call ``tool(value)``: the env's own format for a string value
    (``<go>left</go>``, ``search[shoes]``), a number's JSON text likewise (models write ``{"code": 7}``), and
    anything else unchanged, so that the env answers it as the invalid action it is."""
    from ..core.protocol import Action

    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        value = str(value)
    if not isinstance(value, str):
        return value
    if tool.name == RAW_TOOL:
        return value
    return env.unwrapped.protocol.render(Action(tool.name, {tool.arg: value}))


def episode_success(info: dict, last_reward: float) -> float:
    """Success as the trainer contract reads it: ``metrics["success"]``, else ``metrics["em"]``, else
    whether the last step's reward is > 0."""
    metrics = info.get("metrics") or {}
    for key in ("success", "em"):
        if key in metrics:
            return float(metrics[key])
    return float(last_reward > 0)


def numeric_metrics(info: dict) -> dict[str, float]:
    """``info["metrics"]`` as plain floats (numpy scalars included; non-numbers left out)."""
    out = {}
    for key, value in (info.get("metrics") or {}).items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue
    return out
