"""The numerics of (Direct-)OPD, as pure functions (DESIGN.md §7.2–7.6). Shapes: N = response tokens of a micro-batch
(flattened, padding removed), K = the scored candidates per token: the student's top-K for delta-topk, the one
sampled token (K = 1) for delta-sampled and opd. Every advantage is (N, K); a token's reward is its row sum.

Rewards (`--reward`), all per realized token t of the student's own sample y:
    delta-sampled   r_t = log π_post(y_t) − log π_pre(y_t)                                      (no clamp)
    delta-topk      A_{t,k} = w_k · (log π_post(x_k) − log π_pre(x_k)),  w = softmax_k(log π_θ(x_k)) detached,
                    x_1..x_K the student's top-K candidates at t; the loss sums over k (an exact top-K expectation)
    opd             r_t = −clamp(log π_θ(y_t) − log π_T(y_t), −10, 10)                        (classic OPD, k1)
The advantage is the reward itself: no baseline, no normalisation.

Loss: PPO clipped surrogate (ε = 0.2, verl's dual clip c = 3 and log-ratio clamp ±20) summed over the K candidates,
token-mean over the global batch, plus kl_coef · k3(π_θ ‖ π_ref) on realized tokens:
    k3 = exp(q − p) − (q − p) − 1,  q − p = log π_ref − log π_θ   (clamped as verl's low_var_kl does)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# the loop's collapse watch, re-exported (torch-free: lib/report/campaign.py reads it)
from lib.train.collapse import CollapseWatch  # noqa: F401

REWARDS = ("delta-sampled", "delta-topk", "opd")
OPD_CLAMP = 10.0
CLIP_RATIO_C = 3.0           # verl's dual-clip bound: a negative advantage's loss never exceeds −A · c
LOG_RATIO_CLAMP = 20.0       # verl clamps log ρ to ±20 before exp


# --- rewards ---

def delta_sampled_reward(lp_post_N: torch.Tensor, lp_pre_N: torch.Tensor) -> torch.Tensor:
    return lp_post_N - lp_pre_N


def topk_weights(student_topk_lp_NK: torch.Tensor) -> torch.Tensor:
    """w_k: the student's distribution renormalised over its own top-K candidates, detached."""
    return torch.softmax(student_topk_lp_NK.detach().float(), dim=-1)


def delta_topk_advantage(student_topk_lp_NK, lp_post_NK, lp_pre_NK) -> torch.Tensor:
    return topk_weights(student_topk_lp_NK) * (lp_post_NK - lp_pre_NK)


def opd_reward(lp_student_N: torch.Tensor, lp_teacher_N: torch.Tensor, clamp: float = OPD_CLAMP) -> torch.Tensor:
    return -torch.clamp(lp_student_N.detach() - lp_teacher_N, -clamp, clamp)


def advantages(reward: str, lp_t: dict, old_N: torch.Tensor, old_topk_NK: torch.Tensor):
    """The (N, K) advantage and the (N, K) log-ratio it is built from, as 03_opd_train's step 3 uses them.

    lp_t: each teacher's log-probs at [sampled | top-K] ids, (N, 1 + K); old_N, old_topk_NK: the student's (no grad).
    delta-sampled and opd score the sampled token (K = 1); delta-topk the student's K candidates."""
    if reward not in REWARDS:
        raise ValueError(f"--reward {reward!r}: choose one of {', '.join(REWARDS)}")
    if reward == "opd":
        lp_T = lp_t["teacher"][:, :1]
        return opd_reward(old_N[:, None], lp_T), lp_T - old_N[:, None]
    dlt_NJ = lp_t["pi_post"] - lp_t["pi_pre"]
    if reward == "delta-sampled":
        return delta_sampled_reward(lp_t["pi_post"][:, :1], lp_t["pi_pre"][:, :1]), dlt_NJ[:, :1]
    return delta_topk_advantage(old_topk_NK, lp_t["pi_post"][:, 1:], lp_t["pi_pre"][:, 1:]), dlt_NJ[:, 1:]


def candidate_weights(adv_NK: torch.Tensor, old_topk_NK: torch.Tensor) -> torch.Tensor:
    """How a shift of a token's total Σ_k A_{t,k} is spread over its candidates: w_k over the student's top-K
    (delta-topk), 1 on a single sampled candidate."""
    return topk_weights(old_topk_NK) if old_topk_NK.shape == adv_NK.shape else torch.ones_like(adv_NK)


def center_reward(adv: torch.Tensor, batch_mean: float, weights_NK: torch.Tensor | None = None) -> torch.Tensor:
    """--reward-center: shift so the batch-mean token reward on the student is non-negative (only ever shifts up).

    For top-K advantages the shift is spread as w_k·c, so each token's Σ_k A_{t,k} moves by exactly c."""
    c = -min(0.0, batch_mean)
    return adv + c if weights_NK is None else adv + c * weights_NK


EOS_POLICIES = ("raw", "neutral", "clamp", "neutral-all", "conditional")


def eos_policy(adv_NK: torch.Tensor, is_stop_N: torch.Tensor, policy: str, floor: float = 0.0,
               weights_NK: torch.Tensor | None = None, is_stop_cand_NK: torch.Tensor | None = None) -> torch.Tensor:
    """--eos-policy at the stop token: raw (as scored), neutral (every candidate's reward 0 where the student stopped),
    clamp (there, the token's total Σ_k A ≥ −floor), neutral-all (neutral, and the stop token's own reward 0 wherever
    it is a candidate: `is_stop_cand_NK`, where the student did not stop too). `conditional` replaces the whole
    advantage before this step (stop_conditional_advantage), so here it is raw.

    clamp raises a stop token's total to −floor by spreading the shift as w_k·c (as center_reward does), so a top-K
    token can never reach −K·floor; with one candidate (w = 1) it is the plain clamp. neutral-all is ours, not the
    method's: under delta-topk the stop token is also a candidate where the student wrote something else (at the end
    of an answer line, a newline), and there plain neutral leaves its Δ ≪ 0 pushing the student off it."""
    stop_N1 = is_stop_N[:, None]
    if policy in ("raw", "conditional"):
        return adv_NK
    if policy == "neutral":
        return torch.where(stop_N1, torch.zeros_like(adv_NK), adv_NK)
    if policy == "neutral-all":
        if is_stop_cand_NK is None:
            raise ValueError("--eos-policy neutral-all needs which candidates are the stop token (is_stop_cand_NK)")
        return torch.where(stop_N1 | is_stop_cand_NK, torch.zeros_like(adv_NK), adv_NK)
    if policy == "clamp":
        w = torch.ones_like(adv_NK) if weights_NK is None else weights_NK
        lift_N1 = (-floor - adv_NK.sum(-1, keepdim=True)).clamp(min=0)
        return torch.where(stop_N1, adv_NK + lift_N1 * w, adv_NK)
    raise ValueError(f"--eos-policy {policy!r}: choose one of {', '.join(EOS_POLICIES)}")


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − e^x) for x ≤ 0, accurate at both ends (x is clamped to ≤ −1e-7, so p = 1 gives ≈ −16, not −inf)."""
    x = x.clamp(max=-1e-7)
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def stop_conditional_advantage(reward: str, lp_t: dict, lp_stop_t: dict, old_topk_NK: torch.Tensor,
                               is_stop_cand_NK: torch.Tensor) -> torch.Tensor:
    """--eos-policy conditional (ours): the shift with the teachers' opinion on stopping taken out.

    Each teacher is conditioned on going on, log π(x | no stop) = log π(x) − log(1 − π(stop)) (lp_stop_t: each
    teacher's log π(stop) per token, summed over the stop ids), and Δ is taken between the conditioned teachers. The
    stop candidate is paid the w-weighted mean Δ of the other candidates at its position: the gradient of Σ_k A_k ρ_k
    on the stop token's logit is A_stop − π(stop)·Σ_k A_k, which that choice makes 0 (when the top-K holds the
    student's mass), so no position pushes the student's stop probability either way. delta-sampled: a sampled stop
    token's reward is 0. Returns the (N, K) advantage, as advantages() does."""
    post = lp_t["pi_post"] - log1mexp(lp_stop_t["pi_post"])[:, None]
    pre = lp_t["pi_pre"] - log1mexp(lp_stop_t["pi_pre"])[:, None]
    if reward == "delta-sampled":
        d_N1 = post[:, :1] - pre[:, :1]
        return torch.where(is_stop_cand_NK, torch.zeros_like(d_N1), d_N1)
    if reward != "delta-topk":
        raise ValueError(f"--eos-policy conditional needs a Direct-OPD reward (delta-topk, delta-sampled), "
                         f"not {reward!r}")
    d_NK = post[:, 1:] - pre[:, 1:]
    w_NK = topk_weights(old_topk_NK)
    w_go = torch.where(is_stop_cand_NK, torch.zeros_like(w_NK), w_NK)
    mean_go_N1 = (w_go * d_NK).sum(-1, keepdim=True) / w_go.sum(-1, keepdim=True).clamp(min=1e-30)
    return w_NK * torch.where(is_stop_cand_NK, mean_go_N1.expand_as(d_NK), d_NK)


def truncated_policy(adv_NK: torch.Tensor, is_trunc_N: torch.Tensor, policy: str) -> torch.Tensor:
    """--truncated-policy on the tokens of a response the cap cut: raw (as scored) or mask (every candidate's reward 0
    on all of them, so a response that never stops earns nothing; their KL term stays). Ours, not the method's: DAPO's
    overlong filtering drops such responses from the loss; this drops their reward only."""
    if policy == "raw":
        return adv_NK
    if policy == "mask":
        return torch.where(is_trunc_N[:, None], torch.zeros_like(adv_NK), adv_NK)
    raise ValueError(f"--truncated-policy {policy!r}: choose raw or mask")


# --- loss ---

def ppo_clip_terms(lp, old_lp, adv, clip_eps: float = 0.2, clip_ratio_c: float = CLIP_RATIO_C):
    """Elementwise PPO clipped surrogate as verl's: ρ = exp(clamp(lp − old, ±20)), loss = max(−ρA, −clip(ρ, 1±ε)A),
    and for A < 0 the dual clip min(loss, −c·A). Returns (loss, clipped, −log ρ): `clipped` marks where the ε-clip
    bound (verl's pg_clipfrac), −log ρ is verl's ppo_kl term (both detached)."""
    if not clip_ratio_c > 1:
        raise ValueError(f"dual-clip bound c = {clip_ratio_c} must be > 1")
    log_ratio = torch.clamp(lp - old_lp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    loss = torch.maximum(unclipped, clipped)
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    return loss, (clipped > unclipped).float().detach(), -log_ratio.detach()


def update_loss(lp_NK, old_NK, adv_NK, lp_N, ref_N, kl_coef: float, n_tokens: float, clip_eps: float = 0.2):
    """One micro-batch's share of the step's loss: Σ_{t,k} PPO + kl_coef · Σ_t k3, over the GLOBAL token count.

    Returns (loss, per-token pg_N, per-candidate clipped_NK, per-candidate −log ρ_NK, kl_N); the last four are
    detached, for the metrics. ref_N None: no KL term."""
    pg_NK, clipped_NK, neg_log_ratio_NK = ppo_clip_terms(lp_NK, old_NK, adv_NK, clip_eps)
    kl_N = low_var_kl(lp_N, ref_N) if ref_N is not None else torch.zeros_like(lp_N)
    pg_N = pg_NK.sum(-1)                          # the method sums over candidates, then token-means
    loss = (pg_N.sum() + kl_coef * kl_N.sum()) / n_tokens
    return loss, pg_N.detach(), clipped_NK, neg_log_ratio_NK, kl_N.detach()


def low_var_kl(lp_N: torch.Tensor, ref_lp_N: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(π_θ ‖ π_ref) on sampled tokens, clamped as verl's `low_var_kl` (log-ratio ±20, k3 ±10)."""
    kl = torch.clamp(ref_lp_N - lp_N, -20.0, 20.0)
    return torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)


# --- the adaptive KL coefficient (part of the resume state: the method's own code loses it on resume) ---

@dataclass
class KLController:
    coef: float = 2.5
    mode: str = "adaptive"            # adaptive | constant
    rate: float = 0.01
    lo: float = 0.5
    hi: float = 2.5

    def update(self, weighted_reward_mean: float) -> float:
        """×(1 − rate) when the mean reward is negative, ×(1 + rate) when positive, clamped to [lo, hi]."""
        if self.mode == "adaptive" and math.isfinite(weighted_reward_mean):
            if weighted_reward_mean < 0:
                self.coef *= 1 - self.rate
            elif weighted_reward_mean > 0:
                self.coef *= 1 + self.rate
            self.coef = min(self.hi, max(self.lo, self.coef))
        return self.coef
