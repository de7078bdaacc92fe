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
    """bench/profile_step.py end to end on a tiny model: both layouts run, score the same (fp32), and report."""
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "bench/profile_step.py", "--shape", "tiny", "--seqs", "6", "--resp", "5",
                        "--prompt-min", "2", "--prompt-max", "9", "--topk", "3", "--reps", "1", "--no-profile",
                        "--variants", "off:4:2,on:4:2", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [v["packing"] for v in res["variants"]] == [False, True]
    assert res["meta"]["packed_vs_padded_max_abs_lp"] < 1e-5
