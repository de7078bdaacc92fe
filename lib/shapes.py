"""Randomly initialised models of the real shapes, for speed and memory measurements where real weights can't go.

The GPU machine has no network, so Qwen2.5-1.5B/7B checkpoints can't reach it; a model of the same configuration
with random weights has the same cost per token. The configs are written out here (from the published config.json
files), and the tokenizer is the real Qwen2.5 one (lib/qwen_tokenizer.py). Random weights never favour the stop
token, so every rollout runs to the cap: the worst case for speed, which is what a benchmark should measure.
"""
from __future__ import annotations

import os
from pathlib import Path

from lib.artifacts import REPO, atomic_write_json, umask_mode

QWEN25 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu", rope_theta=1_000_000.0,
              rms_norm_eps=1e-6, max_position_embeddings=32_768, bos_token_id=151_643, eos_token_id=151_645,
              use_sliding_window=False, attention_dropout=0.0, initializer_range=0.02, dtype="bfloat16")
SHAPES = {
    "qwen2.5-1.5b": QWEN25 | dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151_936,
                                  tie_word_embeddings=True),
    "qwen2.5-7b": QWEN25 | dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                num_attention_heads=28, num_key_value_heads=4, vocab_size=152_064,
                                tie_word_embeddings=False),
}


def model_dir(shape: str, seed: int) -> Path:
    """A cached Hugging Face folder: `shape`'s config, random weights drawn with `seed`, the real tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from lib import qwen_tokenizer
    if shape not in SHAPES:
        raise KeyError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
    out = Path(os.environ.get("OPD_CACHE", REPO / ".cache")) / "shapes" / f"{shape}-seed{seed}"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape])).to(torch.bfloat16)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    qwen_tokenizer.build("qwen2.5").save_pretrained(tmp)
    GenerationConfig(bos_token_id=151_643, eos_token_id=[151_645, 151_643], pad_token_id=151_643).save_pretrained(tmp)
    atomic_write_json(tmp / "shape.json", {"shape": shape, "seed": seed, "note": "random weights: speed only"})
    umask_mode(*tmp.glob("*.safetensors"))                   # written 0600 by safetensors
    os.replace(tmp, out)
    return out
