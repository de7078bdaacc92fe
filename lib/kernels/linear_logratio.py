"""Fused-linear log-probs: from hidden states and the lm_head weight straight to the outputs of lib/kernels/logratio.py.

logits_NV = hidden_NH @ weight_VH^T is never materialised. Rows are cut into chunks of TILES["rows"] and the vocabulary
into tiles of TILES["cols"]; each (chunk, tile) block of logits is made by one cuBLAS matmul (in the weight's dtype,
fp32 accumulation) and folded at once into the per-row running state (max, sum, entropy numerator, top-K keys,
gathered logits) by the streaming kernels of lib/kernels/logratio_triton.py, as Cut Cross-Entropy and verl's
linear_cross_entropy do. Peak extra memory is one block plus O(N·K) state, independent of V.
We call cuBLAS per tile rather than a Triton-written matmul: the matmul is 86–94 % of the forward's time on an H200
and cuBLAS is the throughput ceiling we are measured against (bench/logratio.py, bench/RESULTS.md).

Student backward (same math as lib/kernels/logratio.py, per block): recompute the block's logits, dx = −G·softmax(x)
by the dense kernel, overwrite the ≤ K+1 scored ids of each row with their exact one-hot values, then
    grad_hidden[rows] += dx @ W[tile]        grad_W[tile] += dx^T @ hidden[rows]
with fp32 accumulators of N×H and TILES["cols"]×H (cuBLAS writes the fp32 sums directly).
FLOPs: forward 2·N·H·V; forward + backward 8·N·H·V.
Off CUDA the reference materialises the logits (chunked over rows where no grad is needed).
"""
import torch

from lib.kernels.logratio import (_check, _kernels, _row_chunks, reference_student_logprobs, reference_token_logprobs,
                                  student_backward_parts, use_triton)

TILES = {"rows": 4096, "cols": 8192}      # block = rows × cols logits (64 MiB in bf16); chosen in bench/logratio.py


def _blocks(N, V):
    """(row slice, first column, last column, is first tile, is last tile) in the order the state is carried."""
    R, C = TILES["rows"], TILES["cols"]
    for r0 in range(0, N, R):
        for v0 in range(0, V, C):
            yield slice(r0, min(r0 + R, N)), v0, min(v0 + C, V), v0 == 0, v0 + C >= V


def _check_linear(hidden_NH, weight_VH, ids, name, k=0):
    if hidden_NH.dim() != 2 or weight_VH.dim() != 2 or hidden_NH.shape[1] != weight_VH.shape[1]:
        raise ValueError(f"need hidden (N, H) and weight (V, H) with the same H, got {tuple(hidden_NH.shape)} and "
                         f"{tuple(weight_VH.shape)}: pass the lm_head weight as stored (V rows)")
    meta_NV = torch.empty(hidden_NH.shape[0], weight_VH.shape[0], device="meta")             # shape checks only
    _check(meta_NV, ids, name, k)
    return hidden_NH.contiguous(), weight_VH.contiguous(), ids.long().contiguous()


# --- reference (materialises logits) --------------------------------------------------------------------------------

def reference_linear_token_logprobs(hidden_NH, weight_VH, ids_NK):
    hidden_NH, weight_VH, ids_NK = _check_linear(hidden_NH, weight_VH, ids_NK, "ids_NK")
    lp_NK = torch.empty(ids_NK.shape, dtype=torch.float32, device=hidden_NH.device)
    with torch.no_grad():
        for r in _row_chunks(hidden_NH.shape[0], weight_VH.shape[0]):
            lp_NK[r] = reference_token_logprobs(hidden_NH[r] @ weight_VH.T, ids_NK[r])
    return lp_NK


def reference_linear_student_logprobs(hidden_NH, weight_VH, ids_N, k):
    return reference_student_logprobs(hidden_NH @ weight_VH.T, ids_N, k)


# --- fused ----------------------------------------------------------------------------------------------------------

def _fused_token_logprobs(hidden_NH, weight_VH, ids_NK):
    kt = _kernels()
    N, K = ids_NK.shape
    f32 = dict(dtype=torch.float32, device=hidden_NH.device)
    m_N, s_N, xg_NK, lp_NK = torch.empty(N, **f32), torch.empty(N, **f32), torch.empty(N, K, **f32), \
        torch.empty(N, K, **f32)
    with torch.no_grad():
        for r, v0, v1, first, last in _blocks(N, weight_VH.shape[0]):
            x_nw = hidden_NH[r] @ weight_VH[v0:v1].T                                          # (rows, cols) block
            kt.token_tile(x_nw, ids_NK[r], v0, m_N[r], s_N[r], xg_NK[r], lp_NK[r], first, last)
    return lp_NK


_FP32_OUT_MM = [True]      # torch's 16-bit × 16-bit → fp32 addmm (out_dtype); switched off if this torch lacks it


def _accumulate(acc_f32, a, b):
    """acc_f32 += a @ b for 16-bit a, b: one cuBLAS call accumulating in fp32, no rounded 16-bit product between."""
    if acc_f32.is_cuda and a.dtype != torch.float32 and _FP32_OUT_MM[0]:
        try:
            torch.addmm(acc_f32, a, b, out_dtype=torch.float32, out=acc_f32)
            return
        except (RuntimeError, TypeError):
            _FP32_OUT_MM[0] = False
    acc_f32 += (a @ b).float()


class LinearStudentLogprobs(torch.autograd.Function):
    """(hidden_NH, weight_VH, ids_N, k) -> lp_N, topk_ids_NK, topk_lp_NK, entropy_N; grads into hidden and weight."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, ids_N, k):
        kt = _kernels()
        N = hidden_NH.shape[0]
        state = kt.new_student_state(N, k, hidden_NH.device)
        out = kt.new_student_out(N, k, hidden_NH.device)
        for r, v0, v1, first, last in _blocks(N, weight_VH.shape[0]):
            x_nw = hidden_NH[r] @ weight_VH[v0:v1].T
            kt.student_tile(x_nw, ids_N[r], k, v0, [t[r] for t in state], [t[r] for t in out], first, last)
        lp_N, lse_N, ent_N, keys_NK, topk_lp_NK = out
        topk_ids_NK, topk_lp_NK = kt.keys_to_ids(keys_NK, topk_lp_NK)
        ctx.save_for_backward(hidden_NH, weight_VH, ids_N, topk_ids_NK, lp_N, topk_lp_NK, lse_N)
        ctx.mark_non_differentiable(topk_ids_NK, ent_N)
        return lp_N, topk_ids_NK, topk_lp_NK, ent_N

    @staticmethod
    def backward(ctx, g_lp_N, _g_ids, g_topk_NK, _g_ent):
        kt = _kernels()
        hidden_NH, weight_VH, ids_N, topk_ids_NK, lp_N, topk_lp_NK, lse_N = ctx.saved_tensors
        ids_NJ, G_N, values_NJ = student_backward_parts(ids_N, topk_ids_NK, lp_N, topk_lp_NK, g_lp_N, g_topk_NK)
        values_NJ = values_NJ.to(hidden_NH.dtype)
        N, H = hidden_NH.shape
        V = weight_VH.shape[0]
        grad_h_NH = torch.zeros(N, H, dtype=torch.float32, device=hidden_NH.device)
        grad_w_VH = torch.empty_like(weight_VH) if ctx.needs_input_grad[1] else None
        # vocabulary tiles outermost, so each tile's weight gradient is accumulated over the rows once, in fp32
        R, C = TILES["rows"], TILES["cols"]
        for v0 in range(0, V, C):
            v1 = min(v0 + C, V)
            w_CH = weight_VH[v0:v1]
            if grad_w_VH is not None:
                gw_CH = torch.zeros(v1 - v0, H, dtype=torch.float32, device=hidden_NH.device)
            for r0 in range(0, N, R):
                r = slice(r0, min(r0 + R, N))
                x_nw = hidden_NH[r] @ w_CH.T
                # 8 spare columns past the tile (keeping rows 16-byte aligned) take the scatters of ids outside it
                dx_buf = torch.empty(x_nw.shape[0], v1 - v0 + 8, dtype=x_nw.dtype, device=x_nw.device)
                dx_nw = kt.softmax_grad(x_nw, lse_N[r], G_N[r], dx_buf[:, : v1 - v0])        # −G·softmax
                ids_nJ = ids_NJ[r]
                local_nJ = torch.where((ids_nJ >= v0) & (ids_nJ < v1), ids_nJ - v0, v1 - v0)
                dx_buf.scatter_(1, local_nJ, values_NJ[r])                                   # one-hot part
                _accumulate(grad_h_NH[r], dx_nw, w_CH)
                if grad_w_VH is not None:
                    _accumulate(gw_CH, dx_nw.T, hidden_NH[r])
            if grad_w_VH is not None:
                grad_w_VH[v0:v1] = gw_CH
        return grad_h_NH.to(hidden_NH.dtype), grad_w_VH, None, None


# --- public API -------------------------------------------------------------------------------------------------------

def linear_token_logprobs(hidden_NH, weight_VH, ids_NK):
    """Log-probs (fp32, no grad) of K given ids per row under logits = hidden @ weight^T: -> (N, K)."""
    if not use_triton(hidden_NH):
        return reference_linear_token_logprobs(hidden_NH, weight_VH, ids_NK)
    return _fused_token_logprobs(*_check_linear(hidden_NH, weight_VH, ids_NK, "ids_NK"))


def linear_teacher_logprobs(hidden_post_NH, weight_post_VH, hidden_pre_NH, weight_pre_VH, ids_NK):
    """Both teachers from their last hidden states and lm_heads -> (lp_post_NK, lp_pre_NK, delta_NK)."""
    lp_post_NK = linear_token_logprobs(hidden_post_NH, weight_post_VH, ids_NK)
    lp_pre_NK = linear_token_logprobs(hidden_pre_NH, weight_pre_VH, ids_NK)
    return lp_post_NK, lp_pre_NK, lp_post_NK - lp_pre_NK


def linear_student_logprobs(hidden_NH, weight_VH, ids_N, k):
    """As lib.kernels.logratio.student_logprobs on hidden @ weight^T; lp_N and topk_lp_NK carry grad into hidden and
    weight."""
    if not use_triton(hidden_NH):
        return reference_linear_student_logprobs(hidden_NH, weight_VH, ids_N, k)
    hidden_NH, weight_VH, ids_N = _check_linear(hidden_NH, weight_VH, ids_N, "ids_N", k)
    return LinearStudentLogprobs.apply(hidden_NH, weight_VH, ids_N, k)
