"""Choosing the next token, exactly and reproducibly: a counter-based RNG keyed by (request seed, step) and two ways
to turn it into a sample from the model's tempered, top-p-restricted distribution. Pure tensor code with no host
sync, so lib/sample/decode.py can run it inside a CUDA graph.

For request r with 64-bit seed s_r at step t (its t-th generated token, t = 0, 1, …) and raw logits ℓ:

    z_v = ℓ_v / T,  restricted to the top-p nucleus N_p = the smallest prefix of tokens sorted by z (descending)
                    whose probability mass reaches p:  v ∈ N_p  ⇔  (mass of the tokens ranked above v) < p
    y_t ~ softmax(z restricted to N_p);   T = 0 is greedy: y_t = argmax ℓ.
    logprob_t = log_softmax(ℓ)[y_t]        the RAW log-prob (T = 1, no top-p): what the trainer compares

Two modes, both draws from exactly that distribution, both keyed by (s_r, t) only, so a request's tokens depend on
its prompt, its seed and the model — never on its batch-mates — up to the logits' own numerics:

  exact  Gumbel-max: g_v = −log(−log(1 − u_v)), u_v = U(hash(s_r, t, v)) a 52-bit uniform per vocabulary entry,
         y_t = argmax_{v ∈ N_p} (z_v + g_v) in float64. One hash per vocabulary entry per row per step (≈ 40 integer
         ops each); its draws are the ones this project's `hf` backend always made, so eval units keep their samples.
  fast   inverse CDF: ONE uniform u = U(hash(s_r, t, 2^32 − 1)) per row and step; y_t = the first token (vocabulary
         order, or rank order under top-p) whose float32 cumulative probability exceeds u · (nucleus mass). A few
         passes over the logits instead of 40 integer ops per entry: for rollouts on GPU. On CUDA the cumulative
         sums are taken in blocks of 1,024 (block sums, then one block's scan): the same sums, rounded in another
         order, so a draw within float32 rounding of a boundary may take the neighbouring token.

The hash is 32-bit integer mixing in int64 tensors with every product < 2^59 (no signed-overflow UB).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

M32 = 0xFFFFFFFF
MODES = ("exact", "fast")


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (2 multiply-xorshift rounds, constant 0x45d9f3b) on int64 holding [0, 2^32).
    Products stay < 2^32 · 2^27 = 2^59, so int64 never overflows; the mask keeps 32 bits."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    return (x >> 16) ^ x


def split_seeds(seeds: list[int], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """64-bit seeds (any Python int, taken mod 2^64) → low and high 32-bit halves, each (B,) int64."""
    s = [int(x) & (2**64 - 1) for x in seeds]
    return (torch.tensor([x & M32 for x in s], dtype=torch.int64, device=device),
            torch.tensor([x >> 32 for x in s], dtype=torch.int64, device=device))


def uniform52(seed_lo_B, seed_hi_B, step, idx_BK: torch.Tensor) -> torch.Tensor:
    """U(hash(seed, step, idx)) ∈ (0, 1), float64 (B, K). `step`: an int or a (B,) int64 tensor (one per row)."""
    lo, hi = seed_lo_B[:, None], seed_hi_B[:, None]                                   # (B, 1)
    t = step[:, None] if isinstance(step, torch.Tensor) else step
    key_a = mix32(mix32(mix32(lo ^ 0x3C6EF372) ^ hi) ^ t)                             # two 32-bit keys per
    key_b = mix32(mix32(mix32(hi ^ 0x1B873593) ^ lo) ^ (t ^ 0x5BD1E995))              # (request, step)
    h1 = mix32(mix32(idx_BK ^ key_a) ^ key_b)                                         # (B, K) in [0, 2^32)
    h2 = mix32(mix32(idx_BK ^ key_b) ^ key_a ^ 0x68E31DA4)
    return (((h1 << 20) | (h2 >> 12)).double() + 0.5) / 2.0**52                      # 52-bit uniform in (0, 1)


def gumbel_noise(seed_lo_B, seed_hi_B, step, idx_BK: torch.Tensor) -> torch.Tensor:
    """Gumbel(0,1) noise (B, K) float64 for vocab ids `idx_BK` of each request at generation step `step`."""
    return -torch.log(-torch.log1p(-uniform52(seed_lo_B, seed_hi_B, step, idx_BK)))  # log1p keeps u → 1 exact


def nucleus(z_BV: torch.Tensor, top_p, trim: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p candidates: (ids (B, K), z (B, K) with −inf outside each row's nucleus), ranked by z descending.
    trim: K = the largest nucleus (one host sync); else K = V (graph-safe). `top_p`: a float or a 0-dim tensor."""
    z_sorted, idx = torch.sort(z_BV, dim=-1, descending=True, stable=True)
    p = torch.softmax(z_sorted.double(), dim=-1)
    keep = (p.cumsum(-1) - p) < top_p                  # mass ranked above < p; the top token is always kept
    if trim:
        K = int(keep.sum(-1).max())
        idx, z_sorted, keep = idx[:, :K], z_sorted[:, :K], keep[:, :K]
    return idx, z_sorted.masked_fill(~keep, float("-inf"))


def _inverse_cdf(p_BK: torch.Tensor, n_keep_B: torch.Tensor, u_B: torch.Tensor, blocked: bool | None = None):
    """Position of the first entry whose cumulative probability exceeds u · (mass of the first n_keep entries).
    blocked (default: on CUDA): the same search in two levels, see _inverse_cdf_blocked."""
    if p_BK.is_cuda if blocked is None else blocked:
        return _inverse_cdf_blocked(p_BK, n_keep_B, u_B)
    c_BK = p_BK.cumsum(-1)
    mass_B = c_BK.gather(1, (n_keep_B - 1)[:, None])[:, 0]
    k_B = torch.searchsorted(c_BK, (u_B.float() * mass_B)[:, None], right=True)[:, 0]
    return torch.minimum(k_B, n_keep_B - 1)            # u · mass rounding up to the mass itself stays inside


def _inverse_cdf_blocked(p_BK, n_keep_B, u_B, blk: int = 1024):
    """_inverse_cdf without a scan over the whole row (on CUDA one (B, 152k) cumsum took 0.25 ms, a row per block):
    block sums (B, K / blk), their cumsum, the block where the cumulative mass first exceeds u · mass, then the
    cumsum of that one block. The same float32 cumulative sums in another order (they differ in rounding only)."""
    B, K = p_BK.shape
    nb = -(-K // blk)
    keep = torch.arange(nb * blk, device=p_BK.device) < n_keep_B[:, None]
    p_Bnb = torch.nn.functional.pad(p_BK, (0, nb * blk - K)).mul(keep).view(B, nb, blk)
    tot_Bn = p_Bnb.sum(-1)
    c_Bn = tot_Bn.cumsum(-1)
    tau_B1 = u_B.float()[:, None] * c_Bn[:, -1:]
    j_B1 = torch.searchsorted(c_Bn, tau_B1, right=True).clamp(max=nb - 1)
    before_B1 = c_Bn.gather(1, j_B1) - tot_Bn.gather(1, j_B1)                       # mass of the blocks before j
    c_Bb = p_Bnb.gather(1, j_B1[:, :, None].expand(B, 1, blk))[:, 0].cumsum(-1) + before_B1
    k_B = j_B1[:, 0] * blk + torch.searchsorted(c_Bb, tau_B1, right=True)[:, 0].clamp(max=blk - 1)
    return torch.minimum(k_B, n_keep_B - 1)


def draw_tokens(logits_BV: torch.Tensor, seed_lo_B, seed_hi_B, step, temperature, top_p, *, greedy: bool,
                use_top_p: bool, mode: str = "exact", trim: bool = True, blocked: bool | None = None):
    """One decoding step: (token ids (B,), their raw log-probs (B,) fp32). `temperature`, `top_p`: floats or 0-dim
    tensors (a CUDA graph reads them from fixed tensors); `greedy` and `use_top_p` (top_p < 1) pick the code path.
    `blocked`: the fast mode's two-level search (default: on CUDA), see _inverse_cdf_blocked."""
    logits_BV = logits_BV.float()
    B, V = logits_BV.shape
    if greedy:
        tok_B = logits_BV.argmax(-1)
    elif mode == "exact":
        if use_top_p:
            idx_BK, z_BK = nucleus(logits_BV / temperature, top_p, trim)
        else:
            idx_BK, z_BK = torch.arange(V, device=logits_BV.device).expand(B, V), logits_BV / temperature
        k_B = (z_BK.double() + gumbel_noise(seed_lo_B, seed_hi_B, step, idx_BK)).argmax(-1)
        tok_B = idx_BK.gather(1, k_B[:, None])[:, 0]
    elif mode == "fast":
        u_B = uniform52(seed_lo_B, seed_hi_B, step, torch.full_like(seed_lo_B[:, None], M32))[:, 0]
        z_BV = logits_BV / temperature
        if use_top_p:
            z_sorted, idx_BV = torch.sort(z_BV, dim=-1, descending=True, stable=True)
            p_BV = torch.softmax(z_sorted, -1)
            n_keep_B = ((p_BV.cumsum(-1) - p_BV) < top_p).sum(-1)
            tok_B = idx_BV.gather(1, _inverse_cdf(p_BV, n_keep_B, u_B, blocked)[:, None])[:, 0]
        else:
            tok_B = _inverse_cdf(torch.softmax(z_BV, -1), torch.full_like(seed_lo_B, V), u_B, blocked)
    else:
        raise ValueError(f"unknown sampling mode {mode!r}; choose one of {MODES}")
    logp_B = logits_BV.gather(1, tok_B[:, None])[:, 0] - torch.logsumexp(logits_BV, -1)
    return tok_B, logp_B


def topk_two_stage(z_BV: torch.Tensor, k: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(z_BV, k) in two stages: each chunk of `chunk` columns its own top-k (the row padded with −inf to a
    whole number of chunks), then the top-k of those. Exact: an entry among a row's k largest is among its chunk's.
    Values sorted descending, as torch.topk's. Built to spread one (256, 151,936) topk over more thread blocks, it
    measured SLOWER on one H200 (bench/student_scores.py, RESULTS §8: 1,475 µs against 891 µs for the one torch.topk
    inside student_scores at 256 rows, chunks of 1,024; 986 µs at 4,096), so student_scores does not use it by
    default; the bench keeps it as a variant."""
    B, V = z_BV.shape
    if V <= chunk or k == 0:
        return torch.topk(z_BV, k, dim=-1)
    n = -(-V // chunk)
    z_Bnc = F.pad(z_BV, (0, n * chunk - V), value=float("-inf")).view(B, n, chunk)
    v_Bnk, i_Bnk = torch.topk(z_Bnc, min(k, chunk), dim=-1)
    i_Bnk = i_Bnk + torch.arange(0, n * chunk, chunk, device=z_BV.device)[None, :, None]   # column ids in the row
    v_Bk, j_Bk = torch.topk(v_Bnk.reshape(B, -1), k, dim=-1)
    return v_Bk, i_Bnk.reshape(B, -1).gather(1, j_Bk)


def student_scores(logits_BV: torch.Tensor, tok_B: torch.Tensor, temperature, k: int, chunk: int | None = None):
    """What a trainer's scoring pass would compute from these logits, for 03's `--student-scores sampler`: with
    z = logits / T (the scorer's temperature, as verl scores its actor),

        lp_B       log_softmax(z)[tok_B]                     the drawn token's log-prob at T
        ids_Bk     the k largest z (one torch.topk; topk_two_stage with `chunk`): equal logits in an unspecified
                   order; the scorer's sort sends them to the lower id, so ids can differ only inside an exact tie
        lp_Bk      log_softmax(z) at ids_Bk
        ent_B      the entropy of softmax(z): −Σ_v p_v log p_v with log p = z − logsumexp(z) (not logsumexp(z) − Σ p z,
                   whose two large terms cancel: 2.5e-5 off at an entropy of 0.003 on the toy student)

    all fp32, graph-safe (no host sync). `temperature`: a float or a 0-dim tensor."""
    z_BV = logits_BV.float() / temperature
    lse_B = torch.logsumexp(z_BV, -1)
    lp_BV = z_BV - lse_B[:, None]
    ent_B = -(lp_BV.exp() * lp_BV).sum(-1)
    lp_B = z_BV.gather(1, tok_B[:, None])[:, 0] - lse_B
    top_Bk, ids_Bk = topk_two_stage(z_BV, k, chunk) if chunk else torch.topk(z_BV, k, dim=-1)
    return lp_B, ids_Bk, top_Bk - lse_B[:, None], ent_B
