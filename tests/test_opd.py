"""Rewards, top-K weights, k3 KL, PPO clip and the KL controller against values computed by hand."""
import math

import pytest
import torch

from lib.train import opd


def t(*x):
    return torch.tensor(x, dtype=torch.float64)


def test_delta_sampled_is_the_plain_log_ratio():
    r = opd.delta_sampled_reward(t(-0.5, -3.0, -0.1), t(-1.0, -1.0, -0.1))
    assert r.tolist() == pytest.approx([0.5, -2.0, 0.0])


def test_topk_weights_and_advantage_by_hand():
    # student log-probs of its top-3 candidates: log(0.5), log(0.3), log(0.1) → renormalised 5/9, 3/9, 1/9
    lp = t(math.log(0.5), math.log(0.3), math.log(0.1))[None]
    w = opd.topk_weights(lp)
    assert w[0].tolist() == pytest.approx([5 / 9, 3 / 9, 1 / 9])
    post, pre = t(-1.0, -2.0, -3.0)[None], t(-1.5, -1.0, -3.0)[None]
    a = opd.delta_topk_advantage(lp, post, pre)
    assert a[0].tolist() == pytest.approx([5 / 9 * 0.5, 3 / 9 * -1.0, 0.0])
    assert not opd.topk_weights(lp.requires_grad_()).requires_grad   # detached


def test_opd_reward_is_negative_clamped_k1():
    r = opd.opd_reward(t(-1.0, -20.0, -0.5), t(-3.0, -1.0, -30.0))
    # student − teacher = 2, −19 (→ −10), 29.5 (→ 10); reward = −clamp
    assert r.tolist() == pytest.approx([-2.0, 10.0, -10.0])


def test_k3_kl_by_hand_and_clamped():
    lp, ref = t(-1.0, -2.0, 0.0), t(-1.5, -2.0, -40.0)
    # q − p = ref − lp = −0.5, 0, −20 (clamped); k3 = e^x − x − 1
    want = [math.exp(-0.5) + 0.5 - 1, 0.0, math.exp(-20) + 20 - 1]
    got = opd.low_var_kl(lp, ref).tolist()
    assert got[:2] == pytest.approx(want[:2])
    assert got[2] == pytest.approx(10.0)                                  # k3 itself clamped to 10
    assert (opd.low_var_kl(t(-1, -2), t(-1, -2)) == 0).all()


def test_ppo_clip_by_hand():
    old = t(0.0, 0.0, 0.0, 0.0)
    lp = t(math.log(1.5), math.log(1.5), math.log(0.5), math.log(1.1))
    adv = t(1.0, -1.0, -1.0, 2.0)
    loss, clipped, kl = opd.ppo_clip_terms(lp, old, adv, 0.2)
    # ρ = 1.5, A>0 → min(1.5, 1.2)·1 → loss −1.2 (clipped); ρ = 1.5, A<0 → max(1.5, 1.2) → loss 1.5 (unclipped)
    # ρ = 0.5, A<0 → −min(−0.5, −0.8) = 0.8 (clipped);       ρ = 1.1 inside the band → −2.2
    assert loss.tolist() == pytest.approx([-1.2, 1.5, 0.8, -2.2])
    assert clipped.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert kl.tolist() == pytest.approx([-math.log(1.5), -math.log(1.5), -math.log(0.5), -math.log(1.1)])


def test_ppo_dual_clip_and_log_ratio_clamp():
    # A < 0 and ρ = 5 > c = 3: the loss stops at −A·c (verl's dual clip); A > 0 is never dual-clipped
    lp = t(math.log(5.0), math.log(5.0), 30.0, -30.0)
    loss, clipped, kl = opd.ppo_clip_terms(lp, torch.zeros(4, dtype=torch.float64), t(-1.0, 1.0, -1.0, 1.0))
    assert loss.tolist() == pytest.approx([3.0, -1.2, 3.0, -math.exp(-20.0)])       # ρ = e^−20, A > 0: unclipped
    assert kl.tolist() == pytest.approx([-math.log(5.0), -math.log(5.0), -20.0, 20.0])   # log ρ clamped to ±20
    assert clipped.tolist() == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="dual-clip"):
        opd.ppo_clip_terms(lp, lp, lp, clip_ratio_c=1.0)


def test_ppo_on_policy_gradient_is_the_policy_gradient():
    lp = t(-1.0, -2.0).requires_grad_()
    loss, _, _ = opd.ppo_clip_terms(lp, lp.detach(), t(0.3, -0.7))
    loss.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-0.3, 0.7])                 # −A · ∂ρ/∂lp at ρ = 1


def test_kl_controller_steps_and_clamps():
    c = opd.KLController()
    assert opd.KLController().rate == 0.01            # the method's training script: ADAPTIVE_KL_LOSS_EPS=0.01
    assert c.update(-0.1) == pytest.approx(2.5 * 0.99)
    assert c.update(+0.1) == pytest.approx(2.5 * 0.99 * 1.01)
    assert c.update(+0.1) == pytest.approx(2.5)                           # clamped at the top
    assert c.update(0.0) == pytest.approx(2.5)                            # zero: unchanged
    for _ in range(200):
        c.update(-1.0)
    assert c.coef == pytest.approx(0.5)                                   # clamped at the bottom
    const = opd.KLController(coef=1.0, mode="constant")
    assert const.update(-5.0) == 1.0


def test_center_and_eos_policy():
    r = t(-1.0, 0.5, -0.5)
    assert opd.center_reward(r, -0.25).tolist() == pytest.approx([-0.75, 0.75, -0.25])
    assert opd.center_reward(r, +0.3).tolist() == pytest.approx(r.tolist())   # never shifts down
    w = t(0.75, 0.25)[None]
    shifted = opd.center_reward(t(0.1, -0.2)[None], -0.4, w)
    assert shifted.sum().item() == pytest.approx(-0.1 + 0.4)               # Σ_k A moves by exactly c
    stop = torch.tensor([False, False, True])
    col = t(-1, -2, -90)[:, None]                                           # one candidate per token: (N, 1)
    assert opd.eos_policy(col, stop, "raw")[:, 0].tolist() == [-1, -2, -90]
    assert opd.eos_policy(col, stop, "neutral")[:, 0].tolist() == [-1, -2, 0]
    assert opd.eos_policy(col, stop, "clamp", floor=0.5)[:, 0].tolist() == [-1, -2, -0.5]
    assert opd.eos_policy(t(0.3, 0.2, 2.0)[:, None], stop, "clamp", floor=0.5)[:, 0].tolist() == [0.3, 0.2, 2.0]
    with pytest.raises(ValueError, match="eos-policy"):
        opd.eos_policy(col, stop, "bogus")


def test_eos_neutral_all_also_zeroes_the_stop_candidate_where_the_student_went_on():
    # 3 tokens × 3 candidates; row 0 wrote a newline where the stop token was its candidate 0 (Δ ≪ 0 there), row 2
    # stopped. neutral leaves row 0's stop candidate pushing the student off it; neutral-all zeroes it, nothing else
    adv = t(-8.0, 0.5, -0.1, 0.2, 0.3, -0.4, -9.0, 0.1, 0.1).reshape(3, 3)
    stop_N = torch.tensor([False, False, True])
    cand = torch.tensor([[True, False, False], [False, False, False], [True, False, False]])
    neutral = opd.eos_policy(adv, stop_N, "neutral")
    assert neutral[0].tolist() == adv[0].tolist() and neutral[2].tolist() == [0, 0, 0]
    out = opd.eos_policy(adv, stop_N, "neutral-all", is_stop_cand_NK=cand)
    assert out.tolist() == [[0, 0.5, -0.1], [0.2, 0.3, -0.4], [0, 0, 0]]
    assert opd.eos_policy(adv, stop_N, "conditional").tolist() == adv.tolist()   # applied before, not here
    with pytest.raises(ValueError, match="is_stop_cand_NK"):
        opd.eos_policy(adv, stop_N, "neutral-all")


def test_log1mexp_is_accurate_in_float32_and_finite_at_p_one():
    x = t(-1e-6, -1e-3, -0.5, -math.log(2), -1.0, -5.0, -40.0)
    want = [math.log(1 - math.exp(v)) for v in x.tolist()]
    assert opd.log1mexp(x).tolist() == pytest.approx(want, rel=1e-9)
    x32 = x.float()                                   # float32 (the teachers' log-probs): naive 1 − e^x cancels
    assert opd.log1mexp(x32).tolist() == pytest.approx([math.log(-math.expm1(v)) for v in x32.tolist()], rel=1e-5)
    assert math.isfinite(opd.log1mexp(t(0.0)).item())                       # p(stop) = 1: clamped, not −inf


def conditional_case(seed=0, N=5, V=7, stop=6, post_stop_shift=-9.0):
    """Random student / π_pre logits over a V-token vocabulary; π_post = π_pre with only the stop logit moved."""
    g = torch.Generator().manual_seed(seed)
    z_s, z_pre = torch.randn(N, V, generator=g, dtype=torch.float64), torch.randn(N, V, generator=g, dtype=torch.float64)
    z_post = z_pre.clone()
    z_post[:, stop] += post_stop_shift
    return z_s, z_pre, z_post


def test_conditional_pays_nothing_when_the_teachers_differ_only_at_the_stop_token():
    # the idealised unlearned stop token (bench/nostop_probe.py's π_post-stoprow): raw delta-topk pays every other
    # candidate −log(1 − p_pre(stop)·(1 − e^shift)) > 0; conditioned on going on, both teachers agree everywhere
    z_s, z_pre, z_post = conditional_case()
    ids = torch.arange(7).expand(5, 7)                                     # every token a candidate (K = V)
    lp_pre, lp_post, lp_s = (torch.log_softmax(z, -1) for z in (z_pre, z_post, z_s))
    sampled = torch.zeros(5, 1, dtype=torch.long)
    lp_t = {"pi_post": torch.cat([lp_post[:, :1], lp_post], 1), "pi_pre": torch.cat([lp_pre[:, :1], lp_pre], 1)}
    stop_t = {"pi_post": lp_post[:, 6], "pi_pre": lp_pre[:, 6]}
    adv = opd.stop_conditional_advantage("delta-topk", lp_t, stop_t, lp_s, ids == 6)
    assert adv.abs().max().item() < 1e-12
    raw = opd.delta_topk_advantage(lp_s, lp_post, lp_pre)
    assert (raw[:, :6] > 0).all()                                          # what the condition takes out
    d = opd.stop_conditional_advantage("delta-sampled", lp_t, stop_t, lp_s, sampled == 6)
    assert d.abs().max().item() < 1e-12


def test_conditional_leaves_the_students_stop_probability_alone_to_first_order():
    # teachers that differ everywhere: the gradient of Σ_k A_k ρ_k on the stop logit is 0 under conditional (the
    # stop candidate is paid the w-weighted mean of the others), and clearly not under raw delta-topk
    z_s, z_pre, _ = conditional_case(seed=1)
    z_post = torch.randn(5, 7, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    lp_pre, lp_post = torch.log_softmax(z_pre, -1), torch.log_softmax(z_post, -1)
    ids, is_stop = torch.arange(7).expand(5, 7), torch.arange(7).expand(5, 7) == 6
    lp_t = {"pi_post": torch.cat([lp_post[:, :1], lp_post], 1), "pi_pre": torch.cat([lp_pre[:, :1], lp_pre], 1)}
    stop_t = {"pi_post": lp_post[:, 6], "pi_pre": lp_pre[:, 6]}

    def stop_logit_grad(adv_fn):
        z = z_s.clone().requires_grad_(True)
        lp = torch.log_softmax(z, -1).gather(1, ids)
        adv = adv_fn(lp.detach())
        (adv * torch.exp(lp - lp.detach())).sum().backward()
        return z.grad[:, 6]

    cond = stop_logit_grad(lambda old: opd.stop_conditional_advantage("delta-topk", lp_t, stop_t, old, is_stop))
    raw = stop_logit_grad(lambda old: opd.delta_topk_advantage(old, lp_post, lp_pre))
    assert cond.abs().max().item() < 1e-6 and raw.abs().max().item() > 1e-3      # (w_k is float32)
    with pytest.raises(ValueError, match="Direct-OPD"):
        opd.stop_conditional_advantage("opd", lp_t, stop_t, torch.log_softmax(z_s, -1), is_stop)


def test_truncated_policy_masks_every_token_of_a_cut_response():
    adv = t(0.5, -1.0, 2.0, 0.25).reshape(4, 1)
    trunc = torch.tensor([False, True, True, False])
    assert opd.truncated_policy(adv, trunc, "raw").tolist() == adv.tolist()
    assert opd.truncated_policy(adv, trunc, "mask")[:, 0].tolist() == [0.5, 0, 0, 0.25]
    with pytest.raises(ValueError, match="truncated-policy"):
        opd.truncated_policy(adv, trunc, "drop")


def test_eos_clamp_floors_the_tokens_total_over_topk():
    # a stop token with 3 candidates each −4: per-candidate clamping would leave a total of −3·floor; the total is
    # lifted to exactly −floor, the shift spread by the weights; the token above the floor and non-stop rows untouched
    adv = t(-4.0, -4.0, -4.0, -0.1, 0.0, 0.0, -4.0, -4.0, -4.0).reshape(3, 3)
    w = t(0.5, 0.3, 0.2, 1.0, 0.0, 0.0, 0.6, 0.2, 0.2).reshape(3, 3)
    out = opd.eos_policy(adv, torch.tensor([True, True, False]), "clamp", floor=1.0, weights_NK=w)
    assert out.sum(-1).tolist() == pytest.approx([-1.0, -0.1, -12.0])
    assert out[0].tolist() == pytest.approx([-4 + 0.5 * 11, -4 + 0.3 * 11, -4 + 0.2 * 11])
    assert out[1:].tolist() == adv[1:].tolist()


def test_advantages_as_the_loop_builds_them():
    # teachers scored at [sampled | 2 candidates]; student: sampled lp −0.5, candidates log(0.6), log(0.2)
    post = t(-1.0, -0.2, -3.0)[None]
    pre = t(-2.5, -1.2, -1.0)[None]
    old_N, old_topk = t(-0.5), t(math.log(0.6), math.log(0.2))[None]
    adv, dlt = opd.advantages("delta-sampled", {"pi_post": post, "pi_pre": pre}, old_N, old_topk[:, :0])
    assert adv.tolist() == [[1.5]] and dlt.tolist() == [[1.5]]                 # log π_post − log π_pre, not reversed
    adv, dlt = opd.advantages("delta-topk", {"pi_post": post, "pi_pre": pre}, old_N, old_topk)
    assert dlt[0].tolist() == pytest.approx([1.0, -2.0])
    assert adv[0].tolist() == pytest.approx([0.75 * 1.0, 0.25 * -2.0])           # w = (0.6, 0.2) renormalised
    adv, dlt = opd.advantages("opd", {"teacher": t(-2.0, -9.0)[None]}, old_N, old_topk[:, :0])
    assert adv.tolist() == [[-1.5]] and dlt.tolist() == [[-1.5]]                   # −(log π_θ − log π_T)
    with pytest.raises(ValueError, match="--reward"):
        opd.advantages("bogus", {}, old_N, old_topk)


def test_update_loss_on_policy_by_hand():
    lp = t(-1.0, -2.0).requires_grad_()
    adv = t(0.3, -0.7)[:, None]
    ref = t(-1.5, -2.0)
    loss, pg_N, clipped, nlr, kl_N = opd.update_loss(lp[:, None], lp.detach()[:, None], adv, lp, ref, 2.0, 4.0)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert loss.item() == pytest.approx((-0.3 + 0.7 + 2.0 * k3) / 4.0)
    assert pg_N.tolist() == pytest.approx([-0.3, 0.7]) and clipped.sum() == 0 and nlr.abs().sum() == 0
    assert kl_N.tolist() == pytest.approx([k3, 0.0])
    loss.backward()
    # ∂/∂lp: (−A + kl_coef · ∂k3/∂lp) / n,  ∂k3/∂lp = 1 − e^(ref − lp)
    assert lp.grad.tolist() == pytest.approx([(-0.3 + 2.0 * (1 - math.exp(-0.5))) / 4, 0.7 / 4])


def test_collapse_watch():
    w = opd.CollapseWatch()
    clips = [0.0, 0.1, 0.6, 0.95, 0.95, 0.2, 0.92, 0.99, 0.97]
    lengths = [100, 150, 201, 300, 400, 100, 400, 400, 400]
    for i, (c, n) in enumerate(zip(clips, lengths), 1):
        w.update(i, c, n)
    assert w.summary() == {"collapse_onset_step": 3, "length_runaway_step": 3, "longest_clip90_run": 3}
