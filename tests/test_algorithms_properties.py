"""Hypothesis property tests for capo_train.algorithms (float64 throughout)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capo_train.algorithms import StepBatch, action_gae, action_log_ratio, whiten
from capo_train.algorithms import estimators as E

F64 = torch.float64
SETTINGS = settings(max_examples=40, deadline=None)
small = st.floats(-5, 5, allow_nan=False, allow_infinity=False)


@st.composite
def trajectories(draw, max_n=4, max_t=6):
    """Padded trajectories: rewards, values [N, T] (garbage on padding), mask [N, T] left-aligned, lengths [N]."""
    n = draw(st.integers(1, max_n))
    t = draw(st.integers(1, max_t))
    lengths = draw(st.lists(st.integers(0, t), min_size=n, max_size=n))
    rewards = torch.tensor(draw(st.lists(st.lists(small, min_size=t, max_size=t), min_size=n, max_size=n)), dtype=F64)
    values = torch.tensor(draw(st.lists(st.lists(small, min_size=t, max_size=t), min_size=n, max_size=n)), dtype=F64)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return rewards, values, mask, lengths


def naive_gae(r, v, length, last_value, gamma, lam):
    """Definition, term by term: A_t = sum_l (gamma lam)^l delta_{t+l}."""
    vals = [float(v[i]) for i in range(length)] + [last_value]
    delta = [float(r[i]) + gamma * vals[i + 1] - vals[i] for i in range(length)]
    return [sum((gamma * lam) ** (l - i) * delta[l] for l in range(i, length)) for i in range(length)]


@SETTINGS
@given(trajectories(), st.floats(0, 1), st.floats(0, 1), st.lists(small, min_size=4, max_size=4))
def test_action_gae_matches_definition(traj, gamma, lam, last):
    r, v, mask, lengths = traj
    last_value = torch.tensor(last[: len(lengths)], dtype=F64)
    adv, ret = action_gae(r, v, mask, last_value, gamma, lam)
    for i, n in enumerate(lengths):
        expected = naive_gae(r[i], v[i], n, float(last_value[i]), gamma, lam)
        torch.testing.assert_close(adv[i, :n], torch.tensor(expected, dtype=F64), atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(ret[i, :n], adv[i, :n] + v[i, :n])
        assert torch.all(adv[i, n:] == 0) and torch.all(ret[i, n:] == 0)  # padding: 0 advantage, 0 return


@SETTINGS
@given(trajectories())
def test_gamma_lam_one_is_monte_carlo_minus_value(traj):
    r, v, mask, lengths = traj
    adv, _ = action_gae(r, v, mask, torch.zeros(len(lengths), dtype=F64), 1.0, 1.0)
    for i, n in enumerate(lengths):
        mc = torch.flip(torch.cumsum(torch.flip(r[i, :n], [0]), 0), [0])  # sum_{k >= t} r_k
        torch.testing.assert_close(adv[i, :n], mc - v[i, :n], atol=1e-9, rtol=1e-9)


@SETTINGS
@given(trajectories(), st.floats(0, 1))
def test_lam_zero_is_td_residual(traj, gamma):
    r, v, mask, lengths = traj
    adv, _ = action_gae(r, v, mask, torch.zeros(len(lengths), dtype=F64), gamma, 0.0)
    for i, n in enumerate(lengths):
        next_v = torch.cat([v[i, 1:n], torch.zeros(1, dtype=F64)])
        torch.testing.assert_close(adv[i, :n], r[i, :n] + gamma * next_v - v[i, :n], atol=1e-9, rtol=1e-9)


@SETTINGS
@given(trajectories(), st.integers(1, 4), small, st.floats(0, 1), st.floats(0, 1))
def test_padding_does_not_change_real_entries(traj, extra, garbage, gamma, lam):
    r, v, mask, lengths = traj
    last_value = torch.ones(len(lengths), dtype=F64)
    adv, ret = action_gae(r, v, mask, last_value, gamma, lam)
    pad = torch.full((len(lengths), extra), garbage, dtype=F64)
    r2 = torch.where(mask, r, garbage)  # rewrite padding too
    adv2, ret2 = action_gae(torch.cat([r2, pad], 1), torch.cat([torch.where(mask, v, -garbage), pad], 1),
                            torch.cat([mask, torch.zeros(len(lengths), extra, dtype=torch.bool)], 1),
                            last_value, gamma, lam)
    torch.testing.assert_close(adv2[:, : r.shape[1]], adv)
    torch.testing.assert_close(ret2[:, : r.shape[1]], ret)


# ----------------------------------------------------------------------------- the CAPO ratio


@st.composite
def token_log_ratios(draw, equal_lengths=False):
    """``z [B, L]`` token log-ratios (as logp, with old_logp = 0) and mask; every row has >= 1 token."""
    b = draw(st.integers(1, 6))
    width = draw(st.integers(1, 8))
    if equal_lengths:
        lengths = [draw(st.integers(1, width))] * b
    else:
        lengths = draw(st.lists(st.integers(1, width), min_size=b, max_size=b))
    z = torch.tensor(draw(st.lists(st.lists(st.floats(-0.5, 0.5), min_size=width, max_size=width),
                                   min_size=b, max_size=b)), dtype=F64)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return z, mask, torch.tensor(lengths, dtype=F64)


def _lw(z, mask, mode, **kw):
    return action_log_ratio(z, torch.zeros_like(z), mask, mode, **kw)


@SETTINGS
@given(token_log_ratios(equal_lengths=True))
def test_capo_ratio_equal_lengths_mu_zero(data):
    # mu = 0 and every L equal: log w = S / sqrt(L) = sum / sqrt(L) = geomean * sqrt(L)
    z, mask, L = data
    capo = _lw(z, mask, "capo", mu=0.0)
    torch.testing.assert_close(capo, _lw(z, mask, "sum") / L.sqrt())
    torch.testing.assert_close(capo, _lw(z, mask, "geomean") * L.sqrt())


@SETTINGS
@given(token_log_ratios(equal_lengths=True))
def test_capo_ratio_equal_lengths_mean_restoration(data):
    # equal L, batch mu = mean(S) / L: the batch mean of log w is mu, which is also the batch mean of the
    # geomean log-ratio (mean restoration keeps the average update direction)
    z, mask, L = data
    mu = (z * mask).sum() / mask.sum()
    capo = _lw(z, mask, "capo")
    torch.testing.assert_close(capo.mean(), mu)
    torch.testing.assert_close(capo.mean(), _lw(z, mask, "geomean").mean())


@SETTINGS
@given(token_log_ratios())
def test_capo_ratio_sqrt_length_weighted_centring(data):
    # any lengths: sum_t sqrt(L_t) (log w_t - mu) = sum_t (S_t - L_t mu) = 0
    z, mask, L = data
    mu = (z * mask).sum() / mask.sum()
    torch.testing.assert_close((L.sqrt() * (_lw(z, mask, "capo") - mu)).sum(), torch.tensor(0.0, dtype=F64))


@SETTINGS
@given(token_log_ratios(), st.floats(-1, 1))
def test_capo_ratio_uniform_drift(data, c):
    # a drift c added to every token: mu absorbs it, log w - mu is unchanged
    z, mask, _ = data
    base = _lw(z, mask, "capo") - (z * mask).sum() / mask.sum()
    shifted = _lw(z + c, mask, "capo") - ((z + c) * mask).sum() / mask.sum()
    torch.testing.assert_close(shifted, base)
    # the pure drift itself passes through unchanged (log w = c for every action, like geomean)
    torch.testing.assert_close(_lw(torch.full_like(z, c), mask, "capo"), torch.full((z.shape[0],), c, dtype=F64))


@SETTINGS
@given(token_log_ratios())
def test_capo_ratio_single_token_actions(data):
    # L = 1 everywhere: capo = geomean = sum
    z, _, _ = data
    mask = torch.zeros_like(z, dtype=torch.bool)
    mask[:, 0] = True
    torch.testing.assert_close(_lw(z, mask, "capo"), _lw(z, mask, "sum"))
    torch.testing.assert_close(_lw(z, mask, "geomean"), _lw(z, mask, "sum"))


# ----------------------------------------------------------------------------- whitening, group baselines


@SETTINGS
@given(st.lists(small, min_size=2, max_size=30))
def test_whiten_mean_zero_std_one(xs):
    x = torch.tensor(xs, dtype=F64)
    w = whiten(x)
    assert torch.isfinite(w).all()
    if x.std() > 1e-3:  # (x - mean) / (std + 1e-8): mean 0, std 1 up to the eps
        assert abs(float(w.mean())) < 1e-9 and abs(float(w.std()) - 1) < 1e-4
    # |x - mean| <= sqrt(n - 1) * std (unbiased std), so no whitened value exceeds sqrt(n - 1), whatever
    # the spread: a (near-)constant input stays bounded instead of blowing up its rounding error
    assert w.abs().max() <= (len(xs) - 1) ** 0.5 + 1e-6


@st.composite
def step_batches(draw):
    """Random step rows: trajectories of 1-4 steps grouped into tasks; rows shuffled."""
    n = draw(st.integers(1, 8))
    steps = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    tasks = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    traj = torch.tensor([i for i, s in enumerate(steps) for _ in range(s)])
    step = torch.tensor([k for s in steps for k in range(s)])
    b = traj.numel()
    reward = torch.tensor(draw(st.lists(small, min_size=b, max_size=b)), dtype=F64)
    values = torch.tensor(draw(st.lists(small, min_size=b, max_size=b)), dtype=F64)
    anchors = draw(st.lists(st.sampled_from("abc"), min_size=b, max_size=b))
    perm = torch.tensor(draw(st.permutations(range(b))), dtype=torch.long)
    return StepBatch(reward=reward[perm], traj_index=traj[perm] * 7 + 3, step_index=step[perm],
                     group_index=torch.tensor(tasks)[traj][perm], values=values[perm],
                     anchor=[anchors[i] for i in perm.tolist()])


def _per_trajectory(batch, x):
    """One value per trajectory from a row tensor that is constant within a trajectory: {traj: (task, x)}."""
    out = {}
    for i, tr in enumerate(batch.traj_index.tolist()):
        out[tr] = (int(batch.group_index[i]), float(x[i]))
    return out


@SETTINGS
@given(step_batches())
def test_grpo_and_rloo_sum_to_zero_within_each_group(batch):
    for est in (E.grpo, E.rloo):
        per_traj = _per_trajectory(batch, est(batch).advantages)
        sizes, sums = {}, {}
        for task, a in per_traj.values():
            sizes[task] = sizes.get(task, 0) + 1
            sums[task] = sums.get(task, 0.0) + a
        for task in sums:
            if sizes[task] > 1:  # singleton groups: grpo gives R / (1 + eps), rloo 0
                assert abs(sums[task]) < 1e-6


@SETTINGS
@given(step_batches(), st.data())
def test_estimators_are_row_order_invariant(batch, data):
    perm = torch.tensor(data.draw(st.permutations(range(batch.reward.numel()))), dtype=torch.long)
    shuffled = StepBatch(reward=batch.reward[perm], traj_index=batch.traj_index[perm],
                         step_index=batch.step_index[perm], group_index=batch.group_index[perm],
                         values=batch.values[perm], anchor=[batch.anchor[i] for i in perm.tolist()])
    for est in (E.capo, E.grpo, E.rloo, E.gigpo):
        a, s = est(batch), est(shuffled)
        torch.testing.assert_close(s.advantages, a.advantages[perm], atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(s.returns, a.returns[perm], atol=1e-9, rtol=1e-9)


@SETTINGS
@given(step_batches())
def test_capo_estimator_equals_action_gae_per_trajectory(batch):
    # with gamma = lam = 1, no whitening: A = (sum of the trajectory's rewards from this step on) - V
    est = E.capo(batch, gamma=1.0, lam=1.0, whiten_advantages=False)
    for i in range(batch.reward.numel()):
        same = (batch.traj_index == batch.traj_index[i]) & (batch.step_index >= batch.step_index[i])
        expected = float(batch.reward[same].sum() - batch.values[i])
        assert math.isclose(float(est.advantages[i]), expected, abs_tol=1e-9)
