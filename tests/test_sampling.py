"""lib/sample/engine.py + lib/sample/draw.py, `hf` backend (lib/sample/decode.py's loop): greedy = plain generate, raw log-probs = a teacher-forced forward pass (fp32, 1e-4),
seeded samples independent of batch size and neighbours, exact Gumbel-max + top-p distribution, stop/length.

The model is a tiny random Qwen2 (head_dim 64, init std 0.2 so its outputs are diverse and peaked) with a small
byte-level BPE tokenizer trained here; both are saved to a folder, as the vLLM test needs one too.
"""
from __future__ import annotations

import copy
import json
import math
import random
import sys

import pytest
import torch

from helpers import DEV
from lib.sample.completion import stop_ids
from lib.sample.draw import draw_tokens, gumbel_noise, mix32, nucleus, split_seeds, topk_two_stage
from lib.sample.engine import HFEngine, load_engine, sample

MAX_NEW = 12


# --- the tiny world ---

def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog. What is 2+3? The answer is 5."] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def build_model(vocab_size: int, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=True, initializer_range=0.2)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def make_prompts(n: int, seed: int = 0, vocab: int = 300) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 12))] for _ in range(n)]


def forward_logprobs(model, prompt: list[int], ids: list[int]) -> list[float]:
    """Reference: one teacher-forced forward pass over prompt + ids, log_softmax, the realized tokens."""
    with torch.no_grad():
        logits_TV = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits_TV, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tok = build_tokenizer()
    model = build_model(len(tok))
    model.generation_config.eos_token_id = [tok.eos_token_id]
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok, model, folder


def engine(world, **kw):
    tok, model, _ = world
    return HFEngine(model, tok, batch_size=kw.pop("batch_size", 4), **kw)


# --- the counter-based RNG ---

def test_mix32_matches_python_big_int_reference():
    def ref(x):
        for _ in range(2):
            x = (((x >> 16) ^ x) * 0x45D9F3B) % 2**32
        return (x >> 16) ^ x
    rng = random.Random(1)
    xs = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + [rng.randrange(2**32) for _ in range(2000)]
    got = mix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [ref(x) for x in xs]
    assert len(set(got)) == len(set(xs))                             # a bijection on 32 bits: no collisions


def test_seeds_split_as_unsigned_64_bit():
    lo, hi = split_seeds([0, 2**64 - 1, -1, 2**32 + 7])
    assert lo.tolist() == [0, 2**32 - 1, 2**32 - 1, 7] and hi.tolist() == [0, 2**32 - 1, 2**32 - 1, 1]


def test_gumbel_noise_has_gumbel_moments_and_decorrelates_steps_and_seeds():
    lo, hi = split_seeds(list(range(64)) + [2**63 + 5])
    idx = torch.arange(4096).expand(65, 4096)
    g0, g1 = gumbel_noise(lo, hi, 0, idx), gumbel_noise(lo, hi, 1, idx)
    assert torch.equal(g0, gumbel_noise(lo, hi, 0, idx))                              # deterministic
    g = torch.cat([g0.flatten(), g1.flatten()])
    assert abs(g.mean().item() - 0.5772157) < 0.01                                    # Euler–Mascheroni
    assert abs(g.var().item() - math.pi**2 / 6) < 0.03
    u = torch.exp(-torch.exp(-g))                                                     # back to uniforms
    hist = torch.histc(u.float(), bins=20, min=0, max=1) / u.numel()
    assert (hist - 0.05).abs().max() < 0.002
    for a, b in [(g0, g1), (g0[:-1], g0[1:])]:                                        # steps; neighbouring seeds
        assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 0.01


# --- the sampler's distribution ---

def reference_probs(logits: list[float], T: float, top_p: float) -> list[float]:
    """softmax(logits/T) restricted to the top-p nucleus, written independently of lib.sample.engine."""
    z = [x / T for x in logits]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    p = [x / sum(e) for x in e]
    kept, mass = set(), 0.0
    for i in sorted(range(len(p)), key=lambda i: -p[i]):
        if mass < top_p:
            kept.add(i)
        mass += p[i]
    s = sum(p[i] for i in kept)
    return [p[i] / s if i in kept else 0.0 for i in range(len(p))]


def chi2_pvalue(counts: list[int], probs: list[float]) -> float:
    """Pearson chi-square of counts against probs (cells with expected < 5 pooled); upper-tail p-value."""
    n = sum(counts)
    cells, pool_c, pool_e = [], 0, 0.0
    for c, p in zip(counts, probs):
        if p == 0:
            assert c == 0, "a token outside the nucleus was sampled"
        elif n * p < 5:
            pool_c, pool_e = pool_c + c, pool_e + n * p
        else:
            cells.append((c, n * p))
    if pool_e > 0:
        cells.append((pool_c, pool_e))
    stat = sum((c - e) ** 2 / e for c, e in cells)
    return torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2, dtype=torch.float64),
                                   torch.tensor(stat / 2, dtype=torch.float64)).item()


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("T,top_p,n_kept", [(1.0, 1.0, 6), (0.7, 0.815, 2), (0.7, 0.83, 3), (1.5, 0.95, 5)])
def test_draw_frequencies_match_tempered_top_p_softmax(T, top_p, n_kept, mode):
    logits = [2.0, 1.6, 1.0, 0.0, -0.5, -1.0]
    probs = reference_probs(logits, T, top_p)
    assert sum(p > 0 for p in probs) == n_kept                                        # the case is the intended one
    N = 40_000
    lo, hi = split_seeds([1000 + s for s in range(N)])
    tok, _ = draw_tokens(torch.tensor([logits]).expand(N, -1), lo, hi, 3, T, top_p, greedy=False,
                         use_top_p=top_p < 1, mode=mode)
    counts = torch.bincount(tok, minlength=len(logits)).tolist()
    assert chi2_pvalue(counts, probs) > 1e-4, (counts, probs)


def test_nucleus_keeps_exactly_the_reference_set():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(8, 50, generator=g) * 2
    idx, zk = nucleus(z, 0.9)
    for b in range(8):
        ref = {i for i, p in enumerate(reference_probs(z[b].tolist(), 1.0, 0.9)) if p > 0}
        assert {int(i) for i, v in zip(idx[b], zk[b]) if v > float("-inf")} == ref


def test_nucleus_boundary_and_inverse_cdf_by_hand():
    """Where the mass ranked above a token equals p exactly, the token is outside the nucleus (mass above < p); the
    inverse CDF picks the first entry whose cumulative mass EXCEEDS u · (nucleus mass), and u · mass rounded up to the
    mass itself stays inside the nucleus. Four equal probabilities of 1/4 make every sum exact in binary."""
    from lib.sample.draw import _inverse_cdf
    idx, zk = nucleus(torch.zeros(1, 4), 0.5)
    assert (zk > float("-inf")).sum().item() == 2                   # mass above: 0, 1/4 kept; 1/2 = p is not
    p = torch.full((3, 4), 0.25)
    n_keep, u = torch.tensor([4, 4, 2]), torch.tensor([0.5, 0.8, 1.0], dtype=torch.float64)
    # u · mass = 0.5 (= the 2nd cumulative sum: the next entry), 0.8 (the 4th), 0.5 with a nucleus of 2 (its last)
    assert _inverse_cdf(p, n_keep, u, blocked=False).tolist() == [2, 3, 1]


def test_blocked_inverse_cdf_is_the_plain_search():
    """The two-level search (the fast draw's default on CUDA) = the one-level search, on sums exact in binary (every
    probability a multiple of 1/64), with nuclei ending inside a block, at a block's edge and in the padded last one."""
    from lib.sample.draw import _inverse_cdf, _inverse_cdf_blocked
    g = torch.Generator().manual_seed(0)
    B, K = 64, 37
    p = torch.randint(0, 4, (B, K), generator=g).float()
    p[:, 0] += 1                                                    # every nucleus has mass
    p /= 64
    n_keep = torch.randint(1, K + 1, (B,), generator=g)
    n_keep[:4] = torch.tensor([8, 16, 36, 37])
    u = torch.randint(1, 64, (B,), generator=g).double() / 64      # many u · mass on a cumulative sum exactly
    plain = _inverse_cdf(p, n_keep, u, blocked=False)
    assert torch.equal(_inverse_cdf_blocked(p, n_keep, u, blk=8), plain)
    assert torch.equal(_inverse_cdf(p, n_keep, u, blocked=True), _inverse_cdf_blocked(p, n_keep, u))
    assert (plain < n_keep).all()


@pytest.mark.parametrize("B,V,k,chunk", [(3, 5000, 16, 1024), (2, 1030, 16, 1024), (5, 2049, 4, 1024),
                                         (4, 100, 16, 1024), (3, 3000, 8, 7), (2, 4096, 16, 1024)])
def test_two_stage_topk_is_torch_topk(B, V, k, chunk):
    """draw.topk_two_stage (bench/student_scores.py's two-stage variants; measured slower than one torch.topk, so
    not the sampler's default) returns torch.topk's values and ids on
    rows that are not a whole number of chunks, on chunks smaller than k, and on rows shorter than one chunk; with the
    row's largest entry placed in the last, padded chunk, and a row of negative entries only."""
    z = torch.randn(B, V, generator=torch.Generator().manual_seed(V)) * 3
    z[0, -1] = 100.0
    z[1] = -z[1].abs() - 1                         # every entry below the padding a careless pad would add (0)
    got, want = topk_two_stage(z, k, chunk), torch.topk(z, k, dim=-1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_one_step_engine_frequencies_match_forward_softmax(world, mode):
    tok, model, _ = world
    prompt, N, T, top_p = make_prompts(1, seed=5)[0], 4000, 0.7, 0.8
    outs = sample(engine(world, batch_size=1000, mode=mode), [prompt] * N, list(range(N)), temperature=T, top_p=top_p,
                  max_new_tokens=1, progress=False)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].tolist()
    probs = reference_probs(logits, T, top_p)
    counts = [0] * len(logits)
    for c in outs:
        counts[c.token_ids[0]] += 1
    assert 3 <= sum(p > 0 for p in probs) < 100                                       # a real nucleus
    assert chi2_pvalue(counts, probs) > 1e-4


# --- the hf backend against plain transformers ---

def test_greedy_equals_plain_generate_and_logprobs_equal_forward(world):
    tok, model, _ = world
    prompts = make_prompts(6, seed=1)
    eng = engine(world, batch_size=4)                                                 # left padding in play
    outs = sample(eng, prompts, [0] * 6, temperature=0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    for p, c in zip(prompts, outs):
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_NEW,
                             eos_token_id=eng.stop, pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        assert c.token_ids == ref[:len(c.token_ids)] and len(c.token_ids) == len(ref)
        assert max(abs(a - b) for a, b in zip(c.logprobs, forward_logprobs(model, p, c.token_ids))) < 1e-4


@pytest.mark.parametrize("T,top_p", [(0.7, 0.9), (1.0, 1.0), (1.3, 0.95)])
def test_sampled_logprobs_are_raw_and_equal_forward(world, T, top_p):
    _, model, _ = world
    prompts = make_prompts(5, seed=2)
    outs = sample(engine(world), prompts, [11, 12, 13, 14, 15], temperature=T, top_p=top_p,
                  max_new_tokens=MAX_NEW, progress=False)
    for p, c in zip(prompts, outs):
        assert len(c.logprobs) == len(c.token_ids)
        assert max(abs(a - b) for a, b in zip(c.logprobs, forward_logprobs(model, p, c.token_ids))) < 1e-4


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_same_seed_same_sample_whatever_the_batch(world, mode):
    prompts, seeds = make_prompts(5, seed=3), [7, 2**40 + 3, 99, 2**64 - 1, 5]
    kw = dict(temperature=0.9, top_p=0.95, max_new_tokens=MAX_NEW, progress=False)
    alone = [sample(engine(world, batch_size=1, mode=mode), [p], [s], **kw)[0] for p, s in zip(prompts, seeds)]
    batched = sample(engine(world, batch_size=5, mode=mode), prompts, seeds, **kw)
    others = make_prompts(6, seed=9)                                                  # new neighbours, other order
    mixed = sample(engine(world, batch_size=3, mode=mode), others[:3] + prompts[::-1] + others[3:],
                   [1, 2, 3] + seeds[::-1] + [4, 5, 6], **kw)[3:8][::-1]
    for a, b, c in zip(alone, batched, mixed):
        assert a.token_ids == b.token_ids == c.token_ids and a.finish_reason == b.finish_reason == c.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, c.logprobs)) < 1e-5


def test_different_seeds_give_different_samples(world):
    prompt = make_prompts(1, seed=4)[0]
    outs = sample(engine(world), [prompt] * 8, list(range(8)), temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW,
                  progress=False)
    assert len({tuple(c.token_ids) for c in outs}) == 8


def test_stop_token_included_and_length_exactly_at_the_cap(world):
    tok, model, _ = world
    prompts, seeds = make_prompts(8, seed=6), list(range(100, 108))
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    free = sample(engine(world, stop_token_ids=[tok.eos_token_id]), prompts, seeds, **kw)
    stop_tok = free[0].token_ids[4]                       # a token the model emits: make it a stop id
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, stop_tok]
    try:
        eng = engine(world)                               # stop ids read from the model's generation config
        outs = sample(eng, prompts, seeds, **kw)
    finally:
        model.generation_config.eos_token_id = saved
    assert eng.stop == sorted({tok.eos_token_id, stop_tok})
    assert {c.finish_reason for c in outs} == {"stop", "length"}
    for f, c in zip(free, outs):
        hit = [i for i, t in enumerate(f.token_ids) if t in eng.stop]
        if hit:      # the same sample, cut right after its first stop id, which it includes
            assert c.finish_reason == "stop" and c.token_ids == f.token_ids[:hit[0] + 1]
            assert c.text == tok.decode(c.token_ids[:-1], skip_special_tokens=True)
        else:
            assert c.finish_reason == "length" and c.token_ids == f.token_ids and len(c.token_ids) == MAX_NEW
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.logprobs == pytest.approx(f.logprobs[:len(c.token_ids)], abs=1e-5)   # other batch-mates: fp32 noise


def test_model_generation_defaults_do_not_leak_and_train_mode_is_restored(world):
    tok, model, _ = world
    prompts = make_prompts(3, seed=7)
    kw = dict(temperature=0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    ref = sample(engine(world), prompts, [0] * 3, **kw)
    saved = model.generation_config
    gc = saved.__class__(**saved.to_dict())
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.min_new_tokens = 5.0, 1, MAX_NEW   # would change the output
    model.generation_config = gc
    model.train()
    try:
        outs = sample(engine(world), prompts, [0] * 3, **kw)
        assert model.training and model.generation_config is gc
    finally:
        model.generation_config = saved
        model.eval()
    assert [c.token_ids for c in outs] == [c.token_ids for c in ref]


def test_engine_from_folder_and_update_weights(world):
    tok, model, folder = world
    prompts = make_prompts(3, seed=8)
    kw = dict(temperature=0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    ref = [c.token_ids for c in sample(engine(world), prompts, [0] * 3, **kw)]
    from_folder = load_engine("hf", folder, tok, batch_size=2, dtype=torch.float32, device="cpu")
    assert [c.token_ids for c in sample(from_folder, prompts, [0] * 3, **kw)] == ref
    copy_eng = HFEngine(copy.deepcopy(model), tok)                 # 03_opd_train's pattern: a sampler copy
    g = torch.Generator().manual_seed(1)
    perturbed = {n: p + 0.3 * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    for eng in (from_folder, copy_eng):
        eng.update_weights(perturbed.items())
        assert [c.token_ids for c in sample(eng, prompts, [0] * 3, **kw)] != ref
        eng.update_weights(model.state_dict().items())             # with the tied alias lm_head.weight
        assert [c.token_ids for c in sample(eng, prompts, [0] * 3, **kw)] == ref
    with pytest.raises(KeyError, match="not a weight"):
        copy_eng.update_weights([("model.nope.weight", torch.zeros(1))])


def test_stop_ids_union_tokenizer_and_generation_config(world, tmp_path):
    tok, model, folder = world
    assert stop_ids(tok, folder) == [tok.eos_token_id]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, tok.eos_token_id, 5]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert stop_ids(tok, tmp_path) == sorted({5, 7, tok.eos_token_id})
    (tmp_path / "generation_config.json").unlink()
    assert stop_ids(tok, tmp_path) == sorted({9, tok.eos_token_id})                 # config.json fallback
    with pytest.raises(ValueError, match="no stop token"):
        stop_ids(None, tmp_path / "missing")


def test_sample_refuses_bad_arguments(world):
    eng = engine(world)
    with pytest.raises(ValueError, match="one seed per request"):
        sample(eng, [[5, 6]], [1, 2], temperature=1, top_p=1, max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        sample(eng, [[5, 6], []], [1, 2], temperature=1, top_p=1, max_new_tokens=4)
    with pytest.raises(ValueError, match="top_p"):
        sample(eng, [[5, 6]], [1], temperature=1, top_p=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="unknown sampling backend"):
        load_engine("sglang", "x", None)


def test_progress_bar_only_on_a_terminal(world, capsys, monkeypatch):
    """A bar is drawn where stderr is a terminal and nowhere else: a log file gets no carriage-return lines."""
    eng, prompts = engine(world, batch_size=4), make_prompts(3, seed=4)
    sample(eng, prompts, [0] * 3, temperature=0, top_p=1.0, max_new_tokens=2, progress="bar test")
    assert "bar test" not in capsys.readouterr().err                   # pytest's capture is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    sample(eng, prompts, [0] * 3, temperature=0, top_p=1.0, max_new_tokens=2, progress="bar test")
    assert "bar test" in capsys.readouterr().err


# --- an architecture the built-in decoder does not run: transformers' generate instead ---

@pytest.fixture(scope="module")
def mistral(world):
    from transformers import MistralConfig, MistralForCausalLM
    tok = world[0]
    cfg = MistralConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                        tie_word_embeddings=True, initializer_range=0.2, sliding_window=None)
    torch.manual_seed(3)
    return tok, MistralForCausalLM(cfg).eval()


def test_unknown_architecture_falls_back_to_generate(mistral, capsys):
    """A Mistral model: the engine says in one log line that it falls back, greedy equals plain generate with
    log-probs equal to a forward pass, and a seeded sample depends on its seed only (not its batch-mates)."""
    tok, model = mistral
    eng = HFEngine(model, tok, batch_size=4)
    prompts = make_prompts(5, seed=7)
    outs = sample(eng, prompts, [0] * 5, temperature=0, top_p=1.0, max_new_tokens=MAX_NEW, progress=False)
    log = capsys.readouterr().out
    assert "falling back to transformers' generate" in log and "MistralForCausalLM" in log
    for p, c in zip(prompts, outs):
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eng.stop,
                             pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        assert c.token_ids == ref
        assert max(abs(a - b) for a, b in zip(c.logprobs, forward_logprobs(model, p, c.token_ids))) < 1e-4
        ends = [i for i, t in enumerate(c.token_ids) if t in eng.stop]
        assert ends in ([], [len(c.token_ids) - 1]), "cut after the first stop id, and only there"
        assert c.finish_reason == ("stop" if ends else "length") and (ends or len(c.token_ids) == MAX_NEW)
    first = max((o.token_ids for o in outs), key=len)
    stop = next(t for t in first[2:] if t not in eng.stop)   # an id the greedy text reaches: cut right after it
    longest = prompts[max(range(len(outs)), key=lambda i: len(outs[i].token_ids))]
    stopped = sample(HFEngine(model, tok, stop_token_ids=[stop]), [longest], [0], temperature=0, top_p=1.0,
                     max_new_tokens=MAX_NEW, progress=False)[0]
    assert stopped.token_ids == first[:first.index(stop) + 1] and stopped.finish_reason == "stop"
    capsys.readouterr()
    kw = dict(temperature=1.0, top_p=0.9, max_new_tokens=MAX_NEW, progress=False)
    alone = sample(eng, prompts[2:3], [11], **kw)[0]
    among = sample(eng, prompts, [5, 6, 11, 8, 9], **kw)[2]
    other = sample(eng, prompts[2:3], [12], **kw)[0]
    assert alone.token_ids == among.token_ids and alone.logprobs == among.logprobs
    assert other.token_ids != alone.token_ids
    assert "falling back" not in capsys.readouterr().out                    # said once per engine


@pytest.mark.parametrize("B,V,k,T,block", [(3, 5000, 16, 1.0, 2048), (2, 777, 4, 0.7, 256), (4, 3000, 0, 1.3, 1024),
                                           (2, 2048, 16, 1.0, 2048), (1, 300, 16, 2.0, 64), (3, 3001, 16, 1.0, 64),
                                           (2, 5000, 8, 0.7, 128)])
def test_fused_student_scores_equal_the_torch_ops(B, V, k, T, block):
    """lib/sample/scores_triton.py's two passes (Triton's interpreter on CPU) against draw.student_scores: the drawn
    token's log-prob, the top-k ids and log-probs and the entropy, on rows that are not a whole number of blocks,
    at T ≠ 1, with k = 0, and with the row's largest logit in the last, partial block; with fewer blocks than k (no
    threshold) and with more (the threshold's fast path), and with every block taking the K rounds."""
    from lib.sample.draw import student_scores
    from lib.sample.scores_triton import student_scores_fused
    g = torch.Generator().manual_seed(V + k)
    x = torch.randn(B, V, generator=g) * 3
    x[0, -1] = 30.0
    tok = torch.randint(0, V, (B,), generator=g)
    x, tok, T = x.to(DEV), tok.to(DEV), torch.tensor(T, device=DEV)
    want = student_scores(x, tok, T, k)
    for threshold in (True, False):
        got = student_scores_fused(x, tok, T, k, block, threshold=threshold)
        assert got[1].shape == (B, k) and torch.equal(got[1], want[1])
        for a, b in zip(got[::2] + got[3:], want[::2] + want[3:]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fused_student_scores_keep_the_top_k_where_a_block_holds_many_candidates():
    """The threshold's slow path: a block with more than K entries at or above τ keeps its own K largest by K
    rounds. Row 0 puts 40 near-equal large logits in one block (and 3 in another), row 1 is constant (every block
    over K: ties, lower ids first, as the torch ops' sort), row 2 holds bf16 logits, which tie often. Row 3 is the
    threshold's edge: its K largest each lead their own block, so the K-th largest equals τ."""
    from lib.sample.draw import student_scores
    from lib.sample.scores_triton import student_scores_fused
    g = torch.Generator().manual_seed(0)
    V, k, block = 1000, 16, 128
    x = torch.randn(3, V, generator=g)
    x[0, 300:340] = 20 + torch.arange(40) * 1e-3
    x[0, [5, 600, 999]] = torch.tensor([25.0, 19.0, 26.0])
    x[1] = 0.5
    x[2] = (x[2] * 2).bfloat16().float()
    x = torch.cat([x, torch.randn(1, V, generator=g)])
    x[3, torch.arange(k) * 61 + 7] = 10 + torch.arange(k, dtype=torch.float32)   # the top k: one per block, so the
    tok = torch.tensor([3, 999, 17, 0])                                           # k-th largest is τ itself
    x, tok, one = x.to(DEV), tok.to(DEV), torch.tensor(1.0, device=DEV)
    want = student_scores(x, tok, one, k)
    got = student_scores_fused(x, tok, one, k, block)
    assert torch.equal(got[1][0], want[1][0]) and torch.equal(got[1][3], want[1][3])
    assert torch.equal(got[1][1], torch.arange(k, device=DEV))      # equal logits: the lowest ids, in order
    for a, b in zip(got[::2] + got[3:], want[::2] + want[3:]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    z2 = x[2] - torch.logsumexp(x[2], -1)
    torch.testing.assert_close(z2[got[1][2]], got[2][2], atol=1e-5, rtol=0)     # each id carries its log-prob
