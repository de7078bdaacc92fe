"""bench/varlen_check.py — on a CUDA machine: PyTorch's varlen_attn, called as lib/kernels/varlen.py calls it, against
the per-sequence SDPA reference in fp32 (forward and the three input gradients), with 2 and with 12 KV heads for 12
query heads (grouped-query and plain), lengths 37, 200, 1, 129. Prints the installed signature and the keyword
arguments lib/kernels/varlen.py derived from it, then the largest differences (bf16 kernel vs fp32 reference).

    python3 bench/varlen_check.py
"""
import inspect, torch, transformers, sys
sys.path.insert(0, ".")
print("torch", torch.__version__, "transformers", transformers.__version__)
from torch.nn.attention.varlen import varlen_attn
print("varlen_attn", inspect.signature(varlen_attn))
from lib.kernels import varlen
print("kwargs used", varlen._VARLEN_KW)
torch.manual_seed(0)
lens = [37, 200, 1, 129]
cu = varlen.cu_seqlens(lens).cuda()
T = sum(lens)
for hkv in (2, 12):
    q = torch.randn(T, 12, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(T, hkv, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(T, hkv, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = varlen._flash(q, k, v, cu, max(lens), 128 ** -0.5)
    ref = varlen.reference(q.float(), k.float(), v.float(), cu, max(lens), 128 ** -0.5)
    g = torch.randn_like(out)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), g)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), g.float())
    print(f"hkv {hkv}: fwd max|diff| {(out.float()-ref).abs().max().item():.4f} (|ref| max {ref.abs().max().item():.2f}); "
          f"grad q {(gq.float()-rq).abs().max().item():.4f} k {(gk.float()-rk).abs().max().item():.4f} v {(gv.float()-rv).abs().max().item():.4f}")

# shared prompts (lib/train/scoring.pack_shared, 03's --share-prompts): query and key segments of different lengths,
# the keys gathered by KV_INDEX; the kernel must align its causal mask bottom-right, as the reference does. Prompts of
# 37 and 129 tokens, each drawn 3 times (responses 200, 1, 64 and 5, 90, 17 tokens).
from lib.train.scoring import pack
prompts = [[1] * 37] * 3 + [[2] * 129] * 3
batch = pack(prompts, [[3] * n for n in (200, 1, 64, 5, 90, 17)], 0, packed=True, share_prompts=True).to("cuda")
T = batch.input_ids_BT.shape[1]
kw = {"cu_seq_lens_q": batch.cu_seqlens, "max_length_q": batch.max_len, "cu_seq_lens_k": batch.cu_seqlens_k,
      "max_length_k": batch.max_len_k, varlen.KV_INDEX: batch.kv_index}
for hkv in (2, 12):
    q = torch.randn(1, 12, T, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, hkv, T, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, hkv, T, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = varlen.attention(None, q, k, v, None, scaling=128 ** -0.5, **kw)[0]
    ref = varlen.attention(None, q.float(), k.float(), v.float(), None, scaling=128 ** -0.5, **kw)[0]
    g = torch.randn_like(out)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), g)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), g.float())
    print(f"shared prompts, hkv {hkv}: fwd max|diff| {(out.float() - ref).abs().max().item():.4f} (|ref| max "
          f"{ref.abs().max().item():.2f}); grad q {(gq.float() - rq).abs().max().item():.4f} "
          f"k {(gk.float() - rk).abs().max().item():.4f} v {(gv.float() - rv).abs().max().item():.4f}")
    # bf16 rounding moves an output by ~1e-2; a mask aligned top-left would move the response rows by O(1)
    print(("PASS" if (out.float() - ref).abs().max().item() < 0.05 else "FAIL") + f" shared prompts, hkv {hkv}: the "
          "kernel's causal mask is aligned bottom-right")
