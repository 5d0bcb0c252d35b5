"""The ``capo_env`` agent loop: drives any capo-contract Gymnasium text env inside verl's rollout.

One dataset row = one episode. Its ``extra_info`` says which env and task (:func:`.dataset.task_row` writes
such rows): ``env_id``, ``env_kwargs`` (dict), ``task_id`` (a task id, or for an env without
``task_ids()`` its reset seed), ``seed``, and optionally ``state`` ("concat" | "window"), ``window``,
``earlier_actions``, ``instructions``. The loop plays the episode exactly as capo_train's rollout does (the same
``start_episode`` / ``step_episode`` / ``ChatFormat``: identical prompt tokens and records), with verl's
async server for generation (token ids in, token ids and log-probs out) and env calls in a thread
(``asyncio.to_thread``) so that a slow env step does not block the worker's event loop, which the CAPO
authors' ALFWorld flow does (docs/scaleout.md, 1.6).

It returns **one ``AgentLoopOutput`` per action** (verl's V1 trainer stores each as its own row,
key ``{uid}_{session_id}_{index}``): ``prompt_ids`` = the state the action was sampled from,
``response_ids`` = the action's tokens (mask all 1: observations are never action tokens),
``response_logprobs`` = the sampled tokens' log-probs, and in ``extra_fields`` the action's own reward
(``capo_reward``: verl overwrites every earlier row's ``reward_score`` with the final row's), its step, how
the episode ended (``capo_terminated`` / ``capo_truncated``, the same on every action of the episode), the
env's ``action_valid``, how the action ended (``capo_finish_reason``: stop / eos / length, since verl
reports both vLLM's stop and length as "completed") and the observation it answered (``capo_anchor``,
GiGPO). ``reward_score`` is the episode's return on every row, so verl's own group estimators (GRPO on
the final row) and metrics see the episode outcome. With a critic (``critic.enable``), an episode the env
truncated gets one more row holding only the state it stopped in, for the critic to value: see
:meth:`CapoEnvAgentLoop.outputs`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from uuid import uuid4

import gymnasium as gym
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from capo_train.rollout import start_episode, step_episode
from capo_train.states import ChatFormat

from .core import (
    ACTION_VALID,
    AGENT_LOOP,
    ANCHOR,
    BOOTSTRAP,
    FINISH_REASON,
    REWARD,
    STEP,
    TERMINATED,
    TRUNCATED,
    end_reason,
)

MAX_ACTIONS = 1000  # a runaway env that never ends its episode is cut here (truncated)


def make_env(env_id: str, env_kwargs: dict | str | None = None) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)``, with ``capo_envs`` imported so that its ids are registered
    (other packages' ids: Gymnasium's ``module:Id`` form imports the module). ``env_kwargs`` may be a JSON
    object (as :mod:`.dataset` stores it: Parquet cannot hold rows whose dicts differ in keys)."""
    import capo_envs  # noqa: F401  registers capo/* ids

    if isinstance(env_kwargs, str):
        env_kwargs = json.loads(env_kwargs) if env_kwargs else {}
    return gym.make(env_id, **(env_kwargs or {}))


def _eos_ids(tokenizer) -> list[int]:
    ids = tokenizer.eos_token_id
    return [i for i in (ids if isinstance(ids, list) else [ids]) if i is not None]


@register(AGENT_LOOP)
class CapoEnvAgentLoop(AgentLoopBase):
    """See the module docstring. Per-action budgets: ``rollout.prompt_length`` (a longer state ends the
    episode, truncated, as capo_train's rollout does; verl would left-truncate it and drop the system
    prompt) and ``rollout.response_length`` (``max_tokens`` of each action)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        critic = self.config.get("critic", None) or {}
        self.bootstrap_rows = bool(critic.get("enable", False))  # only a critic reads them

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput]:
        spec = dict(kwargs.get("extra_info") or {})
        env = await asyncio.to_thread(make_env, spec["env_id"], spec.get("env_kwargs"))
        try:
            return await self.play(env, spec, sampling_params)
        finally:
            await asyncio.to_thread(env.close)

    async def play(self, env: gym.Env, spec: dict, sampling_params: dict[str, Any]) -> list[AgentLoopOutput]:
        """One episode of ``env`` (already made) for the task in ``spec``; see the module docstring."""
        fmt = ChatFormat(self.tokenizer)
        episode = await asyncio.to_thread(
            start_episode, env, fmt, str(spec.get("task_id", spec.get("seed", 0))), seed=int(spec.get("seed", 0)),
            traj_id=0, group_id=0, state=spec.get("state", "concat"), window=int(spec.get("window", 2)),
            earlier_actions=int(spec.get("earlier_actions", 0)),
            instructions=spec.get("instructions", ""),
        )
        request_id = uuid4().hex  # one sticky session per episode: its prefixes stay in the server's cache
        params = {**sampling_params, "stop": list(episode.stop), "include_stop_str_in_output": True,
                  "max_tokens": self.response_length, "logprobs": True}
        eos = _eos_ids(self.tokenizer)
        finish, timings = [], []
        going, has_logprobs = True, True
        while going and len(episode.traj.actions) < MAX_ACTIONS:
            prompt = episode.state.prompt()
            if len(prompt) > self.prompt_length:  # over the per-action budget: cut, as capo_train's rollout
                episode.traj.truncated = True
                break
            t0 = time.perf_counter()
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt,
                                                     sampling_params=params)
            t1 = time.perf_counter()
            ids = list(out.token_ids)
            has_logprobs = has_logprobs and bool(out.log_probs)  # rollout.calculate_log_probs=false: none
            logprobs = list(out.log_probs) if out.log_probs else [0.0] * len(ids)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            finish.append(end_reason(ids, self.tokenizer.decode(ids), episode.stop, eos, self.response_length))
            going = await asyncio.to_thread(step_episode, episode, prompt, ids, logprobs, text, self.prompt_length)
            timings.append((t1 - t0, time.perf_counter() - t1))
        else:
            if going:  # MAX_ACTIONS reached with the episode still running
                episode.traj.truncated = True
        return self.outputs(episode.traj, finish, timings, has_logprobs=has_logprobs,
                            bootstrap_row=self.bootstrap_rows, eos_id=(eos or [self.tokenizer.pad_token_id or 0])[0])

    @staticmethod
    def outputs(traj, finish: list[str], timings: list[tuple[float, float]], has_logprobs: bool = True,
                bootstrap_row: bool = False, eos_id: int = 0) -> list[AgentLoopOutput]:
        """One ``AgentLoopOutput`` per recorded action of ``traj`` (a ``capo_train.rows.Trajectory``), and with
        ``bootstrap_row`` one more after an episode the env truncated: the state it stopped in as the prompt, a
        one-token response (``eos_id``) with response mask 0, ``extra_fields[BOOTSTRAP]`` set. verl's critic
        values it like any row, which gives V(s_{T+1}) for bootstrapping (capo_train's ``final_values``);
        the mask keeps it out of the policy, KL and critic losses, as verl's own padding rows are kept out."""
        episode_return = sum(a.reward for a in traj.actions)
        outs = []
        for t, action in enumerate(traj.actions):
            generate_s, env_s = timings[t] if t < len(timings) else (0.0, 0.0)
            outs.append(AgentLoopOutput(
                prompt_ids=list(action.prompt_ids),
                response_ids=list(action.action_ids),
                response_mask=[1] * len(action.action_ids),
                response_logprobs=list(action.old_logprobs) if has_logprobs else None,
                reward_score=float(episode_return),
                num_turns=2,
                metrics=AgentLoopMetrics(generate_sequences=generate_s, tool_calls=env_s),
                extra_fields={
                    REWARD: float(action.reward),
                    STEP: t,
                    TERMINATED: bool(traj.terminated),
                    TRUNCATED: bool(traj.truncated),
                    ACTION_VALID: bool(action.action_valid),
                    FINISH_REASON: finish[t] if t < len(finish) else "stop",
                    ANCHOR: traj.anchors[t],
                    "reward_extra_info": {},  # verl copies the final row's onto the others: it must exist
                },
            ))
        if bootstrap_row and traj.truncated and traj.final_prompt_ids:  # env-truncated, final state in budget
            outs.append(AgentLoopOutput(
                prompt_ids=list(traj.final_prompt_ids), response_ids=[eos_id], response_mask=[0],
                response_logprobs=[0.0] if has_logprobs else None, reward_score=float(episode_return), num_turns=2,
                metrics=AgentLoopMetrics(generate_sequences=0.0, tool_calls=0.0),
                extra_fields={REWARD: 0.0, STEP: len(traj.actions), TERMINATED: False, TRUNCATED: True,
                              ACTION_VALID: True, FINISH_REASON: "bootstrap", ANCHOR: "", BOOTSTRAP: True,
                              "reward_extra_info": {}},
            ))
        return outs


__all__ = ["CapoEnvAgentLoop", "make_env"]
