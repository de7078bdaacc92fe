"""Triton kernels and launchers behind lib/kernels/logratio.py and lib/kernels/linear_logratio.py (the math is in
lib/kernels/logratio.py).

Three kernels, one program per row, each streaming over a *tile* of the vocabulary, columns [v0, v0 + W), in
BLOCK-wide slices with an online log-sum-exp:
  _token_tile_kernel    log-sum-exp + gather of K given ids                       (teachers, reference model)
  _student_tile_kernel  log-sum-exp + entropy + streaming top-K + the sampled id  (the student's forward)
  _softmax_grad_kernel  dx = -G · softmax(x), cast to x's dtype                   (dense part of the backward)
The plain path calls each kernel once with the whole row as its tile (IS_FIRST = IS_LAST = True). The fused-linear
path feeds them one matmul tile at a time and carries the per-row running state (max, sum, entropy numerator,
top-K keys, gathered logits) between tiles in small (N,)/(N, K) buffers, so the (N, V) logits never exist.

Inside, everything is in base 2 (y = x·log2 e, so each element costs one ex2) and converted back to nats on output.
Top-K keys: (logit, id) is packed into one int64 that orders like "larger logit first, then lower id", so a single
integer max finds the next candidate and ties need no special case; a slice is merged only when its max could beat
the current K-th best. How often that happens depends only on the order of the logits along the row (with the ids
in random order, about K·(1 + ln #slices) candidates enter the top-K per row).
"""
import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
ID_BITS = 20                                   # packed keys hold ids < 2**20 (Qwen's V = 151,936 < 2**18)
ID_MASK = tl.constexpr((1 << ID_BITS) - 1)
ID_MUL = tl.constexpr(1 << ID_BITS)
ID_SHIFT = tl.constexpr(ID_BITS)
TAKEN = tl.constexpr(-(1 << 62))               # key of a padded column or of a candidate already moved into the top-K
NEVER = tl.constexpr(1 << 62)                  # key of a top-K slot past K (power-of-2 padding): never evicted

# Launch configurations, one per kernel, picked from a small sweep in bench/logratio.py on the H200 (bench/RESULTS.md):
# the streaming kernels read fastest with wide slices and few warps (8192 / 4: 64 elements a thread); the student
# kernel's top-K merge scans a whole slice per accepted candidate, so it prefers short slices in one warp (512 / 1,
# whose reductions need no shared memory or barrier).
CONFIG = {"token": dict(block=8192, num_warps=4), "student": dict(block=512, num_warps=1),
          "grad": dict(block=4096, num_warps=4)}


def _launch(kernel, n_cols):
    block = min(CONFIG[kernel]["block"], triton.next_power_of_2(n_cols))
    return block, min(CONFIG[kernel]["num_warps"], max(1, block // 128))


# --- packed top-K keys ----------------------------------------------------------------------------------------------

@triton.jit
def _order_key(x, ids):
    """(fp32 logit, id) -> int64 key; key order = (logit descending, id ascending). -0.0 counts as +0.0."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits).to(tl.int64)
    order = tl.where(bits >= 0, bits + 2147483648, -1 - bits)           # monotone map of the float onto [0, 2**32)
    return order * ID_MUL + (ID_MASK - ids.to(tl.int64))


@triton.jit
def _key_logit(key):
    """Inverse of _order_key for the logit."""
    order = key >> ID_SHIFT
    bits = tl.where(order >= 2147483648, order - 2147483648, -1 - order)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


def keys_to_ids(keys_NK, topk_lp_NK):
    """Sort the kernel's unordered top-K keys (best first) and decode ids; permute the log-probs alongside."""
    keys_NK, order_NK = keys_NK.sort(dim=1, descending=True)
    return ID_MASK.value - (keys_NK & ID_MASK.value), topk_lp_NK.gather(1, order_NK)


# --- kernels --------------------------------------------------------------------------------------------------------

@triton.jit
def _token_tile_kernel(X, stride_x, IDS, M, S, XG, LP, v0,
                       W: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                       IS_FIRST: tl.constexpr, IS_LAST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    if IS_FIRST:
        m = float("-inf")                                                 # running max of y = x·log2 e
        s = 0.0                                                           # running Σ 2^(y - m)
    else:
        m = tl.load(M + row)
        s = tl.load(S + row)
    for b in range(0, W, BLOCK):
        cols = b + tl.arange(0, BLOCK)
        y = tl.load(x_row + cols, mask=cols < W, other=float("-inf")).to(tl.float32) * LOG2E
        m_new = tl.maximum(m, tl.max(y, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)             # all -inf so far: keep exp2 finite (= 0)
        s = s * tl.exp2(m - m_use) + tl.sum(tl.exp2(y - m_use), 0)
        m = m_new
    # gather the K requested logits that fall in this tile (a missing / out-of-range id gives NaN)
    kk = tl.arange(0, KP)
    ids = tl.load(IDS + row * K + kk, mask=kk < K, other=-1)
    hit = (ids >= v0) & (ids < v0 + W)
    xg = tl.load(x_row + (ids - v0), mask=hit, other=float("nan")).to(tl.float32)
    if not IS_FIRST:
        xg = tl.where(hit, xg, tl.load(XG + row * K + kk, mask=kk < K))
    if IS_LAST:
        lse = (m + tl.log2(s)) * LN2
        tl.store(LP + row * K + kk, xg - lse, mask=kk < K)
    else:
        tl.store(M + row, m)
        tl.store(S + row, s)
        tl.store(XG + row * K + kk, xg, mask=kk < K)


@triton.jit
def _student_tile_kernel(X, stride_x, IDS, STATE, KEYS, LP, LSE, ENT, TOPK_KEYS, TOPK_LP, v0,
                         W: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                         IS_FIRST: tl.constexpr, IS_LAST: tl.constexpr, DO_TOPK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    slot = tl.arange(0, KP)
    if IS_FIRST:
        m = float("-inf")
        s = 0.0
        t = 0.0                                                           # running Σ 2^(y - m) · y  (entropy)
        xs = float("nan")                                                 # the sampled id's logit
        keys = tl.where(slot < K, -1 - slot.to(tl.int64), NEVER)         # empty slots: distinct negative keys
    else:
        m = tl.load(STATE + row * 4)
        s = tl.load(STATE + row * 4 + 1)
        t = tl.load(STATE + row * 4 + 2)
        xs = tl.load(STATE + row * 4 + 3)
        keys = tl.load(KEYS + row * KP + slot)
    worst = tl.min(keys, 0)                                               # the K-th best key so far
    worst_y = tl.where(worst < 0, float("-inf"), _key_logit(worst) * LOG2E)
    for b in range(0, W, BLOCK):
        cols = b + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < W, other=float("-inf")).to(tl.float32)
        y = x * LOG2E
        y_max = tl.max(y, 0)
        m_new = tl.maximum(m, y_max)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.exp2(y - m_use)
        alpha = tl.exp2(m - m_use)
        s = s * alpha + tl.sum(e, 0)
        t = t * alpha + tl.sum(e * tl.where(e > 0, y, 0.0), 0)          # 0·(-inf) would be NaN
        m = m_new
        if DO_TOPK:
            # x ↦ y is monotone but not strictly (rounding), so test with >=; the keys decide exactly.
            if (y_max >= worst_y) | (worst < 0):
                cand = tl.where(cols < W, _order_key(x, v0 + cols), TAKEN)
                best = tl.max(cand, 0)
                while best > worst:                                       # evict the worst, take the best
                    keys = tl.where(keys == worst, best, keys)
                    cand = tl.where(cand == best, TAKEN, cand)
                    best = tl.max(cand, 0)
                    worst = tl.min(keys, 0)
                worst_y = tl.where(worst < 0, float("-inf"), _key_logit(worst) * LOG2E)
    sid = tl.load(IDS + row)
    hit = (sid >= v0) & (sid < v0 + W)
    xs = tl.where(hit, tl.load(x_row + (sid - v0), mask=hit, other=0.0).to(tl.float32), xs)
    if IS_LAST:
        lse2 = m + tl.log2(s)
        lse = lse2 * LN2
        tl.store(LP + row, xs - lse)
        tl.store(LSE + row, lse)
        tl.store(ENT + row, (lse2 - t / s) * LN2)                         # H = ln2 · (lse2 - Σ p·y)
        if DO_TOPK:
            tl.store(TOPK_KEYS + row * K + slot, keys, mask=slot < K)
            tl.store(TOPK_LP + row * K + slot, _key_logit(keys) - lse, mask=slot < K)
    else:
        tl.store(STATE + row * 4, m)
        tl.store(STATE + row * 4 + 1, s)
        tl.store(STATE + row * 4 + 2, t)
        tl.store(STATE + row * 4 + 3, xs)
        tl.store(KEYS + row * KP + slot, keys)


@triton.jit
def _softmax_grad_kernel(X, stride_x, LSE, G, DX, stride_dx, W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lse2 = tl.load(LSE + row) * LOG2E                                     # an all -inf row gives NaN, as torch does
    neg_g = -tl.load(G + row)
    for b in range(0, W, BLOCK):
        cols = b + tl.arange(0, BLOCK)
        y = tl.load(X + row * stride_x + cols, mask=cols < W, other=float("-inf")).to(tl.float32) * LOG2E
        dx = neg_g * tl.exp2(y - lse2)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=cols < W)


# --- launchers ------------------------------------------------------------------------------------------------------

def token_tile(x_NW, ids_NK, v0, m_N, s_N, xg_NK, lp_NK, first, last):
    """Fold logits tile x_NW = columns [v0, v0+W) into the running (m, s, xg) state; on the last tile write lp_NK."""
    N, W = x_NW.shape
    K = ids_NK.shape[1]
    block, warps = _launch("token", W)
    _token_tile_kernel[(N,)](x_NW, x_NW.stride(0), ids_NK, m_N, s_N, xg_NK, lp_NK, v0,
                             W=W, K=K, KP=triton.next_power_of_2(K), BLOCK=block,
                             IS_FIRST=first, IS_LAST=last, num_warps=warps)


def token_logprobs(logits_NV, ids_NK):
    """lp_NK = logits[n, ids[n, k]] - logsumexp(logits[n]), one pass over logits_NV."""
    lp_NK = torch.empty(ids_NK.shape, dtype=torch.float32, device=logits_NV.device)
    token_tile(logits_NV, ids_NK, 0, lp_NK, lp_NK, lp_NK, lp_NK, first=True, last=True)   # state unused
    return lp_NK


def new_student_state(N, k, device):
    """Running per-row state of the student kernel between tiles: (m, s, t, x_sampled) and the top-K keys."""
    return torch.empty(N, 4, device=device), torch.empty(N, triton.next_power_of_2(max(k, 1)), dtype=torch.int64,
                                                          device=device)


def student_tile(x_NW, ids_N, k, v0, state, out, first, last):
    """Fold logits tile x_NW into the student state; on the last tile fill out = (lp, lse, ent, keys, topk_lp)."""
    N, W = x_NW.shape
    block, warps = _launch("student", W)
    state_N4, keys_NKP = state
    lp_N, lse_N, ent_N, keys_NK, topk_lp_NK = out
    _student_tile_kernel[(N,)](x_NW, x_NW.stride(0), ids_N, state_N4, keys_NKP, lp_N, lse_N, ent_N, keys_NK,
                               topk_lp_NK, v0, W=W, K=max(k, 1), KP=keys_NKP.shape[1], BLOCK=block,
                               IS_FIRST=first, IS_LAST=last, DO_TOPK=k > 0, num_warps=warps)


def new_student_out(N, k, device):
    f32 = dict(dtype=torch.float32, device=device)
    return (torch.empty(N, **f32), torch.empty(N, **f32), torch.empty(N, **f32),
            torch.empty(N, k, dtype=torch.int64, device=device), torch.empty(N, k, **f32))


def student_forward(logits_NV, ids_N, k):
    """-> lp_N, lse_N, entropy_N, topk_ids_NK (best first), topk_lp_NK, one pass over logits_NV."""
    N = logits_NV.shape[0]
    out = new_student_out(N, k, logits_NV.device)
    student_tile(logits_NV, ids_N, k, 0, new_student_state(N, k, logits_NV.device), out, first=True, last=True)
    lp_N, lse_N, ent_N, keys_NK, topk_lp_NK = out
    topk_ids_NK, topk_lp_NK = keys_to_ids(keys_NK, topk_lp_NK)
    return lp_N, lse_N, ent_N, topk_ids_NK, topk_lp_NK


def softmax_grad(x_NW, lse_N, g_N, dx_NW):
    """dx_NW = -g_N · softmax(x_NW) given the full-row lse_N (dx_NW may be a strided view)."""
    N, W = x_NW.shape
    block, warps = _launch("grad", W)
    _softmax_grad_kernel[(N,)](x_NW, x_NW.stride(0), lse_N, g_N, dx_NW, dx_NW.stride(0), W=W, BLOCK=block,
                               num_warps=warps)
    return dx_NW
