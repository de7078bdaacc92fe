"""The decode step's attention as two Triton kernels (lib/sample/decode.py, `attn_impl="triton"`): split-K
flash-decoding over each slot's LIVE length, reading the cache in place, with the step's new K/V row written on the
way.

For slot s at position p_s (the token being decoded), kv head j and its G query heads (GQA rows g = 0…G−1):

    split     one program per (s, j, c) for chunks c of CHUNK positions: the positions [c·CHUNK, (c+1)·CHUNK) ∩
              [0, p_s] in BLOCK-wide tiles, in a loop the compiler software-pipelines (`stages` deep), online
              softmax in fp32: unnormalised sum o_c, running max m_c, mass l_c. A tile is read by pointer loads
              masked to the rows < p_s, or (`tma`) as a whole box by the Hopper tensor-memory-access engine, its V
              rows ≥ p_s then zeroed and its K rows ≥ p_s masked out of the scores: a stale or NaN row at or past a
              slot's position never reaches the result. The new row comes from the step's projections: its score
              q·k_new and its share p_new·v_new are added beside the tile's two dots, and the program whose chunk
              holds p_s writes k_new, v_new into the cache at p_s (no program of the step reads that row from the
              cache). A chunk past p_s stores nothing and costs one early exit.
    combine   per (s, query head), over the chunks c ≤ p_s / CHUNK only:
              o = Σ_c e^(m_c − M) o_c / Σ_c e^(m_c − M) l_c,  M = max_c m_c.

Chunks are fixed positions (not a share of the length), so a slot's result depends on its own cache and position
only: not on the slot count, the cache length or its batch-mates. The grid is static (S, H_kv, ⌈T / CHUNK⌉), so one
CUDA graph serves every length. Shared prompts (`lead`, `pre`): the n requests of one prompt hold identical prompt
rows in their n slots, and slot s may read its rows before pre[s] from slot lead[s] instead. The slots of a prompt
are neighbours in the grid, so their programs run at once: the leader's rows, read from memory by one, can reach
the others from L2. The values read are the same, and so is the output. Dots run as `input_precision="ieee"` (fp32
inputs stay fp32; bf16 ones are unaffected). On CPU the kernels run under TRITON_INTERPRET=1 (tests/test_decode.py),
set before this is imported; there bf16 operands are upcast to fp32 before the dots (the interpreter's bf16 dot is
wrong).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:      # Triton ≤ 3.6's interpreter holds scalars as 1-element arrays and takes int() of them for a loop
    from triton.runtime import interpreter as _interp          # bound, which NumPy ≥ 2.4 refuses (triton-lang/triton
    _patch = getattr(_interp, "_patch_lang_tensor", None)      # #9171, fixed upstream): squeeze them first

    def _patch_lang_tensor(tensor, scope):
        _patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    if _patch is not None:
        _interp._patch_lang_tensor = _patch_lang_tensor
NEG = tl.constexpr(-1.0e30)            # "minus infinity" that keeps exp(m − m_new) finite in an all-masked tile


@triton.jit
def _split_kernel(Q, KN, VN, KC, VC, KD, VD, POS, LEAD, PRE, PO, PM, PL, O, scale,
                  sq_s, sq_h, sk_s, sk_h, sv_s, sv_h, sc_s, sc_h, sc_t, so_s, so_h, T, n_split,
                  G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                  TMA: tl.constexpr, UPCAST: tl.constexpr, DIRECT: tl.constexpr, SHARED: tl.constexpr):
    """Program (s, j, c). KD, VD: the caches as (S·H_kv·T, D) tensor descriptors of (BLOCK, D) boxes when TMA.
    DIRECT (one chunk spans the cache): the program normalises its sum and writes the output O itself, no
    partials, no combine. SHARED (pointer loads only): the rows before PRE[s] are read from slot LEAD[s]'s cache,
    which holds the same prompt rows."""
    s, j, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    Hkv = tl.num_programs(1)
    pos = tl.load(POS + s).to(tl.int32)
    start = c * CHUNK
    if start <= pos:                                            # else an empty chunk: nothing stored, nor read
        g, d, b = tl.arange(0, GP), tl.arange(0, D), tl.arange(0, BLOCK)
        q = tl.load(Q + s * sq_s + (j * G + g)[:, None] * sq_h + d[None, :], mask=(g < G)[:, None], other=0.0)
        kn = tl.load(KN + s * sk_s + j * sk_h + d)                                  # (D,) this step's k, v
        vn = tl.load(VN + s * sv_s + j * sv_h + d)
        cache = s.to(tl.int64) * sc_s + j * sc_h                                    # K and V share the layout
        if SHARED:                                              # the shared prompt's rows: the leader's copy
            lead = tl.load(LEAD + s).to(tl.int64) * sc_s + j * sc_h
            pre = tl.load(PRE + s).to(tl.int32)
        if pos < start + CHUNK:                                 # this chunk holds pos: the new row goes in
            tl.store(KC + cache + pos * sc_t + d, kn)
            tl.store(VC + cache + pos * sc_t + d, vn)
        if UPCAST:                                         # the interpreter's bf16 dot is wrong: fp32 operands
            q = q.to(tl.float32)
        w_new = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1) * scale      # (GP,) the new row's score
        m = tl.full([GP], NEG, tl.float32)                                          # finite: no inf − inf
        l = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for t in range(0, tl.cdiv(tl.minimum(CHUNK, pos + 1 - start), BLOCK)):     # pipelined loads
            n = start + t * BLOCK + b
            old = n < pos
            if TMA:                                              # whole boxes: rows ≥ pos may hold anything
                r = (s * Hkv + j) * T + start + t * BLOCK                          # the cache as (S·H_kv·T, D)
                k, v = KD.load([r, 0]), VD.load([r, 0])                             # (BLOCK, D)
                v = tl.where(old[:, None], v, 0.0)
            else:
                if SHARED:
                    at = tl.where(n < pre, lead, cache)[:, None] + n[:, None] * sc_t + d[None, :]
                else:
                    at = cache + n[:, None] * sc_t + d[None, :]
                k = tl.load(KC + at, mask=old[:, None], other=0.0)
                v = tl.load(VC + at, mask=old[:, None], other=0.0)
            if UPCAST:
                k, v = k.to(tl.float32), v.to(tl.float32)
            w = tl.dot(q, tl.trans(k), input_precision="ieee") * scale              # (GP, BLOCK) fp32
            w = tl.where(old[None, :], w, tl.where((n == pos)[None, :], w_new[:, None], NEG))
            m_new = tl.maximum(m, tl.max(w, 1))
            alpha = tl.exp(m - m_new)
            p = tl.where((n <= pos)[None, :], tl.exp(w - m_new[:, None]), 0.0)
            p_new = tl.sum(tl.where((n == pos)[None, :], p, 0.0), 1)               # (GP,) the new row's weight
            pv = tl.dot(tl.where(old[None, :], p, 0.0).to(v.dtype), v, input_precision="ieee")
            acc = acc * alpha[:, None] + pv + p_new[:, None] * vn.to(tl.float32)[None, :]
            l = l * alpha + tl.sum(p, 1)
            m = m_new
        if DIRECT:                                              # the only chunk: l > 0 (it holds row pos)
            o = acc / l[:, None]
            tl.store(O + s * so_s + (j * G + g)[:, None] * so_h + d[None, :], o.to(O.dtype.element_ty),
                     mask=(g < G)[:, None])
        else:
            row = ((s * Hkv + j) * n_split + c) * G + g                              # (S, H_kv, n_split, G)
            tl.store(PM + row, m, mask=g < G)
            tl.store(PL + row, l, mask=g < G)
            tl.store(PO + row[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])


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


# Tilings by attention shape (query heads, kv heads, head_dim) → [(minimum slots, SplitAttention options)], the
# last entry whose minimum ≤ the slot count applying; other shapes and fewer slots take the class defaults. Measured
# on one H200, 2026-12-04 (bench/RESULTS.md §3: bench/decode_attn.py, split + combine, a cache of 1,536 positions):
# at the 7B heads one chunk spanning the cache (the split writes the output; no combine) took 25.7 / 38.7 / 48.3 µs
# at 64 slots decoding at 600 / 1,024 / 1,400 and 85.2 / 137.1 / 180.4 µs at 256 slots, against 31.7 / 46.3 / 58.1
# and 100.1 / 163.9 / 210.6 µs for the default (chunks of 128); at 256 slots tiles of 32 and 2 warps took 84.6 /
# 135.7 / 178.3 µs, at 64 slots 29.8 / 46.5 / 59.6. The 1.5B heads keep the defaults: single chunks there were
# within 1.5 % of them, and chunks of 1,024 in tiles of 32, 2 warps, 4 stages (c1024b32w2s4), 12–17 % faster alone at
# 256 slots, made 03's 1.5B step's generation 0.06 s slower (1.61 against 1.55 s, one call, 2026-12-04;
# bench/RESULTS.md §3, §8).
ATTN_TILINGS: dict[tuple[int, int, int], list[tuple[int, dict]]] = {
    (28, 4, 128): [(64, dict(chunk=2048, block=64, warps=4, stages=3)),
                   (256, dict(chunk=2048, block=32, warps=2, stages=4))],
}


def default_tiling(S: int, H: int, Hkv: int, D: int) -> dict:
    """SplitAttention options for S slots of H query and Hkv kv heads of D (ATTN_TILINGS), {} for the defaults."""
    fit = [opts for least, opts in ATTN_TILINGS.get((H, Hkv, D), []) if least <= S]
    return dict(fit[-1]) if fit else {}


class SplitAttention:
    """Preallocated partial buffers for S slots × H_kv kv heads × ⌈T / chunk⌉ chunks; `__call__` runs one layer.
    Defaults from bench/decode_attn.py's sweep of 14 tilings on one H200 (2026-12-02, ninth run; 1.5B heads, bf16,
    split + combine as one graph replay): chunks of 128 in tiles of 64, 4 warps, 2 pipeline stages took 26.1 / 14.8 /
    83.8 / 43.8 µs at S:T:p = 64:1088:1024 / 64:704:456 / 256:1536:1024 / 256:704:456, against 27.3 / 16.3 / 91.7 /
    47.0 µs for the previous kernel's default (one unpipelined tile of 64 a chunk) in the same call; the best tiling
    per case was within 0.4 / 0 / 3.6 / 0.9 µs of it. Whole boxes through tensor descriptors (`tma`) were slower at
    every case (bench/RESULTS.md, ninth run)."""

    def __init__(self, S: int, H: int, Hkv: int, D: int, T: int, dtype, device, chunk: int = 128, block: int = 64,
                 warps: int = 4, stages: int | None = 2, tma: bool = False):
        """stages: the loop's software-pipelining depth (None: Triton's default); tma: tiles read as whole boxes
        through tensor descriptors (the Hopper copy engine on CUDA; needs contiguous caches, and on CUDA a GPU of
        compute capability ≥ 9)."""
        block = min(block, chunk)
        if D < 16 or D & (D - 1) or block < 16 or block & (block - 1) or chunk % block:
            raise ValueError(f"attn_impl='triton' needs a power-of-2 head_dim and tile, each ≥ 16, and a chunk that "
                             f"is a whole number of tiles; got head_dim {D}, tile {block}, chunk {chunk}: use "
                             "attn_impl='matmul' or another tiling")
        self.S, self.H, self.Hkv, self.D, self.G, self.T = S, H, Hkv, D, H // Hkv, T
        self.block, self.tma = block, tma
        self.launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
        self.chunk, self.n_split = chunk, -(-T // chunk)
        self.n_items, self.compiled, self.descs = S * Hkv * self.n_split, None, {}   # compiled: the last split
        f32 = dict(device=device, dtype=torch.float32)
        self.po = torch.empty(S, Hkv, self.n_split, self.G, D, **f32)
        self.pm = torch.empty(S, Hkv, self.n_split, self.G, **f32)
        self.pl = torch.empty_like(self.pm)
        self.out = torch.empty(S, H, D, device=device, dtype=dtype)

    def _descriptors(self, kc, vc):
        """(K, V) tensor descriptors of one layer's caches, built once per cache address."""
        key = (kc.data_ptr(), vc.data_ptr())
        if key not in self.descs:
            assert kc.is_contiguous() and vc.is_contiguous(), "tma needs contiguous (S, H_kv, T, D) caches"
            self.descs[key] = tuple(TensorDescriptor.from_tensor(c.view(-1, self.D), [self.block, self.D])
                                    for c in (kc, vc))
        return self.descs[key]

    def __call__(self, q, k, v, kc, vc, pos, scale: float, lead=None, pre=None):
        """q (S, H, D), k and v (S, H_kv, D) (any strides with a unit last one), caches (S, H_kv, T, D) contiguous
        in their last dim, pos (S,) → attention output (S, H, D) (a buffer reused by the next call).
        lead, pre (S,) (shared prompts, lib/sample/decode.py): slot s reads its rows before pre[s] from slot
        lead[s]'s cache, which must hold the same rows there (its own copy is then not read). Slots that share a
        prompt run as neighbouring programs, so the leader's rows are read from memory once and from L2 by the
        rest; the values read, and so the output, are those of the slot's own copy. With `tma` the redirect is
        not applied (each slot reads its own copy)."""
        S, Hkv, D, G = self.S, self.Hkv, self.D, self.G
        assert kc.stride() == vc.stride() and kc.stride(-1) == q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        assert kc.shape[2] == self.T, f"a cache of {kc.shape[2]} positions for a SplitAttention built for {self.T}"
        kd, vd = self._descriptors(kc, vc) if self.tma else (kc, vc)
        direct, shared = self.n_split == 1, lead is not None and not self.tma
        self.compiled = _split_kernel[(S, Hkv, self.n_split)](
            q, k, v, kc, vc, kd, vd, pos, lead if shared else pos, pre if shared else pos,
            self.po, self.pm, self.pl, self.out, scale,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            kc.stride(0), kc.stride(1), kc.stride(2), self.out.stride(0), self.out.stride(1), self.T, self.n_split,
            G=G, GP=max(16, triton.next_power_of_2(G)), D=D, CHUNK=self.chunk, BLOCK=self.block, TMA=self.tma,
            UPCAST=INTERPRET and q.dtype != torch.float32, DIRECT=direct, SHARED=shared, **self.launch)
        if direct:
            return self.out
        _combine_kernel[(S, self.H)](self.po, self.pm, self.pl, self.out, pos, self.out.stride(0), self.out.stride(1),
                                     self.n_split, G=G, D=D, NP=triton.next_power_of_2(self.n_split),
                                     CHUNK=self.chunk, num_warps=1)
        return self.out
