"""Token log-probs and log-ratios from logits, without an (N, V) fp32 temporary (DESIGN.md §12).

Per scored position n (N = B·T rows) the loop needs, over a V ≈ 152k vocabulary, at temperature 1 (raw logits):

    lse_n       = log Σ_v exp(x_nv)                               (streaming, below)
    lp_nk       = x_n,id_nk − lse_n                               log-prob of a given id (K = 1 sampled, K = 16 top-K)
    delta_nk    = lp^post_nk − lp^pre_nk                          the Direct-OPD reward (teachers, no grad)
    top-K ids   = the K largest x_nv, ties → lower v first        the student's own candidates
    H_n         = lse_n − Σ_v p_nv x_nv = −Σ_v p_nv log p_nv      the student's entropy (a metric, detached)

Backward of the student's outputs lp_j = x_{i_j} − lse (j over the sampled id and the K top-K ids), upstream g_j:

    ∂L/∂x_v = Σ_j g_j ([v = i_j] − p_v) = −G·p_v + Σ_j g_j [v = i_j],      G = Σ_j g_j

so the dense part −G·softmax(x) is one streaming pass written straight in the logits' dtype, and the one-hot part
touches only the ≤ K+1 ids of a row: a scatter of values computed exactly in fp32 (`_onehot_values`).
Streaming log-sum-exp over slices b of a row: m' = max(m, max_b x), s' = s·e^(m−m') + Σ_b e^(x−m'), lse = m + log s.

Naive `log_softmax(x.float()).gather` moves ≈ 16·N·V bytes and allocates an N×V fp32 tensor; the Triton kernels
(lib/kernels/logratio_triton.py) read each logit once and write O(N·K). The pure-torch reference here is the same
math, chunked over rows so CPU memory stays bounded; it is what runs off CUDA. Dispatch: Triton when the logits are on
CUDA, or on CPU when TRITON_INTERPRET=1 and LOGRATIO_FORCE_TRITON=1 (the interpreter, for tests); else the reference.
Outputs are fp32, in nats. The fused-linear variant (hidden states → same outputs) is lib/kernels/linear_logratio.py,
which builds on this module (import its names from there; nothing here imports it).
Measured on an H200: bench/RESULTS.md.
"""
import os

import torch

REF_CHUNK_ELEMS = 1 << 24          # the reference upcasts at most this many logits at a time (64 MiB of fp32)
MAX_VOCAB = 1 << 20                # the kernels pack ids into 20 bits of a top-K key


def use_triton(x):
    if x.is_cuda:
        return True
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("LOGRATIO_FORCE_TRITON") == "1"


def _kernels():
    # imported lazily: TRITON_INTERPRET is read when the kernels are defined
    import lib.kernels.logratio_triton as kernels
    return kernels


def _check(logits_NV, ids, name, k=0):
    """Validate shapes and make the layout the kernels expect (unit stride along V, int64 ids)."""
    if logits_NV.dim() != 2:
        raise ValueError(f"logits must be (N, V), got shape {tuple(logits_NV.shape)}: flatten (B, T, V) with "
                         f".reshape(-1, V) first")
    N, V = logits_NV.shape
    if ids.shape[0] != N:
        raise ValueError(f"{name} has {ids.shape[0]} rows but logits have {N}: score the same positions")
    if V >= MAX_VOCAB:
        raise ValueError(f"vocabulary {V} ≥ {MAX_VOCAB}: widen ID_BITS in lib/kernels/logratio_triton.py")
    if not 0 <= k <= V:
        raise ValueError(f"k = {k} must be in [0, V = {V}]")
    if logits_NV.stride(1) != 1:
        logits_NV = logits_NV.contiguous()
    return logits_NV, ids.long().contiguous()


def _row_chunks(N, V):
    step = max(1, REF_CHUNK_ELEMS // max(V, 1))
    return [slice(r, min(r + step, N)) for r in range(0, N, step)]


# --- pure-torch reference -------------------------------------------------------------------------------------------

def reference_token_logprobs(logits_NV, ids_NK):
    """lp_NK = logits[n, ids_NK[n, k]] − logsumexp(logits[n]), fp32, chunked over rows."""
    logits_NV, ids_NK = _check(logits_NV, ids_NK, "ids_NK")
    lp_NK = torch.empty(ids_NK.shape, dtype=torch.float32, device=logits_NV.device)
    with torch.no_grad():
        for r in _row_chunks(*logits_NV.shape):
            x = logits_NV[r].float()                                                       # (n, V) fp32, one chunk
            lp_NK[r] = x.gather(1, ids_NK[r]) - torch.logsumexp(x, dim=1, keepdim=True)
    return lp_NK


def reference_teacher_logprobs(logits_post_NV, logits_pre_NV, ids_NK):
    lp_post_NK = reference_token_logprobs(logits_post_NV, ids_NK)
    lp_pre_NK = reference_token_logprobs(logits_pre_NV, ids_NK)
    return lp_post_NK, lp_pre_NK, lp_post_NK - lp_pre_NK


def _reference_student_forward(logits_NV, ids_N, k):
    """-> lp_N, lse_N, entropy_N, topk_ids_NK, topk_lp_NK (no autograd; chunked over rows)."""
    N, V = logits_NV.shape
    f32 = dict(dtype=torch.float32, device=logits_NV.device)
    lp_N, lse_N, ent_N = torch.empty(N, **f32), torch.empty(N, **f32), torch.empty(N, **f32)
    topk_ids_NK = torch.empty(N, k, dtype=torch.long, device=logits_NV.device)
    topk_lp_NK = torch.empty(N, k, **f32)
    for r in _row_chunks(N, V):
        x = logits_NV[r].float()
        lse = torch.logsumexp(x, dim=1)
        lse_N[r] = lse
        lp_N[r] = x.gather(1, ids_N[r, None])[:, 0] - lse
        ent_N[r] = torch.special.entr(torch.exp(x - lse[:, None])).sum(1)                  # entr(0) = 0
        if k:
            # a stable descending sort keeps equal logits in id order: ties go to the lower id
            ids = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :k]
            topk_ids_NK[r] = ids
            topk_lp_NK[r] = x.gather(1, ids) - lse[:, None]
    return lp_N, lse_N, ent_N, topk_ids_NK, topk_lp_NK


def _reference_softmax_grad(logits_NV, lse_N, g_N, dx_NV):
    for r in _row_chunks(*logits_NV.shape):
        p = torch.exp(logits_NV[r].float() - lse_N[r, None])
        dx_NV[r] = (-g_N[r, None] * p).to(dx_NV.dtype)
    return dx_NV


# --- autograd ---------------------------------------------------------------------------------------------------------

def _onehot_values(ids_NJ, g_NJ, lp_NJ):
    """Exact logit-gradient at the scored ids: Σ_{j'} g_j' [i_j' = i_j] − G·p_{i_j}; also G_N = Σ_j g_j."""
    same_NJJ = ids_NJ[:, :, None] == ids_NJ[:, None, :]                   # the sampled id may be in the top-K
    acc_NJ = (same_NJJ * g_NJ[:, None, :]).sum(2)
    G_N = g_NJ.sum(1)
    return G_N, acc_NJ - G_N[:, None] * lp_NJ.exp()


def student_backward_parts(ids_N, topk_ids_NK, lp_N, topk_lp_NK, g_lp_N, g_topk_NK):
    """Stack the differentiable outputs: -> ids_NJ, G_N, onehot values_NJ (J = 1 + K)."""
    ids_NJ = torch.cat([ids_N[:, None], topk_ids_NK], 1)
    g_NJ = torch.cat([g_lp_N[:, None], g_topk_NK], 1).float()
    G_N, values_NJ = _onehot_values(ids_NJ, g_NJ, torch.cat([lp_N[:, None], topk_lp_NK], 1))
    return ids_NJ, G_N, values_NJ


class StudentLogprobs(torch.autograd.Function):
    """(logits_NV, ids_N, k, kernels?) -> lp_N, topk_ids_NK, topk_lp_NK, entropy_N; grad flows into logits only."""

    @staticmethod
    def forward(ctx, logits_NV, ids_N, k, kernels):
        fwd = _kernels().student_forward if kernels else _reference_student_forward
        lp_N, lse_N, ent_N, topk_ids_NK, topk_lp_NK = fwd(logits_NV, ids_N, k)
        ctx.save_for_backward(logits_NV, ids_N, topk_ids_NK, lp_N, topk_lp_NK, lse_N)
        ctx.kernels = kernels
        ctx.mark_non_differentiable(topk_ids_NK, ent_N)
        return lp_N, topk_ids_NK, topk_lp_NK, ent_N

    @staticmethod
    def backward(ctx, g_lp_N, _g_ids, g_topk_NK, _g_ent):
        logits_NV, ids_N, topk_ids_NK, lp_N, topk_lp_NK, lse_N = ctx.saved_tensors
        ids_NJ, G_N, values_NJ = student_backward_parts(ids_N, topk_ids_NK, lp_N, topk_lp_NK, g_lp_N, g_topk_NK)
        dx_NV = torch.empty_like(logits_NV)                                               # logits' dtype, no fp32 N×V
        dense = _kernels().softmax_grad if ctx.kernels else _reference_softmax_grad
        dense(logits_NV, lse_N, G_N, dx_NV)                                               # −G·softmax
        dx_NV.scatter_(1, ids_NJ, values_NJ.to(dx_NV.dtype))              # duplicates write equal values
        return dx_NV, None, None, None


# --- public API -------------------------------------------------------------------------------------------------------

def token_logprobs(logits_NV, ids_NK):
    """Log-probs (fp32, no grad) of K given ids per row under one model: (N, V), (N, K) -> (N, K)."""
    if not use_triton(logits_NV):
        return reference_token_logprobs(logits_NV, ids_NK)
    logits_NV, ids_NK = _check(logits_NV, ids_NK, "ids_NK")
    with torch.no_grad():
        return _kernels().token_logprobs(logits_NV, ids_NK)


def teacher_logprobs(logits_post_NV, logits_pre_NV, ids_NK):
    """Both teachers at the same ids, one pass over each logit tensor -> (lp_post_NK, lp_pre_NK, delta_NK)."""
    lp_post_NK = token_logprobs(logits_post_NV, ids_NK)
    lp_pre_NK = token_logprobs(logits_pre_NV, ids_NK)
    return lp_post_NK, lp_pre_NK, lp_post_NK - lp_pre_NK


def student_logprobs(logits_NV, ids_N, k):
    """The student's scores: (N, V), (N,), k -> lp_N, topk_ids_NK, topk_lp_NK, entropy_N.

    lp_N and topk_lp_NK carry gradient into logits_NV; topk_ids (by logit, ties → lower id) and entropy do not.
    k = 0 gives (N, 0) top-K outputs.
    """
    logits_NV, ids_N = _check(logits_NV, ids_N, "ids_N", k)
    return StudentLogprobs.apply(logits_NV, ids_N, k, use_triton(logits_NV))


def reference_student_logprobs(logits_NV, ids_N, k):
    logits_NV, ids_N = _check(logits_NV, ids_N, "ids_N", k)
    return StudentLogprobs.apply(logits_NV, ids_N, k, False)

