"""The decode step's attention as two Triton kernels (lib/decode.py, `attn_impl="triton"`): split-K flash-decoding
over each slot's LIVE length, reading the cache in place, with the step's new K/V row written on the way.

For slot s at position p_s (the token being decoded), kv head j and its G query heads (GQA rows g = 0…G−1):

    split     one program per (s, j, c) for chunks c of CHUNK positions: the positions [c·CHUNK, (c+1)·CHUNK) ∩
              [0, p_s] in BLOCK-wide tiles, online softmax in fp32, unnormalised sum o_c, running max m_c, mass l_c.
              The chunk holding p_s takes the new k, v from the step's projections (not from the cache) and writes
              them into the cache at p_s: no other program of the step reads that row. A chunk past p_s stores
              nothing and costs one early exit. Or (`per_sm`) a persistent grid looping over the same items.
    combine   per (s, query head), over the chunks c ≤ p_s / CHUNK only:
              o = Σ_c e^(m_c − M) o_c / Σ_c e^(m_c − M) l_c,  M = max_c m_c.

Chunks are fixed positions (not a share of the length), so a slot's result depends on its own cache and position
only: not on the slot count, the cache length or its batch-mates. The grid is static (S, H_kv, ⌈T / CHUNK⌉), so one
CUDA graph serves every length. Dots run as `input_precision="ieee"` (fp32 inputs stay fp32; bf16 ones are
unaffected). On CPU the kernels run under TRITON_INTERPRET=1 (tests/test_decode.py), set before this is imported;
there bf16 operands are upcast to fp32 before the dots (the interpreter's bf16 dot is wrong).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
NEG = tl.constexpr(-1.0e30)            # "minus infinity" that keeps exp(m − m_new) finite in an all-masked tile


@triton.jit
def _chunk(s, j, c, Hkv, Q, KN, VN, KC, VC, POS, PO, PM, PL, scale,
           sq_s, sq_h, sk_s, sk_h, sv_s, sv_h, sc_s, sc_h, sc_t, n_split,
           G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
           UPCAST: tl.constexpr):
    """One work item (slot s, kv head j, chunk c): both kernels below run this, so their results are identical."""
    pos = tl.load(POS + s).to(tl.int32)
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, pos + 1)
    g, d = tl.arange(0, GP), tl.arange(0, D)
    kn = tl.load(KN + s * sk_s + j * sk_h + d)                                      # (D,) this step's k, v
    vn = tl.load(VN + s * sv_s + j * sv_h + d)
    cache = s.to(tl.int64) * sc_s + j * sc_h                                        # K and V share the layout
    own = (pos >= start) & (pos < start + CHUNK)
    tl.store(KC + cache + pos * sc_t + d, kn, mask=own & (d < D))
    tl.store(VC + cache + pos * sc_t + d, vn, mask=own & (d < D))
    q = tl.load(Q + s * sq_s + (j * G + g)[:, None] * sq_h + d[None, :], mask=(g < G)[:, None], other=0.0)
    if UPCAST:                                             # the interpreter's bf16 dot is wrong: fp32 operands
        q, kn, vn = q.to(tl.float32), kn.to(tl.float32), vn.to(tl.float32)
    m = tl.full([GP], NEG, tl.float32)                                              # finite: no inf − inf
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    if start <= pos:                                            # else an empty chunk: nothing stored, nor read
        for i in range(0, CHUNK, BLOCK):                                            # fixed trip count, masked
            n = start + i + tl.arange(0, BLOCK)
            valid, new = n < end, n == pos
            old = valid & (n != pos)
            at = cache + n[:, None] * sc_t + d[None, :]
            k = tl.load(KC + at, mask=old[:, None], other=0.0).to(q.dtype)            # both loads in flight
            v = tl.load(VC + at, mask=old[:, None], other=0.0).to(q.dtype)
            k = tl.where(new[:, None], kn[None, :], k)                               # (BLOCK, D)
            v = tl.where(new[:, None], vn[None, :], v)
            w = tl.dot(q, tl.trans(k), input_precision="ieee") * scale              # (GP, BLOCK) fp32
            w = tl.where(valid[None, :], w, NEG)
            m_new = tl.maximum(m, tl.max(w, 1))
            alpha = tl.exp(m - m_new)
            p = tl.where(valid[None, :], tl.exp(w - m_new[:, None]), 0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            l = l * alpha + tl.sum(p, 1)
            m = m_new
        row = ((s * Hkv + j) * n_split + c) * G + g                                  # (S, H_kv, n_split, G)
        tl.store(PM + row, m, mask=g < G)
        tl.store(PL + row, l, mask=g < G)
        tl.store(PO + row[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])


@triton.jit
def _split_kernel(Q, KN, VN, KC, VC, POS, PO, PM, PL, scale,
                  sq_s, sq_h, sk_s, sk_h, sv_s, sv_h, sc_s, sc_h, sc_t, n_split,
                  G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                  UPCAST: tl.constexpr):
    """One program per item: grid (S, H_kv, n_split)."""
    _chunk(tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1), Q, KN, VN, KC, VC, POS, PO,
           PM, PL, scale, sq_s, sq_h, sk_s, sk_h, sv_s, sv_h, sc_s, sc_h, sc_t, n_split, G, GP, D, CHUNK, BLOCK, UPCAST)


@triton.jit
def _split_persistent(Q, KN, VN, KC, VC, POS, PO, PM, PL, scale,
                      sq_s, sq_h, sk_s, sk_h, sv_s, sv_h, sc_s, sc_h, sc_t, n_split, Hkv, n_items,
                      G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK: tl.constexpr, UPCAST: tl.constexpr, ROUNDS: tl.constexpr):
    """A fixed number P of programs, each taking items pid, pid + P, pid + 2P, … (item = (s · H_kv + j) · n_split
    + c): no wave of short programs left part-full at the end of the grid."""
    for r in range(0, ROUNDS):                                      # ⌈n_items / P⌉, the last round ragged
        it = r * tl.num_programs(0) + tl.program_id(0)
        if it < n_items:
            _chunk(it // (Hkv * n_split), it // n_split % Hkv, it % n_split, Hkv, Q, KN, VN, KC, VC, POS, PO, PM, PL,
                   scale, sq_s, sq_h, sk_s, sk_h, sv_s, sv_h, sc_s, sc_h, sc_t, n_split, G, GP, D, CHUNK, BLOCK,
                   UPCAST)


@triton.jit
def _combine_kernel(PO, PM, PL, O, POS, so_s, so_h, n_split, G: tl.constexpr, D: tl.constexpr, NP: tl.constexpr,
                    CHUNK: tl.constexpr):
    s, h = tl.program_id(0), tl.program_id(1)                                       # h = j · G + g
    j, g = h // G, h % G
    c, d = tl.arange(0, NP), tl.arange(0, D)
    live = c <= tl.load(POS + s).to(tl.int32) // CHUNK                 # the chunks that start at or before pos
    row = ((s * (tl.num_programs(1) // G) + j) * n_split + c) * G + g               # (NP,)
    m = tl.load(PM + row, mask=live, other=NEG)
    l = tl.load(PL + row, mask=live, other=0.0)
    w = tl.exp(m - tl.max(m, 0))                                        # chunk 0 is never empty: w_0 > 0
    acc = tl.load(PO + row[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    o = tl.sum(w[:, None] * acc, 0) / tl.sum(w * l, 0)
    tl.store(O + s * so_s + h * so_h + d, o.to(O.dtype.element_ty))


class SplitAttention:
    """Preallocated partial buffers for S slots × H_kv kv heads × ⌈T / chunk⌉ chunks; `__call__` runs one layer.
    Defaults from bench/decode_attn.py's sweep of 20 tilings on one H200 (2026-12-02; 1.5B heads, bf16, split +
    combine as one graph replay): chunk 64, tiles of 64, 4 warps took 28.7 / 15.3 / 99.6 / 50.2 µs at S:T:p =
    64:1088:1024 / 64:704:456 / 256:1536:1024 / 256:704:456, against 34.4 / 17.2 / 100.3 / 47.1 µs for the former
    256, 32, 2. No tiling read K and V faster than 2.7 TB/s (bench/RESULTS.md, fifth run). The persistent grid
    (`per_sm`) ran 1.15–1.44× slower than this default at every case and both heads' shapes (seventh run): its loop
    needs 146–181 registers a thread against 96, and Triton does not prefetch the next item's K and V."""

    def __init__(self, S: int, H: int, Hkv: int, D: int, T: int, dtype, device, chunk: int = 64, block: int = 64,
                 warps: int = 4, stages: int | None = None, per_sm: int | None = None):
        """per_sm: None, one program per item (S, H_kv, n_split); n, a persistent grid of n programs per SM
        (CPU: per core), each looping over items (`_split_persistent`, the same results bit for bit)."""
        if D < 16 or D & (D - 1) or chunk < 16 or chunk & (chunk - 1):
            raise ValueError(f"attn_impl='triton' needs a power-of-2 head_dim and chunk, each ≥ 16; got "
                             f"{D} and {chunk}: use attn_impl='matmul' or another chunk")
        self.S, self.H, self.Hkv, self.D, self.G = S, H, Hkv, D, H // Hkv
        self.block, self.launch = min(block, chunk), {"num_warps": warps} | ({"num_stages": stages} if stages else {})
        self.chunk, self.n_split = chunk, -(-T // chunk)
        self.n_items, self.programs, self.compiled = S * Hkv * self.n_split, None, None   # compiled: the last split
        if per_sm:
            units = (torch.cuda.get_device_properties(device).multi_processor_count
                     if torch.device(device).type == "cuda" else os.cpu_count() or 1)
            self.programs = min(self.n_items, per_sm * units)
        f32 = dict(device=device, dtype=torch.float32)
        self.po = torch.empty(S, Hkv, self.n_split, self.G, D, **f32)
        self.pm = torch.empty(S, Hkv, self.n_split, self.G, **f32)
        self.pl = torch.empty_like(self.pm)
        self.out = torch.empty(S, H, D, device=device, dtype=dtype)

    def __call__(self, q, k, v, kc, vc, pos, scale: float):
        """q (S, H, D), k and v (S, H_kv, D) (any strides with a unit last one), caches (S, H_kv, T, D) contiguous
        in their last dim, pos (S,) → attention output (S, H, D) (a buffer reused by the next call)."""
        S, Hkv, D, G = self.S, self.Hkv, self.D, self.G
        assert kc.stride() == vc.stride() and kc.stride(-1) == q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        args = (q, k, v, kc, vc, pos, self.po, self.pm, self.pl, scale,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                kc.stride(0), kc.stride(1), kc.stride(2), self.n_split)
        meta = dict(G=G, GP=max(16, triton.next_power_of_2(G)), D=D, CHUNK=self.chunk, BLOCK=self.block,
                    UPCAST=INTERPRET and q.dtype != torch.float32, **self.launch)
        if self.programs:
            self.compiled = _split_persistent[(self.programs,)](*args, Hkv, self.n_items,
                                                ROUNDS=-(-self.n_items // self.programs), **meta)
        else:
            self.compiled = _split_kernel[(S, Hkv, self.n_split)](*args, **meta)
        _combine_kernel[(S, self.H)](self.po, self.pm, self.pl, self.out, pos, self.out.stride(0), self.out.stride(1),
                                     self.n_split, G=G, D=D, NP=triton.next_power_of_2(self.n_split),
                                     CHUNK=self.chunk, num_warps=1)
        return self.out
