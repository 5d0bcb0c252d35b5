"""Warm start: behaviour-clone an env's expert on the same rows and masks the RL loop uses.

A small instruct model prompted with the action format rarely writes a well-formed action (SmolLM2-135M:
docs/results/learning.md, section 1), so RL from it would see no reward. Cloning the expert's actions first gives RL a policy
that acts in the env's format; the loss is the negative log-likelihood of the expert's action tokens only
(states and observations are masked exactly as in RL).
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from collections.abc import Sequence

import gymnasium as gym
import torch

from data_prep.progress import SILENT, Progress, duration

from .config import TrainConfig
from .demonstrator import demonstrator_action
from .models import ActorCritic
from .rollout import env_tasks, episode_success, has_task_ids, start_episode, step_episode, success_key
from .rows import RowBatch, Trajectory, build_rows, gather_actions, minibatches, select_rows
from .states import ChatFormat


def expert_trajectories(
    env: gym.Env,
    tokenizer,
    *,
    episodes: int,
    state: str = "concat",
    window: int = 2,
    earlier_actions: int = 0,
    seed: int = 0,
    task_pool: Sequence[str] | None = None,
    expert_skill: float = 1.0,
    progress: Progress = SILENT,
) -> list[Trajectory]:
    """Run the env's expert for ``episodes`` episodes on distinct tasks (of ``task_pool``, default every
    task of the env, ``rollout.env_tasks``; repeated only when there are fewer tasks than episodes) and
    record them as trajectories. The env needs ``expert_action()``.

    The expert's action text is tokenised (it was never sampled, so there is nothing to keep token-exact);
    each episode runs through the same start_episode/step_episode code as RL rollouts.

    ``expert_skill`` < 1 makes a demonstrator that errs: at each step, with probability 1 - expert_skill, it
    plays the env's ``random_action(rng)`` (a random legal action) instead of the expert's, where the env
    has one; the expert then goes on from where the error led. A warm start cloned from it acts validly
    but leaves RL something to learn (the oracle's clone would already do what the model can).

    A demonstrator that gives up (``expert_action()`` None after at least one action: SynthHouse's
    skip-transform, once it has made its mistaken move) ends its demonstration there: the trajectory is cut
    (``truncated``, no metrics, so lost), and nothing it would have done after is cloned.
    """
    base = env.unwrapped
    ids = env_tasks(env) if task_pool is None else task_pool
    rng = random.Random(seed)
    task_ids = rng.sample(ids, episodes) if episodes <= len(ids) else rng.choices(ids, k=episodes)
    fmt = ChatFormat(tokenizer)
    trajectories = []
    for n, task_id in enumerate(progress.bar(task_ids, "expert episodes")):
        episode = start_episode(env, fmt, task_id, seed=seed + n, traj_id=n, group_id=n, state=state, window=window,
                                earlier_actions=earlier_actions)
        going = True
        while going:
            text = demonstrator_action(base, rng, expert_skill)
            if text is None and not episode.traj.actions:
                raise ValueError(f"{env.spec.id if env.spec else base} has no expert to clone")
            if text is None:  # the demonstrator gave up (SynthHouse's skip-transform, after its move): it ends here
                episode.traj.truncated = True
                break
            action_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            going = step_episode(episode, episode.state.prompt(), action_ids, [0.0] * len(action_ids), text,
                                 max_prompt_tokens=sys.maxsize)
        trajectories.append(episode.traj)
    return trajectories


def actions_over_limit(trajectories: Sequence[Trajectory], limit: int) -> tuple[int, int]:
    """``(how many demonstrated actions have more than limit tokens, the longest's length)``. The policy
    generates at most ``rollout.max_action_tokens`` tokens an action, so a cloned action longer than that is
    cut before its closing tag when the policy plays it: an invalid step wherever the demonstrator took a
    long step (SynthHouse's `take butterknife 1 from sinkbasin 2` is 18 SmolLM2 tokens with its tags)."""
    lengths = [len(action.action_ids) for trajectory in trajectories for action in trajectory.actions]
    return sum(n > limit for n in lengths), max(lengths, default=0)


def sft_minibatches(batch: RowBatch, size: int, generator: torch.Generator, *, by_length: bool = False):
    """Mini-batches of ``size`` rows: shuffled (``rows.minibatches``), or with ``by_length`` rows of similar
    length together (sorted by length, ties in random order) and the mini-batches in random order, which
    cuts the padding of packed trajectories of 2 to 5 actions by about a fifth."""
    if not by_length:
        yield from minibatches(batch, size, generator)
        return
    order = torch.randperm(batch.num_rows, generator=generator)
    lengths = batch.attention_mask.sum(1).cpu()[order]
    order = order[torch.sort(lengths, stable=True).indices]  # by length; equal lengths stay shuffled
    chunks = list(torch.split(order, size))
    for i in torch.randperm(len(chunks), generator=generator).tolist():
        yield select_rows(batch, chunks[i].to(batch.input_ids.device))


def lr_factor(step: int, total: int, warmup_frac: float, schedule: str) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based) of ``total``: linear warm-up over the
    first ``warmup_frac`` of the steps, then constant or a cosine decay to 0 (reached after the last step)."""
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"sft.lr_schedule must be 'constant' or 'cosine', got {schedule!r}")
    warmup = round(warmup_frac * total)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup + 1) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def warm_start_tasks(config: TrainConfig, env: gym.Env) -> tuple[Sequence | None, Sequence | None]:
    """``(warm-start task ids, RL task ids)``: with ``sft.tasks = N > 0`` the first N train tasks (of
    ``rollout.env_tasks``: task ids, or reset seeds) go to the warm start and the rest to RL;
    ``(None, None)`` (every task for both) otherwise."""
    n = config.sft.tasks
    if n <= 0:
        return None, None
    ids = [str(i) for i in env_tasks(env)] if has_task_ids(env) else env_tasks(env)
    if n >= len(ids):
        raise ValueError(f"sft.tasks={n} leaves no task for RL: the train split has {len(ids)} tasks")
    return ids[:n], ids[n:]


def behaviour_clone(model: ActorCritic, tokenizer, config: TrainConfig, env: gym.Env,
                    progress: Progress = SILENT) -> dict[str, float]:
    """Clone ``config.sft.episodes`` expert episodes (on the ``sft.tasks`` first train tasks if set);
    returns what to log.

    The loss is the mean NLL of the expert's action tokens, plus ``sft.state_loss_coef`` times the mean
    next-token NLL of the state tokens (system prompt, question, observations) if that is set: a model
    trained from scratch then learns from every token it reads, not only the few that are actions (on
    SynthHop, action tokens are about 6% of a packed row). It costs the LM head on every position instead
    of the action positions only. ``sft.warmup_frac``/``sft.lr_schedule`` shape the learning rate and
    ``sft.length_buckets`` batches rows of similar length; their defaults keep the plain recipe.
    """
    start = time.perf_counter()
    sft = config.sft
    progress.say(f"warm start: behaviour-cloning {sft.episodes} expert episodes")
    layout = config.rollout.layout if config.rollout.state == "concat" else "per_action"
    trajectories = expert_trajectories(env, tokenizer, episodes=sft.episodes, state=config.rollout.state,
                                       window=config.rollout.window,
                                       earlier_actions=config.rollout.earlier_actions, seed=config.seed,
                                       task_pool=warm_start_tasks(config, env)[0],
                                       expert_skill=sft.expert_skill, progress=progress)
    limit = config.rollout.max_action_tokens
    too_long, longest = actions_over_limit(trajectories, limit)
    if too_long:  # said before the clone trains, so that a run which cuts its own demonstrations can be stopped
        message = (f"{too_long} demonstrated actions are longer than rollout.max_action_tokens={limit} "
                   f"(the longest has {longest} tokens): the policy is cut off before it finishes them, so they "
                   f"are invalid when it plays; raise rollout.max_action_tokens to at least {longest}")
        warnings.warn(message, stacklevel=2)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    batch = build_rows(trajectories, layout, pad_id).to(device)
    params = list(model.actor_parameters())
    optimizer = torch.optim.AdamW(params, lr=sft.lr, weight_decay=config.optim.weight_decay)
    total_steps = sft.epochs * math.ceil(batch.num_rows / sft.minibatch_rows)
    generator = torch.Generator().manual_seed(config.seed)
    losses, state_losses = [], []
    step = 0
    bar = progress.bar(desc="warm-start step", total=total_steps)
    model.train()
    for _ in range(sft.epochs):
        for mb in sft_minibatches(batch, sft.minibatch_rows, generator, by_length=sft.length_buckets):
            in_action = mb.action_index >= 0
            out = model(mb.input_ids, mb.attention_mask, need_values=False,
                        logp_mask=None if sft.state_loss_coef > 0 else in_action)
            logp = gather_actions(out.logp, mb)  # [a, L]
            loss = -(logp * mb.action_mask).sum() / mb.action_mask.sum()  # mean NLL per action token
            losses.append(loss.item())
            if sft.state_loss_coef > 0:
                real = mb.attention_mask.bool()
                scored = torch.zeros_like(real)
                scored[:, 1:] = real[:, 1:] & real[:, :-1]  # where lm_logp scored a token
                on_state = scored & ~in_action
                state_loss = -(out.logp * on_state).sum() / on_state.sum().clamp(min=1)
                state_losses.append(state_loss.item())
                loss = loss + sft.state_loss_coef * state_loss
            for group in optimizer.param_groups:
                group["lr"] = sft.lr * lr_factor(step, total_steps, sft.warmup_frac, sft.lr_schedule)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)
            optimizer.step()
            step += 1
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update(1)
    bar.close()
    key = success_key(trajectories)  # as rollout_stats scores RL episodes
    expert_success = sum(episode_success(t, key) for t in trajectories) / len(trajectories)
    record = {
        "sft/episodes": float(len(trajectories)),
        "sft/actions": float(batch.num_actions),
        "sft/action_tokens_max": float(longest),
        "sft/actions_over_limit": float(too_long),
        "sft/expert_success": expert_success,
        "sft/steps": float(step),
        "sft/loss_first": losses[0],
        "sft/loss_last": losses[-1],
        "time/sft_s": time.perf_counter() - start,
    }
    if state_losses:
        record |= {"sft/state_loss_first": state_losses[0], "sft/state_loss_last": state_losses[-1]}
    progress.say(f"warm start done: {step} steps, action NLL {losses[0]:.3f} -> {losses[-1]:.3f} "
                 f"({duration(record['time/sft_s'])})")
    return record
