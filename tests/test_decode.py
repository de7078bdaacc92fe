"""lib/sample/decode.py's loop against independent references on a tiny random Qwen2 (fp32, CPU):

- greedy = `model.generate` per prompt (unpadded), with odd prompt lengths, fewer slots than requests (refills), a
  row that stops early and rows that hit the cap, in the default CPU configuration and in the GPU one (several steps
  per host sync, bucketed key lengths, GEMM attention) run eagerly;
- sampled tokens = a teacher-forced reference that re-runs the whole prefix through the model at every step and
  draws with the same (seed, step) key, for both modes; raw log-probs within 1e-4 of that forward pass (the
  training loop's `rollout/logprob_gap` must stay < 1e-3 in fp32);
- the fast step (v2, CUDA's default) run eagerly on CPU: greedy = `generate` with fused q|k|v and gate|up GEMMs,
  with v1's attention and with the Triton split-K kernel (Triton's interpreter, TRITON_INTERPRET=1, set here
  before the kernel module is imported), and with all four GEMMs by lib/sample/skinny_gemm.py's Triton partials; the
  kernel alone against a float64 reference, cache write included; shared reads (a prompt's followers reading its
  rows from the leader's slot): the kernel with the followers' own rows poisoned, the decoder's tokens with the
  reads on and off and with a leader refilled under its followers;
  weights pushed by HFEngine.update_weights reach the fused copies (a stale copy fails it); CUDA's configuration
  constructs here (its compiled blocks are not run on CPU).
"""
from __future__ import annotations

import copy
import math
import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import DEV, INTERPRETED  # noqa: E402
from lib.sample.decode import Decoder  # noqa: E402
from lib.sample.draw import M32, draw_tokens, gumbel_noise, split_seeds, uniform52  # noqa: E402
from lib.sample.engine import HFEngine, sample  # noqa: E402
from test_sampling import build_tokenizer, forward_logprobs, reference_probs  # noqa: E402

MAX_NEW = 9
GPU_STYLE = dict(sync_every=4, kv_bucket=8, attn_impl="matmul")     # what CUDA ran before v2, minus the graphs
V2 = dict(fuse_gemms=True, sync_every=4)                            # v2 eagerly: fused GEMMs, v1's attention
V2_TRITON = dict(fuse_gemms=True, attn_impl="triton", attn_opts={"chunk": 16}, sync_every=4)   # + split-K kernel
SKINNY = dict(gemm_opts={"qkv": "n32k32s2w4", "o": "n16k64s1w4", "gate_up": "n64k32s4w4", "down": "n16k64s3w4"})


@pytest.fixture(scope="module")
def tiny():
    """2 kv heads of 2 query heads each (so the GQA head layout matters), head_dim 32, odd-free random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tok = build_tokenizer()
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      tie_word_embeddings=True, initializer_range=0.2)
    return tok, Qwen2ForCausalLM(cfg).eval()


def odd_prompts():
    g = torch.Generator().manual_seed(4)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 7, 3, 12, 5, 9, 2)]


def generate_ref(model, prompt, stop):
    ids = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=stop,
                         pad_token_id=0)[0, len(prompt):].tolist()
    cut = next((i for i, t in enumerate(ids) if t in stop), None)
    return ids if cut is None else ids[:cut + 1]


def run(model, prompts, seeds, stop, *, slots=3, T=0.0, top_p=1.0, mode="fast", **kw):
    dec = Decoder(model, slots=slots, max_len=max(map(len, prompts)) + MAX_NEW, max_new_tokens=MAX_NEW,
                  stop_ids=stop, mode=mode, **kw)
    return dec.run(prompts, seeds, temperature=T, top_p=top_p)


@pytest.mark.parametrize("config", [{}, GPU_STYLE, V2, V2 | GPU_STYLE | dict(kv_bucket=4),
                                    pytest.param(V2_TRITON, marks=INTERPRETED),
                                    pytest.param(V2_TRITON | SKINNY, marks=INTERPRETED)],
                         ids=["cpu", "gpu-style", "v2", "v2-matmul", "v2-triton", "v2-triton-skinny-gemms"])
def test_greedy_equals_generate_with_refills_stops_and_caps(tiny, config):
    tok, model = tiny
    prompts = odd_prompts()
    free = [generate_ref(model, p, [tok.eos_token_id]) for p in prompts]
    j = next(j for j in range(2, MAX_NEW) if free[1][j] not in free[1][:j])
    stop = [tok.eos_token_id, free[1][j]]                             # request 1 stops early, at its (j+1)-th token
    refs = [generate_ref(model, p, stop) for p in prompts]
    assert len(refs[1]) == j + 1 < MAX_NEW and sum(len(r) == MAX_NEW for r in refs) >= 3   # the intended cases
    outs = run(model, prompts, [0] * len(prompts), stop, **config)
    for p, r, (ids, lps) in zip(prompts, refs, outs):
        assert ids == r
        assert max(abs(a - b) for a, b in zip(lps, forward_logprobs(model, p, ids))) < 1e-4


def reference_draw(logits: list[float], seed: int, step: int, T: float, top_p: float, mode: str) -> int:
    """One draw written from the definitions in lib/sample/draw.py's docstring, in Python floats where it can be."""
    probs = reference_probs(logits, T, top_p)
    lo, hi = split_seeds([seed])
    if mode == "exact":
        kept = [v for v, q in enumerate(probs) if q > 0]
        g = gumbel_noise(lo, hi, step, torch.tensor([kept]))[0].tolist()
        return max(zip(kept, g), key=lambda vg: logits[vg[0]] / T + vg[1])[0]
    u = uniform52(lo, hi, step, torch.tensor([[M32]]))[0, 0].item()
    order = range(len(probs)) if top_p >= 1 else sorted(range(len(probs)), key=lambda v: -probs[v])
    acc = 0.0
    for v in order:                                                   # first whose cumulative mass exceeds u
        acc += probs[v]
        if acc > u:
            return v
    return max(v for v in order if probs[v] > 0)


@pytest.mark.parametrize("mode,T,top_p", [("exact", 0.8, 0.9), ("exact", 1.0, 1.0), ("fast", 0.8, 0.9),
                                          ("fast", 1.2, 1.0)])
def test_sampled_tokens_equal_a_teacher_forced_reference(tiny, mode, T, top_p):
    tok, model = tiny
    prompts, seeds = odd_prompts(), [5, 2**40 + 1, 17, 2**64 - 1, 0, 99, 123456789]
    outs = run(model, prompts, seeds, [tok.eos_token_id], T=T, top_p=top_p, mode=mode, **GPU_STYLE)
    assert_teacher_forced(model, prompts, seeds, outs, T, top_p, mode)


def assert_teacher_forced(model, prompts, seeds, outs, T, top_p, mode):
    """Each request's tokens are the reference draw on a plain forward of its own prefix, and its log-probs those of
    a teacher-forced pass (within 1e-4)."""
    for p, s, (ids, lps) in zip(prompts, seeds, outs):
        ref = []
        for t in range(len(ids)):
            with torch.no_grad():
                logits = model(torch.tensor([p + ref])).logits[0, -1].tolist()
            ref.append(reference_draw(logits, s, t, T, top_p, mode))
        assert ids == ref
        gap = max(abs(a - b) for a, b in zip(lps, forward_logprobs(model, p, ids)))
        assert gap < 1e-4 and all(math.isfinite(x) for x in lps)


def test_refuses_other_architectures_and_overlong_prompts(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=32))
    with pytest.raises(TypeError, match="backend 'vllm'"):
        Decoder(gpt2, slots=2, max_len=16, max_new_tokens=4, stop_ids=[0], mode="fast")
    dec = Decoder(tiny[1], slots=2, max_len=16, max_new_tokens=8, stop_ids=[0], mode="fast")
    with pytest.raises(ValueError, match="larger max_len"):
        dec.run([[5] * 9], [0], temperature=0, top_p=1.0)


@pytest.mark.parametrize("opts,T,edge", [({"chunk": 16}, 70, 16), ({}, 200, 128),
                                         ({"chunk": 32, "block": 16, "tma": True}, 70, 32),
                                         ({"chunk": 128, "block": 16}, 70, 32),
                                         ({"chunk": 1024, "block": 32, "warps": 2, "stages": 4}, 1100, 1024)],
                         ids=["chunk16", "defaults", "tiles-of-16-tma", "one-chunk-direct", "c1024b32w2s4"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_split_attention_kernel_equals_a_float64_reference_and_writes_the_new_row(dtype, tol, opts, T, edge):
    """GQA with G = 3 (padded to 16 rows); chunks of 16 (5, the last ragged), the CUDA defaults (chunks of 128 in
    tiles of 64, 2 stages: 2 chunks, the last ragged) or chunks of 32 in tiles of 16 read through tensor
    descriptors, or one chunk spanning the cache (its output written by the split, no combine), or the 1.5B heads'
    candidate tiling at 256 slots (chunks of 1,024 in tiles of 32: 2 chunks, the last ragged); positions 0,
    edge − 1, edge (a chunk or tile boundary) and T − 1; the new k, v come from the arguments,
    land in the cache at pos, and nothing else is written."""
    from lib.sample.decode_triton import SplitAttention
    S, H, Hkv, D, dev = 4, 6, 2, 32, "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    kc, vc = (torch.randn(S, Hkv, T, D, generator=g).to(dev, dtype) for _ in range(2))
    q, k, v = (torch.randn(S, h, D, generator=g).to(dev, dtype) for h in (H, Hkv, Hkv))
    pos = torch.tensor([0, edge - 1, edge, T - 1], device=dev)
    kr, vr = kc.clone(), vc.clone()
    for s in range(S):
        kr[s, :, pos[s]], vr[s, :, pos[s]] = k[s], v[s]
    o = SplitAttention(S, H, Hkv, D, T, dtype, dev, **opts)(q, k, v, kc, vc, pos, 0.3)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    for s in range(S):
        L = int(pos[s]) + 1
        kk, vv = (c[s, :, :L].double().repeat_interleave(H // Hkv, 0) for c in (kr, vr))    # (H, L, D)
        ref = torch.softmax(q[s, :, None].double() @ kk.transpose(-1, -2) * 0.3, -1) @ vv     # (H, 1, D)
        assert (o[s].double() - ref[:, 0]).abs().max() < tol
    with pytest.raises(ValueError, match="power-of-2"):
        SplitAttention(S, H, Hkv, 48, T, dtype, dev)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_split_attention_ignores_every_cache_row_at_or_past_pos(tma):
    """Multi-tile chunks (chunk 32, tiles of 16): every cache row at or after a slot's position poisoned with NaN
    (the row at pos holds a stale value the step replaces) must leave the output finite and bit for bit the clean
    call's, whether tiles are read by masked pointer loads or as whole boxes through tensor descriptors (`tma`,
    which read the poisoned rows and must discard them). Positions: 0, a tile's last row, a tile's first row, a
    chunk's first row, T − 1 (T = 90: 3 chunks, the last ragged, its last box past the cache's end)."""
    from lib.sample.decode_triton import SplitAttention
    S, H, Hkv, D, T, dev = 5, 6, 2, 32, 90, "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(1)
    kc, vc = (torch.randn(S, Hkv, T, D, generator=g).to(dev) for _ in range(2))
    q, k, v = (torch.randn(S, h, D, generator=g).to(dev) for h in (H, Hkv, Hkv))
    pos = torch.tensor([0, 15, 16, 64, 89], device=dev)
    past = torch.arange(T, device=dev)[None, :] >= pos[:, None]                    # (S, T)
    runs = []
    for opts, poison in (({}, False), ({"tma": tma}, True)):
        a, b = kc.clone(), vc.clone()
        if poison:
            a[past[:, None].expand(S, Hkv, T)] = float("nan")
            b[past[:, None].expand(S, Hkv, T)] = float("nan")
        att = SplitAttention(S, H, Hkv, D, T, torch.float32, dev, chunk=32, block=16, **opts)
        runs.append((att(q, k, v, a, b, pos, 0.3).clone(), a, b))
    (o0, k0, v0), (o1, k1, v1) = runs
    assert torch.isfinite(o1).all() and torch.equal(o0, o1)
    rows = torch.arange(S, device=dev)
    assert torch.equal(k1[rows, :, pos], k) and torch.equal(v1[rows, :, pos], v)     # the new row written
    assert torch.equal(k0[~past[:, None].expand(S, Hkv, T)], k1[~past[:, None].expand(S, Hkv, T)])


def test_split_attention_neither_writes_nor_reads_the_partials_of_chunks_past_pos():
    """Chunks that start after a slot's position are skipped by the split (their partials stay as they were) and
    left out by the combine: partial buffers poisoned with NaN give the clean call's output bit for bit."""
    from lib.sample.decode_triton import SplitAttention
    S, H, Hkv, D, T, dev = 3, 6, 2, 32, 90, DEV
    g = torch.Generator().manual_seed(2)
    kc, vc = (torch.randn(S, Hkv, T, D, generator=g).to(dev) for _ in range(2))
    q, k, v = (torch.randn(S, h, D, generator=g).to(dev) for h in (H, Hkv, Hkv))
    pos = torch.tensor([0, 17, 89], device=dev)                          # 1, 2 and 6 of the 6 chunks of 16 live
    outs = []
    for poison in (0.0, float("nan")):
        att = SplitAttention(S, H, Hkv, D, T, torch.float32, dev, chunk=16)
        for t in (att.po, att.pm, att.pl):
            t.fill_(poison)
        outs.append(att(q, k, v, kc.clone(), vc.clone(), pos, 0.3).clone())
        if math.isnan(poison):                                            # pm is (S, H_kv, n_split, G)
            live = torch.arange(att.n_split, device=dev)[None, :] <= (pos // 16)[:, None]   # (S, n_split)
            assert torch.equal(att.pm.isnan().all(-1).all(1), ~live)
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("opts", [dict(chunk=32, block=16), dict(chunk=128, block=64)], ids=["chunks", "direct"])
def test_split_attention_reads_a_shared_prompt_from_its_leader(opts):
    """Shared prompts: slots 0–2 hold one prompt of 21 rows (slot 0 the leader: the others read rows < 21 from
    it), slots 3–4 one of 40 (slot 3 the leader), slot 5 its own; the prompt lengths cut a tile and a chunk. With
    every follower's own prompt rows poisoned with NaN, the call given (lead, pre) must equal bit for bit the clean
    call without them, write each step's new row into the slot's own cache, and leave the leaders' rows as they
    were; without (lead, pre) the poisoned call is NaN where a follower reads (so the poison is there to be read)."""
    from lib.sample.decode_triton import SplitAttention
    S, H, Hkv, D, T, dev = 6, 6, 2, 32, 90, "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(5)
    kc, vc = (torch.randn(S, Hkv, T, D, generator=g).to(dev) for _ in range(2))
    q, k, v = (torch.randn(S, h, D, generator=g).to(dev) for h in (H, Hkv, Hkv))
    lead = torch.tensor([0, 0, 0, 3, 3, 5], device=dev, dtype=torch.int32)
    pre = torch.tensor([21, 21, 21, 40, 40, 7], device=dev, dtype=torch.int32)
    pos = torch.tensor([21, 50, 89, 40, 75, 33], device=dev)
    for s in range(S):                                                   # the followers' copies of the prompt
        kc[s, :, :pre[s]], vc[s, :, :pre[s]] = kc[lead[s], :, :pre[s]], vc[lead[s], :, :pre[s]]
    follower = [s for s in range(S) if lead[s] != s]
    att = SplitAttention(S, H, Hkv, D, T, torch.float32, dev, **opts)
    clean = att(q, k, v, kc.clone(), vc.clone(), pos, 0.3).clone()
    poisoned = []
    for shared in (True, False):
        a, b = kc.clone(), vc.clone()
        for s in follower:
            a[s, :, :pre[s]], b[s, :, :pre[s]] = float("nan"), float("nan")
        o = att(q, k, v, a, b, pos, 0.3, *((lead, pre) if shared else ())).clone()
        poisoned.append((o, a, b))
    (o, a, b), (o_own, _, _) = poisoned
    assert torch.isfinite(o).all() and torch.equal(o, clean)
    rows = torch.arange(S, device=dev)
    assert torch.equal(a[rows, :, pos], k) and torch.equal(b[rows, :, pos], v)
    for s in (0, 3, 5):
        assert torch.equal(a[s, :, :pos[s]], kc[s, :, :pos[s]]) and torch.equal(b[s, :, :pos[s]], vc[s, :, :pos[s]])
    assert o_own[follower].isnan().all() and torch.equal(o_own[[0, 3, 5]], clean[[0, 3, 5]])


def test_decoder_reads_shared_prompts_from_leaders_and_back_when_a_leader_is_refilled(tiny, monkeypatch):
    """The decoder's shared reads (`shared_reads`, on with the triton attention): 7 prompts asked 3 times each, in 4
    slots, sampled with distinct seeds and stop ids common enough that rows of one prompt finish apart. Every
    request's tokens and log-probs must be the teacher-forced reference's and those of the same run with the reads
    off; the run must have refilled a leader while one of its followers still decoded (the case where a follower
    must go back to its own copy), and held followers at all. A run with 21 slots (no refill) that poisons every
    follower's own prompt rows with NaN after the prefill must return what 21 slots return with the reads off (not
    the 4-slot run's numbers: the GEMMs round differently at another slot count). A run of distinct prompts keeps
    the plain kernel (`shared_now` off). On a CUDA host the decoder runs a CUDA copy of the model (CUDA graphs, the
    compiled kernel; a CPU model there would hand the kernel CPU pointers), against the CPU model's reference: the
    kernel's dots run in IEEE float32, so both devices' tokens are the reference's."""
    tok, reference = tiny
    model = copy.deepcopy(reference).cuda() if torch.cuda.is_available() else reference
    prompts = [p for p in odd_prompts() for _ in range(3)]
    seeds = list(range(len(prompts)))
    stop = [tok.eos_token_id] + list(range(40, 60))
    events = {"followers": 0, "leader_refilled_under_a_follower": 0}
    prefill = Decoder._prefill

    def watched(self, slots, prompts_, seeds_, poison=False):
        if self.shared_now:
            live = [s for s in range(self.S) if not self.done_S[s]]
            events["leader_refilled_under_a_follower"] += any(self.lead[s] in slots and self.lead[s] != s
                                                              for s in live)
        prefill(self, slots, prompts_, seeds_)
        if self.shared_now:
            events["followers"] += sum(self.lead[s] != s for s in slots)
            if poison:
                for s in slots:
                    if self.lead[s] != s:
                        for c in self.k + self.v:
                            c[s, :, :int(self.pre_S[s])] = float("nan")

    dec = Decoder(model, slots=4, max_len=12 + MAX_NEW, max_new_tokens=MAX_NEW, stop_ids=stop, mode="fast",
                  **V2_TRITON)
    dec.run(odd_prompts(), seeds[:7], temperature=1.0, top_p=1.0)
    assert dec.shared_reads and not dec.shared_now            # distinct prompts: the plain kernel
    monkeypatch.setattr(Decoder, "_prefill", watched)
    on = run(model, prompts, seeds, stop, slots=4, T=1.0, **V2_TRITON)
    assert events["followers"] > 0 and events["leader_refilled_under_a_follower"] > 0
    assert_teacher_forced(reference, prompts, seeds, on, 1.0, 1.0, "fast")
    assert run(model, prompts, seeds, stop, slots=4, T=1.0, **V2_TRITON, shared_reads=False) == on
    alone = run(model, prompts, seeds, stop, slots=len(prompts), T=1.0, **V2_TRITON, shared_reads=False)
    monkeypatch.setattr(Decoder, "_prefill", lambda self, *a: watched(self, *a, poison=True))
    assert run(model, prompts, seeds, stop, slots=len(prompts), T=1.0, **V2_TRITON) == alone


def test_compiled_block_keeps_the_residual_add_out_of_the_gemm():
    """v2's attn_out_mlp adds o_proj's and down_proj's outputs to the residual after rounding them, as the model
    does eagerly: Inductor must compile three plain GEMMs (o, gate|up, down), no addmm (which would fold the add
    into the GEMM, round once, and on CUDA first copy the residual into the output)."""
    from torch._inductor.utils import run_and_get_code
    from lib.sample.decode_step import make_blocks
    torch.manual_seed(0)
    S, E, FF = 8, 64, 128
    bf = dict(dtype=torch.bfloat16)
    x, o, ln2, ln_next = torch.randn(S, E, **bf), torch.randn(S, E, **bf), torch.ones(E, **bf), torch.ones(E, **bf)
    wo, gate_up, wd = torch.randn(E, E, **bf), torch.randn(2 * FF, E, **bf), torch.randn(E, FF, **bf)
    _, block = make_blocks(4, 2, 16, 1e-6, torch.nn.functional.silu, True)
    _, code = run_and_get_code(block, x, o, (wo, None), ln2, [(gate_up, None)], (wd, None), ln_next)
    src = "\n".join(code)
    assert "addmm" not in src and src.count("extern_kernels.mm(") == 3


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_attn_in_rotates_q_and_k_together_as_each_alone(compiled):
    """v2's attn_in with one q|k|v GEMM rotates q and k as one tensor: each must equal the model's own rotation of
    its projection (eagerly bit for bit; compiled by Inductor, up to its GEMM's float32 rounding), v unrotated."""
    from lib.sample.decode_step import _rope, make_blocks
    g = torch.Generator().manual_seed(3)
    S, E, H, Hkv, D = 5, 64, 6, 2, 16
    h, w, b = (torch.randn(*shape, generator=g) for shape in ((S, E), ((H + 2 * Hkv) * D, E), ((H + 2 * Hkv) * D,)))
    angle = torch.randn(S, 1, D, generator=g)
    cos, sin = angle.cos(), angle.sin()
    attn_in, _ = make_blocks(H, Hkv, D, 1e-6, torch.nn.functional.silu, compiled)
    q, k, v = attn_in(h, [(w, b)], None, None, 0.0, cos, sin)
    rq, rk, rv = torch.nn.functional.linear(h, w, b).split([H * D, Hkv * D, Hkv * D], -1)
    ref = _rope(rq.reshape(S, H, D), cos, sin), _rope(rk.reshape(S, Hkv, D), cos, sin), rv.reshape(S, Hkv, D)
    for got, want in zip((q, k, v), ref):
        assert got.shape == want.shape
        assert torch.equal(got, want) if not compiled else torch.allclose(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-request"])
def test_fast_prefill_writes_and_draws_what_the_model_modules_prefill_does(tiny, monkeypatch, share):
    """The packed prefill through v2's blocks (`fast_prefill`, the CUDA default with fused GEMMs) against the packed
    prefill through the model's own modules: every slot's cache rows [0, L) in every layer (to 1e-5), the first token
    drawn and its log-prob, with odd prompt lengths (1 included), a prompt shared by several requests, requests in
    another order than their slots, and two passes (a prefill_tokens limit that splits the prompts). The fast path
    must run without the modules' path (a K/V row written one position off, a prompt's rotation running on from the
    last, a missed final norm fail it)."""
    _, model = tiny
    ps = odd_prompts()
    prompts = [ps[i] for i in (3, 0, 3, 5, 1, 6, 3, 2)]                       # prompt 3 asked three times
    seeds = [11 * i + 5 for i in range(len(prompts))]
    slots = [7, 2, 0, 5, 1, 3, 6, 4]
    got = []
    for fast in (True, False):
        dec = Decoder(model, slots=8, max_len=20, max_new_tokens=4, stop_ids=[0], mode="fast", packed_prefill=True,
                      fast_prefill=fast, share_prefill=share, prefill_tokens=20, **V2)
        assert dec.fast_prefill is fast
        if fast:
            monkeypatch.setattr(dec, "_forward_prefill_packed", None)      # the modules' path may not run
        dec.greedy, dec.use_top_p = False, False
        dec.temp.fill_(1.0)
        dec._prefill(slots, prompts, seeds)
        got.append(dec)
    a, b = got
    assert a.prefill_tokens_run == b.prefill_tokens_run and torch.equal(a.pos_S, b.pos_S)
    assert torch.equal(a.tok_S, b.tok_S) and torch.allclose(a.out_lp_SN[:, 0], b.out_lp_SN[:, 0], atol=1e-5)
    for s, p in zip(slots, prompts):
        for x, y in zip(a.k + a.v, b.k + b.v):
            assert torch.allclose(x[s, :, :len(p)], y[s, :, :len(p)], atol=1e-5), (s, len(p))


def test_compiled_prefill_blocks_serve_every_pass_length_with_one_graph():
    """The prefill's blocks compiled by Inductor with the pass's tokens marked dynamic: passes of 5, 9 and 3 tokens
    run one graph each block (a recompile per length would cost seconds in every 03 step) and equal the eager
    blocks up to float32 rounding; q, k and v come out contiguous."""
    from lib.sample.decode_step import make_prefill_blocks, mark_tokens_dynamic
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    E, FF, H, Hkv, D = 64, 96, 4, 2, 16
    rnd = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    qkv, wo, gu, wd = [(rnd((H + 2 * Hkv) * D, E), rnd((H + 2 * Hkv) * D))], (rnd(E, E), None), [(rnd(2 * FF, E),
                                                                                                  None)], (rnd(E, FF), None)
    ln0, ln2, ln_next = rnd(E), rnd(E), rnd(E)
    eager = make_prefill_blocks(H, Hkv, D, 1e-6, torch.nn.functional.silu, False)
    comp = make_prefill_blocks(H, Hkv, D, 1e-6, torch.nn.functional.silu, True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for M in (5, 9, 3):
            x, o, angle = rnd(M, E), rnd(M, E), rnd(M, 1, D)
            cos, sin = angle.cos(), angle.sin()
            outs = []
            for rms, attn_in, attn_out_mlp in (eager, comp):
                mark_tokens_dynamic(x, o, cos, sin)
                h = rms(x, ln0)
                mark_tokens_dynamic(h)
                outs.append((h, *attn_in(h, qkv, None, None, 0.0, cos, sin), *attn_out_mlp(x, o, wo, ln2, gu, wd,
                                                                                           ln_next)))
            for want, got in zip(*outs):
                assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4)
            assert all(t.is_contiguous() for o in outs for t in o[1:4])        # q, k, v as the varlen kernel reads


@INTERPRETED
def test_attention_tiling_is_chosen_by_shape_and_slots(tiny, monkeypatch):
    """decode_triton.ATTN_TILINGS: the last entry for the model's (H, H_kv, D) whose slot minimum ≤ the slots, the
    class defaults for fewer slots or other heads, and attn_opts over both. The 7B heads' table as measured."""
    import lib.sample.decode_triton as dt
    assert dt.default_tiling(256, 28, 4, 128) == dict(chunk=2048, block=32, warps=2, stages=4)
    assert dt.default_tiling(64, 28, 4, 128)["block"] == 64 and dt.default_tiling(255, 28, 4, 128)["block"] == 64
    assert dt.default_tiling(63, 28, 4, 128) == {} == dt.default_tiling(256, 12, 2, 128)
    monkeypatch.setitem(dt.ATTN_TILINGS, (4, 2, 32), [(3, dict(chunk=64, block=16)), (5, dict(chunk=32))])
    chunk = lambda slots, **kw: Decoder(tiny[1], slots=slots, max_len=40, max_new_tokens=4, stop_ids=[0],  # noqa: E731
                                        mode="fast", **V2_TRITON | kw).split_attn.chunk
    assert (chunk(2, attn_opts=None), chunk(3, attn_opts=None), chunk(6, attn_opts=None)) == (128, 64, 32)
    assert chunk(6) == 16                                                # attn_opts given: the table unread


@INTERPRETED
def test_skinny_gemm_options_run_every_projection_through_the_kernel(tiny, monkeypatch):
    """gemm_opts reach the blocks: each decode step calls the Triton partials once per projection and layer, with
    that projection's tiling (the greedy test above checks the tokens)."""
    import lib.sample.skinny_gemm as sk
    calls, real = [], sk.skinny_partials
    monkeypatch.setattr(sk, "skinny_partials", lambda x, w, *t: calls.append((tuple(w.shape), t)) or real(x, w, *t))
    dec = Decoder(tiny[1], slots=2, max_len=16, max_new_tokens=3, stop_ids=[0], mode="fast", **V2_TRITON | SKINNY)
    dec.run([[5, 6, 7], [8, 9]], [0, 1], temperature=0.0, top_p=1.0)
    E, L = 128, 2
    shapes = {(256, E): "qkv", (E, E): "o", (512, E): "gate_up", (E, 256): "down"}
    assert calls and len(calls) % (4 * L) == 0 and {shapes[w] for w, _ in calls} == set(shapes.values())
    for w, t in calls:
        assert t == tuple(sk.tiling(SKINNY["gemm_opts"][shapes[w]]).values())


def test_fused_copies_follow_update_weights(tiny):
    """03_opd_train's pattern: a sampler copy in an engine kept between calls, new weights pushed in place by
    update_weights. The next run must sample what a fresh engine on the new weights samples (tokens and log-probs
    bit for bit): a fused q|k|v or gate|up copy left stale would not."""
    tok, model = tiny
    prompts, seeds = odd_prompts(), list(range(7))
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    eng = HFEngine(copy.deepcopy(model), tok, batch_size=3, decoder_options=V2)
    before = sample(eng, prompts, seeds, **kw)
    dec = eng.decoder
    g = torch.Generator().manual_seed(1)
    new = {n: p + 0.2 * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    eng.update_weights(new.items())
    after = sample(eng, prompts, seeds, **kw)
    assert eng.decoder is dec and dec.v2 and dec.weights.fuse            # the same decoder, its copies refreshed
    fresh_model = copy.deepcopy(model)
    fresh_model.load_state_dict(new, strict=False)
    fresh = sample(HFEngine(fresh_model, tok, batch_size=3, decoder_options=V2), prompts, seeds, **kw)
    assert [c.token_ids for c in after] == [c.token_ids for c in fresh] != [c.token_ids for c in before]
    assert [c.logprobs for c in after] == [c.logprobs for c in fresh]


@pytest.mark.parametrize("kw,what", [(V2_TRITON, "attn_impl 'triton'"), (V2 | SKINNY, "gemm_opts"),
                                     (dict(candidates=2, scores_impl="triton"), "scores_impl 'triton'")],
                         ids=["attention", "gemms", "scores"])
def test_a_triton_kernel_on_a_cpu_model_is_refused_without_the_interpreter(tiny, monkeypatch, kw, what):
    """Each Triton option, asked for with the model on the CPU and TRITON_INTERPRET unset, is refused at construction
    in one line that names it (not by the driver's pointer error at the first launch)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=f"{re.escape(what)} runs Triton kernels.*on cpu.*TRITON_INTERPRET=1"):
        Decoder(tiny[1], slots=2, max_len=16, max_new_tokens=3, stop_ids=[0], mode="fast", **kw)


@INTERPRETED
def test_cuda_configuration_constructs_on_cpu(tiny):
    """What CUDA runs by default (v2: fused GEMMs, compiled blocks, Triton attention) builds here; a head_dim the
    kernel cannot take falls back to the GEMM attention by default."""
    dec = Decoder(tiny[1], slots=2, max_len=32, max_new_tokens=4, stop_ids=[0], mode="fast", fuse_gemms=True,
                  compile_step="max-autotune-no-cudagraphs", attn_impl="triton")
    assert dec.v2 and dec.split_attn.n_split == 1 and all(hasattr(b, "_torchdynamo_orig_callable") for b in dec.blocks)
    cpu = Decoder(tiny[1], slots=2, max_len=32, max_new_tokens=4, stop_ids=[0], mode="fast")
    assert not cpu.v2 and cpu.attn_impl == "sdpa"                        # CPU: v1, the toy campaign's numerics


def test_compiled_draw_draws_what_the_eager_one_draws(tiny):
    """CUDA compiles the step's fast and greedy draws whole (`compile_draw`). Here traced by dynamo whole (fullgraph)
    and run through AOT autograd's decompositions (Inductor's C++ build takes minutes on CPU; bench/rollout.py --check
    compares Inductor's draws on the GPU): the same tokens and log-probs, and the compiled function is what ran."""
    import torch._dynamo.eval_frame as ef
    prompts, seeds, model = odd_prompts(), list(range(7)), tiny[1]
    for T, top_p in ((1.0, 0.9),):                                       # top-p: the longest path
        eager = run(model, prompts, seeds, [0], T=T, top_p=top_p, **V2)
        torch._dynamo.reset()
        dec = Decoder(model, slots=3, max_len=max(map(len, prompts)) + MAX_NEW, max_new_tokens=MAX_NEW, stop_ids=[0],
                      mode="fast", compile_draw="aot_eager", **V2)
        fused = dec.run(prompts, seeds, temperature=T, top_p=top_p)
        assert ef._debug_get_cache_entry_list(draw_tokens.__code__)       # compiled, and called by the step
        assert [ids for ids, _ in fused] == [ids for ids, _ in eager]
        assert max(abs(a - b) for (_, x), (_, y) in zip(fused, eager) for a, b in zip(x, y)) < 1e-5


@pytest.mark.parametrize("V,top_p", [(3001, 1.0), (2048, 1.0), (3001, 0.9)])
def test_blocked_inverse_cdf_draws_the_same_tokens(V, top_p):
    """CUDA's fast draw (block sums, then one block's scan) against the one-scan search CPU runs: the same tokens on
    rows of every temperature (a differing one would need u · mass within float32 rounding of a boundary)."""
    g = torch.Generator().manual_seed(V)
    logits = torch.randn(96, V, generator=g) * torch.linspace(0.1, 8, 96)[:, None]
    lo, hi = split_seeds(list(range(96)))
    kw = dict(greedy=False, use_top_p=top_p < 1, mode="fast", trim=False)
    plain, lp = draw_tokens(logits, lo, hi, 5, 1.0, top_p, blocked=False, **kw)
    blocked, lp2 = draw_tokens(logits, lo, hi, 5, 1.0, top_p, blocked=True, **kw)
    assert torch.equal(plain, blocked) and torch.equal(lp, lp2) and len(set(plain.tolist())) > 48


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_v2_greedy_equals_generate_on_llama_and_qwen3(arch):
    """v2's blocks on the other supported layouts: no q|k|v bias (llama), per-head q/k norms (qwen3)."""
    import transformers
    M, C = (getattr(transformers, f"{arch.capitalize()}{k}") for k in ("ForCausalLM", "Config"))
    torch.manual_seed(0)
    model = M(C(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, initializer_range=0.2)).eval()
    prompts = odd_prompts()[:4]
    refs = [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    assert [ids for ids, _ in run(model, prompts, [0] * 4, [300], **V2)] == refs
