"""The trainer's models built as torchtitan builds them (DESIGN.md §7.7): on the meta device, wrapped, then filled.

`build_scorer(path, dtype, device, ...)`:
  1. the architecture from the folder's config.json on the meta device, in `dtype` (no memory, no random init);
  2. `TokenScorer` around it, then `lib/dist.shard` (activation checkpointing, per-layer torch.compile, fully_shard);
  3. `to_empty(device=...)`: each rank allocates its own shards only;
  4. the checkpoint's weights into the shards: rank 0 reads the safetensors on CPU, `set_model_state_dict`
     (full_state_dict, broadcast_from_rank0) sends each full tensor and every rank keeps its slice, cast to `dtype`;
  5. the non-persistent buffers, which no state dict carries and `to_empty` left as garbage (Qwen2's rotary
     `inv_freq`), recomputed as the model's constructor computes them; any other such buffer is refused.
Tied embeddings stay one parameter (FSDP2 shards it once). The result equals `from_pretrained(path, dtype=dtype)
.to(device)` wrapped the same way, to the bit, in 1 and in 2 processes (tests/test_model_init.py).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from lib.train import dist as D
from lib.train.scoring import TokenScorer


def meta_lm(path: Path, dtype: torch.dtype) -> nn.Module:
    """The causal LM of `path`'s config.json on the meta device, in `dtype`, in eval mode (as from_pretrained)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return lm.eval()


def _clean(name: str) -> str:
    for part in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name


def read_checkpoint(path: Path, model: nn.Module) -> dict:
    """The folder's safetensors as one CPU state dict keyed as `model.state_dict()` (a TokenScorer's under `lm.`);
    a tied alias absent from the files (the head of tied embeddings) is filled from its twin. Missing or unexpected
    keys are refused, named."""
    from safetensors.torch import load_file
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors weights")
    prefix = "lm." if hasattr(model, "lm") else ""
    sd = {prefix + k: v for f in files for k, v in load_file(f).items()}
    twins = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        twins.setdefault(id(p), []).append(_clean(name))
    for names in twins.values():
        if have := next((n for n in names if n in sd), None):
            for n in names:
                sd.setdefault(n, sd[have])
    want = {_clean(k) for k in model.state_dict()}
    missing, extra = sorted(want - set(sd)), sorted(set(sd) - want)
    if missing or extra:
        raise KeyError(f"{path}: the checkpoint does not match its config's model: missing {missing[:5]}, "
                       f"unexpected {extra[:5]}")
    return sd


def load_weights(model: nn.Module, path: Path) -> None:
    """Fill a sharded model whose parameters to_empty allocated: rank 0 reads the checkpoint on CPU, each tensor is
    broadcast, every rank keeps its shard (cast to the parameter's dtype). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    sd = read_checkpoint(path, model) if dist.get_rank() == 0 else {}
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def reinit_buffers(lm: nn.Module, device) -> None:
    """Recompute the non-persistent buffers after to_empty: each rotary embedding rebuilt from its config on the CPU
    (its constructor's arithmetic) and copied in. Any other non-persistent buffer is refused (its value is unknown)."""
    for name, mod in lm.named_modules():
        own = [b for b in mod._non_persistent_buffers_set if getattr(mod, b, None) is not None]
        if not own:
            continue
        if "RotaryEmbedding" not in type(mod).__name__ or not hasattr(mod, "config"):
            raise NotImplementedError(f"{name or type(lm).__name__}: non-persistent buffers {own} cannot be rebuilt "
                                      f"after meta-device construction (only rotary embeddings are known)")
        with torch.device("cpu"):
            fresh = type(mod)(config=mod.config)
        with torch.no_grad():
            for b in own:
                getattr(mod, b).copy_(getattr(fresh, b).to(device))


def build_scorer(path: Path, dtype: torch.dtype, device, *, fused_linear: bool = True, temperature: float = 1.0,
                 frozen: bool = False, bf16: bool = False, activation_checkpointing: bool = False,
                 compile: bool = False, packed: bool = False) -> TokenScorer:
    """A sharded TokenScorer of the model at `path`, built on meta and filled from the checkpoint. `frozen`: no grad,
    eval (teachers, the reference); `bf16`: FSDP2's bf16 compute / fp32 reduce policy (the student on CUDA);
    `packed`: it takes padding-free batches (lib/kernels/varlen.py).
    Collective."""
    scorer = TokenScorer(meta_lm(path, dtype), fused_linear=fused_linear, temperature=temperature, packed=packed)
    if frozen:
        scorer.requires_grad_(False).eval()
    D.shard(scorer, bf16=bf16, activation_checkpointing=activation_checkpointing, compile=compile)
    scorer.to_empty(device=device)
    load_weights(scorer, path)
    reinit_buffers(scorer.lm, device)
    return scorer
