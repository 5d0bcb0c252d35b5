"""Rollout -> training rows: token ids in, token ids out, never re-tokenised ("token-space consistency",
a goal of the authors' code, AgentR1/StepPO README); observations are never action tokens.

Two words, used the same way here and in ``capo_train.algorithms``:

- a **row** is one model-input sequence (``R`` rows of ``S`` tokens: ``[R, S]``);
- an **action** is one LLM response (one env step): a span of action tokens inside a row, with its own
  reward, advantage, ratio and clip decision (``A`` actions of at most ``L`` tokens: ``[A]``, ``[A, L]``).

A rollout gives :class:`Trajectory` objects made of :class:`ActionRecord` segments (the exact state tokens
each action was sampled from, the action tokens, their old log-probs). :func:`build_rows` lays them out
as rows in one of two layouts:

- ``"per_action"`` (the authors' layout): one row per action, ``prompt_ids + action_ids`` (R = A). Works
  for any state builder.
- ``"packed"`` (concatenated states only): one row per trajectory, ``prompt_0 + a_0 + obs_0 + ... + a_T``
  (= ``prompt_T + a_T``). Each action is a span of the row; observation tokens belong to no span, so
  they get no log-prob, advantage or loss. One forward pass reads every action's log-probs and every
  boundary value: O(T) tokens instead of O(T^2) (R = number of trajectories).

Whatever the layout, the algorithms see per-action tensors ``[A, L]``: :func:`gather_actions` takes
per-position model outputs ``[R, S]`` to ``[A, L]``, so both layouts give the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterator

import torch
from torch import Tensor

LAYOUTS = ("per_action", "packed")


@dataclass(kw_only=True)
class ActionRecord:
    """One action of a trajectory.

    prompt_ids:   the exact state tokens the action was generated from.
    action_ids:   the generated tokens (at least one).
    old_logprobs: log pi_old of each action token, as recorded by the backend (same length as action_ids).
    reward:       the env's reward for this step.
    action_valid: whether the env could parse the action.
    invalid_reason: why the env refused it (its ``info["invalid_reason"]`` at that step), or "".
    obs_ids:      tokens of the observation that followed, wrapped in the chat format's tokens (end of the
                  assistant turn, user turn, next assistant header); ``[]`` after the last action. With
                  concatenated states, ``next.prompt_ids == prompt_ids + action_ids + obs_ids``.
    state_features: ``[len(action_ids), H]`` hidden states of the actor before each action token, when the
                  backend recorded them (``HFBackend(keep_features=True)``); None otherwise. In memory only.
    frozen_states: ``[n, H]`` hidden states entering the actor's first trainable layer at the first ``n``
                  tokens of ``prompt_ids + action_ids``, ``n`` = all of them, or all but the last action
                  token (the backend never feeds it; nothing reads what the layers make of it), when the
                  backend recorded them (``HFBackend(keep_frozen_states=True)``); None otherwise. In memory only.
    """

    prompt_ids: list[int]
    action_ids: list[int]
    old_logprobs: list[float]
    reward: float
    action_valid: bool
    obs_ids: list[int]
    state_features: Any = None
    frozen_states: Any = None
    invalid_reason: str = ""


@dataclass(kw_only=True)
class Trajectory:
    """One episode. ``group_id`` is shared by the G rollouts of one task; ``anchors[t]`` is the observation
    text the policy saw before action t (GiGPO's anchor state). At the end of an episode exactly one of
    ``terminated`` (the env said the task ended) and ``truncated`` (a step, context or prompt budget ran
    out) is True. ``metrics`` are the env's end-of-episode metrics ({} when the rollout cut the episode).
    ``final_prompt_ids``: when the env truncated the episode, the state after the last action (what the
    next action would have been sampled from), so a critic can bootstrap V(s_{T+1}); [] otherwise.
    ``final_features``: the actor's ``[H]`` final hidden state at that state's last token, when an HF rollout
    recorded it (``HFBackend.prompt_features``): a shared critic's bootstrap value without a pass over it."""

    traj_id: int
    task_id: str
    group_id: int
    actions: list[ActionRecord]
    terminated: bool
    truncated: bool
    metrics: dict[str, float]
    anchors: list[str]
    final_prompt_ids: list[int] = field(default_factory=list)
    final_features: Any = None


@dataclass
class RowBatch:
    """Model inputs plus per-action data. ``R`` rows, ``S`` row length, ``A`` actions, ``L`` longest action.

    input_ids      [R, S] long   right-padded rows.
    attention_mask [R, S] long   1 on real tokens.
    action_index   [R, S] long   which action (0..A-1) a token belongs to; -1 on state, observation and
                                 padding tokens.
    boundary_row   [A] long      the row each action lives in.
    boundary_pos   [A] long      position of the action's last state token (first action token - 1): where
                                 the critic's V(s_t) is read (CAPO paper, Fig. 2(b)). Action tokens are at
                                 ``boundary_pos + 1 .. boundary_pos + L_t``.
    old_logp       [A, L] float  rollout log-probs, left-aligned, 0 on padding.
    action_mask    [A, L] float  1 on action tokens.
    reward         [A] float     step reward.
    traj_index     [A] long      trajectory (its position in the list given to build_rows).
    step_index     [A] long      0..T-1 inside the trajectory.
    group_index    [A] long      the trajectory's group (task).
    truncated      [A] bool      the action's trajectory was truncated.
    terminated     [A] bool      the action's trajectory terminated.
    anchor         [A] long      anchor observation, interned to ints (equal strings, equal ids).
    action_valid   [A] bool      the env parsed the action.
    action_id      [A] long      the action's index in the batch build_rows made; kept by minibatches, so
                                 per-action targets computed on the whole batch can be indexed with it.
    frozen_states  R x [n_r, H]  optional (None: absent), a list, not a tensor: per row, the hidden states
                                 entering the actor's first trainable layer that the rollout recorded
                                 (:func:`row_frozen_states`), unpadded and where the rollout left them
                                 (concatenated-state rows share them); :func:`pad_frozen_states` pads a
                                 mini-batch's. Not moved by :meth:`to`.
    """

    input_ids: Tensor
    attention_mask: Tensor
    action_index: Tensor
    boundary_row: Tensor
    boundary_pos: Tensor
    old_logp: Tensor
    action_mask: Tensor
    reward: Tensor
    traj_index: Tensor
    step_index: Tensor
    group_index: Tensor
    truncated: Tensor
    terminated: Tensor
    anchor: Tensor
    action_valid: Tensor
    action_id: Tensor
    frozen_states: list[Tensor] | None = None

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_actions(self) -> int:
        return self.boundary_row.shape[0]

    def to(self, device) -> RowBatch:
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name != "frozen_states"}
        return RowBatch(**moved, frozen_states=self.frozen_states)


def _row_spans(traj: Trajectory, layout: str) -> list[tuple[list[int], list[int]]]:
    """The rows of one trajectory: ``(input_ids, start position of each of its actions)``."""
    acts = traj.actions
    for t, a in enumerate(acts):
        if not a.prompt_ids or not a.action_ids:
            raise ValueError(f"trajectory {traj.traj_id} action {t}: empty prompt_ids or action_ids")
        if len(a.old_logprobs) != len(a.action_ids):
            raise ValueError(
                f"trajectory {traj.traj_id} action {t}: {len(a.old_logprobs)} old_logprobs for "
                f"{len(a.action_ids)} action tokens"
            )
    if layout == "per_action":
        return [(a.prompt_ids + a.action_ids, [len(a.prompt_ids)]) for a in acts]
    if layout != "packed":
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    for t in range(len(acts) - 1):
        a, nxt = acts[t], acts[t + 1]
        if nxt.prompt_ids != a.prompt_ids + a.action_ids + a.obs_ids:
            raise ValueError(
                f"packed layout needs concatenated states (state_t+1 = state_t + action_t + obs_t); trajectory "
                f"{traj.traj_id} breaks it at action {t}. Use layout='per_action' (required for window states)."
            )
    last = acts[-1]
    return [(last.prompt_ids + last.action_ids, [len(a.prompt_ids) for a in acts])]


def build_rows(trajectories: list[Trajectory], layout: str, pad_id: int, max_tokens: int | None = None) -> RowBatch:
    """Lay ``trajectories`` out as a :class:`RowBatch` (see the module doc for the layouts).

    Trajectories without actions (cut before their first action) give no rows. A row longer than
    ``max_tokens`` raises: rows are never cut, since a cut state would not be the state the action was
    sampled from (bound rows with the rollout's ``max_prompt_tokens + max_action_tokens`` instead).
    """
    rows: list[list[int]] = []
    row_action_starts: list[list[int]] = []
    actions: list[tuple[int, int, Trajectory, ActionRecord]] = []  # (traj index, step, traj, record)
    for i, traj in enumerate(trajectories):
        if not traj.actions:
            continue
        if len(traj.anchors) != len(traj.actions):
            raise ValueError(f"trajectory {traj.traj_id}: {len(traj.anchors)} anchors for {len(traj.actions)} actions")
        for ids, starts in _row_spans(traj, layout):
            if max_tokens is not None and len(ids) > max_tokens:
                raise ValueError(
                    f"trajectory {traj.traj_id}: a row of {len(ids)} tokens exceeds max_tokens={max_tokens}"
                )
            rows.append(ids)
            row_action_starts.append(starts)
        actions += [(i, t, traj, a) for t, a in enumerate(traj.actions)]

    R, A = len(rows), len(actions)
    S = max((len(r) for r in rows), default=0)
    L = max((len(a.action_ids) for *_, a in actions), default=0)
    input_ids = torch.full((R, S), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(R, S, dtype=torch.long)
    action_index = torch.full((R, S), -1, dtype=torch.long)
    boundary_row = torch.empty(A, dtype=torch.long)
    boundary_pos = torch.empty(A, dtype=torch.long)
    old_logp = torch.zeros(A, L)
    action_mask = torch.zeros(A, L)

    k = 0  # running action index: actions are numbered in row order, then position order
    for r, (ids, starts) in enumerate(zip(rows, row_action_starts)):
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[r, : len(ids)] = 1
        for start in starts:
            record = actions[k][3]
            n = len(record.action_ids)
            action_index[r, start : start + n] = k
            boundary_row[k], boundary_pos[k] = r, start - 1
            old_logp[k, :n] = torch.tensor(record.old_logprobs)
            action_mask[k, :n] = 1
            k += 1

    interned: dict[str, int] = {}
    traj_of = [i for i, *_ in actions]
    return RowBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_index=action_index,
        boundary_row=boundary_row,
        boundary_pos=boundary_pos,
        old_logp=old_logp,
        action_mask=action_mask,
        reward=torch.tensor([a.reward for *_, a in actions], dtype=torch.float32),
        traj_index=torch.tensor(traj_of, dtype=torch.long),
        step_index=torch.tensor([t for _, t, *_ in actions], dtype=torch.long),
        group_index=torch.tensor([tr.group_id for _, _, tr, _ in actions], dtype=torch.long),
        truncated=torch.tensor([tr.truncated for _, _, tr, _ in actions], dtype=torch.bool),
        terminated=torch.tensor([tr.terminated for _, _, tr, _ in actions], dtype=torch.bool),
        anchor=torch.tensor(
            [interned.setdefault(tr.anchors[t], len(interned)) for _, t, tr, _ in actions], dtype=torch.long
        ),
        action_valid=torch.tensor([a.action_valid for *_, a in actions], dtype=torch.bool),
        action_id=torch.arange(A),
    )


def action_features(trajectories: list[Trajectory]) -> list[Tensor] | None:
    """Each action's ``state_features`` in :func:`build_rows`'s action order (trajectories in order, then
    steps), or None unless every action has them whole (``[len(action_ids), H]``)."""
    features = [a.state_features for t in trajectories for a in t.actions]
    lengths = [len(a.action_ids) for t in trajectories for a in t.actions]
    if not features or any(f is None or f.shape[0] != n for f, n in zip(features, lengths)):
        return None
    return features


def row_frozen_states(trajectories: list[Trajectory], layout: str) -> list[Tensor] | None:
    """Each row's frozen-layer states (``ActionRecord.frozen_states``) in :func:`build_rows`'s row order, or
    None unless every row has them for all its tokens but at most the last (the update then runs the
    whole actor, as it does for a backend that records none: vLLM, OpenAI).

    A row is ``prompt_ids + action_ids`` of one action (per_action) or of a trajectory's last action
    (packed, = the whole episode): the very tokens the backend was given and sampled, whatever the state
    builder, so the recorded states line up with it position by position."""
    out = []
    for traj in trajectories:
        if not traj.actions:
            continue
        records = traj.actions if layout == "per_action" else traj.actions[-1:]
        for a in records:
            n = len(a.prompt_ids) + len(a.action_ids)
            if a.frozen_states is None or a.frozen_states.shape[0] not in (n - 1, n):
                return None
            out.append(a.frozen_states)
    return out or None


def pad_frozen_states(states: list[Tensor], S: int, device=None) -> Tensor:
    """``R x [n_r, H]`` -> ``[R, S, H]`` right-padded with zeros, like the rows. A row's last token may have
    no state (the backend never feeds the last sampled token): its zeros go through the trainable layers
    to an output at that position only (attention is causal), which no log-prob, entropy or value reads
    (position s - 1 predicts token s; V(s_t) is read before each action token)."""
    out = states[0].new_zeros(len(states), S, states[0].shape[-1], device=device)
    for r, x in enumerate(states):
        out[r, : x.shape[0]] = x[:S]
    return out


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """``[R, S, V]`` logits, ``[R, S]`` ids -> ``[R, S]`` with ``out[:, s] = log p(input_ids[:, s] | < s)``.

    Aligned to the token's own position (the logits of position s-1 predict token s), so it can go
    straight into :func:`gather_actions`; ``out[:, 0] = 0``. Computed in float32 as logit - logsumexp,
    without materialising a second ``[R, S, V]`` tensor of log-probs.
    """
    logits = logits[:, :-1].float()  # [R, S-1, V]
    picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [R, S-1]
    out = picked - torch.logsumexp(logits, dim=-1)  # [R, S-1]
    return torch.cat([out.new_zeros(out.shape[0], 1), out], dim=1)  # [R, S]


def gather_actions(token_values: Tensor, batch: RowBatch) -> Tensor:
    """Per-position values ``[R, S, ...]`` -> per-action ``[A, L, ...]``, left-aligned, 0 on padding.

    ``token_values[r, s]`` must be the value belonging to token s itself (e.g. :func:`token_logprobs`).
    To read V(s_t) instead, index ``values[batch.boundary_row, batch.boundary_pos]``.
    """
    A, L = batch.action_mask.shape
    S = token_values.shape[1]
    offsets = torch.arange(1, L + 1, device=token_values.device)  # [L]
    pos = (batch.boundary_pos[:, None] + offsets).clamp(max=S - 1)  # [A, L]
    out = token_values[batch.boundary_row[:, None].expand(A, L), pos]  # [A, L, ...]
    mask = batch.action_mask.bool().reshape(A, L, *([1] * (out.dim() - 2)))
    return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=out.device))


def select_rows(batch: RowBatch, rows: Tensor) -> RowBatch:
    """The sub-batch of ``rows [r]`` (in that order) with the actions that live in them, re-indexed.

    Actions keep their relative order; columns are trimmed to the longest kept row and action.
    """
    R, A = batch.num_rows, batch.num_actions
    new_row = torch.full((R,), -1, dtype=torch.long, device=rows.device)
    new_row[rows] = torch.arange(len(rows), device=rows.device)
    kept = (new_row[batch.boundary_row] >= 0).nonzero().squeeze(1)  # [a] old action ids kept
    new_action = torch.full((A,), -1, dtype=torch.long, device=rows.device)
    new_action[kept] = torch.arange(len(kept), device=rows.device)

    S = int(batch.attention_mask[rows].sum(1).max()) if len(rows) else 0
    L = int(batch.action_mask[kept].sum(1).max()) if len(kept) else 0
    action_index = batch.action_index[rows, :S]  # [r, S]
    action_index = torch.where(action_index >= 0, new_action[action_index.clamp(min=0)], -1)
    per_action = {
        f.name: getattr(batch, f.name)[kept]
        for f in fields(batch)
        if f.name not in ("input_ids", "attention_mask", "action_index", "boundary_row", "old_logp", "action_mask",
                          "frozen_states")
    }
    return RowBatch(
        input_ids=batch.input_ids[rows, :S],
        attention_mask=batch.attention_mask[rows, :S],
        action_index=action_index,
        boundary_row=new_row[batch.boundary_row[kept]],
        old_logp=batch.old_logp[kept, :L],
        action_mask=batch.action_mask[kept, :L],
        frozen_states=[batch.frozen_states[r] for r in rows.tolist()] if batch.frozen_states is not None else None,
        **per_action,
    )


def minibatches(
    batch: RowBatch, size: int, generator: torch.Generator | None = None, count: int | None = None
) -> Iterator[RowBatch]:
    """Shuffle the rows (with ``generator``) and yield sub-batches of ``size`` rows each (the last may be
    smaller). Split by rows, so a packed trajectory is never cut; each action goes with its row.

    ``count``: yield exactly this many near-equal sub-batches instead (data-parallel processes must all
    take the same number of optimizer steps); with fewer rows than ``count``, rows are reused cyclically."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    order = torch.randperm(batch.num_rows, generator=generator).to(batch.input_ids.device)
    if count is not None:
        if batch.num_rows < count:
            order = order.repeat(-(-count // batch.num_rows))[:count]
        for part in torch.tensor_split(order, count):
            yield select_rows(batch, part)
        return
    for start in range(0, batch.num_rows, size):
        yield select_rows(batch, order[start : start + size])
