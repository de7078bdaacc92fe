"""lib/decode.py's loop against independent references on a tiny random Qwen2 (fp32, CPU):

- greedy = `model.generate` per prompt (unpadded), with odd prompt lengths, fewer slots than requests (refills), a
  row that stops early and rows that hit the cap, in the default CPU configuration and in the GPU one (several steps
  per host sync, bucketed key lengths, GEMM attention) run eagerly;
- sampled tokens = a teacher-forced reference that re-runs the whole prefix through the model at every step and
  draws with the same (seed, step) key, for both modes; raw log-probs within 1e-4 of that forward pass (the
  training loop's `rollout/logprob_gap` must stay < 1e-3 in fp32).
"""
from __future__ import annotations

import math

import pytest
import torch

from lib.decode import Decoder
from lib.draw import M32, gumbel_noise, split_seeds, uniform52
from test_sampling import build_tokenizer, forward_logprobs, reference_probs

MAX_NEW = 9
GPU_STYLE = dict(sync_every=4, kv_bucket=8, attn_impl="matmul")     # what CUDA runs, minus the graphs


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


@pytest.mark.parametrize("config", [{}, GPU_STYLE], ids=["cpu", "gpu-style"])
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
    """One draw written from the definitions in lib/draw.py's docstring, in Python floats where it can be."""
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
