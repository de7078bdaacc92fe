"""The numerics of (Direct-)OPD, as pure functions (SPEC §7.2–7.6). Shapes: N = response tokens of a micro-batch
(flattened, padding removed), K = top-K candidates per token.

Rewards (`--reward`), all per realized token t of the student's own sample y:
    delta-sampled   r_t = log π_post(y_t) − log π_pre(y_t)                                      (no clamp)
    delta-topk      A_{t,k} = w_k · (log π_post(x_k) − log π_pre(x_k)),  w = softmax_k(log π_θ(x_k)) detached,
                    x_1..x_K the student's top-K candidates at t; the loss sums over k (an exact top-K expectation)
    opd             r_t = −clamp(log π_θ(y_t) − log π_T(y_t), −10, 10)                        (classic OPD, k1)
The advantage is the reward itself: no baseline, no normalisation.

Loss: PPO clipped surrogate (ε = 0.2) with token-mean aggregation, plus kl_coef · k3(π_θ ‖ π_ref) on realized tokens:
    k3 = exp(q − p) − (q − p) − 1,  q − p = log π_ref − log π_θ   (clamped as verl's low_var_kl does)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

REWARDS = ("delta-sampled", "delta-topk", "opd")
OPD_CLAMP = 10.0


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


def center_reward(adv: torch.Tensor, batch_mean: float, weights_NK: torch.Tensor | None = None) -> torch.Tensor:
    """--reward-center: shift so the batch-mean token reward on the student is non-negative (only ever shifts up).

    For top-K advantages the shift is spread as w_k·c, so each token's Σ_k A_{t,k} moves by exactly c."""
    c = -min(0.0, batch_mean)
    return adv + c if weights_NK is None else adv + c * weights_NK


def eos_policy(r_N: torch.Tensor, is_stop_N: torch.Tensor, policy: str, floor: float = 0.0) -> torch.Tensor:
    """--eos-policy at the terminal stop token: raw (as scored), neutral (0), clamp (never below −floor)."""
    if policy == "raw":
        return r_N
    if policy == "neutral":
        return torch.where(is_stop_N, torch.zeros_like(r_N), r_N)
    if policy == "clamp":
        return torch.where(is_stop_N, r_N.clamp(min=-floor), r_N)
    raise ValueError(f"--eos-policy {policy!r}: choose raw, neutral or clamp")


# --- loss ---

def ppo_clip_terms(lp_N, old_lp_N, adv_N, clip_eps: float = 0.2):
    """Per-token PPO clipped surrogate −min(ρA, clip(ρ, 1±ε)A), ρ = exp(lp − old); returns (loss_N, clipped_N, kl_N)."""
    log_ratio = lp_N - old_lp_N
    ratio = torch.exp(log_ratio)
    unclipped = -adv_N * ratio
    clipped = -adv_N * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float(), -log_ratio.detach()


def low_var_kl(lp_N: torch.Tensor, ref_lp_N: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π_θ ‖ π_ref) on sampled tokens, clamped as verl's `low_var_kl` (log-ratio to ±20, k3 to ±10)."""
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


# --- the collapse watch (SPEC §7.5) ---

@dataclass
class CollapseWatch:
    onset_clip: float = 0.5
    run_clip: float = 0.9
    collapse_onset_step: int | None = None
    length_runaway_step: int | None = None
    first_mean_length: float | None = None
    longest_clip90_run: int = 0
    current_run: int = 0
    history: list = field(default_factory=list)

    def update(self, step: int, clip_ratio: float, mean_length: float) -> list[str]:
        """Feed one step; returns the events that fired on it (printed live by the training loop)."""
        events = []
        if self.first_mean_length is None:
            self.first_mean_length = mean_length
        if self.collapse_onset_step is None and clip_ratio > self.onset_clip:
            self.collapse_onset_step = step
            events.append(f"collapse onset: clip_ratio {clip_ratio:.2f} > {self.onset_clip}")
        if self.length_runaway_step is None and mean_length > 2 * self.first_mean_length:
            self.length_runaway_step = step
            events.append(f"length runaway: mean length {mean_length:.0f} > 2 × step-1's {self.first_mean_length:.0f}")
        self.current_run = self.current_run + 1 if clip_ratio > self.run_clip else 0
        self.longest_clip90_run = max(self.longest_clip90_run, self.current_run)
        return events

    @property
    def collapsed(self) -> bool:
        return self.collapse_onset_step is not None

    def summary(self) -> dict:
        return {"collapse_onset_step": self.collapse_onset_step, "length_runaway_step": self.length_runaway_step,
                "longest_clip90_run": self.longest_clip90_run}
