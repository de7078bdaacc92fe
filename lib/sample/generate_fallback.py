"""The built-in sampler's fallback for a model lib/sample/decode.py does not run: transformers' own `generate`.

lib/sample/decode.py owns attention and the KV cache, so it runs only the full-attention decoders it knows
(decode.SUPPORTED: qwen2, llama, qwen3). Any other causal LM (Mistral, Gemma, Phi, a sliding-window Qwen2 …) is
sampled here instead, with the same `run()` contract as decode.Decoder:

    per request (generated ids cut after the first stop id or at max_new_tokens, the RAW log-prob of each)

One request at a time, under torch's global RNG seeded with the request's seed (forked, so the caller's RNG state is
left as it was): a request's sample depends on its prompt, its seed and the model, not on its batch-mates, as with
the built-in decoder, though the draws themselves are transformers' and differ from lib/sample/draw.py's. The log-prob
of a token is log_softmax of the model's unprocessed logits (T = 1, no top-p), as every backend reports it. It is
correct and slow (no batching, no CUDA graphs): HFEngine says so in the log when it falls back; for speed, sample
such a model with the vLLM backend.
"""
from __future__ import annotations

import torch


class GenerateDecoder:
    """decode.Decoder's interface (`run`) over `model.generate`, one request at a time."""

    def __init__(self, model, *, max_new_tokens: int, stop_ids: list[int], pad_id: int | None = None):
        self.model, self.N, self.stop = model, max_new_tokens, list(stop_ids)
        self.pad = pad_id if pad_id is not None else self.stop[0]
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def run(self, prompts: list[list[int]], seeds: list[int], *, temperature: float, top_p: float,
            on_done=None) -> list[tuple[list[int], list[float]]]:
        from transformers import GenerationConfig
        greedy = temperature == 0
        config = GenerationConfig(do_sample=not greedy, temperature=None if greedy else temperature,
                                  top_p=None if greedy else top_p, top_k=None, max_new_tokens=self.N,
                                  eos_token_id=self.stop, pad_token_id=self.pad, return_dict_in_generate=True,
                                  output_logits=True)
        rows = []
        for prompt, seed in zip(prompts, seeds):
            x = torch.tensor([prompt], device=self.device)
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(int(seed) & (2**63 - 1))                  # torch's seed range
                out = self.model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
            ids = out.sequences[0, len(prompt):].tolist()
            ends = [i for i, t in enumerate(ids) if t in self.stop]
            ids = ids[:ends[0] + 1] if ends else ids[:self.N]
            logprobs = [torch.log_softmax(out.logits[t][0].float(), dim=-1)[tok].item() for t, tok in enumerate(ids)]
            rows.append((ids, logprobs))
            if on_done:
                on_done(1)
        return rows
