"""Padding-free micro-batches: every sequence of a micro-batch laid end to end in one row, attention kept inside each.

A packed micro-batch is one row of Σ L_i tokens (no pad token anywhere), `position_ids` restarting at 0 at each
sequence, and `cu_seqlens` = [0, L_0, L_0 + L_1, …] (int32), the boundaries. Hugging Face models take this as
`position_ids` (the rotary positions) plus the FlashAttention keyword arguments `cu_seq_lens_q/_k`, `max_length_q/_k`,
which they hand down to the attention function untouched. We register one such function under the name `NAME`:
  - on CUDA in bf16/fp16: `torch.nn.attention.varlen.varlen_attn` (PyTorch's FlashAttention-2 varlen kernel), causal,
    forward and backward; KV heads repeated for grouped-query attention where the installed torch lacks enable_gqa;
  - anywhere else (CPU, fp32): the reference, one causal `scaled_dot_product_attention` per sequence. It is what the
    tests compare the padded path against, and a named fallback, never the fast path.
A model whose `config._attn_implementation` is `NAME` has no mask function registered for it, so Hugging Face builds
no (T, T) mask at all (its rule for attention backends that bring their own masking).

Shared prompts (lib/train/scoring.pack(..., share_prompts=True), 03's --share-prompts): a prompt sampled n times is laid
out ONCE, followed by its n responses, and each response's queries see that prompt plus their own response. The row
is cut into query segments (the prompt, then each response) with boundaries `cu_seq_lens_q`; each segment's keys
are rows `KV_INDEX` of the row's own keys and values (a response segment's: its prompt, then itself), gathered into
a second packed layout with boundaries `cu_seq_lens_k`. Causal within a segment is bottom-right aligned: query j of a
segment of Lq queries and Lk keys sees keys 0 … j + Lk − Lq, so a response's token sees the whole prompt and the
response up to itself, as in its own unshared row. The gather's backward adds each prompt key's gradient from the n + 1
segments that read it.

Why: with padding, a micro-batch costs rows × longest; packed, it costs Σ L_i, and a padding mask keeps SDPA on a
masked kernel. At the 1.5B shape on one H200 (prompts of 60–260 tokens + 400 response tokens, bench/profile_step.py)
packing cut the scoring matmul time by 14–18 % and its attention from 0.53 s to 0.25 s (bench/RESULTS.md).
"""
from __future__ import annotations

import inspect
import os

import torch
import torch.nn.functional as F

NAME = "opd_varlen"
KV_INDEX = "opd_kv_index"        # the keyword a shared-prompt batch passes: which rows of K/V each key segment reads


def register() -> None:
    """Make `NAME` an attention implementation Hugging Face models can be switched to (idempotent)."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, attention)


def use_packing(lm: torch.nn.Module) -> None:
    """Switch a Hugging Face model to packed batches (its attention becomes `attention` below)."""
    register()
    lm.config._attn_implementation = NAME              # every layer reads its attention from this one config


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    """[0, L_0, L_0 + L_1, …] as int32: the boundaries of packed sequences."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              **kwargs):
    """Hugging Face's attention-function contract: query (1, Hq, T, D), key/value (1, Hkv, T, D) → ((1, T, Hq, D),
    None). Needs `cu_seq_lens_q` and `max_length_q` in kwargs (lib/train/scoring.py's packed Batch passes them); a
    shared-prompt batch also passes `KV_INDEX`, `cu_seq_lens_k` and `max_length_k` (the module docstring)."""
    cu, max_len = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    kv_index = kwargs.get(KV_INDEX)
    if cu is None or max_len is None:
        raise ValueError(f"attention {NAME!r} needs a packed batch (cu_seq_lens_q, max_length_q): build the batch with "
                         f"lib.train.scoring.pack(..., packed=True), or build the model without packing")
    if query.shape[0] != 1:
        raise ValueError(f"a packed batch is one row; got {query.shape[0]} rows")
    if dropout:
        raise ValueError("packed attention has no dropout (the trainer never uses it)")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))           # (T, H, D)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    cu_k, max_k = None, None
    if kv_index is not None:                          # shared prompts: the keys each segment reads (module docstring)
        cu_k, max_k = kwargs.get("cu_seq_lens_k"), kwargs.get("max_length_k")
        if cu_k is None or max_k is None:
            raise ValueError(f"attention {NAME!r}: {KV_INDEX} given without cu_seq_lens_k and max_length_k")
        k, v = k.index_select(0, kv_index), v.index_select(0, kv_index)
        cu_k = cu_k.to(q.device, torch.int32)
    fast = q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and _VARLEN is not None
    out = (_flash if fast else reference)(q, k, v, cu.to(q.device, torch.int32), max_len, scale, cu_k, max_k)
    return out[None], None


def reference(q, k, v, cu, max_len, scale, cu_k=None, max_k=None):
    """(T, Hq, D) causal attention within each segment, queries q[cu[i]:cu[i+1]] against keys k[cu_k[i]:cu_k[i+1]]
    (cu_k None: the same spans), causal aligned bottom-right: one SDPA call per segment (the fallback)."""
    groups = q.shape[1] // k.shape[1]
    bq, bk = cu.tolist(), (cu if cu_k is None else cu_k).tolist()
    if bq[0] != 0 or bq[-1] != q.shape[0] or bk[0] != 0 or bk[-1] != k.shape[0]:
        raise ValueError(f"the segments must cover the rows: queries [{bq[0]}, {bq[-1]}) of {q.shape[0]}, keys "
                         f"[{bk[0]}, {bk[-1]}) of {k.shape[0]}")
    # The segments by one split each and the outputs by one cat, not a slice and a write into a preallocated output
    # per segment: under autograd a slice's backward builds a gradient of the whole input and an in-place write is
    # recorded on the whole output, so the backward passed whole tensors through every segment, time quadratic in
    # their number (bench/varlen_cpu.py; bench/RESULTS.md §17). Values and gradients are the same to the bit: each
    # segment's gradient lands in its own rows either way.
    lq, lk = [b - a for a, b in zip(bq[:-1], bq[1:])], [d - c for c, d in zip(bk[:-1], bk[1:])]
    outs = []
    for qs, ks, vs in zip(q.split(lq), k.split(lk), v.split(lk)):
        qs, ks, vs = qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1)                  # (H, L, D)
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        nq, nk = qs.shape[1], ks.shape[1]        # query j sees keys ≤ j + nk − nq (SDPA's is_causal aligns top-left)
        see = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=see, scale=scale).transpose(0, 1))
    return torch.cat(outs, 0)


def call_kwargs(fn) -> dict:
    """The keyword arguments that make this torch's varlen_attn causal (and grouped-query, where it can be)."""
    params = inspect.signature(fn).parameters
    # the causal switch moved between torch releases: is_causal=True (2.10), window_size=(-1, 0) (2.11 on)
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    return causal | ({"enable_gqa": True} if "enable_gqa" in params else {}) | ({"scale": None} if "scale" in params
                                                                               else {})


def _find_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, {}
    return varlen_attn, call_kwargs(varlen_attn)


_VARLEN, _VARLEN_KW = _find_varlen()
# varlen_attn is a custom op with a fake (shape) implementation and a registered backward, so torch.compile traces it
# inside each compiled decoder layer (max_len becomes a symbolic int after its first change: one recompile).
# OPD_VARLEN_EAGER=1 runs it outside the graph instead (a graph break per layer), for a torch that cannot trace it.
EAGER = os.environ.get("OPD_VARLEN_EAGER") == "1"


def _flash(q, k, v, cu, max_len, scale, cu_k=None, max_k=None):
    return (_flash_outside_graph if EAGER else _flash_kernel)(q, k, v, cu, max_len, scale, cu_k, max_k)


def _flash_kernel(q, k, v, cu, max_len, scale, cu_k=None, max_k=None):
    kw = dict(_VARLEN_KW)
    if "enable_gqa" not in kw and k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if "scale" in kw:
        kw["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise NotImplementedError("this torch's varlen_attn has no scale argument; the model's scale is not 1/√D")
    if cu_k is None:
        cu_k, max_k = cu, max_len
    return _VARLEN(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu_k, max_len, max_k, **kw)


_flash_outside_graph = torch.compiler.disable(_flash_kernel)
