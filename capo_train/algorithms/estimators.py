"""Advantage estimators over actions: CAPO's action-level GAE and the baselines it is compared with.

An action is one LLM response, i.e. one environment step (the authors' code makes each one its own
training row; ``capo_train.rows`` may pack a whole trajectory into one model-input row instead, which the
estimators never see). Shapes: ``A`` = number of actions, ``L`` = padded action length in tokens,
``N`` = number of trajectories, ``T`` = most actions in one trajectory. Actions may come in any order:
estimators place them by ``(traj_index, step_index)`` and every result is per action, so shuffling the
actions shuffles the results the same way and changes nothing else.

An estimator is ``fn(batch: StepBatch, **hyperparameters) -> Estimate`` where ``Estimate.advantages``
is ``[A]`` (one advantage per action, for action-level estimators: capo, grpo, rloo,
reinforce_pp_baseline, gigpo) or ``[A, L]`` (per action token: ppo's token GAE, reinforce_pp), and
``Estimate.returns`` has the same shape (critic targets for critic methods; the Monte-Carlo quantity the
advantage was built from otherwise). Policy losses take either shape. Estimators run under
``torch.no_grad``: advantages never carry gradient.

KL in the reward (RLOO, REINFORCE++): :func:`apply_kl_in_reward` subtracts ``kl_coef * k1`` from the
token rewards before the estimator runs (``BoundAlgorithm.estimate`` does it when ``kl_in_reward`` is set).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Hashable, NamedTuple, Sequence

import torch
from torch import Tensor


@dataclass
class StepBatch:
    """The estimator input: one entry per action (``[A]``) or per action token (``[A, L]``).

    Required:
      reward       [A] float  step reward r_t (sum of the action's token rewards).
      traj_index   [A] int    trajectory id (any integers; the actions of one trajectory share it).
      step_index   [A] int    the action's position inside its trajectory (0..T_i-1; only the order matters).
    Needed by some estimators:
      group_index  [A] int    task id; the trajectories of one task form a group (grpo, rloo, gigpo, ...).
                              Must be the same on every action of a trajectory.
      values       [A] float  critic value at the action boundary, V(s_t) (capo, capo_no_action_ratio).
      truncated    [A] bool   True on the actions of a trajectory that ended by truncation (max steps);
                              None = every trajectory terminated.
      final_value  [A] float  critic value of the state AFTER the trajectory's last action; read only on
                              the last action of truncated trajectories (bootstrapping).
      response_mask [A, L]    1 on action tokens (ppo, reinforce_pp, token whitening, kl_in_reward).
      token_values [A, L]     critic value before each action token (ppo); token_values[:, 0] = V(s_t).
      token_rewards [A, L]    per-token rewards; default: ``reward`` placed on the action's last token.
      token_kl     [A, L]     k1 = old_logp - ref_logp per action token (for kl_in_reward).
      anchor       [A]        hashable anchor-observation key per action (gigpo), e.g. a string or int.
    """

    reward: Tensor
    traj_index: Tensor
    step_index: Tensor
    group_index: Tensor | None = None
    values: Tensor | None = None
    truncated: Tensor | None = None
    final_value: Tensor | None = None
    response_mask: Tensor | None = None
    token_values: Tensor | None = None
    token_rewards: Tensor | None = None
    token_kl: Tensor | None = None
    anchor: Sequence[Hashable] | Tensor | None = None


class Estimate(NamedTuple):
    """Estimator output: ``advantages`` and ``returns``, both ``[A]`` or both ``[A, L]``."""

    advantages: Tensor
    returns: Tensor | None


# ----------------------------------------------------------------------------- generic pieces


def whiten(values: Tensor, mask: Tensor | None = None, eps: float = 1e-8, std_floor: float = 0.0) -> Tensor:
    """Masked whitening ``(x - mean) / (max(std, std_floor) + eps)`` with torch's unbiased std; 0 outside
    the mask.

    Any shape; the statistics are over all masked entries together (action level for ``[A]``
    advantages, token level for ``[A, L]``). With 0 or 1 entry the std is taken as 0 (not NaN), so a
    single entry whitens to 0. ``std_floor`` (0: plain whitening, the paper's): a batch in which every
    episode failed has advantages that are only critic noise (~1e-3 from a fresh value head), which plain
    whitening blows up to unit scale, so the actor takes full-size steps in random directions; a floor
    on the std (in reward units, e.g. 0.1 for 0/1 rewards) keeps such batches' steps small.
    """
    m = torch.ones_like(values, dtype=torch.bool) if mask is None else mask.bool()
    n = m.sum()
    mean = torch.where(m, values, 0).sum() / n.clamp(min=1)
    centred = torch.where(m, values - mean, 0)
    var = (centred**2).sum() / (n - 1).clamp(min=1)  # unbiased, like torch.std; n <= 1 gives 0
    return torch.where(m, centred / (var.sqrt().clamp(min=std_floor) + eps), 0)


def discounted_cumsum(x: Tensor, mask: Tensor, discount: float) -> Tensor:
    """``y_t = x_t + discount * y_{t+1}`` along the last axis, restarting at masked-out positions.

    ``x, mask [N, T]`` with ``mask`` left-aligned (real entries first). Returns ``[N, T]``, 0 on padding.
    A plain backward loop over ``T`` (vectorised over ``N``): readable, and ``T`` is small for steps.
    """
    m = mask.bool()
    out = torch.zeros_like(x)
    running = torch.zeros_like(x[..., 0])
    for t in reversed(range(x.shape[-1])):
        running = torch.where(m[..., t], x[..., t] + discount * running, 0)
        out[..., t] = running
    return out


def _trajectory_layout(traj_index: Tensor, step_index: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """Where each action sits in a padded ``[N, T]`` trajectory grid.

    Returns ``traj [A]`` (0..N-1, trajectories numbered by sorted id), ``pos [A]`` (0..T_i-1, rank of
    the action's step_index inside its trajectory), ``N`` and ``T``. Depends only on the (id, step) pairs,
    never on the order of the actions. Raises on a repeated (traj, step) pair.
    """
    A = traj_index.shape[0]
    _, traj = torch.unique(traj_index, return_inverse=True)  # [A]
    N = int(traj.max()) + 1 if A else 0
    order = torch.argsort(step_index, stable=True)
    order = order[torch.argsort(traj[order], stable=True)]  # actions sorted by (traj, step)
    t_sorted, s_sorted = traj[order], step_index[order]
    if A > 1 and ((t_sorted[1:] == t_sorted[:-1]) & (s_sorted[1:] == s_sorted[:-1])).any():
        raise ValueError("two actions share the same (traj_index, step_index)")
    counts = torch.bincount(traj, minlength=N)  # [N] steps per trajectory
    starts = torch.cumsum(counts, 0) - counts  # [N] first sorted position of each trajectory
    pos = torch.empty_like(traj)
    pos[order] = torch.arange(A, device=traj.device) - starts[t_sorted]
    T = int(counts.max()) if A else 0
    return traj, pos, N, T


def _to_grid(x: Tensor, traj: Tensor, pos: Tensor, N: int, T: int) -> Tensor:
    """Per action ``[A]`` -> padded trajectories ``[N, T]`` (0 on padding)."""
    grid = torch.zeros(N, T, dtype=x.dtype, device=x.device)
    grid[traj, pos] = x
    return grid


def _per_trajectory(x: Tensor, traj: Tensor, N: int, what: str) -> Tensor:
    """A per-action quantity that must be constant within a trajectory ``[A]`` -> ``[N]``."""
    out = torch.zeros(N, dtype=x.dtype, device=x.device)
    out[traj] = x
    if not torch.equal(out[traj], x):
        raise ValueError(f"{what} must be the same on every action of a trajectory")
    return out


def _last_values(batch: StepBatch, traj: Tensor, pos: Tensor, N: int, bootstrap_truncated: bool) -> Tensor:
    """``[N]`` value after each trajectory's last action: 0 unless truncated and bootstrapping."""
    last_value = torch.zeros(N, dtype=batch.reward.dtype, device=batch.reward.device)
    if batch.truncated is None or not bootstrap_truncated:
        return last_value
    counts = torch.bincount(traj, minlength=N)
    is_last = pos == counts[traj] - 1  # [A]
    truncated_last = is_last & batch.truncated.bool()
    if truncated_last.any():
        if batch.final_value is None:
            raise ValueError(
                "truncated trajectories need final_value (critic value of the state after the last "
                "action) to bootstrap; pass it, or bootstrap_truncated=False for the authors' behaviour"
            )
        last_value[traj[truncated_last]] = batch.final_value[truncated_last].to(last_value.dtype)
    return last_value


def _group_mean_std(x: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element mean, unbiased std and size of its group: ``x [M], group [M] (any ids)`` -> 3 x ``[M]``."""
    _, g = torch.unique(group, return_inverse=True)
    G = int(g.max()) + 1 if g.numel() else 0
    count = torch.bincount(g, minlength=G).to(x.dtype)
    mean = torch.zeros(G, dtype=x.dtype, device=x.device).index_add_(0, g, x) / count
    sq = torch.zeros(G, dtype=x.dtype, device=x.device).index_add_(0, g, (x - mean[g]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return mean[g], std[g], count[g]


def _token_rewards(batch: StepBatch) -> Tensor:
    """``[A, L]`` token rewards: ``batch.token_rewards``, or the step reward on the last action token.

    An action with no token has nowhere to put its reward; it is dropped (token-level estimators only).
    """
    mask = _require(batch, "response_mask").bool()
    if batch.token_rewards is not None:
        return torch.where(mask, batch.token_rewards, 0)
    L = mask.shape[-1]
    last = (mask * torch.arange(1, L + 1, device=mask.device)).argmax(-1)  # [A] last action token
    rewards = torch.zeros(mask.shape, dtype=batch.reward.dtype, device=mask.device)
    rewards[torch.arange(mask.shape[0], device=mask.device), last] = batch.reward
    return torch.where(mask, rewards, 0)


def _require(batch: StepBatch, name: str):
    value = getattr(batch, name)
    if value is None:
        raise ValueError(f"this estimator needs StepBatch.{name}")
    return value


def apply_kl_in_reward(batch: StepBatch, kl_coef: float) -> StepBatch:
    """KL as a reward penalty (verl ``apply_kl_penalty``): ``r_{t,j} <- r_{t,j} - kl_coef * token_kl_{t,j}``.

    ``token_kl [A, L]`` should be k1 = old_logp - ref_logp. Returns a new batch whose ``token_rewards``
    are penalised and whose step ``reward [A]`` is their sum over the action, so action-level estimators
    (rloo) see the penalty too.
    """
    kl = _require(batch, "token_kl")
    mask = _require(batch, "response_mask").bool()
    token_rewards = _token_rewards(batch) - kl_coef * torch.where(mask, kl, 0)  # [A, L]
    return replace(batch, token_rewards=token_rewards, reward=token_rewards.sum(-1))


# ----------------------------------------------------------------------------- action-level GAE


@torch.no_grad()
def action_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, last_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE along the action (step) axis of padded trajectories (CAPO paper, Fig. 2(b); the authors' code,
    AgentR1/CAPO arft/core_algos.py, ``compute_gae_advantage_return``).

    Shapes: ``rewards, values, mask [N, T]`` (mask 1 on real actions, left-aligned), ``last_value [N]``.
    ``values[:, t]`` = V(s_t), the critic before action t. ``last_value[i]`` = value of the state after
    trajectory i's last real action: 0 where it terminated; the critic's value of the final state where
    it was truncated (the caller decides). Passing zeros reproduces the authors' code, which always
    uses 0 (it does not tell truncation from termination).

    ``delta_t = r_t + gamma V_{t+1} - V_t`` (``V_{t+1}`` of the last real action = ``last_value``),
    ``A_t = sum_l (gamma lam)^l delta_{t+l}``, ``returns = A + V``. gamma and lam are per action.
    Returns ``(advantages [N, T], returns [N, T])``, 0 on padding.
    """
    m = mask.bool()
    if m.shape[-1] > 1 and (m[:, 1:] & ~m[:, :-1]).any():
        raise ValueError("mask must be left-aligned (real actions first, then padding)")
    r = torch.where(m, rewards, 0)
    v = torch.where(m, values, 0)
    N, T = v.shape
    next_v = torch.cat([v[:, 1:], v.new_zeros(N, 1)], dim=1)  # V_{t+1}; 0 after the last real action...
    length = m.sum(-1)
    nonempty = (length > 0).nonzero(as_tuple=True)[0]
    next_v[nonempty, length[nonempty] - 1] = last_value.to(v.dtype)[nonempty]  # ...replaced by last_value there
    delta = torch.where(m, r + gamma * next_v - v, 0)
    advantages = discounted_cumsum(delta, m, gamma * lam)
    returns = torch.where(m, advantages + v, 0)
    return advantages, returns


@torch.no_grad()
def capo(
    batch: StepBatch,
    *,
    gamma: float = 0.99,
    lam: float = 1.0,
    bootstrap_truncated: bool = True,
    whiten_advantages: bool = True,
    whiten_std_floor: float = 0.0,
) -> Estimate:
    """CAPO / StepPO credit assignment: action-level GAE with the boundary critic (CAPO paper, Fig. 2(b);
    the authors' code, AgentR1/CAPO arft/core_algos.py, ``gae``: critic value at the last state token,
    GAE over actions, advantages whitened over actions, then broadcast to the action's tokens).

    Needs ``reward, traj_index, step_index, values [A]`` (and ``truncated, final_value`` to bootstrap).
    Actions -> ``[N, T]`` by (traj, step), :func:`action_gae`, back to actions; advantages whitened at the
    action level over all actions (``whiten_advantages``); returns = raw A + V (critic targets, not
    whitened).
    ``bootstrap_truncated=False`` reproduces the authors' code: V after the last action is 0 even for
    truncated (max-steps) trajectories. ``whiten_std_floor``: see :func:`whiten`. Returns
    ``Estimate([A], [A])``.
    """
    values = _require(batch, "values")
    traj, pos, N, T = _trajectory_layout(batch.traj_index, batch.step_index)
    ones = torch.ones_like(batch.reward, dtype=torch.bool)
    last_value = _last_values(batch, traj, pos, N, bootstrap_truncated)
    adv, ret = action_gae(
        _to_grid(batch.reward, traj, pos, N, T),
        _to_grid(values.to(batch.reward.dtype), traj, pos, N, T),
        _to_grid(ones, traj, pos, N, T),
        last_value,
        gamma,
        lam,
    )
    adv_actions, ret_actions = adv[traj, pos], ret[traj, pos]  # [A], [A]
    if whiten_advantages:
        adv_actions = whiten(adv_actions, std_floor=whiten_std_floor)
    return Estimate(adv_actions, ret_actions)


# ----------------------------------------------------------------------------- token-level GAE (PPO)


@torch.no_grad()
def ppo(
    batch: StepBatch,
    *,
    gamma: float = 0.99,
    lam: float = 1.0,
    bootstrap_truncated: bool = True,
    whiten_advantages: bool = True,
    whiten_std_floor: float = 0.0,
) -> Estimate:
    """PPO's token GAE over action tokens across steps (the authors' PPO baseline: AgentR1/CAPO
    arft/core_algos.py, ``compute_token_gae_advantage_return``).

    Needs ``response_mask, token_values [A, L]`` (+ ``token_rewards`` or step ``reward``). Each
    trajectory's action tokens are concatenated in step order (observation/prompt tokens are not action
    tokens, so they are skipped without advancing the recursion), then :func:`action_gae` runs over that
    token sequence with gamma/lam PER TOKEN. The last token of step t bootstraps from the first action
    token value of step t+1 (= that step's boundary value); the trajectory's last token from 0 (or
    ``final_value`` when truncated and ``bootstrap_truncated``). Token-level masked whitening
    (``whiten_std_floor``: see :func:`whiten`). Returns ``Estimate([A, L], [A, L])``.
    """
    mask = _require(batch, "response_mask").bool()
    token_values = _require(batch, "token_values")
    token_rewards = _token_rewards(batch)
    traj, pos, N, T = _trajectory_layout(batch.traj_index, batch.step_index)
    lengths = mask.sum(-1)  # [A]
    grid_len = _to_grid(lengths, traj, pos, N, T)  # [N, T]
    offset = (torch.cumsum(grid_len, 1) - grid_len)[traj, pos]  # [A] tokens of earlier actions
    K = int(grid_len.sum(1).max()) if N else 0  # longest trajectory, in action tokens
    b, j = mask.nonzero(as_tuple=True)  # every action token (action b, column j)
    k = offset[b] + torch.cumsum(mask, -1)[b, j] - 1  # its position in the packed trajectory
    n = traj[b]

    def pack(x: Tensor) -> Tensor:  # [A, L] -> [N, K]
        packed = torch.zeros(N, K, dtype=token_values.dtype, device=mask.device)
        packed[n, k] = x[b, j].to(packed.dtype)
        return packed

    packed_mask = torch.zeros(N, K, dtype=torch.bool, device=mask.device)
    packed_mask[n, k] = True
    last_value = _last_values(batch, traj, pos, N, bootstrap_truncated)
    adv_p, ret_p = action_gae(pack(token_rewards), pack(token_values), packed_mask, last_value, gamma, lam)
    adv = torch.zeros(mask.shape, dtype=adv_p.dtype, device=mask.device)
    ret = torch.zeros_like(adv)
    adv[b, j], ret[b, j] = adv_p[n, k], ret_p[n, k]
    return Estimate(whiten(adv, mask, std_floor=whiten_std_floor) if whiten_advantages else adv, ret)


# ----------------------------------------------------------------------------- critic-free, group based


def _trajectory_returns(batch: StepBatch) -> tuple[Tensor, Tensor, Tensor]:
    """``R [N]`` = sum of step rewards per trajectory, ``group [N]`` task ids, ``traj [A]`` action -> trajectory."""
    group_index = _require(batch, "group_index")
    _, traj = torch.unique(batch.traj_index, return_inverse=True)
    N = int(traj.max()) + 1 if traj.numel() else 0
    R = torch.zeros(N, dtype=batch.reward.dtype, device=batch.reward.device).index_add_(0, traj, batch.reward)
    return R, _per_trajectory(group_index, traj, N, "group_index"), traj


def _grpo_scores(R: Tensor, group: Tensor, eps: float, norm_by_std: bool) -> Tensor:
    """``[N]`` GRPO trajectory advantages ``(R - mean_G) / (std_G + eps)``; a singleton group: mean 0, std 1."""
    mean, std, count = _group_mean_std(R, group)
    single = count < 2
    mean = torch.where(single, 0, mean)
    std = torch.where(single, 1, std)
    return (R - mean) / (std + eps) if norm_by_std else R - mean


@torch.no_grad()
def grpo(batch: StepBatch, *, eps: float = 1e-6, norm_by_std: bool = True) -> Estimate:
    """GRPO: ``A_i = (R_i - mean_G R) / (std_G R + eps)`` over the trajectories of one task (as the
    authors' code runs it: AgentR1/CAPO arft/core_algos.py, ``grpo``).

    ``R_i`` = sum of trajectory i's step rewards; groups are trajectories (not actions) sharing
    ``group_index``. Singleton group: mean 0, std 1. ``norm_by_std=False`` gives Dr.GRPO-style
    ``R_i - mean``. Broadcast to every action of the trajectory. Returns ``Estimate([A], R_i per action [A])``.
    """
    R, group, traj = _trajectory_returns(batch)
    return Estimate(_grpo_scores(R, group, eps, norm_by_std)[traj], R[traj])


@torch.no_grad()
def rloo(batch: StepBatch) -> Estimate:
    """RLOO: ``A_i = R_i - mean_{j != i} R_j = n/(n-1) (R_i - mean_G R)``; singleton group -> 0.

    Usually run on KL-penalised rewards (k1 in reward, coef 0.001; see :func:`apply_kl_in_reward`).
    Broadcast to every action. Returns ``Estimate([A], R_i per action [A])``.
    """
    R, group, traj = _trajectory_returns(batch)
    mean, _, n = _group_mean_std(R, group)
    adv = torch.where(n > 1, n / (n - 1).clamp(min=1) * (R - mean), 0)
    return Estimate(adv[traj], R[traj])


@torch.no_grad()
def reinforce_pp(batch: StepBatch, *, gamma: float = 1.0, whiten_std_floor: float = 0.0) -> Estimate:
    """REINFORCE++ as the authors run it (AgentR1/CAPO arft/core_algos.py, ``reinforce_plus_plus``): token
    returns within each action, global whitening.

    ``G_{t,j} = sum_{k >= j} gamma^{k-j} r_{t,k}`` over the action's OWN tokens (the return does not
    cross actions: earlier steps only see their own rewards), then masked whitening over all action
    tokens of the batch. The token rewards are meant to include ``-kl_coef * k1`` per token: run the batch
    through :func:`apply_kl_in_reward` first (``BoundAlgorithm.estimate`` does), which needs ``token_kl``.
    Needs ``response_mask``; ``whiten_std_floor``: see :func:`whiten`. Returns ``Estimate([A, L], G [A, L])``.
    """
    mask = _require(batch, "response_mask").bool()
    G = discounted_cumsum(_token_rewards(batch), mask, gamma)  # [A, L]
    return Estimate(whiten(G, mask, std_floor=whiten_std_floor), G)


@torch.no_grad()
def reinforce_pp_baseline(batch: StepBatch, *, whiten_level: str = "token", whiten_std_floor: float = 0.0) -> Estimate:
    """REINFORCE++-baseline: ``R_i - mean_G R`` (singleton: mean 0), broadcast to actions, global whitening.

    ``whiten_level="token"`` (default, verl's ``masked_whiten`` of the broadcast ``[A, L]`` scores): the
    statistics weigh each action by its number of tokens (needs ``response_mask``); ``"row"``: every
    action counts once (one row per action, as in the authors' layout). The advantage is constant over an
    action's tokens, so the result is returned per action. ``whiten_std_floor``: see :func:`whiten`.
    Returns ``Estimate([A], R_i per action [A])``.
    """
    R, group, traj = _trajectory_returns(batch)
    mean, _, count = _group_mean_std(R, group)
    scores = (R - torch.where(count < 2, 0, mean))[traj]  # [A]
    if whiten_level == "row":
        return Estimate(whiten(scores, std_floor=whiten_std_floor), R[traj])
    if whiten_level != "token":
        raise ValueError(f"whiten_level must be 'token' or 'row', got {whiten_level!r}")
    mask = _require(batch, "response_mask").bool()
    tok = whiten(torch.where(mask, scores[:, None], 0), mask, std_floor=whiten_std_floor)  # [A, L]
    adv = tok.sum(-1) / mask.sum(-1).clamp(min=1)  # back to one value per action (constant over its tokens)
    return Estimate(adv, R[traj])


@torch.no_grad()
def gigpo(
    batch: StepBatch,
    *,
    omega: float = 1.0,
    gamma: float = 1.0,
    eps: float = 1e-6,
    step_norm: str = "mean_std",
) -> Estimate:
    """GiGPO (Feng et al. 2025; AgentR1/CAPO arft/core_algos.py, ``gigpo``): ``A = A^E + omega * A^S`` per
    action.

    ``A^E``: GRPO's episode advantage of the action's trajectory (mean-std, eps 1e-6).
    ``A^S``: actions of the same task (``group_index``) whose ``anchor`` key is identical form a step group
    (exact match). Each action's discounted step return ``R_t = sum_k gamma^k r_{t+k}`` (within its
    trajectory; gamma 1 in the authors' scripts, 0.95 in verl-agent) is normalised inside its step group:
    ``(R_t - mean) / (std + eps)`` (``step_norm="mean"``: ``R_t - mean``, verl-agent's default). A
    singleton step group gives 0 (as in verl-agent: the action minus its own mean).
    Returns ``Estimate([A], R_t [A])``.
    """
    anchor = _require(batch, "anchor")
    R_ep, group, traj_of_action = _trajectory_returns(batch)
    a_episode = _grpo_scores(R_ep, group, eps, True)[traj_of_action]  # [A]

    traj, pos, N, T = _trajectory_layout(batch.traj_index, batch.step_index)
    ones = torch.ones_like(batch.reward, dtype=torch.bool)
    step_return = discounted_cumsum(
        _to_grid(batch.reward, traj, pos, N, T), _to_grid(ones, traj, pos, N, T), gamma
    )[traj, pos]  # [A]

    keys = anchor.tolist() if isinstance(anchor, Tensor) else list(anchor)
    if len(keys) != batch.reward.shape[0]:
        raise ValueError("anchor needs one key per action")
    ids: dict[tuple, int] = {}
    step_group = torch.tensor(
        [ids.setdefault((g, key), len(ids)) for g, key in zip(batch.group_index.tolist(), keys)],
        device=batch.reward.device,
    )  # [A] step-group id: (task, anchor)
    mean, std, count = _group_mean_std(step_return, step_group)
    if step_norm == "mean_std":
        a_step = (step_return - mean) / (std + eps)
    elif step_norm == "mean":
        a_step = step_return - mean
    else:
        raise ValueError(f"step_norm must be 'mean_std' or 'mean', got {step_norm!r}")
    a_step = torch.where(count < 2, 0, a_step)
    return Estimate(a_episode + omega * a_step, step_return)


__all__ = [
    "Estimate",
    "StepBatch",
    "action_gae",
    "apply_kl_in_reward",
    "capo",
    "discounted_cumsum",
    "gigpo",
    "grpo",
    "ppo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "whiten",
]
