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
