"""Rewards, top-K weights, k3 KL, PPO clip and the KL controller against values computed by hand."""
import math

import pytest
import torch

from lib import opd


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


def test_ppo_on_policy_gradient_is_the_policy_gradient():
    lp = t(-1.0, -2.0).requires_grad_()
    loss, _, _ = opd.ppo_clip_terms(lp, lp.detach(), t(0.3, -0.7))
    loss.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-0.3, 0.7])                 # −A · ∂ρ/∂lp at ρ = 1


def test_kl_controller_steps_and_clamps():
    c = opd.KLController()
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
    assert opd.eos_policy(t(-1, -2, -90), stop, "raw").tolist() == [-1, -2, -90]
    assert opd.eos_policy(t(-1, -2, -90), stop, "neutral").tolist() == [-1, -2, 0]
    assert opd.eos_policy(t(-1, -2, -90), stop, "clamp", floor=0.5).tolist() == [-1, -2, -0.5]
    with pytest.raises(ValueError, match="eos-policy"):
        opd.eos_policy(r, stop, "bogus")


def test_collapse_watch():
    w = opd.CollapseWatch()
    clips = [0.0, 0.1, 0.6, 0.95, 0.95, 0.2, 0.92, 0.99, 0.97]
    lengths = [100, 150, 201, 300, 400, 100, 400, 400, 400]
    for i, (c, n) in enumerate(zip(clips, lengths), 1):
        w.update(i, c, n)
    assert w.summary() == {"collapse_onset_step": 3, "length_runaway_step": 3, "longest_clip90_run": 3}
