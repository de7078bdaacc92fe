"""What every sampling backend returns, and the stop ids they all stop on: the bottom of the sampling stack.

lib/sample/decode.py (the built-in decoder), lib/sample/engine.py (the engine interface and factory) and
lib/sample/vllm_engine.py (the vLLM engine) all import from here and never from each other upwards, so the imports
stay one-way: completion ← decode ← engine → vllm_engine → completion.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class StudentScores:
    """The sampler's own scores of a completion's tokens, from the logits it drew them from (lib/sample/draw.
    student_scores, at the scorer's temperature): what 03's scoring pass would otherwise compute by forwarding the
    student again (`--student-scores sampler`). Tensors on the sampler's device, one row per generated token."""
    logprobs: torch.Tensor        # (n,) fp32: log p(token) at logits / T
    topk_ids: torch.Tensor        # (n, k) int64: the k most likely ids at each position
    topk_logprobs: torch.Tensor   # (n, k) fp32: their log-probs at logits / T
    entropy: torch.Tensor         # (n,) fp32

    def cut(self, n: int) -> "StudentScores":
        return StudentScores(self.logprobs[:n], self.topk_ids[:n], self.topk_logprobs[:n], self.entropy[:n])


@dataclass
class Completion:
    token_ids: list[int]      # generated ids; INCLUDES the stop token when finish_reason == "stop"
    text: str                 # decoded generated text without the stop token (special tokens skipped)
    logprobs: list[float] | None  # log p(token) under the RAW distribution (log_softmax of unscaled logits), per
    #                               token id; None where the engine was not asked for them (VLLMEngine.logprob_every)
    finish_reason: str        # "stop" | "length"
    student: StudentScores | None = None  # the built-in sampler's scores of these tokens, when asked for (03's
    #                                       --student-scores sampler); None otherwise


def stop_ids(tokenizer, model_path_or_config) -> list[int]:
    """The tokenizer's eos plus the model's generation-config eos ids (e.g. `<|im_end|>` and `<|endoftext|>`).

    `model_path_or_config`: a model folder (its generation_config.json, else config.json), a model (its
    `generation_config`), or a GenerationConfig / PretrainedConfig. vLLM stops on the same set.
    """
    src, eos = model_path_or_config, None
    if isinstance(src, (str, os.PathLike)):
        for name in ("generation_config.json", "config.json"):
            f = Path(src) / name
            if f.exists() and (eos := json.loads(f.read_text()).get("eos_token_id")) is not None:
                break
    else:
        eos = getattr(getattr(src, "generation_config", src), "eos_token_id", None)
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError(f"no stop token for {src!r}: neither the tokenizer nor the generation config names an eos; "
                         "pass stop_token_ids explicitly")
    return sorted(set(int(i) for i in ids))


def make_completion(ids: list[int], logprobs: list[float] | None, stop: set[int], tokenizer,
                    max_new_tokens: int, student: StudentScores | None = None) -> Completion:
    """Cut a generated row after its first stop id (the rest is padding); "length" iff no stop id within the cap."""
    cut = next((i for i, t in enumerate(ids) if t in stop), None)
    if cut is None:
        if len(ids) != max_new_tokens:
            raise RuntimeError(f"a completion ended after {len(ids)} of {max_new_tokens} tokens without a stop id")
        return Completion(ids, tokenizer.decode(ids, skip_special_tokens=True), logprobs, "length",
                          None if student is None else student.cut(len(ids)))
    ids, logprobs = ids[:cut + 1], None if logprobs is None else logprobs[:cut + 1]
    return Completion(ids, tokenizer.decode(ids[:-1], skip_special_tokens=True), logprobs, "stop",
                      None if student is None else student.cut(len(ids)))
