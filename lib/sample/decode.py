"""The built-in decoder: a Hugging Face Llama / Qwen2-style causal LM sampled by a loop that owns its KV cache.

    prefill   waiting prompts in one forward pass per refill; their K/V go into free slots. A prompt that several
              requests share (03's n rollouts of one prompt) is forwarded once and its K/V copied into each of their
              slots; each request still draws its first token with its own seed (and, with the triton attention, reads
              the prompt's rows from the first of those slots while it decodes: `shared_reads`). The distinct prompts
              are laid end to end in one row (`packed_prefill`, the CUDA default: lib/kernels/varlen.py's attention
              keeps each prompt to itself), or right-padded to the longest (CPU): padded, a step's 64 training prompts
              of 60–830 tokens cost 64 × the longest, 2.5–5× their sum, and the step's generation time followed the
              longest prompt of the step. With v2's fused weights the packed pass runs v2's blocks over its tokens
              (`fast_prefill`, default on there: one q|k|v and one gate|up GEMM a layer, norms, rotation, residuals and
              act·up compiled into few kernels, one graph for every pass length), not the model's modules
    decode    one token for every slot: forward (S, 1) → draw (lib/sample/draw.py) → stop / cap bookkeeping, all on
              device; on CUDA each step is one replay of a captured CUDA graph (no host sync, no Python per kernel)
    refill    every `sync_every` steps the host reads which slots finished, collects them and, once ≥ 1/8 of the
              slots are free, prefills waiting requests into them (continuous batching: a long tail does not idle
              the batch; a finished slot still computes until it is refilled)

The cache is preallocated, K and V each (S, H_kv, T_max, D) per layer, a slot's sequence starting at position 0 of
its own row. Grouped-query attention without copying K/V: a kv head's G query heads are G query rows. Two steps:

    v1   (CPU; `fuse_gemms=False, compile_step=False, attn_impl="sdpa"|"matmul"`) the model's own projections,
         attention over the first `kv_len` positions (rounded up to `kv_bucket`, one graph per bucket) masked to
         pos ≤ pos_S, small glue functions compiled one kernel each on CUDA (`fuse`)
    v2   (CUDA default) one GEMM for q|k|v and one for gate|up (`fuse_gemms`: concatenated copies of the weights,
         rebuilt from the model at the start of every `run`), each layer two torch.compile'd blocks
         (`compile_step`, a torch.compile mode if a str), attention by lib/sample/decode_triton.py over each slot's
         live length (`attn_impl="triton"`, tuned by `attn_opts`, else by shape: decode_triton.ATTN_TILINGS; no
         buckets: one graph for every length), GEMMs by
         lib/sample/skinny_gemm.py (`gemm_opts`, {projection: tiling}; else its defaults: down_proj at ≤ 64 slots);
         the fast draw's cumulative sums in two levels (`draw_blocked`, lib/sample/draw.py), the step's fast or
         greedy draw compiled whole (`compile_draw`, a backend if a str: ~110 launch-bound kernels → a few; exact
         draws stay eager)
`candidates=k` (03's --student-scores sampler) records, beside each drawn token, the student's scores of it from the
same logits (lib/sample/draw.student_scores: the log-prob at logits / T, the top-k ids and log-probs, the entropy),
inside the step's graph; a finished row returns them as a StudentScores on the device: on CUDA by
lib/sample/scores_triton.py's kernels (`scores_impl="triton"`, the logits read twice), elsewhere by the compiled torch
ops (`"torch"`; bench/RESULTS.md §8 times both).
CPU runs v1 eagerly unless asked otherwise; its numerics are those of the toy campaign. Slot invariance: a request's
tokens do not depend on the slot count or batch-mates up to the numerics of the GEMMs (v2's attention is per slot).

The layers are the model's own modules (norms, rotary table, projections or v2's copies of them), so weights
pushed into the model in place (HFEngine.update_weights) are what the next run reads, graphs included (a replaced
tensor, one with a new address, drops the graphs); only attention and the cache are ours. Supported: model_type
qwen2, llama, qwen3 (per-head q/k norms), full attention.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from lib.sample.decode_step import V1_PIECES, FusedWeights, _rope, make_blocks
from lib.sample.completion import StudentScores
from lib.sample.draw import draw_tokens, split_seeds, student_scores

SUPPORTED = ("qwen2", "llama", "qwen3")


def _ramps(lens: torch.Tensor) -> torch.Tensor:
    """[0, 1, …, L_0 − 1, 0, 1, …, L_1 − 1, …]: each length's positions, end to end."""
    ends = lens.cumsum(0)
    return torch.arange(int(ends[-1]), device=lens.device) - torch.repeat_interleave(ends - lens, lens)


def runs(model) -> bool:
    """Whether this decoder runs `model`: a full-attention decoder of a SUPPORTED type (lib/sample/engine.py falls
    back to transformers' generate for any other, lib/sample/generate_fallback.py)."""
    cfg = model.config
    return cfg.model_type in SUPPORTED and not getattr(cfg, "use_sliding_window", False)


def slot_bytes(model, max_len: int, max_new_tokens: int) -> int:
    """Device bytes one slot of a Decoder(max_len=…, max_new_tokens=…) over `model` costs: its K and V rows in every
    layer, the split-K kernel's float32 partials (chunks of ≥ 64 positions), its output rows, and the decode step's
    per-row transients (the logits in the model's dtype and the fast draw's float32 working copies, ~4 rows of V).
    What HFEngine divides its KV budget by."""
    cfg, p = model.config, next(model.parameters())
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * max_len * D * p.element_size()
    partials = cfg.num_attention_heads * -(-max_len // 64) * (D + 2) * 4
    step = cfg.vocab_size * (p.element_size() + 4 * 4) + max_new_tokens * (8 + 4)
    return kv + partials + step


def workspace_bytes(model, prefill_tokens: int) -> int:
    """Device bytes a prefill pass of `prefill_tokens` padded tokens holds at its peak beyond the cache: the residual
    stream, q|k|v (the GQA-repeated K and V included) and the MLP's gate, up and their product, in the model's dtype.
    HFEngine keeps them out of the KV budget."""
    cfg, p = model.config, next(model.parameters())
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 3 * cfg.hidden_size + 3 * cfg.num_attention_heads * D + 3 * cfg.intermediate_size
    return prefill_tokens * per_token * p.element_size()


def triton_reaches(device: torch.device, what: str) -> None:
    """A Triton kernel is handed raw CUDA pointers: a model on the CPU runs one only under Triton's interpreter
    (TRITON_INTERPRET=1, set before the kernels are imported, as the tests do). Anything else is refused here, in
    one line, rather than by the driver's pointer error at the first launch."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"Decoder: {what} runs Triton kernels, which need the model on CUDA (it is on {device}) "
                         "or TRITON_INTERPRET=1 set before the kernels are imported; leave the option at its default")


class Decoder:
    """Continuous-batching sampler over `slots` rows for prompts of ≤ max_len − max_new_tokens tokens."""

    def __init__(self, model, *, slots: int, max_len: int, max_new_tokens: int, stop_ids: list[int],
                 mode: str, cuda_graphs: bool | None = None, sync_every: int | None = None,
                 kv_bucket: int | None = None, prefill_tokens: int = 65_536, attn_impl: str | None = None,
                 fuse: bool | None = None, fuse_gemms: bool | None = None, compile_step: bool | str | None = None,
                 attn_opts: dict | None = None, draw_blocked: bool | None = None,
                 compile_draw: bool | str | None = None, gemm_opts: dict | None = None, share_prefill: bool = True,
                 packed_prefill: bool | None = None, fast_prefill: bool | None = None,
                 candidates: int | None = None, scores_impl: str | None = None, shared_reads: bool | None = None):
        cfg = model.config
        if not runs(model):
            raise TypeError(f"lib.sample.decode runs full-attention {SUPPORTED} decoders; {type(model).__name__} "
                            f"(model_type {cfg.model_type!r}) is not one: sample it with backend 'vllm'")
        inner, p = model.model, next(model.parameters())
        self.model, self.layers, self.device, self.dtype = model, inner.layers, p.device, p.dtype
        self.S, self.T, self.N, self.mode = slots, max_len, max_new_tokens, mode
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = self.layers[0].self_attn.head_dim
        cuda = self.device.type == "cuda"
        self.graphs_on = cuda if cuda_graphs is None else cuda_graphs
        self.sync_every, self.kv_bucket = sync_every or (16 if cuda else 1), kv_bucket or (256 if cuda else 1)
        self.refill_min = max(1, slots // 8)
        self.share_prefill, self.prefill_rows = share_prefill, 0     # rows forwarded by prefills so far (tests, logs)
        self.packed_prefill = cuda if packed_prefill is None else packed_prefill
        self.prefill_tokens_run = 0                                  # tokens forwarded by prefills, padding included
        pow2, self.prefill_tokens = self.D >= 16 and not self.D & (self.D - 1), prefill_tokens
        self.attn_impl = attn_impl or ("sdpa" if not cuda else "triton" if pow2 else "matmul")
        self.eps, self.silu = cfg.rms_norm_eps, getattr(cfg, "hidden_act", None) == "silu"
        # draw_blocked: lib/sample/draw.py's two-level search
        self.draw_blocked, self.fuse_gemms, self.compile_step = (
            cuda if x is None else x for x in (draw_blocked, fuse_gemms, compile_step))
        if self.attn_impl == "triton":
            triton_reaches(self.device, "attn_impl 'triton'")
        self.v2 = bool(self.fuse_gemms or self.compile_step or self.attn_impl == "triton")
        c = bool(self.v2 and self.compile_step) if compile_draw is None else compile_draw   # True or a backend
        self.draw_c = torch.compile(draw_tokens, dynamic=False, fullgraph=True, **(
            {"backend": c} if isinstance(c, str) else {})) if c else draw_tokens       # the step's fast / greedy draw
        fns, pieces = V1_PIECES, not self.v2 and (cuda if fuse is None else fuse)
        if pieces or self.v2 and self.compile_step:             # graphs per slot count (v1: and kv bucket)
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        if pieces:                                              # v1: one kernel each
            fns = {k: torch.compile(f, dynamic=False, fullgraph=True) for k, f in fns.items()}
        self.fx = SimpleNamespace(**fns)
        if self.v2:                                             # v2: two compiled blocks per layer, weights as args
            act = F.silu if self.silu else self.layers[0].mlp.act_fn
            from lib.sample.skinny_gemm import defaults, tiling                      # {projection: Triton tiling}
            self.gemms = (defaults(slots, cuda, self.layers[0].mlp.down_proj.in_features) if gemm_opts is None
                          else {k: tiling(v) for k, v in gemm_opts.items()})
            if self.gemms:
                triton_reaches(self.device, "gemm_opts")
            self.blocks = make_blocks(self.H, self.Hkv, self.D, self.eps, act, self.compile_step or False, self.gemms)
            self.weights = FusedWeights(model, self.fuse_gemms)
        # fast_prefill: the packed prefill through v2's blocks and fused weights (compiled with the step), not the
        # model's modules run eagerly
        self.fast_prefill = bool(self.v2 and self.fuse_gemms and self.packed_prefill and
                                 (True if fast_prefill is None else fast_prefill))
        if self.fast_prefill:
            from lib.sample.decode_step import make_prefill_blocks
            self.prefill_blocks = make_prefill_blocks(self.H, self.Hkv, self.D, self.eps, act,
                                                      bool(self.compile_step))
        self.split_attn = None
        if self.attn_impl == "triton":   # imported lazily (TRITON_INTERPRET is read at its import); attn_opts:
            from lib.sample.decode_triton import SplitAttention, default_tiling
            opts = default_tiling(slots, self.H, self.Hkv, self.D) if attn_opts is None else attn_opts
            self.split_attn = SplitAttention(slots, self.H, self.Hkv, self.D, max_len, self.dtype, self.device,
                                             **opts)                           # chunk, block, warps, stages
        # shared_reads (with share_prefill and the triton attention, on by default there): the requests of one prompt
        # in one refill read the prompt's K/V rows from the first of their slots, the leader (each slot still holds
        # its own copy, which a follower goes back to when its leader is refilled first); their programs run side by
        # side, so the rows come from memory once and from L2 for the rest. The same values: the same tokens. Only a
        # run whose prompts repeat reads leaders (`shared_now`); a run of distinct prompts runs the plain kernel.
        self.shared_reads = bool(self.split_attn is not None and share_prefill and not self.split_attn.tma
                                 and (True if shared_reads is None else shared_reads))
        self.shared_now = False                         # this run's step reads leaders: some prompt asked twice
        i32 = dict(device=self.device, dtype=torch.int32)
        self.lead_S, self.pre_S = torch.arange(slots, **i32), torch.zeros(slots, **i32)   # leader slot, rows read there
        self.lead = list(range(slots))                                                     # lead_S on the host
        kw = dict(device=self.device, dtype=self.dtype)
        self.k = [torch.zeros(slots, self.Hkv, max_len, self.D, **kw) for _ in self.layers]   # (S, H_kv, T, D)
        self.v = [torch.zeros_like(k) for k in self.k]
        self.cos, self.sin = (t[0] for t in inner.rotary_emb(torch.zeros(1, **kw),
                                                             torch.arange(max_len, device=self.device)[None]))
        i64 = dict(device=self.device, dtype=torch.int64)
        self.stop_t = torch.tensor(stop_ids, **i64)
        self.tok_S, self.pos_S, self.step_S, self.lo_S, self.hi_S = (torch.zeros(slots, **i64) for _ in range(5))
        self.done_S = torch.ones(slots, device=self.device, dtype=torch.bool)
        self.out_tok_SN = torch.zeros(slots, max_new_tokens, **i64)
        self.out_lp_SN = torch.zeros(slots, max_new_tokens, device=self.device, dtype=torch.float32)
        self.temp, self.top_p = (torch.ones((), device=self.device) for _ in range(2))
        self.graphs, self.pool, self.ptrs = {}, None, None
        # candidates = k (03's --student-scores sampler): every drawn token also records, from the logits it was
        # drawn from, its log-prob at logits / T, the k most likely ids with theirs, and the entropy
        # (lib/sample/draw.student_scores), returned with the row as a StudentScores; None: not recorded
        self.cand_k = candidates
        if candidates is not None:
            f32 = dict(device=self.device, dtype=torch.float32)
            self.out_slp_SN, self.out_ent_SN = torch.zeros(slots, max_new_tokens, **f32), torch.zeros(
                slots, max_new_tokens, **f32)
            self.out_cid_SNk = torch.zeros(slots, max_new_tokens, candidates, **i64)
            self.out_clp_SNk = torch.zeros(slots, max_new_tokens, candidates, **f32)
            scores_impl = scores_impl or ("triton" if cuda else "torch")
            if scores_impl == "triton":       # lib/sample/scores_triton.py: the logits read twice
                triton_reaches(self.device, "scores_impl 'triton'")
                from lib.sample.scores_triton import student_scores_fused
                self.scores_c = student_scores_fused
            elif scores_impl == "torch":      # the torch ops, compiled with the draw
                self.scores_c = torch.compile(student_scores, dynamic=False, fullgraph=True, **(
                    {"backend": c} if isinstance(c, str) else {})) if c else student_scores
            else:
                raise ValueError(f"Decoder: scores_impl {scores_impl!r} is not 'torch' or 'triton'")

    # --- the forward passes (the model's modules, our attention) ---

    def _qkv(self, attn, h, B, T):
        q = attn.q_proj(h).view(B, T, self.H, self.D)
        k = attn.k_proj(h).view(B, T, self.Hkv, self.D)
        if hasattr(attn, "q_norm"):                                        # qwen3: RMSNorm per head before rope
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), attn.v_proj(h).view(B, T, self.Hkv, self.D).transpose(1, 2)

    def _forward_prefill(self, ids_UT, lens_U, slots_B, rows_B):
        """Distinct prompts right-padded in (U, T); request b's K/V (those of prompt row rows_B[b]) written to positions
        [0, T) of slot slots_B[b]; the last prompt token's logits per request (B, V). A prompt shared by n requests
        is forwarded once and its K/V copied into its n slots (rows_B repeats its row n times)."""
        U, T = ids_UT.shape
        x = self.model.model.embed_tokens(ids_UT)                          # (U, T, E)
        cos, sin = self.cos[:T], self.sin[:T]                              # (T, D)
        for l, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(x), U, T)      # (U, H|H_kv, T, D)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.k[l][:, :, :T].index_copy_(0, slots_B, k.index_select(0, rows_B))
            self.v[l][:, :, :T].index_copy_(0, slots_B, v.index_select(0, rows_B))
            G = self.H // self.Hkv                                         # right padding: causal is enough
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1),
                                               is_causal=True, scale=attn.scaling)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(U, T, self.H * self.D))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = x[torch.arange(U, device=x.device), lens_U - 1]           # (U, E): each prompt's last position
        return self.model.lm_head(self.model.model.norm(last)).index_select(0, rows_B)

    def _forward_prefill_packed(self, prompts_U: list[list[int]], slots_B, rows_B):
        """`_forward_prefill` without padding: the U distinct prompts end to end in one (1, Σ L) row, rotary
        positions restarting at 0 at each, attention within each prompt (lib/kernels/varlen.py: FlashAttention's
        varlen kernel on CUDA, one causal SDPA per prompt elsewhere). Request b's K/V (prompt row rows_B[b]'s) go to
        positions [0, L) of slot slots_B[b]; returns the last prompt token's logits per request (B, V)."""
        from lib.kernels import varlen
        dev, lens = self.device, [len(p) for p in prompts_U]
        cu = varlen.cu_seqlens(lens).to(dev)                               # (U + 1,) int32 boundaries
        lens_U, start_U = torch.tensor(lens, device=dev), cu[:-1].long()
        ids = torch.tensor([t for p in prompts_U for t in p], device=dev)[None]          # (1, Σ L)
        pos = _ramps(lens_U)                                               # (Σ L,) restarting at 0 at each prompt
        # where each request's prompt tokens go: (slot, position) ← packed index, Σ_b L_{rows_B[b]} entries
        lens_B = lens_U.index_select(0, rows_B)
        dst_slot, dst_pos = torch.repeat_interleave(slots_B, lens_B), _ramps(lens_B)
        src = torch.repeat_interleave(start_U.index_select(0, rows_B), lens_B) + dst_pos
        x = self.model.model.embed_tokens(ids)                             # (1, Σ L, E)
        cos, sin = self.cos[pos], self.sin[pos]                            # (Σ L, D)
        for l, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(x), 1, ids.shape[1])          # (1, H|H_kv, Σ L, D)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.k[l][dst_slot, :, dst_pos] = k[0].index_select(1, src).transpose(0, 1)   # (M, H_kv, D)
            self.v[l][dst_slot, :, dst_pos] = v[0].index_select(1, src).transpose(0, 1)
            o, _ = varlen.attention(attn, q, k, v, None, scaling=attn.scaling, cu_seq_lens_q=cu,
                                    max_length_q=max(lens))                # (1, Σ L, H, D)
            x = x + attn.o_proj(o.reshape(1, -1, self.H * self.D))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = x[0].index_select(0, cu[1:].long() - 1)                     # (U, E): each prompt's last token
        return self.model.lm_head(self.model.model.norm(last)).index_select(0, rows_B)

    def _forward_prefill_fast(self, prompts_U: list[list[int]], slots_B, rows_B):
        """`_forward_prefill_packed` through v2's blocks (lib/sample/decode_step.make_prefill_blocks): per layer one
        GEMM for q|k|v and one for gate|up on the fused weights, rotation, residual adds, norms and act·up fused into
        the compiled blocks' kernels, over the (Σ L, E) tokens of the pass; attention by lib/kernels/varlen.py as
        there. The same K/V rows and last-token logits up to the rounding of the fused GEMMs and kernels."""
        from lib.kernels import varlen
        from lib.sample.decode_step import mark_tokens_dynamic
        dev, lens = self.device, [len(p) for p in prompts_U]
        cu = varlen.cu_seqlens(lens).to(dev)                               # (U + 1,) int32 boundaries
        lens_U, start_U = torch.tensor(lens, device=dev), cu[:-1].long()
        ids = torch.tensor([t for p in prompts_U for t in p], device=dev)               # (M,) M = Σ L
        pos = _ramps(lens_U)                                               # (M,) restarting at 0 at each prompt
        lens_B = lens_U.index_select(0, rows_B)
        dst_slot, dst_pos = torch.repeat_interleave(slots_B, lens_B), _ramps(lens_B)
        src = torch.repeat_interleave(start_U.index_select(0, rows_B), lens_B) + dst_pos
        rms, attn_in, attn_out_mlp = self.prefill_blocks
        M, H, D = ids.shape[0], self.H, self.D
        x = self.model.model.embed_tokens(ids)                             # (M, E)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]          # (M, 1, D)
        mark_tokens_dynamic(x, cos, sin)
        h = rms(x, self.layers[0].input_layernorm.weight)
        for l, (layer, w) in enumerate(zip(self.layers, self.weights.layers)):
            attn = layer.self_attn
            mark_tokens_dynamic(x, h)
            q, k, v = attn_in(h, w["qkv"], w["q_norm"], w["k_norm"], w["qk_eps"], cos, sin)   # (M, H|H_kv, D)
            self.k[l][dst_slot, :, dst_pos] = k.index_select(0, src)       # (Σ_b L_b, H_kv, D)
            self.v[l][dst_slot, :, dst_pos] = v.index_select(0, src)
            o, _ = varlen.attention(attn, *(t.transpose(0, 1)[None] for t in (q, k, v)), None, scaling=attn.scaling,
                                    cu_seq_lens_q=cu, max_length_q=max(lens))             # (1, M, H, D)
            o = o[0].reshape(M, H * D)
            mark_tokens_dynamic(o)
            x, h = attn_out_mlp(x, o, w["wo"], w["ln2"], w["gate_up"], w["wd"], w["ln_next"])
        last = h.index_select(0, cu[1:].long() - 1)                        # (U, E): each prompt's last token, normed
        return self.model.lm_head(last).index_select(0, rows_B)

    def _attend(self, q, k, v, mask, scale):
        """(S, H_kv, G, D) queries against (S, H_kv, kv, D): SDPA, or two batched GEMMs (`attn_impl="matmul"`)."""
        if self.attn_impl == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return self.fx.masked_softmax(q @ k.transpose(-1, -2), mask, scale) @ v

    def _mlp(self, mlp, h):
        if not self.silu:
            return mlp(h)
        return mlp.down_proj(self.fx.silu_mul(mlp.gate_proj(h), mlp.up_proj(h)))

    def _forward_decode(self, kv_len: int):
        """tok_S at pos_S for every slot: K/V written there, attention over [0, kv_len) masked to ≤ pos_S."""
        S, G, fx, L = self.S, self.H // self.Hkv, self.fx, len(self.layers)
        x = self.model.model.embed_tokens(self.tok_S)[:, None]            # (S, 1, E)
        cos, sin = self.cos[self.pos_S][:, None, None], self.sin[self.pos_S][:, None, None]   # (S, 1, 1, D)
        mask = (torch.arange(kv_len, device=self.device) <= self.pos_S[:, None])[:, None, None]  # (S, 1, 1, kv)
        at = self.pos_S[:, None, None, None].expand(S, self.Hkv, 1, self.D)
        h = fx.rms(x, self.layers[0].input_layernorm.weight, self.eps)
        for l, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, h, S, 1)
            q, k = fx.rope2(q, k, cos, sin)
            self.k[l].scatter_(2, at, k)
            self.v[l].scatter_(2, at, v)
            o = self._attend(q.reshape(S, self.Hkv, G, self.D), self.k[l][:, :, :kv_len], self.v[l][:, :, :kv_len],
                             mask, attn.scaling)                            # (S, H_kv, G, D) = heads in HF order
            x, h = fx.add_rms(x, attn.o_proj(o.reshape(S, 1, self.H * self.D)),
                              layer.post_attention_layernorm.weight, self.eps)
            nxt = self.layers[l + 1].input_layernorm if l + 1 < L else self.model.model.norm
            x, h = fx.add_rms(x, self._mlp(layer.mlp, h), nxt.weight, self.eps)
        return self.model.lm_head(h[:, 0])

    def _forward_decode_v2(self, kv_len: int):
        """v1's step in two blocks a layer (lib/sample/decode_step.py), attention over the live length (`triton`) or
        as v1."""
        S, G, D, (attn_in, attn_out_mlp) = self.S, self.H // self.Hkv, self.D, self.blocks
        x = self.model.model.embed_tokens(self.tok_S)                     # (S, E)
        cos, sin = self.cos[self.pos_S][:, None], self.sin[self.pos_S][:, None]   # (S, 1, D)
        if self.split_attn is None:
            mask = (torch.arange(kv_len, device=self.device) <= self.pos_S[:, None])[:, None, None]
            at = self.pos_S[:, None, None, None].expand(S, self.Hkv, 1, D)
        h = self.fx.rms(x, self.layers[0].input_layernorm.weight, self.eps)
        for l, (layer, w) in enumerate(zip(self.layers, self.weights.layers)):
            scale = layer.self_attn.scaling
            q, k, v = attn_in(h, w["qkv"], w["q_norm"], w["k_norm"], w["qk_eps"], cos, sin)   # (S, H|H_kv, D)
            if self.split_attn is not None:                                 # writes k, v into the cache too
                o = self.split_attn(q, k, v, self.k[l], self.v[l], self.pos_S, scale,
                                    *((self.lead_S, self.pre_S) if self.shared_now else ()))
            else:
                self.k[l].scatter_(2, at, k[:, :, None])
                self.v[l].scatter_(2, at, v[:, :, None])
                o = self._attend(q.reshape(S, self.Hkv, G, D), self.k[l][:, :, :kv_len],
                                 self.v[l][:, :, :kv_len], mask, scale)
            x, h = attn_out_mlp(x, o.reshape(S, self.H * D), w["wo"], w["ln2"], w["gate_up"], w["wd"],
                                w["ln_next"])
        return self.model.lm_head(h)

    # --- one decode step: forward, draw, bookkeeping (graph-safe: no host sync) ---

    def _draw(self, logits, lo, hi, step, trim, fn=draw_tokens):
        return fn(logits, lo, hi, step, self.temp, self.top_p, greedy=self.greedy, use_top_p=self.use_top_p,
                  mode=self.mode, trim=trim, blocked=self.draw_blocked)

    def _step(self, kv_len: int):
        fwd = self._forward_decode_v2 if self.v2 else self._forward_decode
        fn = draw_tokens if self.mode == "exact" else self.draw_c         # exact: eager, the documented ops
        logits = fwd(kv_len)
        tok_S, lp_S = self._draw(logits, self.lo_S, self.hi_S, self.step_S, trim=False, fn=fn)
        live_S = ~self.done_S
        col = self.step_S.clamp(max=self.N - 1)[:, None]

        def put(out_SN, new_S):         # the step's value into each live slot's column (a finished slot keeps its own)
            c = col.view(-1, 1, *[1] * (out_SN.dim() - 2)).expand(-1, 1, *out_SN.shape[2:])
            new = new_S[:, None]
            out_SN.scatter_(1, c, torch.where(live_S.view(-1, *[1] * (new.dim() - 1)), new, out_SN.gather(1, c)))

        put(self.out_tok_SN, tok_S)
        put(self.out_lp_SN, lp_S)
        if self.cand_k is not None:
            slp_S, cid_Sk, clp_Sk, ent_S = self.scores_c(logits, tok_S, self.temp, self.cand_k)
            for out, new in ((self.out_slp_SN, slp_S), (self.out_cid_SNk, cid_Sk), (self.out_clp_SNk, clp_Sk),
                             (self.out_ent_SN, ent_S)):
                put(out, new)
        stopped_S = (tok_S[:, None] == self.stop_t).any(-1)
        self.step_S += live_S
        self.done_S |= live_S & (stopped_S | (self.step_S >= self.N))
        self.tok_S.copy_(torch.where(live_S, tok_S, self.tok_S))
        self.pos_S += live_S & ~self.done_S

    def _replay(self, kv_len: int):
        if not self.graphs_on:
            return self._step(kv_len)
        key = (kv_len, self.greedy, self.use_top_p, self.mode, self.shared_now)
        if key not in self.graphs:      # capture; the warm-up step runs on live state, so it is undone after
            state = [self.tok_S, self.pos_S, self.step_S, self.done_S, self.out_tok_SN, self.out_lp_SN]
            if self.cand_k is not None:
                state += [self.out_slp_SN, self.out_cid_SNk, self.out_clp_SNk, self.out_ent_SN]
            saved = [t.clone() for t in state]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(kv_len)
            torch.cuda.current_stream().wait_stream(side)
            self.pool = self.pool or torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self._step(kv_len)
            for t, s in zip(state, saved):   # K/V the warm-up wrote are the ones the real step rewrites
                t.copy_(s)
            self.graphs[key] = g
        self.graphs[key].replay()

    # --- the loop ---

    def _prefill(self, slots: list[int], prompts: list[list[int]], seeds: list[int]):
        """Prefill the requests into `slots`, each distinct prompt forwarded ONCE (`share_prefill`; else every request
        its own row) and its K/V copied into the slots of every request that holds it, in passes of ≤ prefill_tokens
        tokens of distinct prompts (padded: the padding counted). Each request's first token is drawn at step 0 from
        its prompt's logits with its own seed, so a request draws what it would draw prefilled alone (its logits are
        the same numbers, up to the rounding of the GEMMs and the attention kernel at another shape)."""
        rows: dict[tuple, int] = {}                                        # distinct prompt → its row
        row_of = [rows.setdefault(tuple(p), len(rows)) if self.share_prefill else i for i, p in enumerate(prompts)]
        uniq = [list(p) for p in rows] if self.share_prefill else prompts
        if self.shared_now:               # before any row is overwritten: a follower whose leader is refilled reads
            refilled = set(slots)         # its own copy again; each new request reads its prompt's first slot
            self.lead = [s if lead in refilled else lead for s, lead in enumerate(self.lead)]
            first: dict[int, int] = {}
            for b, r in enumerate(row_of):
                self.lead[slots[b]] = first.setdefault(r, slots[b])
            self.lead_S.copy_(torch.tensor(self.lead, dtype=torch.int32))
            self.pre_S[torch.tensor(slots, device=self.device)] = torch.tensor(
                [len(p) for p in prompts], device=self.device, dtype=torch.int32)
        a = 0
        while a < len(uniq):                                               # a pass: distinct prompts [a, a + n)
            if self.packed_prefill:                                        # ≤ prefill_tokens tokens, at least one
                n, total = 1, len(uniq[a])
                while a + n < len(uniq) and total + len(uniq[a + n]) <= self.prefill_tokens:
                    total += len(uniq[a + n])
                    n += 1
            else:                                                          # ≤ prefill_tokens padded tokens
                n = max(1, self.prefill_tokens // max(len(p) for p in uniq[a:]))
            ps, lo_u, a = uniq[a:a + n], a, a + n
            mine = [b for b, r in enumerate(row_of) if lo_u <= r < a]      # the requests of this pass's prompts
            T = max(len(p) for p in ps)
            lens = torch.tensor([len(p) for p in ps], device=self.device)
            rows_b = torch.tensor([row_of[b] - lo_u for b in mine], device=self.device)
            slot_t = torch.tensor([slots[b] for b in mine], device=self.device)
            lo, hi = split_seeds([seeds[b] for b in mine], self.device)
            if self.packed_prefill:
                fwd = self._forward_prefill_fast if self.fast_prefill else self._forward_prefill_packed
                logits = fwd(ps, slot_t, rows_b)
                self.prefill_tokens_run += sum(len(p) for p in ps)
            else:
                ids = torch.tensor([p + [0] * (T - len(p)) for p in ps], device=self.device)     # (U, T) right-padded
                logits = self._forward_prefill(ids, lens, slot_t, rows_b)
                self.prefill_tokens_run += len(ps) * T
            tok, lp = self._draw(logits, lo, hi, 0, trim=True)
            self.prefill_rows += len(ps)
            self.lo_S[slot_t], self.hi_S[slot_t], self.tok_S[slot_t] = lo, hi, tok
            self.pos_S[slot_t] = lens.index_select(0, rows_b)             # the next write position: the prompt's length
            self.step_S[slot_t] = 1
            self.out_tok_SN[slot_t, 0], self.out_lp_SN[slot_t, 0] = tok, lp
            if self.cand_k is not None:
                (self.out_slp_SN[slot_t, 0], self.out_cid_SNk[slot_t, 0], self.out_clp_SNk[slot_t, 0],
                 self.out_ent_SN[slot_t, 0]) = student_scores(logits, tok, self.temp, self.cand_k)
            self.done_S[slot_t] = (tok[:, None] == self.stop_t).any(-1) | (self.N == 1)

    @torch.no_grad()
    def run(self, prompts: list[list[int]], seeds: list[int], *, temperature: float, top_p: float,
            on_done=None) -> list[tuple]:
        """Per request (generated ids, raw log-probs), cut at its first stop id or at max_new_tokens; in input order;
        with `candidates`, (ids, log-probs, StudentScores on the device). `on_done(n)` is called as requests finish
        (a progress bar)."""
        if max(map(len, prompts)) + self.N > self.T:
            raise ValueError(f"a prompt of {max(map(len, prompts))} tokens + {self.N} new exceeds the decoder's "
                             f"cache of {self.T} positions; build it with a larger max_len")
        ptrs = self.weights.refresh() if self.v2 else tuple(t.data_ptr() for t in self.model.parameters())
        if ptrs != self.ptrs:                                  # a weight tensor was replaced, not written in place:
            self.graphs, self.ptrs = {}, ptrs                  # graphs captured its old address
        self.greedy, self.use_top_p = temperature == 0, top_p < 1
        self.temp.fill_(temperature if temperature > 0 else 1.0)
        self.top_p.fill_(top_p)
        self.done_S.fill_(True)
        self.lead = list(range(self.S))                        # every slot its own leader until a prefill says else
        self.lead_S.copy_(torch.arange(self.S, dtype=torch.int32))
        self.shared_now = self.shared_reads and len(set(map(tuple, prompts))) < len(prompts)   # else the plain kernel
        # pop() takes the longest first, a prompt's requests one after another (so one refill holds them together and
        # prefills their prompt once), in input order otherwise
        first: dict[tuple, int] = {}
        group = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        waiting = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), group[i]))[::-1]
        held: dict[int, int] = {}                              # slot → request
        hpos = [0] * self.S                                    # per slot: an upper bound of its next write position
        hstep = [0] * self.S                                   # per slot: an upper bound of its generated tokens
        out: list = [None] * len(prompts)
        free = list(range(self.S))
        while True:
            if waiting and len(free) >= min(self.refill_min, len(waiting)) or free and waiting and not held:
                # refill, one batched prefill for all free slots, once enough are free: a prefill costs a step
                new = [(s, waiting.pop()) for s in free[:len(waiting)]]
                self._prefill([s for s, _ in new], [prompts[r] for _, r in new], [seeds[r] for _, r in new])
                for s, r in new:
                    held[s], hpos[s], hstep[s] = r, len(prompts[r]), 1
                free = free[len(new):]
            if not held:
                return out
            k = min(self.sync_every, max(self.N - hstep[s] for s in held))
            if k > 0:
                kv = max(hpos[s] for s in held) + k           # the bucket (the triton kernel reads lengths)
                kv = self.T if self.split_attn else min(self.T, -(-kv // self.kv_bucket) * self.kv_bucket)
                for _ in range(k):
                    self._replay(kv)
                for s in held:
                    hpos[s], hstep[s] = min(hpos[s] + k, self.T - 1), hstep[s] + k
            done = self.done_S.tolist()                        # the one host sync per `sync_every` steps
            fin = [s for s in held if done[s]]
            if k == 0 and len(fin) < len(held):
                raise RuntimeError(f"decoder: slots {sorted(set(held) - set(fin))} ran {self.N} steps without "
                                   "finishing; the device's step counts disagree with the host's (a bug in lib/decode)")
            if fin:
                idx = torch.tensor(fin, device=self.device)
                toks, lps, n = self.out_tok_SN[idx].tolist(), self.out_lp_SN[idx].tolist(), self.step_S[idx].tolist()
                if self.cand_k is not None:                         # copies: the buffers are the next requests'
                    sc = [t[idx] for t in (self.out_slp_SN, self.out_cid_SNk, self.out_clp_SNk, self.out_ent_SN)]
                for j, (s, t, lp, m) in enumerate(zip(fin, toks, lps, n)):
                    out[held.pop(s)] = (t[:m], lp[:m]) if self.cand_k is None else (
                        t[:m], lp[:m], StudentScores(*(x[j, :m] for x in sc)))
                free += fin
                if on_done:
                    on_done(len(fin))
