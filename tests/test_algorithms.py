"""Hand-worked cases for capo_train.algorithms: every estimator and loss on tensors small enough to check
on paper (the arithmetic is in the comments), plus gradient and registry checks."""

from __future__ import annotations

import math

import pytest
import torch

from capo_train.algorithms import (
    ALGORITHMS,
    StepBatch,
    action_gae,
    action_log_ratio,
    action_ppo_loss,
    apply_kl_in_reward,
    approx_kls,
    entropy_from_logits,
    entropy_loss,
    get,
    kl_loss,
    kl_penalty,
    token_ppo_loss,
    token_value_loss,
    value_loss,
    whiten,
)
from capo_train.algorithms import estimators as E


@pytest.fixture(autouse=True)
def _float64():
    """Every test here runs in float64 (exact hand arithmetic, gradcheck); restored afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def t(*x):
    return torch.tensor(x, dtype=torch.float64)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=0)


# ============================================================================ estimators


def test_action_gae_hand_worked():
    # traj 0: r = [0, 0, 1], V = [.5, .6, .7], terminated (last_value 0), gamma .9, lam .5
    #   delta_2 = 1 + 0 - .7 = .3 ; delta_1 = 0 + .9*.7 - .6 = .03 ; delta_0 = .9*.6 - .5 = .04
    #   gamma*lam = .45: A_2 = .3 ; A_1 = .03 + .45*.3 = .165 ; A_0 = .04 + .45*.165 = .11425
    #   returns = A + V = [.61425, .765, 1.0]
    # traj 1: one real action, r = 2, V = 1, truncated with last_value .5 (padding holds garbage 99)
    #   delta_0 = 2 + .9*.5 - 1 = 1.45 = A_0 ; return 2.45 ; padded entries 0
    rewards = torch.tensor([[0.0, 0.0, 1.0], [2.0, 99.0, 99.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, ret = action_gae(rewards, values, mask, t(0.0, 0.5), gamma=0.9, lam=0.5)
    close(adv, [[0.11425, 0.165, 0.3], [1.45, 0, 0]])
    close(ret, [[0.61425, 0.765, 1.0], [2.45, 0, 0]])


def test_action_gae_rejects_right_aligned_mask():
    with pytest.raises(ValueError, match="left-aligned"):
        action_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[0, 1]]), t(0.0), 1.0, 1.0)


def _two_traj_batch(**kw):
    # traj 7: rewards [0, 0, 1], V = .5 each ; traj 3: rewards [0, 1], V = .2 each. Rows deliberately shuffled.
    rows = [(7, 2, 1.0, 0.5), (3, 0, 0.0, 0.2), (7, 0, 0.0, 0.5), (3, 1, 1.0, 0.2), (7, 1, 0.0, 0.5)]
    traj, step, r, v = zip(*rows)
    return StepBatch(reward=torch.tensor(r), traj_index=torch.tensor(traj), step_index=torch.tensor(step),
                     values=torch.tensor(v), group_index=torch.zeros(5, dtype=torch.long), **kw)


def test_capo_estimator_hand_worked():
    # gamma .99, lam 1: A_t = discounted MC return - V.
    #   traj 7: G = [.9801, .99, 1] -> A = [.4801, .49, .5];  traj 3: G = [.99, 1] -> A = [.79, .8]
    est = E.capo(_two_traj_batch(), gamma=0.99, lam=1.0, whiten_advantages=False)
    close(est.advantages, [0.5, 0.79, 0.4801, 0.8, 0.49])  # row order of the batch
    close(est.returns, [1.0, 0.99, 0.9801, 1.0, 0.99])
    # whitened at the step level: mean 0, unbiased std 1 over the 5 rows
    w = E.capo(_two_traj_batch()).advantages
    close(w, whiten(est.advantages))
    close(w.mean(), 0.0)
    close(w.std(), 1.0, tol=1e-6)


def test_capo_bootstrap_truncated():
    # traj 3 truncated with final_value 1.0: its last delta gains .99 * 1.0 -> A = [.79 + .9801, .8 + .99]
    trunc = torch.tensor([False, True, False, True, False])
    fv = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])  # read on the last row of traj 3 only
    est = E.capo(_two_traj_batch(truncated=trunc, final_value=fv), whiten_advantages=False)
    close(est.advantages, [0.5, 0.79 + 0.9801, 0.4801, 0.8 + 0.99, 0.49])
    # the authors' code: no bootstrap even when truncated
    est = E.capo(_two_traj_batch(truncated=trunc, final_value=fv), whiten_advantages=False,
                 bootstrap_truncated=False)
    close(est.advantages, [0.5, 0.79, 0.4801, 0.8, 0.49])
    with pytest.raises(ValueError, match="final_value"):
        E.capo(_two_traj_batch(truncated=trunc))


def test_capo_rejects_duplicate_steps():
    b = StepBatch(reward=t(0, 0), traj_index=torch.tensor([1, 1]), step_index=torch.tensor([0, 0]), values=t(0, 0))
    with pytest.raises(ValueError, match="same"):
        E.capo(b)


def test_ppo_token_gae_hand_worked():
    # One trajectory, step 0 has 2 action tokens (V = 1, 2; reward 0), step 1 has 1 (V = 3; reward 4).
    # Packed tokens: r = [0, 0, 4], V = [1, 2, 3], next V = [2, 3, 0]; gamma .5, lam .5 (per token):
    #   delta = [0 + .5*2 - 1, 0 + .5*3 - 2, 4 - 3] = [0, -.5, 1]
    #   A_2 = 1 ; A_1 = -.5 + .25*1 = -.25 ; A_0 = 0 + .25*(-.25) = -.0625 ; returns = A + V = [.9375, 1.75, 4]
    # Rows are given step 1 first.
    b = StepBatch(reward=t(4, 0), traj_index=torch.tensor([0, 0]), step_index=torch.tensor([1, 0]),
                  response_mask=torch.tensor([[1, 0], [1, 1]]), token_values=torch.tensor([[3.0, 9.0], [1.0, 2.0]]))
    est = E.ppo(b, gamma=0.5, lam=0.5, whiten_advantages=False)
    close(est.advantages, [[1.0, 0.0], [-0.0625, -0.25]])
    close(est.returns, [[4.0, 0.0], [0.9375, 1.75]])
    # token-level whitening over the three action tokens
    close(E.ppo(b, gamma=0.5, lam=0.5).advantages, whiten(est.advantages, b.response_mask))


def _group_batch():
    # task 0: trajectories 10 (rows r = 0, 1 -> R = 1), 11 (r = 0 -> R = 0), 12 (R = 0), 13 (r = .5, .5 -> R = 1)
    # task 1: trajectory 20 alone (R = 3)
    traj = [10, 10, 11, 12, 13, 13, 20]
    step = [0, 1, 0, 0, 0, 1, 0]
    r = [0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 3.0]
    g = [0, 0, 0, 0, 0, 0, 1]
    return StepBatch(reward=torch.tensor(r), traj_index=torch.tensor(traj), step_index=torch.tensor(step),
                     group_index=torch.tensor(g))


def test_grpo_hand_worked():
    # task 0: R = [1, 0, 0, 1], mean .5, unbiased std sqrt(4*.25/3) = .57735 -> A = +-.5/.57735 = +-.866025
    # task 1 singleton: mean 0, std 1 -> A = 3 / (1 + 1e-6)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    est = E.grpo(_group_batch())
    close(est.advantages, [a, a, -a, -a, a, a, 3 / (1 + 1e-6)])
    close(est.returns, [1, 1, 0, 0, 1, 1, 3])
    close(E.grpo(_group_batch(), norm_by_std=False).advantages, [0.5, 0.5, -0.5, -0.5, 0.5, 0.5, 3])


def test_rloo_hand_worked():
    # n = 4: 4/3 * (R - .5) = +-2/3; leave-one-out check: 1 - mean(0, 0, 1) = 2/3. Singleton -> 0.
    est = E.rloo(_group_batch())
    close(est.advantages, [2 / 3, 2 / 3, -2 / 3, -2 / 3, 2 / 3, 2 / 3, 0])


def test_reinforce_pp_baseline_hand_worked():
    # scores R - group mean: task 0 -> +-.5 ; singleton task 1 -> 3 - 0 = 3
    # row-level whitening over the 7 rows: scores [.5, .5, -.5, -.5, .5, .5, 3]
    scores = t(0.5, 0.5, -0.5, -0.5, 0.5, 0.5, 3)
    close(E.reinforce_pp_baseline(_group_batch(), whiten_level="row").advantages, whiten(scores))
    # token level: rows weigh by their length; lengths [1, 2, 1, 1, 1, 1, 3]
    b = _group_batch()
    b.response_mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 1]])
    expanded = torch.cat([scores.repeat_interleave(b.response_mask.sum(-1))])  # the 10 token scores
    w = whiten(expanded)
    first = torch.cumsum(b.response_mask.sum(-1), 0) - b.response_mask.sum(-1)
    close(E.reinforce_pp_baseline(b).advantages, w[first])


def test_reinforce_pp_hand_worked():
    # one row, 3 action tokens, step reward 1 on the last token; k1 = [.1, .2, .3] with kl_coef .5
    #   token rewards [-.05, -.1, 1 - .15 = .85] ; gamma 1 returns G = [.7, .75, .85]
    # a second row (1 token, reward 0, kl 0) gives G = [0]; whitening over the 4 tokens
    b = StepBatch(reward=t(1, 0), traj_index=torch.tensor([0, 1]), step_index=torch.tensor([0, 0]),
                  response_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]),
                  token_kl=torch.tensor([[0.1, 0.2, 0.3], [0.0, 5.0, 5.0]]))
    pb = apply_kl_in_reward(b, 0.5)
    close(pb.reward, [0.7, 0.0])  # step reward = sum of penalised token rewards
    est = E.reinforce_pp(pb)
    close(est.returns, [[0.7, 0.75, 0.85], [0.0, 0.0, 0.0]])
    close(est.advantages, whiten(est.returns, b.response_mask))
    # the registry applies the k1 penalty itself (kl_coef 0.001 by default)
    est2 = get("reinforce_pp").bind({"kl_coef": 0.5}).estimate(b)
    close(est2.returns, est.returns)


def test_gigpo_hand_worked():
    # task 0: traj a rows (anchor s0, r 0), (anchor s1, r 1); traj b rows (s0, 0), (s2, 0)
    # A^E: R = [1, 0] -> +-.5 / .70711 = +-.70711 (eps 1e-6 ignored at this tolerance)
    # step returns (gamma 1): a = [1, 1], b = [0, 0]; group (0, s0) = {a0: 1, b0: 0} -> +-.70711;
    # s1 and s2 are singletons -> 0.  A = A^E + A^S:
    b = StepBatch(reward=t(0, 1, 0, 0), traj_index=torch.tensor([0, 0, 1, 1]), step_index=torch.tensor([0, 1, 0, 1]),
                  group_index=torch.tensor([0, 0, 0, 0]), anchor=["s0", "s1", "s0", "s2"])
    s = 1 / math.sqrt(2)
    est = E.gigpo(b)
    close(est.advantages, [2 * s, s, -2 * s, -s], tol=1e-5)
    close(est.returns, [1, 1, 0, 0])
    # omega scales A^S; the same anchor in another task is a different step group
    close(E.gigpo(b, omega=0.0).advantages, [s, s, -s, -s], tol=1e-5)
    b.group_index = torch.tensor([0, 0, 1, 1])  # now each task has one trajectory: everything is 0 / singleton
    close(E.gigpo(b).advantages, [1 / (1 + 1e-6), 1 / (1 + 1e-6), 0, 0])


def test_whiten_edge_cases():
    close(whiten(t(1, 2, 3)), t(-1, 0, 1) / (1 + 1e-8))
    close(whiten(t(5.0)), [0.0])  # a single element: std taken as 0, no NaN
    close(whiten(t(1, 2, 3, 100), torch.tensor([1, 1, 1, 0])), [-1, 0, 1, 0])
    close(whiten(torch.zeros(0)), torch.zeros(0))


def test_whiten_std_floor_keeps_noise_small():
    """All episodes failed: the advantages are critic noise; plain whitening makes it unit-scale, the
    floor leaves it at noise scale, and a batch with real signal (std above the floor) is unaffected."""
    noise = t(1e-3, -2e-3, 0.5e-3, 0.5e-3)
    assert whiten(noise).abs().max() > 1
    assert whiten(noise, std_floor=0.1).abs().max() < 0.03
    signal = t(1, 0, 0, 0)
    close(whiten(signal, std_floor=0.1), whiten(signal))
    b = StepBatch(reward=t(0, 0, 0, 0), traj_index=torch.tensor([0, 0, 1, 1]),
                  step_index=torch.tensor([0, 1, 0, 1]), values=noise)
    assert E.capo(b, whiten_std_floor=0.1).advantages.abs().max() < 0.05
    assert E.capo(b).advantages.abs().max() > 1


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_estimators_ignore_row_order(name):
    gen = torch.Generator().manual_seed(0)
    B, L = 12, 5
    traj = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 4, 5])
    step = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 0])
    group = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2])
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    mask = (torch.arange(L) < lengths[:, None]).long()
    b = StepBatch(
        reward=torch.randn(B, generator=gen), traj_index=traj * 11 + 5, step_index=step * 3, group_index=group,
        values=torch.randn(B, generator=gen), response_mask=mask, token_values=torch.randn(B, L, generator=gen),
        token_kl=torch.rand(B, L, generator=gen), anchor=[f"obs{i % 4}" for i in range(B)],
        truncated=(traj == 3), final_value=torch.randn(B, generator=gen))
    perm = torch.randperm(B, generator=gen)
    shuffled = StepBatch(**{k: v if v is None else v[perm] if isinstance(v, torch.Tensor) else [v[i] for i in perm]
                            for k, v in vars(b).items()})
    alg = get(name).bind()
    a, s = alg.estimate(b), alg.estimate(shuffled)
    close(s.advantages, a.advantages[perm], tol=1e-9)
    close(s.returns, a.returns[perm], tol=1e-9)


# ============================================================================ ratios and policy losses


def test_action_log_ratio_hand_worked():
    # row 0: L = 4, z = .1 each -> S = .4 ; row 1: L = 1, z = -.2 -> S = -.2 ; row 2: L = 0
    # mu = (.4 - .2) / 5 = .04
    # capo: row 0 .04 + (.4 - 4*.04)/2 = .16 ; row 1 .04 + (-.2 - .04)/1 = -.2 ; row 2 -> 0
    old = torch.zeros(3, 4)
    logp = torch.tensor([[0.1] * 4, [-0.2, 7, 7, 7], [float("nan")] * 4])  # padding may hold anything
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    close(action_log_ratio(logp, old, mask, "capo"), [0.16, -0.2, 0.0])
    close(action_log_ratio(logp, old, mask, "geomean"), [0.1, -0.2, 0.0])
    close(action_log_ratio(logp, old, mask, "sum"), [0.4, -0.2, 0.0])
    close(action_log_ratio(logp, old, mask, "capo", mu=0.0), [0.2, -0.2, 0.0])  # S / sqrt(L)
    # clamp log w <= 10 (12 tokens of z = 1)
    close(action_log_ratio(torch.ones(1, 12), torch.zeros(1, 12), torch.ones(1, 12), "sum"), [10.0])


def test_action_ppo_loss_hand_worked():
    # the ratios of the previous test: capo log w = [.16, -.2] -> w = [1.173511, .818731]; A = [1, 2], clip .1
    #   row 0: -min(1.173511, 1.1) = -1.1 (clipped: zero gradient)
    #   row 1: -min(2 * .818731, 2 * .9) = -1.637462 (unclipped)
    #   loss = mean = -1.368731 ; d loss / d logp_{1,0} = -w A / sqrt(1) / 2 = -.818731
    old = torch.zeros(2, 4)
    logp = torch.tensor([[0.1] * 4, [-0.2, 0, 0, 0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss, diag = action_ppo_loss(logp, old, t(1, 2), mask, clip_low=0.1, clip_high=0.1)
    w1 = math.exp(-0.2)
    close(loss, -(1.1 + 2 * w1) / 2)
    close(diag["clip_frac"], 0.5)
    close(diag["clip_frac_high"], 0.5)
    close(diag["mu"], 0.04)
    loss.backward()
    close(logp.grad, [[0, 0, 0, 0], [-w1, 0, 0, 0]])


def test_capo_gradient_is_exact_derivative_and_inv_len_option():
    gen = torch.Generator().manual_seed(1)
    B, L = 4, 6
    lengths = torch.tensor([1, 3, 6, 4])
    mask = (torch.arange(L) < lengths[:, None]).long()
    old = torch.randn(B, L, generator=gen)
    logp0 = old + 0.05 * torch.randn(B, L, generator=gen)
    A = t(1.0, -0.5, 2.0, -1.5)
    wide = dict(clip_low=0.99, clip_high=100.0)  # nothing clipped
    for scale, factor in (("exact", lengths.double().rsqrt()), ("inv_len", 1 / lengths.double())):
        logp = logp0.clone().requires_grad_(True)
        loss, _ = action_ppo_loss(logp, old, A, mask, token_scale=scale, **wide)
        loss.backward()
        w = torch.exp(action_log_ratio(logp0, old, mask, "capo"))
        expected = (-(w * A * factor) / B)[:, None] * mask  # same on every action token, 0 on padding
        close(logp.grad, expected, tol=1e-12)
    # geomean: exact derivative of exp(S/L) is the 1/L factor, i.e. the two options coincide
    grads = []
    for scale in ("exact", "inv_len"):
        logp = logp0.clone().requires_grad_(True)
        action_ppo_loss(logp, old, A, mask, ratio_mode="geomean", token_scale=scale, **wide)[0].backward()
        grads.append(logp.grad)
    close(grads[0], grads[1], tol=1e-12)


def test_clipped_actions_get_zero_gradient():
    # row 0: w = e^{.5} > 1 + eps with A > 0 ; row 1: w = e^{-.5} < 1 - eps with A < 0 -> both clipped
    # row 2: w = e^{.5} with A < 0: not clipped (pessimistic branch), gets gradient
    old = torch.zeros(3, 2)
    mask = torch.ones(3, 2)
    for scale in ("exact", "inv_len"):
        logp = torch.tensor([[0.5, 0.5], [-0.5, -0.5], [0.5, 0.5]], requires_grad=True)
        loss, diag = action_ppo_loss(logp, old, t(1, -1, -1), mask, ratio_mode="geomean", token_scale=scale)
        loss.backward()
        assert torch.all(logp.grad[:2] == 0)
        assert torch.all(logp.grad[2] != 0)
        close(diag["clip_frac"], 2 / 3)


def test_action_loss_with_token_advantages():
    # [B] advantages and the same values broadcast to [B, L] give the same loss (constant within a row)
    gen = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    old, logp = torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen)
    A = t(0.3, -1.2)
    l1, _ = action_ppo_loss(logp, old, A, mask, clip_low=0.2, clip_high=0.2)
    l2, _ = action_ppo_loss(logp, old, A[:, None].expand(2, 3), mask, clip_low=0.2, clip_high=0.2)
    close(l1, l2, tol=1e-12)


def test_token_ppo_loss_hand_worked():
    # row 0: ratios [1.5, .5, 4], A = [1, 1, -1], clip .2, dual-clip 3
    #   tok0: -min(1.5, 1.2) = -1.2 (clipped) ; tok1: -min(.5, .8) = -.5
    #   tok2: max(4, 1.2) = 4, dual-clip min(4, 3) = 3
    #   row mean = (-1.2 - .5 + 3)/3 = 1.3/3
    # row 1: one token, ratio 1, A = 1 -> -1
    # seq-mean-token-mean = (1.3/3 - 1)/2 ; token-mean = (1.3 - 1)/4 = .075
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(4)], [0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    A = torch.tensor([[1.0, 1.0, -1.0], [1.0, 0.0, 0.0]])
    loss, diag = token_ppo_loss(logp, old, A, mask)
    close(loss, (1.3 / 3 - 1) / 2)
    close(diag["clip_frac"], 1 / 4)
    close(diag["dual_clip_frac"], 1 / 4)
    close(token_ppo_loss(logp, old, A, mask, agg="token-mean")[0], 0.075)
    # without dual-clip tok2 costs 4: (2.3/3 - 1)/2
    close(token_ppo_loss(logp, old, A, mask, dual_clip=None)[0], (2.3 / 3 - 1) / 2)
    loss.backward()  # clipped and dual-clipped tokens: zero gradient; tok1 and row 1 token: -A r / L / B
    close(logp.grad, [[0, -0.5 / 3 / 2, 0], [-1 / 2, 0, 0]])


def test_both_losses_log_cleanrls_two_kl_estimates():
    # logratio = logp - old_logp on the 3 action tokens: [.1, -.2, .3] (padding holds NaN)
    #   old_approx_kl = mean(-logratio) = -.2/3
    #   approx_kl = mean(e^x - 1 - x) = (.0051709181 + .0187307531 + .0498588076)/3 = .0245868263
    nan = float("nan")
    logp = torch.tensor([[0.1, -0.2], [0.3, nan]])
    old = torch.tensor([[0.0, 0.0], [0.0, nan]])
    mask = torch.tensor([[1, 1], [1, 0]])
    for _, diag in (action_ppo_loss(logp, old, t(1, -1), mask), token_ppo_loss(logp, old, t(1, -1), mask)):
        close(diag["old_approx_kl"], -0.2 / 3)
        close(diag["approx_kl"], 0.0245868263)
    # on-policy both are 0; far off-policy approx_kl stays >= 0 while old_approx_kl can go negative
    close(approx_kls(old, old, mask)["approx_kl"], 0.0)
    moved = approx_kls(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.zeros(2, 2), mask)
    assert moved["old_approx_kl"] < 0 < moved["approx_kl"]


def test_value_losses_hand_worked():
    # row 0: V 1, V_old 0, R 1: (1-1)^2 = 0 vs (clip(1, -.5, .5) - 1)^2 = .25 -> .25 (clipped term wins)
    # row 1: V 2, V_old 2, R 3: 1 vs 1 -> 1 ; loss = .5 * mean(.25, 1) = .3125
    loss, diag = value_loss(t(1, 2), t(0, 2), t(1, 3))
    close(loss, 0.3125)
    close(diag["vf_clipfrac"], 0.5)
    close(value_loss(t(1, 2, 50), t(0, 2, 0), t(1, 3, 0), torch.tensor([1, 1, 0]))[0], 0.3125)  # row mask
    # per token: the same two errors in one row (.625) and a second row with one token, V 0 V_old 0 R 2 -> 4
    # seq-mean-token-mean: .5 * (.625 + 4)/2 = 1.15625
    V = torch.tensor([[1.0, 2.0], [0.0, 9.0]])
    loss, _ = token_value_loss(V, torch.tensor([[0.0, 2.0], [0.0, 9.0]]), torch.tensor([[1.0, 3.0], [2.0, 9.0]]),
                               torch.tensor([[1, 1], [1, 0]]))
    close(loss, 1.15625)



def _verl_value_loss(values, old_values, returns, cliprange=0.5):
    """verl's compute_value_loss on one row per value: clip_by_value, then max of the two errors."""
    v_clipped = torch.max(torch.min(values, old_values + cliprange), old_values - cliprange)
    err, err_clipped = (values - returns) ** 2, (v_clipped - returns) ** 2
    return 0.5 * torch.max(err, err_clipped).mean(), torch.gt(err_clipped, err).float().mean()


def test_value_clipfrac_counts_only_entries_the_clip_moved():
    # row 0: V_old .1, V -.3, R 0: |V - V_old| = .4 < .5, so nothing is clipped; but .1 + (-.3 - .1) is
    #   -0.30000000000000004, one ulp further from R than V, and a clip fraction computed from that sum
    #   counted the row. row 1: V 1, V_old 0, R 1: really clipped. rows 2-9: V = V_old, R one above.
    V = t(-0.3, 1, *[2] * 8).requires_grad_(True)
    V_old, R = t(0.1, 0, *[2] * 8), t(0.0, 1, *[3] * 8)
    assert 0.1 + (-0.3 - 0.1) != -0.3  # the rounding this test is about
    loss, diag = value_loss(V, V_old, R)
    ref_loss, ref_clipfrac = _verl_value_loss(V, V_old, R)
    close(diag["vf_clipfrac"], 0.1)
    close(diag["vf_clipfrac"], ref_clipfrac)
    close(loss, ref_loss, tol=1e-12)
    grad, = torch.autograd.grad(loss, V)
    ref_grad, = torch.autograd.grad(ref_loss, V)
    close(grad, ref_grad, tol=1e-12)
    # the same ten values as per-token values [2, 5] (token mean per row over the full mask = plain mean)
    loss, diag = token_value_loss(V.reshape(2, 5), V_old.reshape(2, 5), R.reshape(2, 5), torch.ones(2, 5))
    close(diag["vf_clipfrac"], 0.1)
    close(loss, ref_loss, tol=1e-12)
    # float32, random values of both signs near 0 (where V_old + (V - V_old) rounds): agrees with verl
    g = torch.Generator().manual_seed(0)
    V_old = 0.2 * torch.rand(4000, generator=g, dtype=torch.float32)
    V = V_old + 0.6 * torch.rand(4000, generator=g, dtype=torch.float32) - 0.4
    R = torch.randn(4000, generator=g, dtype=torch.float32)
    _, ref_clipfrac = _verl_value_loss(V, V_old, R)
    assert value_loss(V, V_old, R)[1]["vf_clipfrac"].item() == ref_clipfrac.item()
    mask = torch.ones(40, 100)
    assert token_value_loss(V.view(40, 100), V_old.view(40, 100), R.view(40, 100), mask)[1]["vf_clipfrac"].item() \
        == ref_clipfrac.item()

def test_kl_hand_worked():
    # r = ref - logp = ln 2: k3 = 2 - ln 2 - 1 = .306853 ; k1 = logp - ref = -ln 2 ; k2 = .5 ln^2 2
    logp, ref = torch.tensor(0.0), torch.tensor(math.log(2))
    close(kl_penalty(logp, ref, "k3"), 1 - math.log(2))
    close(kl_penalty(logp, ref, "low_var_kl"), 1 - math.log(2))
    close(kl_penalty(logp, ref, "k1"), -math.log(2))
    close(kl_penalty(logp, ref, "k2"), 0.5 * math.log(2) ** 2)
    close(kl_penalty(torch.tensor(0.0), torch.tensor(30.0), "k3"), 10.0)  # clamped to [-10, 10]
    # aggregation: row 0 tokens k3 = [0, .306853], row 1 one token 0 -> (.153426 + 0)/2
    loss, _ = kl_loss(torch.zeros(2, 2), torch.tensor([[0.0, math.log(2)], [0.0, 5.0]]), torch.tensor([[1, 1], [1, 0]]))
    close(loss, (1 - math.log(2)) / 4)


def test_entropy():
    # uniform over 4 -> ln 4 ; one-hot-ish logits -> ~0
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    ent = entropy_from_logits(logits)
    close(ent, [[math.log(4), 0.0]], tol=1e-6)
    close(entropy_loss(torch.tensor([[1, 1]]), logits=logits)[0], math.log(4) / 2, tol=1e-6)
    close(entropy_loss(torch.tensor([[1, 0]]), entropy=ent)[0], math.log(4))


def test_losses_ignore_nan_padding():
    # padded positions may hold NaN/-inf (e.g. logits past the end): losses and gradients stay finite
    nan = float("nan")
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    old = torch.tensor([[-1.0, -2.0, nan], [-0.5, -float("inf"), nan]])
    A = t(1.0, -1.0)
    for fn in (lambda lp: action_ppo_loss(lp, old, A, mask)[0],
               lambda lp: action_ppo_loss(lp, old, A, mask, token_scale="inv_len")[0],
               lambda lp: token_ppo_loss(lp, old, A, mask)[0],
               lambda lp: kl_loss(lp, old, mask)[0],
               lambda lp: token_value_loss(lp, old, old, mask)[0]):
        logp = torch.tensor([[-1.1, -1.9, nan], [-0.4, nan, -float("inf")]], requires_grad=True)
        loss = fn(logp)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
        assert torch.all(logp.grad[~mask.bool()] == 0)


# ============================================================================ gradcheck (float64)


def _rand(*shape, seed=0, scale=1.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])


@pytest.mark.parametrize("mode,scale", [("capo", "exact"), ("geomean", "exact"), ("geomean", "inv_len"),
                                        ("sum", "exact")])
def test_gradcheck_action_loss(mode, scale):
    # mu is stop-grad: the "exact" gradient is the derivative of the surrogate with mu held fixed, so
    # gradcheck holds mu fixed too (mu=). capo + inv_len is deliberately NOT a derivative (1/L, not
    # 1/sqrt(L)); for geomean both options are the true derivative.
    old = _rand(3, 4, seed=1)
    logp = (old + _rand(3, 4, seed=2, scale=0.1)).requires_grad_(True)
    A = _rand(3, seed=3)
    mu = 0.03 if mode == "capo" else None
    fn = lambda lp: action_ppo_loss(lp, old, A, MASK, ratio_mode=mode, token_scale=scale, mu=mu,  # noqa: E731
                                    clip_low=0.05, clip_high=0.05)[0]
    assert torch.autograd.gradcheck(fn, (logp,))


def test_gradcheck_token_loss():
    old = _rand(3, 4, seed=1)
    logp = (old + _rand(3, 4, seed=2, scale=0.3)).requires_grad_(True)
    A = _rand(3, 4, seed=3)
    assert torch.autograd.gradcheck(lambda lp: token_ppo_loss(lp, old, A, MASK)[0], (logp,))


def test_gradcheck_value_and_kl():
    old_v, R = _rand(3, seed=1), _rand(3, seed=2)
    v = (old_v + _rand(3, seed=3, scale=0.8)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: value_loss(x, old_v, R)[0], (v,))
    old_V, RR = _rand(3, 4, seed=4), _rand(3, 4, seed=5)
    V = (old_V + _rand(3, 4, seed=6, scale=0.8)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: token_value_loss(x, old_V, RR, MASK)[0], (V,))
    ref = _rand(3, 4, seed=7)
    logp = _rand(3, 4, seed=8).requires_grad_(True)
    for kind in ("k3", "k1", "k2"):
        assert torch.autograd.gradcheck(lambda x: kl_loss(x, ref, MASK, kind=kind)[0], (logp,))


# ============================================================================ registry


def test_registry_names_and_defaults():
    assert set(ALGORITHMS) == {"capo", "ppo", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo",
                               "gigpo", "capo_no_action_credit", "capo_no_action_ratio"}
    capo = get("capo")
    assert capo.needs_critic and capo.critic_at == "boundary" and capo.ratio_mode == "capo"
    assert capo.defaults["clip_low"] == capo.defaults["clip_high"] == 3e-4
    assert capo.defaults["gamma"] == 0.99 and capo.defaults["lam"] == 1.0 and capo.defaults["group_size"] == 1
    assert get("ppo").critic_at == "tokens" and get("ppo").defaults["dual_clip"] == 3.0
    for name in ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "gigpo"):
        alg = get(name)
        assert not alg.needs_critic and alg.critic_at is None and alg.defaults["group_size"] == 8
    for name in ("capo", "ppo", "grpo", "gspo", "gigpo"):
        assert get(name).defaults["kl_in_reward"] is False and get(name).defaults["kl_type"] == "k3"
    for name in ("rloo", "reinforce_pp"):
        assert get(name).defaults["kl_in_reward"] is True and get(name).defaults["kl_type"] == "k1"
    assert get("gspo").ratio_mode == "geomean" and get("gspo").defaults["clip_high"] == 3e-4
    assert get("capo_no_action_credit").estimator is E.ppo and get("capo_no_action_credit").ratio_mode == "capo"
    assert get("capo_no_action_ratio").estimator is E.capo and get("capo_no_action_ratio").ratio_mode == "token"
    assert all(a.defaults["entropy_coef"] == 0.0 for a in ALGORITHMS.values())


def test_registry_errors_and_overrides():
    with pytest.raises(KeyError, match="capo.*grpo"):
        get("nope")
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        get("capo").bind({"gama": 0.9})
    est = get("capo").bind({"gamma": 0.99, "whiten_advantages": False}).estimate(_two_traj_batch())
    close(est.advantages, [0.5, 0.79, 0.4801, 0.8, 0.49])
    # the bound loss gets the ratio mode and the clip (defaults, then overrides)
    logp = torch.tensor([[0.1] * 4, [-0.2, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    capo = get("capo").bind({"clip_low": 0.1, "clip_high": 0.1})
    l1, _ = capo.policy_loss(logp, torch.zeros(2, 4), t(1, 2), mask)
    l2, _ = action_ppo_loss(logp, torch.zeros(2, 4), t(1, 2), mask, clip_low=0.1, clip_high=0.1)
    close(l1, l2)
    assert dict(capo.loss_kwargs) == {"ratio_mode": "capo", "clip_low": 0.1, "clip_high": 0.1, "token_scale": "exact"}
    geomean = get("capo").bind({"ratio_mode": "geomean"})
    l3, _ = geomean.policy_loss(logp, torch.zeros(2, 4), t(1, 2), mask)
    close(l3, action_ppo_loss(logp, torch.zeros(2, 4), t(1, 2), mask, ratio_mode="geomean")[0])


def test_bind_merges_once_drops_keys_of_other_algorithms_and_is_frozen():
    import dataclasses

    grpo = get("grpo").bind({"whiten_std_floor": 0.1, "gamma": 0.5, "eps": 1e-3, "clip_high": 0.3})
    assert "whiten_std_floor" not in grpo.settings and "gamma" not in grpo.settings  # capo's keys: dropped
    assert dict(grpo.estimator_kwargs) == {"eps": 1e-3}  # GRPO's own estimator key
    assert dict(grpo.loss_kwargs) == {"clip_low": 0.2, "clip_high": 0.3, "dual_clip": 3.0}
    capo = get("capo").bind({"whiten_std_floor": 0.1, "kl_coef": 0.0})
    assert capo.estimator_kwargs["whiten_std_floor"] == 0.1 and capo.kl_coef == 0.0
    assert "whiten_std_floor" not in capo.loss_kwargs and "gamma" not in capo.loss_kwargs
    assert get("capo").defaults["kl_coef"] == 0.001  # binding changes no registry default
    with pytest.raises(dataclasses.FrozenInstanceError):
        capo.settings = {}
    with pytest.raises(TypeError):
        capo.settings["gamma"] = 0.5  # read-only
    with pytest.raises(TypeError):
        get("capo").bind(gamma=0.5)  # overrides are one mapping, not keywords
