"""Any capo env (or Gymnasium text env) as a verifiers multi-turn environment.

verifiers (https://github.com/PrimeIntellect-ai/verifiers; its classic API, ``verifiers>=0.3.1,<0.4``, where
``import verifiers as vf`` gives ``vf.MultiTurnEnv``) finds an environment by module name and calls the module's
``load_environment(**env_args)``; this module is one, so its own evaluation entry point plays any capo id::

    vf-eval capo_envs.integrations.verifiers -a '{"env": "capo/SynthHop-v0", "env_kwargs": {"size": "tiny"}}' \\
        -m MODEL -b http://127.0.0.1:8000/v1 -n 20 -r 2

(``--api-client-type openai_completions`` for a completions-only server such as ``capo serve``). In Python,
``load_environment("capo/SynthChain-v0", env_kwargs={"k": 4})`` returns the ``vf.MultiTurnEnv`` itself.

Each dataset row is one task (its first observation is the user message, the env's protocol instructions the
system prompt); each rollout plays its own env, reset to that task; every assistant reply is stepped as the
action text, in the env's own format (``<search>...</search>``), and the observation comes back as the next
user message, until the env ends the episode (``terminated`` or ``truncated``). The reward is the episode's
return; ``success``, ``env_steps``, ``invalid_actions``, ``terminated`` and ``truncated`` are metrics
(weight 0). docs/verifiers.md has the choices made.
"""

from __future__ import annotations

import asyncio
from typing import Any

import verifiers as vf

from . import episode_success, make_env, numeric_metrics


def load_environment(env: str = "capo/SynthChain-v0", env_kwargs: dict | None = None, *,
                     num_train_examples: int = 200, num_eval_examples: int = 20, train_split: str = "train",
                     eval_split: str = "dev", max_turns: int = -1, **kwargs: Any) -> vf.MultiTurnEnv:
    """``env`` (a capo id or Gymnasium's ``module:Id``, made with ``env_kwargs``) as a verifiers
    ``MultiTurnEnv``: ``num_train_examples`` tasks of ``train_split`` as its dataset and ``num_eval_examples``
    of ``eval_split`` as its eval dataset (for an env without splits, seeds 0.. and 1 000 000..).
    ``max_turns`` (-1: none) may end an episode before the env does; other ``kwargs`` go to
    ``vf.MultiTurnEnv`` (``system_prompt``, ``sampling_args``, ...). The id's parameter is ``env``, not
    ``env_id``: verifiers' own loader takes ``env_id`` (the module's name) beside the env args."""
    return CapoMultiTurnEnv(env, env_kwargs, num_train_examples=num_train_examples,
                            num_eval_examples=num_eval_examples, train_split=train_split, eval_split=eval_split,
                            max_turns=max_turns, **kwargs)


class CapoMultiTurnEnv(vf.MultiTurnEnv):
    """One gym env per running rollout (kept here, keyed by the rollout's id, not in the state, which
    verifiers copies and saves); its numbers are in ``state["capo"]``."""

    def __init__(self, env_id: str, env_kwargs: dict | None = None, *, num_train_examples: int,
                 num_eval_examples: int, train_split: str, eval_split: str, max_turns: int = -1, **kwargs: Any):
        for name, value in (("num_train_examples", num_train_examples), ("num_eval_examples", num_eval_examples)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        self.capo_env_id, self.capo_env_kwargs = env_id, dict(env_kwargs or {})
        probe = make_env(env_id, self.capo_env_kwargs, train_split)  # a wrong id or kwarg fails here, clearly
        try:
            _, info = probe.reset(seed=0)
        finally:
            probe.close()
        protocol = info.get("protocol") or {}
        self.stop_strings = [str(s) for s in protocol.get("stop_strings") or ()]
        self._envs: dict[str, Any] = {}
        rubric = vf.Rubric(funcs=[episode_return], weights=[1.0])
        for metric in (success, env_steps, invalid_actions, terminated, truncated):
            rubric.add_metric(metric)
        sampling_args = dict(kwargs.pop("sampling_args", None) or {})
        if self.stop_strings:
            sampling_args.setdefault("stop", self.stop_strings)  # one action per turn, as capo's trainer asks
        super().__init__(
            dataset=lambda: self._tasks(train_split, num_train_examples, 0),
            eval_dataset=lambda: self._tasks(eval_split, num_eval_examples, 1_000_000),
            system_prompt=kwargs.pop("system_prompt", protocol.get("instructions") or None),
            rubric=rubric, sampling_args=sampling_args, max_turns=max_turns, **kwargs)

    def _tasks(self, split: str, count: int, first_seed: int):
        """``count`` rows of ``split``: the first observation as ``question``, the task in ``info``."""
        from datasets import Dataset  # verifiers' own dependency

        env = make_env(self.capo_env_id, self.capo_env_kwargs, split)
        try:
            lister = getattr(env.unwrapped, "task_ids", None)
            task_ids = list(lister())[:count] if callable(lister) else None
            rows = {"question": [], "answer": [], "info": []}
            for i in range(len(task_ids) if task_ids else count):
                task = {"split": split, "task_id": str(task_ids[i]) if task_ids else "", "seed": first_seed + i}
                observation, _ = env.reset(**_reset_args(task))
                rows["question"].append(str(observation))
                rows["answer"].append("")
                rows["info"].append(task)
        finally:
            env.close()
        return Dataset.from_dict(rows)

    async def setup_state(self, state, **kwargs):
        task = dict(state.get("info") or {})
        env = await asyncio.to_thread(make_env, self.capo_env_id, self.capo_env_kwargs, task.get("split"))
        self._envs[state["trajectory_id"]] = env
        await asyncio.to_thread(env.reset, **_reset_args(task))
        state["capo"] = {"return": 0.0, "success": 0.0, "steps": 0, "invalid_actions": 0,
                         "terminated": False, "truncated": False, "metrics": {}}
        return state

    async def env_response(self, messages, state, **kwargs):
        env = self._envs.get(state["trajectory_id"])
        if env is None:  # verifiers never calls this before setup_state; say so rather than KeyError
            raise vf.Error("the capo env of this rollout is gone (closed, or never set up)")
        action = self._action_text(env, _last_assistant_text(messages))
        observation, reward, term, trunc, info = await asyncio.to_thread(env.step, action)
        capo = state["capo"]
        capo["return"] += float(reward)
        capo["steps"] += 1
        capo["invalid_actions"] += 0 if info.get("action_valid", True) else 1
        reply = [{"role": "user", "content": str(observation)}]
        if term or trunc:
            capo.update(terminated=bool(term), truncated=bool(trunc), metrics=numeric_metrics(info),
                        success=episode_success(info, float(reward)))
            state["final_env_response"] = reply  # verifiers ends the rollout after this message
        return reply

    def _action_text(self, env, text: str) -> str:
        """The reply as the env's action. A server that honours ``stop`` cuts the stop string off (OpenAI's
        default); put it back when that is what makes the reply parse (``<go>left`` -> ``<go>left</go>``)."""
        protocol = getattr(env.unwrapped, "protocol", None)
        parse = getattr(protocol, "parse", None)
        if not callable(parse) or parse(text).valid:
            return text
        for stop in self.stop_strings:
            if not text.endswith(stop) and parse(text + stop).valid:
                return text + stop
        return text

    @vf.cleanup
    async def close_capo_env(self, state, **kwargs) -> None:
        env = self._envs.pop(state.get("trajectory_id"), None)
        if env is not None:
            await asyncio.to_thread(env.close)


def _reset_args(task: dict) -> dict:
    if task.get("task_id"):
        return {"options": {"task_id": task["task_id"]}}
    return {"seed": int(task.get("seed") or 0)}


def _last_assistant_text(messages) -> str:
    """The text of the last assistant message (a dict or verifiers' message object; content parts joined)."""
    for message in reversed(list(messages or [])):
        role = message.get("role") if isinstance(message, dict) else getattr(message, "role", None)
        if role != "assistant":
            continue
        content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
        if isinstance(content, list):
            parts = [p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content]
            return "".join(str(p or "") for p in parts)
        return "" if content is None else str(content)
    return ""


async def episode_return(state, **kwargs) -> float:
    """The reward: the sum of the env's step rewards over the episode (0 for a rollout that never stepped)."""
    return float((state.get("capo") or {}).get("return", 0.0))


async def success(state, **kwargs) -> float:
    return float((state.get("capo") or {}).get("success", 0.0))


async def env_steps(state, **kwargs) -> float:
    return float((state.get("capo") or {}).get("steps", 0))


async def invalid_actions(state, **kwargs) -> float:
    return float((state.get("capo") or {}).get("invalid_actions", 0))


async def terminated(state, **kwargs) -> float:
    return float(bool((state.get("capo") or {}).get("terminated")))


async def truncated(state, **kwargs) -> float:
    return float(bool((state.get("capo") or {}).get("truncated")))
