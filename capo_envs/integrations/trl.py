"""Any capo env (or Gymnasium text env) as an ``environment_factory`` for TRL's ``GRPOTrainer``.

TRL (https://huggingface.co/docs/trl/main/en/grpo_trainer, "environment_factory"; trl>=1.16) takes a class: it
makes one instance per rollout, calls ``reset(**dataset_row)`` before generation (a returned string is appended
to the user message), exposes every public method with type hints and a Google-style docstring as a tool
that the model calls in its chat template's tool-call format, and, when the class has ``get_reward()``,
calls it once per finished rollout as a reward source. So::

    from trl import GRPOConfig, GRPOTrainer
    from capo_envs.integrations.trl import environment_factory, task_dataset

    SynthHop = environment_factory("capo/SynthHop-v0", size="tiny")
    trainer = GRPOTrainer(model="Qwen/Qwen3-0.6B", args=GRPOConfig(max_steps=100),
                          train_dataset=task_dataset(SynthHop, 256), environment_factory=SynthHop)
    trainer.train()

The env's actions become the tools (``search(query)``, ``answer(answer)``; ``go(door)``; one ``act(text)``
for an env without named tools), their docstrings the protocol's own descriptions; a call is written in the
env's format (``<search>...</search>``) and stepped, and the tool's result is the next observation. This
module imports nothing from TRL (the class is plain Python), so it needs no more than ``capo-gym[trl]`` for
the trainer itself. docs/trl.md has the choices made: rewards, ``terminated``/``truncated``, groups.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, ClassVar

import gymnasium as gym

from . import EnvTool, action_text, env_tools, episode_success, make_env, numeric_metrics

# Appended to the first observation: TRL's prompt is the chat template's tool list plus this text, and the
# env's own instructions describe its tag format, which a tool-calling model must not use.
DEFAULT_PROMPT_SUFFIX = "\n\nAct by calling the tools, one call per turn, until the episode ends."
EPISODE_OVER = "The episode is over; stop calling tools."
REWARDS = ("return", "success")
# TRL's own method names, and the instance's public attributes (an instance attribute would hide a tool method
# of that name from TRL, which reads the tools off the instance): a tool may take none of them. There is no
# public close(): every public method is a tool to TRL (``instance.env.close()`` closes the env).
RESERVED = ("reset", "get_reward", "env", "episode_return", "metrics", "success", "done", "terminated",
            "truncated", "steps", "invalid_actions", "last_info")


class CapoToolEnv:
    """Base of the classes :func:`environment_factory` builds: one env, one episode at a time.

    Public state for reward functions (TRL passes ``environments=`` to every reward function):
    ``episode_return`` (the sum of this episode's rewards), ``metrics`` (``info["metrics"]`` at the end),
    ``success``, ``done``, ``terminated``, ``truncated``, ``steps``, ``invalid_actions``, ``last_info``.
    """

    env_id: ClassVar[str]
    env_kwargs: ClassVar[dict]
    split: ClassVar[str | None]
    reward: ClassVar[str]
    prompt_suffix: ClassVar[str]
    tools: ClassVar[tuple[EnvTool, ...]]
    _seeds: ClassVar[itertools.count]

    def __init__(self):
        self.env: gym.Env = make_env(self.env_id, self.env_kwargs, self.split)
        self._clear()
        self.done = True  # no episode until reset

    def _clear(self) -> None:
        self.episode_return = 0.0
        self.metrics: dict[str, float] = {}
        self.success = 0.0
        self.done = self.terminated = self.truncated = False
        self.steps = self.invalid_actions = 0
        self.last_info: dict[str, Any] = {}

    def reset(self, **row: Any) -> str:
        """Start an episode; TRL passes the dataset row. Its ``task_id`` (a capo task) or ``seed`` picks the
        task, so the G rollouts of a group (one row, repeated) play the same one; without either (TRL's
        placeholder rows), each episode takes the next seed. Returns the first observation."""
        self._clear()
        options: dict[str, Any] = {}
        seed = None
        if row.get("task_id") not in (None, ""):
            options["task_id"] = str(row["task_id"])
        elif row.get("seed") is not None:
            if isinstance(row["seed"], bool) or not isinstance(row["seed"], int):
                raise ValueError(f"a row's seed must be an integer, got {row['seed']!r}")
            seed = row["seed"]
        else:
            seed = next(type(self)._seeds)
        observation, info = self.env.reset(seed=seed, options=options or None)
        self.last_info = dict(info)
        return f"{observation}{self.prompt_suffix}"

    def get_reward(self) -> float:
        """The episode's reward for GRPO: its return (the sum of the env's step rewards so far), or with
        ``reward="success"`` its success (``metrics["success"]``, else ``em``) once it ended, else 0."""
        if self.reward == "success":
            return self.success if self.done else 0.0
        return self.episode_return

    def _call(self, tool: EnvTool, args: tuple, kwargs: dict) -> str:
        """One tool call: the env's next observation, or why the call could not be made (no step taken)."""
        if self.done:
            return EPISODE_OVER
        values = list(args)  # TRL passes the model's JSON arguments as keywords; positional calls work too
        if tool.arg in kwargs:
            values.append(kwargs.pop(tool.arg))
        if len(values) != 1 or kwargs:
            given = sorted(kwargs) or f"{len(values)} values"
            return f"Error: {tool.name} takes exactly one argument, {tool.arg!r} (a string); got {given}."
        observation, reward, terminated, truncated, info = self.env.step(action_text(self.env, tool, values[0]))
        self.steps += 1
        self.episode_return += float(reward)
        self.invalid_actions += 0 if info.get("action_valid", True) else 1
        self.last_info = dict(info)
        if terminated or truncated:
            self.done, self.terminated, self.truncated = True, bool(terminated), bool(truncated)
            self.metrics = numeric_metrics(info)
            self.success = episode_success(info, float(reward))
            return f"{observation}\n\n{EPISODE_OVER}"
        return str(observation)


def _tool_method(tool: EnvTool):
    """A method ``tool.name(self, <tool.arg>: str) -> str`` with a Google-style docstring, the shape TRL
    (through transformers' ``get_json_schema``) turns into a tool schema."""

    def call(self, *args, **kwargs):
        return self._call(tool, args, kwargs)

    call.__name__ = call.__qualname__ = tool.name
    call.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         inspect.Parameter(tool.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)],
        return_annotation=str,
    )
    call.__annotations__ = {tool.arg: str, "return": str}
    description = tool.description.strip() or f"the {tool.name} action"
    call.__doc__ = (f"{description[0].upper()}{description[1:]}.\n\n"
                    f"Args:\n    {tool.arg}: {tool.name}'s argument, the {tool.arg.replace('_', ' ')}\n\n"
                    "Returns:\n    The environment's next observation.")
    return call


def environment_factory(env_id: str, *, split: str | None = "train", reward: str = "return",
                        prompt_suffix: str = DEFAULT_PROMPT_SUFFIX, **env_kwargs: Any) -> type[CapoToolEnv]:
    """A class for ``GRPOTrainer(environment_factory=...)`` that plays ``env_id`` (a capo id or Gymnasium's
    ``module:Id``) made with ``env_kwargs``, on ``split`` where the env has splits.

    ``reward``: ``"return"`` (default: the sum of the episode's rewards, the env's own reward) or
    ``"success"`` (1/0 or the env's success fraction, at the episode's end). The env is made once here, so a
    wrong id or kwarg raises a ``ValueError`` now rather than inside the trainer."""
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    if not isinstance(prompt_suffix, str):
        raise ValueError(f"prompt_suffix must be a string, got {type(prompt_suffix).__name__}")
    probe = make_env(env_id, env_kwargs, split)
    try:
        tools = tuple(env_tools(probe))
    finally:
        probe.close()
    for tool in tools:
        if tool.name in RESERVED or tool.name.startswith("_") or hasattr(CapoToolEnv, tool.name):
            raise ValueError(f"{env_id}'s action {tool.name!r} clashes with a method TRL or this class uses")
    namespace = {tool.name: _tool_method(tool) for tool in tools}
    namespace.update(env_id=env_id, env_kwargs=dict(env_kwargs), split=split, reward=reward,
                     prompt_suffix=prompt_suffix, tools=tools, _seeds=itertools.count())
    namespace["__doc__"] = f"{env_id} for TRL's GRPOTrainer; tools: {', '.join(t.name for t in tools)}."
    # The class name is what TRL logs the env's reward under (rewards/<name>/mean).
    name = "".join(ch for ch in env_id.rpartition(":")[2].rpartition("/")[2] if ch.isalnum()) or "CapoEnv"
    return type(name, (CapoToolEnv,), namespace)


def task_dataset(env_class: type[CapoToolEnv], num_tasks: int | None = None, *, start: int = 0):
    """A ``datasets.Dataset`` of ``num_tasks`` rows for ``GRPOTrainer(train_dataset=...)``: an empty user
    prompt (the env's first observation is appended by ``reset``) and the task: ``task_id`` for an env that
    lists its tasks (``task_ids()``, from ``start``), else ``seed`` (``start``, ``start + 1``, ...). TRL repeats
    each row for the G generations of a group, so a group plays one task, as GRPO's advantage assumes."""
    from datasets import Dataset  # TRL's own dependency

    if not (isinstance(env_class, type) and issubclass(env_class, CapoToolEnv)):
        raise ValueError("task_dataset takes a class made by environment_factory(...)")
    if num_tasks is not None and (not isinstance(num_tasks, int) or num_tasks < 1):
        raise ValueError(f"num_tasks must be a positive integer or None, got {num_tasks!r}")
    probe = make_env(env_class.env_id, env_class.env_kwargs, env_class.split)
    try:
        lister = getattr(probe.unwrapped, "task_ids", None)
        task_ids = list(lister()) if callable(lister) else None
    finally:
        probe.close()
    prompt = [{"role": "user", "content": ""}]
    if task_ids:
        chosen = task_ids[start:] if num_tasks is None else task_ids[start:start + num_tasks]
        if not chosen:
            raise ValueError(f"{env_class.env_id} has {len(task_ids)} tasks; none from start={start}")
        return Dataset.from_dict({"prompt": [prompt] * len(chosen), "task_id": [str(t) for t in chosen]})
    count = num_tasks or 1000
    return Dataset.from_dict({"prompt": [prompt] * count, "seed": list(range(start, start + count))})
