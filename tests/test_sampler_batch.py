"""The built-in sampler's batch (issue 35, item 1): a prompt shared by n requests prefilled once, and the slot count
sized from the memory left free. A tiny random Qwen2 in fp32 on CPU (tests/test_decode.py's), prompts of ragged
lengths, n = 3 requests per prompt:

- shared prefill = per-request prefill (the path before it, `share_prefill=False`): the same tokens and log-probs,
  greedy and seeded (both draw modes, top-p), with every request in one batch and with fewer slots than requests
  (refills that split a prompt's requests), requests given prompt by prompt or interleaved; and it forwards each
  distinct prompt once (counted);
- greedy with shared prefill = transformers' `generate`, per request; seeded samples = the teacher-forced reference
  of tests/test_decode.py (the whole prefix re-run at every step, drawn with the request's own (seed, step) key);
- the KV budget: HFEngine's slot count = min(requests, (free − reserve − prefill workspace) // slot_bytes), the
  reserve function called when the cache is sized, the choice printed once, the decoder kept while it fits; a
  memory-bound sampler draws what an unbounded one draws; slot_bytes covers what a Decoder allocates per slot;
- 03's wiring: --sampler-slots fixes the count (no budget), sampler_reserve's cases;
- packed prefill (the CUDA default) = right-padded prefill, draws and the K/V written; a held longer cache serves a
  shorter call, drawing what a shorter one draws.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lib.sample.decode import Decoder, slot_bytes, workspace_bytes  # noqa: E402
from lib.sample.engine import HFEngine, sample  # noqa: E402
from helpers import INTERPRETED  # noqa: E402
from test_decode import GPU_STYLE, V2, V2_TRITON, assert_teacher_forced  # noqa: E402
from test_decode import tiny  # noqa: E402,F401  (the decoder tests' tiny random Qwen2, a fixture)
from test_sampling import forward_logprobs  # noqa: E402

MAX_NEW = 7
N_ROLLOUTS = 3


def distinct_prompts():
    """Ragged lengths: 1 (the prompt is its own last token), 7, 3, 12, 5, and 7 again (two distinct prompts of one
    length: their requests must still be grouped prompt by prompt)."""
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 7, 3, 12, 5, 7)]


def requests(order: str):
    """n = 3 requests per prompt, each with its own seed, as 03 builds them ("grouped") or round-robin."""
    ps = distinct_prompts()
    if order == "grouped":
        idx = [i for i in range(len(ps)) for _ in range(N_ROLLOUTS)]
    else:
        idx = [i for _ in range(N_ROLLOUTS) for i in range(len(ps))]
    return [list(ps[i]) for i in idx], [1000 * i + 7 * j + 2**40 for j, i in enumerate(idx)]


def decode(model, prompts, seeds, *, slots, share, T=0.0, top_p=1.0, mode="fast", stop=(0,), **kw):
    dec = Decoder(model, slots=slots, max_len=max(map(len, prompts)) + MAX_NEW, max_new_tokens=MAX_NEW,
                  stop_ids=list(stop), mode=mode, share_prefill=share, **kw)
    return dec.run(prompts, seeds, temperature=T, top_p=top_p), dec


def generate_ref(model, prompt, stop):
    """transformers' greedy `generate` on the prompt alone, cut after the first stop id."""
    ids = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=stop,
                         pad_token_id=0)[0, len(prompt):].tolist()
    cut = next((i for i, t in enumerate(ids) if t in stop), None)
    return ids if cut is None else ids[:cut + 1]


DRAWS = [("greedy", 0.0, 1.0), ("exact", 0.8, 0.9), ("fast", 1.0, 1.0), ("fast", 0.7, 0.8)]


@pytest.mark.parametrize("config", [{}, GPU_STYLE | V2], ids=["cpu", "gpu-style-v2"])
@pytest.mark.parametrize("slots", [18, 3, 4], ids=["one-batch", "refills-of-n", "refills-split"])
@pytest.mark.parametrize("mode,T,top_p", DRAWS, ids=[f"{m}-T{t}-p{p}" for m, t, p in DRAWS])
def test_shared_prefill_draws_what_per_request_prefill_draws(tiny, config, slots, mode, T, top_p):
    """Each request's tokens are those of the path that prefills every request on its own, its log-probs within
    1e-4, in the CPU step and in CUDA's step run eagerly (several steps per host sync, fused GEMMs; the Triton
    attention, slow under the interpreter, is in the greedy test below: it reads the same cache). Log-probs to
    1e-4: fp32 GEMMs over 6 distinct rows instead of 18 may round differently (measured on an Intel Xeon: the first
    token's log-prob 5e-7 apart, the later ones bit for bit; on an AMD EPYC, whose pinned AVX2 GEMMs round the two
    shapes apart, up to 1.6e-5). Sharing a prompt's K/V with the wrong requests changes their tokens, which the
    first assertion compares exactly (seen: each shared prompt's requests handed the next prompt's row fail it)."""
    _, model = tiny
    for order in ("grouped", "interleaved"):
        prompts, seeds = requests(order)
        kw = dict(slots=slots, T=T, top_p=top_p, mode="fast" if mode == "greedy" else mode, **config)
        shared, dec = decode(model, prompts, seeds, share=True, **kw)
        alone, ref = decode(model, prompts, seeds, share=False, **kw)
        assert [ids for ids, _ in shared] == [ids for ids, _ in alone], order
        assert max(abs(a - b) for (_, x), (_, y) in zip(shared, alone) for a, b in zip(x, y)) < 1e-4, order
        assert ref.prefill_rows == len(prompts)
        # every request runs to the cap here, so refills take the requests in fixed groups: all 18 at once or 3 at
        # a time (each distinct prompt forwarded once), or 4 at a time, a prompt's requests side by side (prompts by
        # index: [3 3 3 1] [1 1 5 5] [5 4 4 4] [2 2 2 0] [0 0], 9 rows; taken as they come, 1 and 5 of one length
        # interleave: [3 3 3 1] [5 1 5 1] [5 4 4 4] … the same 9; with 3 slots [1 5 1] [5 1 5]: 8, not 6)
        assert dec.prefill_rows == {18: 6, 3: 6, 4: 9}[slots]
        if T > 0:                                                  # a prompt's n rollouts differ (own seeds)
            by_prompt = {}
            for p, (ids, _) in zip(prompts, shared):
                by_prompt.setdefault(tuple(p), set()).add(tuple(ids))
            assert sum(len(v) > 1 for v in by_prompt.values()) >= 3


@pytest.mark.parametrize("config", [{}, V2, pytest.param(V2_TRITON, marks=INTERPRETED)], ids=["cpu", "v2", "v2-triton"])
def test_shared_prefill_greedy_equals_generate(tiny, config):
    """Greedy, every request of a prompt = transformers' `generate` on that prompt alone (unpadded), log-probs
    within 1e-4 of a teacher-forced forward pass; the prompt's K/V copied, not recomputed, into 3 slots."""
    tok, model = tiny
    prompts, seeds = requests("interleaved")
    refs = {tuple(p): generate_ref(model, p, [tok.eos_token_id]) for p in distinct_prompts()}
    outs, dec = decode(model, prompts, seeds, slots=len(prompts), share=True, stop=[tok.eos_token_id], **config)
    assert dec.prefill_rows == len(distinct_prompts())
    for p, (ids, lps) in zip(prompts, outs):
        assert ids == refs[tuple(p)]
        assert max(abs(a - b) for a, b in zip(lps, forward_logprobs(model, p, ids))) < 1e-4


@pytest.mark.parametrize("mode,T,top_p", [("exact", 0.9, 0.95), ("fast", 1.0, 1.0)])
def test_shared_prefill_samples_equal_a_teacher_forced_reference(tiny, mode, T, top_p):
    """Seeded: each of a prompt's 3 requests draws, at every step, the token its own (seed, step) key picks from the
    model's distribution given the prefix (re-run from scratch): a request whose slot got another prompt's K/V, or
    its prompt's K/V one position off, draws from the wrong distribution."""
    tok, model = tiny
    prompts, seeds = requests("grouped")
    outs, dec = decode(model, prompts, seeds, slots=len(prompts), share=True, T=T, top_p=top_p, mode=mode,
                       stop=[tok.eos_token_id], **GPU_STYLE)
    assert dec.prefill_rows == len(distinct_prompts())
    assert_teacher_forced(model, prompts, seeds, outs, T, top_p, mode)


# --- packed prefill: the distinct prompts end to end in one row, no padding ---

@pytest.mark.parametrize("config", [{}, V2], ids=["cpu", "v2"])
@pytest.mark.parametrize("slots", [18, 4], ids=["one-batch", "refills-split"])
@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-request"])
@pytest.mark.parametrize("mode,T,top_p", DRAWS[:3], ids=[f"{m}-T{t}-p{p}" for m, t, p in DRAWS[:3]])
def test_packed_prefill_draws_what_the_padded_prefill_draws(tiny, config, slots, share, mode, T, top_p):
    """Each request's tokens are the right-padded prefill's, its log-probs within 1e-5 (GEMMs over Σ L rows instead
    of U × L_max may round differently), with prompts shared or not, in one batch or in refills; the packed pass
    forwards Σ L tokens where the padded one forwards U × L_max. A packed K/V row written one position off, to
    another request's slot, or with the rotary positions running on across prompts draws other tokens."""
    _, model = tiny
    prompts, seeds = requests("interleaved")
    kw = dict(slots=slots, share=share, T=T, top_p=top_p, mode="fast" if mode == "greedy" else mode, **config)
    packed, dec = decode(model, prompts, seeds, packed_prefill=True, **kw)
    padded, ref = decode(model, prompts, seeds, packed_prefill=False, **kw)
    assert [ids for ids, _ in packed] == [ids for ids, _ in padded]
    assert max(abs(a - b) for (_, x), (_, y) in zip(packed, padded) for a, b in zip(x, y)) < 1e-5
    assert dec.prefill_rows == ref.prefill_rows
    if slots == 18:                                # one pass: Σ L of the prompts forwarded against U × L_max
        forwarded = {tuple(p): len(p) for p in prompts} if share else {i: len(p) for i, p in enumerate(prompts)}
        assert dec.prefill_tokens_run == sum(forwarded.values())
        assert ref.prefill_tokens_run == len(forwarded) * max(forwarded.values())


def test_packed_prefill_writes_each_prompts_kv_where_the_padded_one_does(tiny):
    """After the prefill alone, every slot's cache rows [0, L) hold its prompt's K and V as the padded pass wrote
    them (to 1e-5), and the draws' inputs agree: the packed row's K/V scattered to the right (slot, position)."""
    _, model = tiny
    prompts, seeds = requests("interleaved")
    caches = []
    for packed in (True, False):
        dec = Decoder(model, slots=len(prompts), max_len=20, max_new_tokens=MAX_NEW, stop_ids=[0], mode="fast",
                      packed_prefill=packed)
        dec.greedy, dec.use_top_p = True, False                         # what run() sets before its first prefill
        dec._prefill(list(range(len(prompts))), prompts, seeds)
        caches.append((dec.k, dec.v, dec.tok_S.clone(), dec.pos_S.clone()))
    (k1, v1, tok1, pos1), (k2, v2, tok2, pos2) = caches
    assert torch.equal(tok1, tok2) and torch.equal(pos1, pos2)
    for s, p in enumerate(prompts):
        for a, b in zip(k1 + v1, k2 + v2):
            assert torch.allclose(a[s, :, :len(p)], b[s, :, :len(p)], atol=1e-5), (s, len(p))


# --- the KV budget ---

@INTERPRETED
def test_slot_bytes_covers_what_a_decoder_allocates_per_slot(tiny):
    _, model = tiny
    per = []
    for S in (2, 5):
        dec = Decoder(model, slots=S, max_len=40, max_new_tokens=9, stop_ids=[0], mode="fast", **V2_TRITON)
        held = [*dec.k, *dec.v, dec.out_tok_SN, dec.out_lp_SN, dec.tok_S, dec.pos_S, dec.step_S, dec.lo_S, dec.hi_S,
                dec.split_attn.po, dec.split_attn.pm, dec.split_attn.pl]
        per.append(sum(t.numel() * t.element_size() for t in held))
    kv = 2 * 2 * 2 * 40 * 32 * 4                                            # layers · K,V · kv heads · T · D · fp32
    assert slot_bytes(model, 40, 9) >= (per[1] - per[0]) / 3 >= kv
    assert slot_bytes(model, 80, 9) - slot_bytes(model, 40, 9) >= kv       # the cache grows with its length
    assert workspace_bytes(model, 1000) == 1000 * (3 * 128 + 3 * 4 * 32 + 3 * 256) * 4


def budget_engine(tiny, free, reserve, batch_size=None):
    tok, model = tiny
    eng = HFEngine(model, tok, batch_size=batch_size, mode="fast", kv_reserve=reserve)
    calls = []
    eng._free_bytes = lambda: calls.append(1) or free                        # as if on a device with `free` bytes
    return eng, calls


def test_budget_sizes_slots_from_free_memory_and_says_so_once(tiny, capsys):
    tok, model = tiny
    prompts, seeds = requests("grouped")
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    T = 64                                                                   # the engine's cache length off CUDA
    per, work = slot_bytes(model, T, MAX_NEW), workspace_bytes(model, 65_536)
    reserve_calls = []

    def reserve():
        reserve_calls.append(1)
        return 10 * per

    # room for 6 slots after the reserve and the workspace: 6 of 18 requests at a time
    eng, calls = budget_engine(tiny, free=work + 16 * per + per // 2, reserve=reserve)
    bound = sample(eng, prompts, seeds, **kw)
    assert eng.decoder.S == 6 and eng.memory_cap == 6 and reserve_calls == [1]
    dec = eng.decoder
    again = sample(eng, prompts, seeds, **kw)                                # the held decoder fits: not re-sized
    assert eng.decoder is dec and len(calls) == 1
    said = capsys.readouterr().out
    assert said.count("sampler: 6 slots, KV budget") == 1 and "memory-bound" in said
    # memory for all: every request in one batch; the same draws as the bounded engine's
    eng2, _ = budget_engine(tiny, free=work + 10 * per + 100 * per, reserve=reserve)
    free_run = sample(eng2, prompts, seeds, **kw)
    assert eng2.decoder.S == len(prompts) and eng2.memory_cap is None
    assert [c.token_ids for c in bound] == [c.token_ids for c in again] == [c.token_ids for c in free_run]
    assert max(abs(a - b) for x, y in zip(bound, free_run) for a, b in zip(x.logprobs, y.logprobs)) < 1e-5
    assert "sampler: 18 slots" in capsys.readouterr().out
    # a cap (batch_size) still caps; no room at all: one slot, still every request answered
    eng3, _ = budget_engine(tiny, free=10**12, reserve=0, batch_size=5)
    sample(eng3, prompts, seeds, **kw)
    assert eng3.decoder.S == 5
    eng4, _ = budget_engine(tiny, free=0, reserve=0)
    assert [c.token_ids for c in sample(eng4, prompts, seeds, **kw)] == [c.token_ids for c in bound]
    assert eng4.decoder.S == 1


@pytest.mark.parametrize("config", [{}, V2], ids=["cpu", "v2"])
def test_a_held_longer_cache_serves_shorter_calls(tiny, config):
    """03's steps alternate between longest prompts either side of a multiple of the cache rounding: the decoder
    built for the longer call is kept for a shorter one (its cache, CUDA graphs and compiled blocks), drawing what a
    decoder sized for the shorter call draws; a call longer than the held cache still gets a new, longer one."""
    tok, model = tiny
    prompts, seeds = requests("grouped")                     # longest 12 + 7 new: a 64-position cache off CUDA
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    eng = HFEngine(model, tok, batch_size=4, mode="fast", decoder_options=config)
    sample(eng, [list(range(3, 73))] * 4, [1, 2, 3, 4], **kw)                   # 70 + 7: a 128-position cache
    dec = eng.decoder
    held = sample(eng, prompts, seeds, **kw)
    assert eng.decoder is dec and dec.T == 128
    fresh = HFEngine(model, tok, batch_size=4, mode="fast", decoder_options=config)
    alone = sample(fresh, prompts, seeds, **kw)
    assert fresh.decoder.T == 64
    assert [c.token_ids for c in held] == [c.token_ids for c in alone]
    assert max(abs(a - b) for x, y in zip(held, alone) for a, b in zip(x.logprobs, y.logprobs)) < 1e-6
    sample(eng, [list(range(3, 133))] * 4, [1, 2, 3, 4], **kw)                  # 130 + 7: longer than held
    assert eng.decoder is not dec and eng.decoder.T == 192


def test_no_reserve_keeps_fixed_slots_and_cpu_ignores_the_budget(tiny):
    tok, model = tiny
    prompts, seeds = requests("grouped")
    kw = dict(temperature=0.0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    eng = HFEngine(model, tok, batch_size=4, mode="fast")
    eng._free_bytes = lambda: pytest.fail("no kv_reserve: memory is not read")
    sample(eng, prompts, seeds, **kw)
    assert eng.decoder.S == 4
    cpu = HFEngine(model, tok, batch_size=None, mode="fast", kv_reserve=123)  # the real _free_bytes: None on CPU
    sample(cpu, prompts, seeds, **kw)
    assert cpu.decoder.S == len(prompts)


def test_03_sampler_flags_and_reserve(monkeypatch):
    """--sampler-slots fixes the slots (no reserve: no budget); on CPU no reserve; with --sampler-sleep only the
    sampler's own workspace; else the trainer's pending gradients and moments, its gathered bf16 copy and the
    activation share (moments left out when offloaded, and once they exist)."""
    import importlib.util
    from lib.artifacts import REPO
    spec = importlib.util.spec_from_file_location("opd_train_03_flags", REPO / "03_opd_train.py")
    m03 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m03)
    a = m03.parse_args(["--pair=toy"])
    assert a.sampler_slots is None and a.sampler_kv_margin is None
    b = m03.parse_args(["--pair=toy", "--sampler-slots", "96", "--sampler-kv-margin", "2.5"])
    assert (b.sampler_slots, b.sampler_kv_margin) == (96, 2.5)
    from lib.train import step_phases as sp
    student = torch.nn.Linear(10, 10, bias=False)                       # 100 fp32 parameters: 400 bytes
    optim = torch.optim.AdamW(student.parameters())
    args = SimpleNamespace(sampler_slots=None, sampler_kv_margin=None, sampler_sleep=False, offload_optimizer=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (0, 1000 * 2**20))
    share = int(sp.ACTIVATION_SHARE * 1000 * 2**20)
    assert sp.sampler_reserve(args, student, optim, cuda=False) is None
    assert sp.sampler_reserve(SimpleNamespace(**{**vars(args), "sampler_slots": 8}), student, optim, True) is None
    r = sp.sampler_reserve(args, student, optim, cuda=True)
    assert r() == sp.SAMPLER_WORKSPACE + 400 + 800 + 200 + share            # grads, moments, bf16 copy, activations
    args.offload_optimizer = True
    assert r() == sp.SAMPLER_WORKSPACE + 400 + 200 + share
    args.offload_optimizer = False
    student(torch.ones(1, 10)).sum().backward()
    optim.step()                                                           # gradients and moments now resident
    assert r() == sp.SAMPLER_WORKSPACE + 200 + share
    args.sampler_sleep = True
    assert r() == sp.SAMPLER_WORKSPACE
    args.sampler_kv_margin = 1.5
    assert r() == int(1.5 * 2**30)
