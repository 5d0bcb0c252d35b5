"""Warm start: behaviour-clone an env's expert on the same rows and masks the RL loop uses.

A small instruct model prompted with the action format rarely writes a well-formed action (SmolLM2-135M:
0 of 12 samples), so RL from it would see no reward. Cloning the expert's actions first gives RL a policy
that acts in the env's format; the loss is the negative log-likelihood of the expert's action tokens only
(states and observations are masked exactly as in RL).
"""

from __future__ import annotations

import random
import time

import gymnasium as gym
import torch

from .config import TrainConfig
from .models import ActorCritic
from .rollout import ChatFormat, ConcatState, WindowState
from .rows import ActionRecord, Trajectory, build_rows, gather_actions, minibatches


def expert_trajectories(
    env: gym.Env, tokenizer, *, episodes: int, state: str = "concat", window: int = 2, seed: int = 0
) -> list[Trajectory]:
    """Run the env's expert for ``episodes`` episodes on distinct tasks and record them as trajectories.

    The expert's action text is tokenised (it was never sampled, so there is nothing to keep token-exact);
    observations go through the same state builders as RL rollouts.
    """
    base = env.unwrapped
    ids = list(base.task_ids())
    rng = random.Random(seed)
    task_ids = rng.sample(ids, episodes) if episodes <= len(ids) else rng.choices(ids, k=episodes)
    fmt = ChatFormat(tokenizer)
    trajectories = []
    for n, task_id in enumerate(task_ids):
        obs, info = env.reset(seed=seed + n, options={"task_id": task_id})
        system = info["protocol"]["instructions"]
        builder = ConcatState(fmt, system, obs) if state == "concat" else WindowState(fmt, system, obs, window)
        traj = Trajectory(n, str(task_id), n, [], False, False, {}, [])
        done = False
        while not done:
            text = base.expert_action()
            if text is None:
                raise ValueError(f"{env.spec.id if env.spec else base} has no expert to clone")
            action_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            next_obs, reward, terminated, truncated, info = env.step(text)
            record = ActionRecord(builder.prompt(), action_ids, [0.0] * len(action_ids), float(reward),
                                  bool(info["action_valid"]), [])
            traj.actions.append(record)
            traj.anchors.append(obs)
            done = terminated or truncated
            if done:
                traj.terminated, traj.truncated = bool(terminated), bool(truncated)
                traj.metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
            else:
                record.obs_ids = builder.advance(action_ids, text, next_obs)
                obs = next_obs
        trajectories.append(traj)
    return trajectories


def behaviour_clone(model: ActorCritic, tokenizer, config: TrainConfig, env: gym.Env) -> dict[str, float]:
    """Clone ``config.sft.episodes`` expert episodes; returns what to log."""
    start = time.perf_counter()
    layout = config.rollout.layout if config.rollout.state == "concat" else "per_action"
    trajectories = expert_trajectories(env, tokenizer, episodes=config.sft.episodes, state=config.rollout.state,
                                       window=config.rollout.window, seed=config.seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = build_rows(trajectories, layout, pad_id)
    params = list(model.actor_parameters())
    optimizer = torch.optim.AdamW(params, lr=config.sft.lr, weight_decay=config.optim.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    model.train()
    for _ in range(config.sft.epochs):
        for mb in minibatches(batch, config.sft.minibatch_rows, generator):
            out = model(mb.input_ids, mb.attention_mask, need_values=False, logp_mask=mb.action_index >= 0)
            logp = gather_actions(out.logp, mb)  # [a, L]
            loss = -(logp * mb.action_mask).sum() / mb.action_mask.sum()  # mean NLL per action token
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)
            optimizer.step()
            losses.append(loss.item())
    expert_success = sum(t.metrics.get("em", t.metrics.get("success", 0.0)) for t in trajectories) / len(trajectories)
    return {
        "sft/episodes": float(len(trajectories)),
        "sft/actions": float(batch.num_actions),
        "sft/expert_success": expert_success,
        "sft/loss_first": losses[0],
        "sft/loss_last": losses[-1],
        "time/sft_s": time.perf_counter() - start,
    }
