"""The decode step's layer math for lib/sample/decode.py: the elementwise pieces of its original step (v1) and the two
blocks of its fast step (v2), which lib/sample/decode.py compiles as wholes on CUDA.

    v1   the model's own modules per projection, attention and norms glued by small functions (rms, add_rms,
         rope2, silu_mul, masked_softmax), each compiled to one kernel on CUDA (`fuse`); the CPU path, unchanged
    v2   per layer:  attn_in        h → one GEMM for q | k | v (concatenated weights) → per-head norms → rope
                     attention      lib/sample/decode_triton.py over the live length, or v1's masked GEMMs over a bucket
                     attn_out_mlp   o_proj, residual, norm, one GEMM for gate | up, act·up, down, residual, the
                                    next layer's norm
         each block one torch.compile graph (one per slot count), shared by all layers: weights are arguments.

FusedWeights holds the concatenated copies (q|k|v and gate|up per layer, memory: those weights twice) and rebuilds
them from the model's modules on `refresh()`, which lib/sample/decode.py calls at the start of every run: weights
changed in place (HFEngine.update_weights, or an optimizer step on a live student) reach the next run, never stale.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _rope(x, cos, sin):
    """Rotary embedding as Hugging Face applies it: x·cos + rotate_half(x)·sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# v1's elementwise pieces, written as functions so that on CUDA each compiles to one fused kernel: a small model's
# step is ~1,000 kernels, and at 2–4 µs each the launches, not the bytes, set its speed.

def _rms(x, w, eps: float):
    """RMSNorm as Qwen2 / Llama compute it: in fp32, the weight applied after the cast back."""
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _add_rms(x, d, w, eps: float):
    """The residual add and the next norm: (x + d, rms(x + d))."""
    x = x + d
    return x, _rms(x, w, eps)


def _rope2(q, k, cos, sin):
    return _rope(q, cos, sin), _rope(k, cos, sin)


def _silu_mul(g, u):
    return F.silu(g) * u


def _masked_softmax(w, mask, scale: float):
    return torch.softmax(w.float().mul(scale).masked_fill(~mask, float("-inf")), -1).to(w.dtype)


V1_PIECES = dict(rms=_rms, add_rms=_add_rms, rope2=_rope2, silu_mul=_silu_mul, masked_softmax=_masked_softmax)


# --- v2 ---

def _linears(h, ws, t=None):
    """[h·Wᵀ + b for (W, b) in ws]; one fused (W, b) or one per projection. t: a lib/sample/skinny_gemm.py tiling (its
    Triton partials, summed in the consumer's kernel), else cuBLAS."""
    if t:
        from lib.sample.skinny_gemm import linear
        return [linear(h, w, b, **t) for w, b in ws]
    return [F.linear(h, w, b) for w, b in ws]


def _residual(x, y):
    """x + y as the model adds them eagerly: y is the projection's output, already rounded to bf16, and the sum is
    taken in fp32 and rounded once more. The explicit casts keep Inductor from folding the add into the GEMM
    (add(x, mm) → addmm: one rounding, and cuBLAS first copying x into the output). The add then lands in the norm
    kernel that reads x anyway. On one H200 at the 1.5B shape, B = 64, this removed 57 copies (69 µs) of a
    2,645 µs step (bench/RESULTS.md, seventh run)."""
    return (x.float() + y.float()).to(x.dtype)


def make_blocks(H: int, Hkv: int, D: int, eps: float, act, compile_mode: str | None | bool,
                gemms: dict | None = None):
    """(attn_in, attn_out_mlp) for one model; compiled (dynamic=False, whole graphs) unless compile_mode is False.
    gemms: {"qkv" | "o" | "gate_up" | "down": a lib/sample/skinny_gemm.py tiling dict}, those projections' GEMMs by its
    kernel (the others by cuBLAS)."""
    t = gemms or {}

    def attn_in(h, qkv, q_norm, k_norm, qk_eps: float, cos, sin):
        """h (S, E) → q (S, H, D), k and v (S, H_kv, D): projected, per-head normed (qwen3), rotated."""
        S = h.shape[0]
        out = _linears(h, qkv, t.get("qkv"))
        if len(out) == 1 and q_norm is None:            # one rotation over q | k: one kernel, not two
            qk = _rope(out[0][:, :(H + Hkv) * D].view(S, H + Hkv, D), cos, sin)
            return qk[:, :H], qk[:, H:], out[0][:, (H + Hkv) * D:].view(S, Hkv, D)
        q, k, v = out[0].split([H * D, Hkv * D, Hkv * D], -1) if len(out) == 1 else out
        q, k, v = q.view(S, H, D), k.view(S, Hkv, D), v.view(S, Hkv, D)
        if q_norm is not None:
            q, k = _rms(q, q_norm, qk_eps), _rms(k, k_norm, qk_eps)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def attn_out_mlp(x, o, wo, ln2, gate_up, wd, ln_next):
        """x (S, E) residual, o (S, H·D) attention → (x', rms(x') with the next norm) after o_proj and the MLP."""
        x = _residual(x, _linears(o, [wo], t.get("o"))[0])
        h = _rms(x, ln2, eps)
        out = _linears(h, gate_up, t.get("gate_up"))
        g, u = out[0].chunk(2, -1) if len(out) == 1 else out
        x = _residual(x, _linears(act(g) * u, [wd], t.get("down"))[0])
        return x, _rms(x, ln_next, eps)

    if compile_mode is False:
        return attn_in, attn_out_mlp
    kw = dict(dynamic=False, fullgraph=True) | ({"mode": compile_mode} if isinstance(compile_mode, str) else {})
    return torch.compile(attn_in, **kw), torch.compile(attn_out_mlp, **kw)


def make_prefill_blocks(H: int, Hkv: int, D: int, eps: float, act, compile_on: bool):
    """(rms, attn_in, attn_out_mlp) for the packed prefill (lib/sample/decode.py `fast_prefill`): v2's two blocks
    over the M tokens of a pass, cuBLAS GEMMs throughout, and the first layer's norm. Compiled (unless compile_on is
    False) with the default dynamic-shape policy: the caller marks M dynamic (`mark_tokens_dynamic`), so one graph
    serves every pass length. What it replaces, the model's own modules run eagerly, spent ≈ 8 passes over a
    (M, E) fp32 tensor per norm, and gate and up as two GEMMs with act·up in two more passes."""
    attn_in_views, attn_out_mlp = make_blocks(H, Hkv, D, eps, act, False, None)

    def attn_in(h, qkv, q_norm, k_norm, qk_eps: float, cos, sin):
        """attn_in with q, k and v each contiguous: the rotation writes them where the varlen kernel reads them
        (views of one q|k buffer cost it three copies, 0.12 s of a 2.97 s prefill at 7B, 256 × 512 tokens)."""
        return tuple(t.contiguous() for t in attn_in_views(h, qkv, q_norm, k_norm, qk_eps, cos, sin))

    def rms(x, w):
        return _rms(x, w, eps)

    if not compile_on:
        return rms, attn_in, attn_out_mlp
    kw = dict(fullgraph=True)
    return torch.compile(rms, **kw), torch.compile(attn_in, **kw), torch.compile(attn_out_mlp, **kw)


def mark_tokens_dynamic(*ts):
    """Mark dim 0 (the pass's tokens) of each tensor dynamic for torch.compile, where it can be (≥ 2 rows: sizes 0
    and 1 are always specialised)."""
    for t in ts:
        if t.shape[0] >= 2:
            torch._dynamo.mark_dynamic(t, 0)


def _wb(lin):
    """A Linear's (weight, bias) as plain tensors sharing its storage (no Parameter: one compiled graph for all)."""
    return lin.weight.detach(), None if lin.bias is None else lin.bias.detach()


class FusedWeights:
    """Per layer, the tensors v2's blocks read: (W, b) lists for q|k|v and gate|up (one concatenated copy each when
    `fuse`, else the model's own three / two), o_proj, down_proj and the norms (always the model's own)."""

    def __init__(self, model, fuse: bool):
        self.model, self.fuse, self.cat = model, fuse, None
        if fuse:
            self.cat = [(self._cat([a.q_proj, a.k_proj, a.v_proj]), self._cat([m.gate_proj, m.up_proj]))
                        for a, m in ((layer.self_attn, layer.mlp) for layer in model.model.layers)]
        self.refresh()

    @staticmethod
    def _cat(lins, out=None):
        """Concatenate Linears' weights (and biases, a missing one as zeros) along the output dim, into `out`."""
        ws, bs = [lin.weight.detach() for lin in lins], [lin.bias for lin in lins]
        if out is None:
            w = torch.empty(sum(x.shape[0] for x in ws), ws[0].shape[1], device=ws[0].device, dtype=ws[0].dtype)
            out = (w, None if all(b is None for b in bs) else torch.empty(w.shape[0], device=w.device, dtype=w.dtype))
        torch.cat(ws, out=out[0])
        if out[1] is not None:
            torch.cat([x.detach() if x is not None else torch.zeros(y.shape[0], device=y.device, dtype=y.dtype)
                       for x, y in zip(bs, ws)], out=out[1])
        return out

    @torch.no_grad()
    def refresh(self):
        """Re-read every weight from the model (in place into the fused copies): call whenever weights may have
        changed. Returns the data pointers read, so a caller holding CUDA graphs can tell a replaced tensor."""
        self.layers = []
        inner = self.model.model
        for i, layer in enumerate(inner.layers):
            a, m = layer.self_attn, layer.mlp
            if self.fuse:
                qkv, gu = [self._cat([a.q_proj, a.k_proj, a.v_proj], self.cat[i][0])], [
                    self._cat([m.gate_proj, m.up_proj], self.cat[i][1])]
            else:
                qkv, gu = [_wb(a.q_proj), _wb(a.k_proj), _wb(a.v_proj)], [_wb(m.gate_proj), _wb(m.up_proj)]
            nxt = inner.layers[i + 1].input_layernorm if i + 1 < len(inner.layers) else inner.norm
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            self.layers.append(dict(
                qkv=qkv, q_norm=None if qn is None else qn.weight.detach(),
                k_norm=None if kn is None else kn.weight.detach(),
                qk_eps=0.0 if qn is None else qn.variance_epsilon,
                wo=_wb(a.o_proj), ln2=layer.post_attention_layernorm.weight.detach(), gate_up=gu,
                wd=_wb(m.down_proj), ln_next=nxt.weight.detach()))
        return tuple(t.data_ptr() for t in self.model.parameters())
