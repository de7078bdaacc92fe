"""lib/kernels/varlen.py and packed batches: the glue around varlen_attn against an independent dense reference, the
signature adaptation across torch releases, the packed layout's indexing, and the profile bench's CPU smoke.
(The packed scorer's log-probs and gradient = plain padded HF: tests/test_train_step.py; 2 packed gloo processes =
1 padded process: tests/test_train.py. The real FlashAttention kernel runs on CUDA only: bench/varlen_check.py.)"""
import json
import subprocess
import sys

import pytest
import torch

from helpers import REPO
from lib.kernels import varlen
from lib.train.scoring import TokenScorer, pack

pytestmark = pytest.mark.usefixtures("one_thread")


def dense_block_causal(q, k, v, cu, scale):
    """(T, H, D) attention over the whole packed row with a block-diagonal causal mask (one matrix, no loop)."""
    T = q.shape[0]
    doc = torch.bucketize(torch.arange(T), cu[1:].long(), right=True)
    pos = torch.arange(T)
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    s = torch.einsum("thd,shd->hts", q, k) * scale
    return torch.einsum("hts,shd->thd", s.masked_fill(~allowed, float("-inf")).softmax(-1), v)


def fake_varlen_211(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
    """torch 2.11's varlen_attn contract on CPU: equal head counts required, window_size (-1, 0) = causal."""
    if query.shape[1] != key.shape[1]:
        raise ValueError("Expect query and key/value to have the same number of heads")
    assert torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    assert max_q >= int((cu_seq_q[1:] - cu_seq_q[:-1]).max())
    if window_size != (-1, 0):
        raise AssertionError(f"not causal: window_size {window_size}")
    return dense_block_causal(query, key, value, cu_seq_q, scale or query.shape[-1] ** -0.5)


@pytest.mark.parametrize("hkv", [2, 6])
def test_flash_glue_and_reference_equal_a_dense_block_causal_mask(hkv, monkeypatch):
    g = torch.Generator().manual_seed(0)
    lens = [1, 7, 3, 12]
    cu, T = varlen.cu_seqlens(lens), sum(lens)
    q = torch.randn(T, 6, 8, generator=g)
    k, v = torch.randn(T, hkv, 8, generator=g), torch.randn(T, hkv, 8, generator=g)
    want = dense_block_causal(q, k.repeat_interleave(6 // hkv, 1), v.repeat_interleave(6 // hkv, 1), cu, 0.3)
    monkeypatch.setattr(varlen, "_VARLEN", fake_varlen_211)             # the CUDA kernel's place, on CPU
    monkeypatch.setattr(varlen, "_VARLEN_KW", varlen.call_kwargs(fake_varlen_211))
    got = varlen._flash_kernel(q, k, v, cu, max(lens), 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(varlen.reference(q, k, v, cu, max(lens), 0.3), want, atol=1e-5, rtol=1e-5)


def test_call_kwargs_follow_the_installed_signature():
    def v210(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None): ...
    def v212(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
             enable_gqa=False): ...
    assert varlen.call_kwargs(v210) == {"is_causal": True}
    assert varlen.call_kwargs(fake_varlen_211) == {"window_size": (-1, 0), "scale": None}
    assert varlen.call_kwargs(v212) == {"window_size": (-1, 0), "enable_gqa": True, "scale": None}


def test_packed_layout_indexes_the_same_tokens_as_the_padded_one():
    prompts, responses = [[5, 6, 7], [8], [9, 10]], [[1, 2], [3, 4, 11, 12], [13]]
    pad, pk = pack(prompts, responses, 0), pack(prompts, responses, 0, packed=True)
    assert torch.equal(pad.targets_N, pk.targets_N) and torch.equal(pad.seq_of_N, pk.seq_of_N)
    assert pk.input_ids_BT.shape == (1, 13) and pk.attention_mask_BT is None and pk.max_len == 5
    assert pk.cu_seqlens.tolist() == [0, 5, 10, 13] and pk.position_ids_BT[0].tolist() == [0, 1, 2, 3, 4] * 2 + [0, 1, 2]
    # the hidden state at (row, col) predicts the token at col + 1: the target, in both layouts
    assert torch.equal(pk.input_ids_BT[pk.rows_N, pk.cols_N + 1], pk.targets_N)
    assert torch.equal(pad.input_ids_BT[pad.rows_N, pad.cols_N + 1], pad.targets_N)


def test_a_scorer_refuses_the_other_layout():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=50)
    packed_scorer = TokenScorer(Qwen2ForCausalLM(cfg), packed=True)
    with pytest.raises(ValueError, match="padded batch given to a scorer built for packed"):
        packed_scorer(pack([[1, 2]], [[3]], 0), None, topk=2)
    with pytest.raises(ValueError, match="needs a packed batch"):
        varlen.attention(None, *(torch.zeros(1, 2, 3, 4) for _ in range(3)), None)


def test_profile_bench_cpu_smoke(tmp_path):
    """bench/profile_step.py end to end on a tiny model: the three layouts run, score the same (fp32), and report; the
    shared one forwards each prompt of 2 rollouts once per micro-batch."""
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "bench/profile_step.py", "--shape", "tiny", "--seqs", "6", "--resp", "5",
                        "--prompt-min", "2", "--prompt-max", "9", "--rollouts", "2", "--topk", "3", "--reps", "1",
                        "--no-profile", "--variants", "off:4:2,on:4:2,shared:4:2", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    off, on, shared = res["variants"]
    assert [v["packing"] for v in res["variants"]] == [False, True, True] and shared["shared_prompts"]
    assert off["score_tokens"] == on["score_tokens"] == on["update_tokens"] == res["meta"]["tokens"]
    assert shared["score_tokens"] < on["score_tokens"] and shared["update_tokens"] < on["update_tokens"]
    assert res["meta"]["packed_vs_padded_max_abs_lp"] < 1e-5 and res["meta"]["shared_vs_packed_max_abs_lp"] < 1e-5


# --- shared prompts: each distinct prompt laid out once, its responses attending to it (pack_shared) ---

SHARED_P = [[1, 2, 3], [1, 2, 3], [4, 5], [1, 2, 3], [7], [4, 5]]       # equal prompts, not all adjacent
SHARED_R = [[9, 8, 7, 6], [5], [3, 3, 3], [], [2, 2], [1, 2, 3, 4, 5]]   # an empty response among them


def test_the_shared_layout_predicts_each_token_from_the_same_token_and_position():
    """For every response token, the hidden state that predicts it sits on the same token id at the same position as
    in the unshared packed layout; each distinct prompt appears once; segments and their keys are as documented."""
    plain, shared = pack(SHARED_P, SHARED_R, 0, packed=True), pack(SHARED_P, SHARED_R, 0, packed=True,
                                                                    share_prompts=True)
    assert torch.equal(plain.targets_N, shared.targets_N) and torch.equal(plain.seq_of_N, shared.seq_of_N)
    for f in ("input_ids_BT", "position_ids_BT"):
        assert torch.equal(getattr(plain, f)[0, plain.cols_N], getattr(shared, f)[0, shared.cols_N]), f
    assert shared.input_ids_BT.shape[1] == 3 + 2 + 1 + sum(map(len, SHARED_R))       # the prompts once each
    # segments: [1 2 3] [9 8 7 6] [5] | [4 5] [3 3 3] [1 2 3 4 5] | [7] [2 2]; keys: a prompt alone, a response after it
    assert shared.cu_seqlens.tolist() == [0, 3, 7, 8, 10, 13, 18, 19, 21]
    assert shared.cu_seqlens_k.tolist() == [0, 3, 10, 14, 16, 21, 28, 29, 32]
    row = shared.input_ids_BT[0]
    keys = row[shared.kv_index]
    assert keys[3:10].tolist() == [1, 2, 3, 9, 8, 7, 6] and keys[21:28].tolist() == [4, 5, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="packed=True, share_prompts=True"):
        pack(SHARED_P, SHARED_R, 0, share_prompts=True)


def dense_shared(q, k, v, batch, scale):
    """(T, H, D) attention over the shared row with one mask written from the layout's meaning: a token sees the
    tokens before it in the row that are its own segment's, or its prompt's when it is a response."""
    T, bounds = q.shape[0], batch.cu_seqlens.tolist()
    seg = torch.bucketize(torch.arange(T), batch.cu_seqlens[1:].long(), right=True)
    pos = batch.position_ids_BT[0]
    is_prompt = torch.zeros(len(bounds) - 1, dtype=torch.bool)
    prompt_of = torch.zeros(len(bounds) - 1, dtype=torch.long)
    for s in range(len(bounds) - 1):               # a segment that starts at position 0 is a prompt
        is_prompt[s] = pos[bounds[s]] == 0
        prompt_of[s] = s if is_prompt[s] else prompt_of[s - 1]
    sq, sk = seg[:, None], seg[None, :]
    allowed = (torch.arange(T)[None, :] <= torch.arange(T)[:, None]) & (
        (sq == sk) | (is_prompt[sk] & (prompt_of[sq] == sk)))
    s_ = torch.einsum("thd,shd->hts", q, k) * scale
    return torch.einsum("hts,shd->thd", s_.masked_fill(~allowed, float("-inf")).softmax(-1), v)


def fake_varlen_two_layouts(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                            window_size=(-1, -1)):
    """varlen_attn's contract with query and key segments of different lengths, causal aligned bottom-right (as
    FlashAttention's), each segment by one dense softmax."""
    assert window_size == (-1, 0)
    out = torch.empty_like(query)
    for a, b, c, d in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist(), cu_seq_k[:-1].tolist(), cu_seq_k[1:].tolist()):
        assert b - a <= max_q and d - c <= max_k
        s_ = torch.einsum("thd,shd->hts", query[a:b], key[c:d]) * scale
        j, i = torch.arange(d - c)[None, :], torch.arange(b - a)[:, None]
        out[a:b] = torch.einsum("hts,shd->thd", s_.masked_fill(j > i + (d - c) - (b - a), float("-inf")).softmax(-1),
                                value[c:d])
    return out


@pytest.mark.parametrize("path", ["reference", "flash glue"])
def test_shared_attention_equals_a_dense_shared_mask(path, monkeypatch):
    """varlen.attention on a shared-prompt batch (the KV_INDEX gather, the key segments, bottom-right causal) against
    one dense mask over the row; through the CPU reference and through the flash path's glue (its kernel's place taken
    by a dense per-segment contract)."""
    batch = pack(SHARED_P, SHARED_R, 0, packed=True, share_prompts=True)
    g = torch.Generator().manual_seed(1)
    T = batch.input_ids_BT.shape[1]
    q = torch.randn(1, 4, T, 8, generator=g)
    k, v = torch.randn(1, 2, T, 8, generator=g), torch.randn(1, 2, T, 8, generator=g)
    want = dense_shared(q[0].transpose(0, 1), k[0].transpose(0, 1).repeat_interleave(2, 1),
                        v[0].transpose(0, 1).repeat_interleave(2, 1), batch, 0.3)
    kw = {"cu_seq_lens_q": batch.cu_seqlens, "max_length_q": batch.max_len, "cu_seq_lens_k": batch.cu_seqlens_k,
          "max_length_k": batch.max_len_k, varlen.KV_INDEX: batch.kv_index}
    if path == "flash glue":         # attention's own gather and segments, handed to the CUDA path's glue
        monkeypatch.setattr(varlen, "_VARLEN", fake_varlen_two_layouts)
        monkeypatch.setattr(varlen, "_VARLEN_KW", varlen.call_kwargs(fake_varlen_two_layouts))
        monkeypatch.setattr(varlen, "reference", varlen._flash_kernel)
    got = varlen.attention(None, q, k, v, None, scaling=0.3, **kw)[0][0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_shared_prompt_scorer_equals_the_unshared_one():
    """TokenScorer on the shared layout: the student's log-probs, top-K, entropy and parameter gradient, and a
    teacher's log-probs at given ids, equal the unshared packed layout's (fp32, CPU reference attention)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=60)
    lm = Qwen2ForCausalLM(cfg).float()
    scorer = TokenScorer(lm, packed=True, temperature=0.7)
    got = []
    for share in (False, True):
        batch = pack(SHARED_P, SHARED_R, 0, packed=True, share_prompts=share)
        lm.zero_grad()
        lp, ids, tlp, ent = scorer(batch, None, topk=3)
        (lp.sum() + tlp.square().sum() + ent.sum()).backward()
        with torch.no_grad():
            teacher = scorer(batch, ids)
        got.append([lp, ids, tlp, ent, teacher] + [p.grad.clone() for p in lm.parameters()])
    for a, b in zip(*got):
        torch.testing.assert_close(a.detach(), b.detach(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2)])
def test_reference_values_and_gradients_are_each_segments_own_to_the_bit(heads, kv_heads):
    """The CPU fallback splits the row into segments and concatenates their outputs (so its backward stays linear in
    the segments, bench/varlen_cpu.py). Its output and its q, k, v gradients must be, bit for bit, those of each
    segment attended on its own from separate leaves (shared-prompt shapes: a query segment shorter than its keys,
    bottom-right causal)."""
    g = torch.Generator().manual_seed(3)
    lq, lk = [5, 3, 4, 6, 2], [5, 8, 9, 6, 8]                  # a prompt segment, responses that see a prompt too
    cu, cu_k = varlen.cu_seqlens(lq), varlen.cu_seqlens(lk)
    q = torch.randn(sum(lq), heads, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(sum(lk), kv_heads, 16, generator=g, requires_grad=True) for _ in range(2))
    up = torch.randn(sum(lq), heads, 16, generator=g)
    out = varlen.reference(q, k, v, cu, max(lq), 0.25, cu_k, max(lk))
    out.backward(up)
    want_o, want_g = [], [[], [], []]
    for i in range(len(lq)):
        a, b, c, d = int(cu[i]), int(cu[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        leaves = [x.detach()[s:e].clone().requires_grad_() for x, (s, e) in ((q, (a, b)), (k, (c, d)), (v, (c, d)))]
        qs, ks, vs = (x.transpose(0, 1) for x in leaves)
        if heads != kv_heads:
            ks, vs = ks.repeat_interleave(heads // kv_heads, 0), vs.repeat_interleave(heads // kv_heads, 0)
        see = torch.arange(d - c)[None, :] <= torch.arange(b - a)[:, None] + (d - c) - (b - a)
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=see, scale=0.25).transpose(0, 1)
        o.backward(up[a:b])
        want_o.append(o.detach())
        for w, x in zip(want_g, leaves):
            w.append(x.grad)
    assert torch.equal(out.detach(), torch.cat(want_o))
    for got, want in zip((q.grad, k.grad, v.grad), want_g):
        assert torch.equal(got, torch.cat(want))
    with pytest.raises(ValueError, match="must cover the rows"):
        varlen.reference(q[:-1], k, v, cu, max(lq), 0.25, cu_k, max(lk))


def test_varlen_cpu_bench_compares_like_with_like(tmp_path):
    """bench/varlen_cpu.py times the fallback against one batched SDPA call and one call per segment shape: each
    variant must compute the same attention (output and gradients) as the reference it is timed against, or its ratio
    means nothing."""
    out = tmp_path / "v.json"
    p = subprocess.run([sys.executable, "bench/varlen_cpu.py", "--prompts", "3", "--repeats", "1", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(out.read_text())
    diff = row["max_abs_diff"]
    assert row["segments"] == 3 * 5 and diff["per segment (varlen.reference)"] == 0
    assert 0 <= diff["one batched call"] < 1e-4 and 0 <= diff["one call per segment shape"] < 1e-4


def test_what_packed_attention_refuses_is_named():
    q, kv = torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4)
    packed = {"cu_seq_lens_q": varlen.cu_seqlens([2, 3]), "max_length_q": 3}
    out, _ = varlen.attention(None, q, kv, kv, None, **packed)
    assert out.shape == (1, 5, 2, 4)
    with pytest.raises(ValueError, match="needs a packed batch"):
        varlen.attention(None, q, kv, kv, None)
    with pytest.raises(ValueError, match="a packed batch is one row; got 2 rows"):
        varlen.attention(None, q.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1), None,
                         **packed)
    with pytest.raises(ValueError, match="no dropout"):
        varlen.attention(None, q, kv, kv, None, dropout=0.1, **packed)
    with pytest.raises(ValueError, match="given without cu_seq_lens_k"):
        varlen.attention(None, q, kv, kv, None, **packed, **{varlen.KV_INDEX: torch.arange(5)})
