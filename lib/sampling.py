"""Sampling completions from a causal LM: one `sample()` over two real backends, `hf` (transformers) and `vllm`.

Both return, per request, the generated token ids (the stop token included when the model stopped), the text, the
log-prob of every generated token under the model's RAW distribution and whether it stopped or hit the cap:

    logprob_t = log_softmax(logits_t)[y_t]          (unscaled logits: T = 1, no top-p), one per token id

so the trainer can compare sampler and trainer log-probs on the realized tokens (SPEC §7.4 `rollout/logprob_gap`).

The `hf` backend samples exactly and batch-invariantly by Gumbel-max with a counter-based RNG. For request r with
64-bit seed s_r at step t (t-th generated token) and vocabulary index v:

    z_v   = logit_v / T,  restricted to the top-p nucleus N_p = the smallest prefix of tokens sorted by z (descending)
            whose probability mass reaches p: v ∈ N_p  ⇔  (mass of the tokens ranked above v) < p
    u_v   = U(hash(s_r, t, v)) ∈ (0, 1), 52-bit uniform;   g_v = −log(−log(1 − u_v))  ~ Gumbel(0, 1)
    y_t   = argmax_{v ∈ N_p} (z_v + g_v)   ~  softmax(z restricted to N_p)          (the Gumbel-max trick)

The noise depends only on (seed, step, vocab index), never on the batch, so a request's sample depends only on its
prompt, its seed and the model (up to logit numerics), on CPU and GPU alike. T = 0 is greedy: y_t = argmax logit.
The hash is 32-bit integer mixing in int64 tensors with every product < 2^59 (no signed-overflow UB). It runs as
a transformers LogitsProcessor under greedy `generate`: the processor returns a one-hot of its choice, so generate's
argmax takes it, and records the raw log-prob of that token — no (T × B × V) logits are kept.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList


@dataclass
class Completion:
    token_ids: list[int]      # generated ids; INCLUDES the stop token when finish_reason == "stop"
    text: str                 # decoded generated text without the stop token (special tokens skipped)
    logprobs: list[float]     # log p(token) under the RAW distribution (log_softmax of unscaled logits), per token id
    finish_reason: str        # "stop" | "length"


# --- stop ids ---

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


def make_completion(ids: list[int], logprobs: list[float], stop: set[int], tokenizer, max_new_tokens: int) -> Completion:
    """Cut a generated row after its first stop id (the rest is padding); "length" iff no stop id within the cap."""
    cut = next((i for i, t in enumerate(ids) if t in stop), None)
    if cut is None:
        if len(ids) != max_new_tokens:
            raise RuntimeError(f"a completion ended after {len(ids)} of {max_new_tokens} tokens without a stop id")
        return Completion(ids, tokenizer.decode(ids, skip_special_tokens=True), logprobs, "length")
    ids, logprobs = ids[:cut + 1], logprobs[:cut + 1]
    return Completion(ids, tokenizer.decode(ids[:-1], skip_special_tokens=True), logprobs, "stop")


# --- counter-based RNG and the exact Gumbel-max sampler ---

M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (2 multiply-xorshift rounds, constant 0x45d9f3b) on int64 holding [0, 2^32).
    Products stay < 2^32 · 2^27 = 2^59, so int64 never overflows; the mask keeps 32 bits."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    return (x >> 16) ^ x


def split_seeds(seeds: list[int], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """64-bit seeds (any Python int, taken mod 2^64) → low and high 32-bit halves, each (B,) int64."""
    s = [int(x) & (2**64 - 1) for x in seeds]
    return (torch.tensor([x & M32 for x in s], dtype=torch.int64, device=device),
            torch.tensor([x >> 32 for x in s], dtype=torch.int64, device=device))


def gumbel_noise(seed_lo_B: torch.Tensor, seed_hi_B: torch.Tensor, step: int, idx_BK: torch.Tensor) -> torch.Tensor:
    """Gumbel(0,1) noise (B, K) float64 for vocab ids `idx_BK` of each request at generation step `step`."""
    lo, hi = seed_lo_B[:, None], seed_hi_B[:, None]                                   # (B, 1)
    key_a = mix32(mix32(mix32(lo ^ 0x3C6EF372) ^ hi) ^ step)                          # two 32-bit keys per
    key_b = mix32(mix32(mix32(hi ^ 0x1B873593) ^ lo) ^ (step ^ 0x5BD1E995))           # (request, step)
    h1 = mix32(mix32(idx_BK ^ key_a) ^ key_b)                                         # (B, K) in [0, 2^32)
    h2 = mix32(mix32(idx_BK ^ key_b) ^ key_a ^ 0x68E31DA4)
    u = (((h1 << 20) | (h2 >> 12)).double() + 0.5) / 2.0**52                         # 52-bit uniform in (0, 1)
    return -torch.log(-torch.log1p(-u))                                               # log1p keeps u → 1 exact


def nucleus(z_BV: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p candidates: (ids (B, K), z (B, K) with −inf outside each row's nucleus), K = the largest nucleus."""
    B, V = z_BV.shape
    if top_p >= 1.0:
        return torch.arange(V, device=z_BV.device).expand(B, V), z_BV
    z_sorted, idx = torch.sort(z_BV, dim=-1, descending=True, stable=True)
    p = torch.softmax(z_sorted.double(), dim=-1)
    keep = (p.cumsum(-1) - p) < top_p                  # mass ranked above < p; the top token is always kept
    K = int(keep.sum(-1).max())
    return idx[:, :K], z_sorted[:, :K].masked_fill(~keep[:, :K], float("-inf"))


def noisy_argmax(z_BK, idx_BK, seed_lo_B, seed_hi_B, step) -> torch.Tensor:
    """argmax_k (z + Gumbel noise): the sampled position in each row."""
    return (z_BK.double() + gumbel_noise(seed_lo_B, seed_hi_B, step, idx_BK)).argmax(-1)


_fused_noisy_argmax = None


def fused_noisy_argmax(z_BK, idx_BK, seed_lo_B, seed_hi_B, step: int) -> torch.Tensor:
    """On CUDA the ~40 elementwise integer ops of the hash over B × V run as one compiled kernel (measured on the
    H200 at B = 64, V = 151,936: eager costs ~50 ms a step, 3× a whole decode step). Same ops, same bits."""
    global _fused_noisy_argmax
    if not z_BK.is_cuda:
        return noisy_argmax(z_BK, idx_BK, seed_lo_B, seed_hi_B, step)
    if _fused_noisy_argmax is None:
        _fused_noisy_argmax = torch.compile(noisy_argmax, dynamic=True)
    step_t = torch.tensor(step, dtype=torch.int64, device=z_BK.device)   # a tensor: no recompile per step
    return _fused_noisy_argmax(z_BK, idx_BK, seed_lo_B, seed_hi_B, step_t)


def choose_tokens(logits_BV: torch.Tensor, seed_lo_B, seed_hi_B, step: int, temperature: float, top_p: float):
    """One decoding step: (token ids (B,), their raw log-probs (B,) fp32)."""
    logits_BV = logits_BV.float()
    if temperature == 0:
        tok_B = logits_BV.argmax(-1)
    else:
        idx_BK, z_BK = nucleus(logits_BV / temperature, top_p)
        k_B = fused_noisy_argmax(z_BK, idx_BK, seed_lo_B, seed_hi_B, step)
        tok_B = idx_BK.gather(1, k_B[:, None])[:, 0]
    logp_B = logits_BV.gather(1, tok_B[:, None])[:, 0] - torch.logsumexp(logits_BV, -1)
    return tok_B, logp_B


class GumbelMaxProcessor(LogitsProcessor):
    """Under greedy `generate`: picks y_t by `choose_tokens`, returns its one-hot (0 / −inf) so argmax takes it,
    and keeps the raw log-prob of y_t for every row (finished rows too; the caller cuts them at their stop)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, prompt_len: int, device):
        self.seed_lo_B, self.seed_hi_B = split_seeds(seeds, device)
        self.temperature, self.top_p, self.prompt_len = temperature, top_p, prompt_len
        self.logprobs: list[torch.Tensor] = []        # one (B,) per step

    def __call__(self, input_ids_BT: torch.LongTensor, scores_BV: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids_BT.shape[1] - self.prompt_len
        tok_B, logp_B = choose_tokens(scores_BV, self.seed_lo_B, self.seed_hi_B, step, self.temperature, self.top_p)
        self.logprobs.append(logp_B)
        onehot_BV = torch.full_like(scores_BV, float("-inf"))
        return onehot_BV.scatter_(1, tok_B[:, None], 0.0)


# --- the hf backend ---

@contextmanager
def _sampling_mode(model):
    """eval() (dropout off, KV cache on under gradient checkpointing), then restore the caller's state.
    generate() fills every unset field from model.generation_config (e.g. Qwen2.5's repetition_penalty=1.05), which
    would add processors before ours and make the recorded log-probs non-raw: a blank one stands in meanwhile."""
    was_training, saved = model.training, model.generation_config
    model.eval()
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved
        model.train(was_training)


class HFEngine:
    """transformers `generate` (greedy + GumbelMaxProcessor) over length-sorted, left-padded batches.

    `model_or_path`: an nn.Module (the trainer's live student, sampled in place with its training mode restored, or
    a sampler copy kept current by `update_weights`) or a folder loaded with `dtype` ("auto" = the checkpoint's) onto
    `device` (default cuda if present)."""
    backend = "hf"

    def __init__(self, model_or_path, tokenizer, *, batch_size: int = 64, dtype="auto", device=None,
                 stop_token_ids: list[int] | None = None):
        if isinstance(model_or_path, torch.nn.Module):
            self.model = model_or_path
        else:
            from transformers import AutoModelForCausalLM
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.model = AutoModelForCausalLM.from_pretrained(model_or_path, dtype=dtype).to(device).eval()
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.stop = stop_token_ids or stop_ids(tokenizer, self.model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop[0]

    def update_weights(self, named_tensors) -> None:
        """Copy trainer weights (HF names; tied aliases such as lm_head.weight accepted) into the sampler's model.
        Tensors that already are the model's own storage (a live student) are skipped."""
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, t in named_tensors:
                if name not in params:
                    raise KeyError(f"update_weights: {name!r} is not a weight of the sampler's model "
                                   f"({type(self.model).__name__}); push names as in its state_dict")
                if params[name].data_ptr() != t.data_ptr():
                    params[name].copy_(t)

    def sleep(self) -> None: ...      # nothing to free: the model is the trainer's or a small eval copy
    def wake_up(self) -> None: ...

    @torch.no_grad()
    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens, progress) -> list[Completion]:
        device = next(self.model.parameters()).device
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))        # longest first: OOM shows early
        gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                              eos_token_id=self.stop, pad_token_id=self.pad_id)
        out: list[Completion | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), desc=progress if isinstance(progress, str) else "sampling (hf)",
                   unit="req", disable=not progress)
        with _sampling_mode(self.model):
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                Tp = max(len(prompts[i]) for i in rows)
                ids_BT = torch.full((len(rows), Tp), self.pad_id, dtype=torch.long)
                mask_BT = torch.zeros((len(rows), Tp), dtype=torch.long)
                for b, i in enumerate(rows):                                       # left padding
                    ids_BT[b, Tp - len(prompts[i]):] = torch.tensor(prompts[i])
                    mask_BT[b, Tp - len(prompts[i]):] = 1
                proc = GumbelMaxProcessor([seeds[i] for i in rows], temperature, top_p, Tp, device)
                seq_BT = self.model.generate(input_ids=ids_BT.to(device), attention_mask=mask_BT.to(device),
                                             generation_config=gc, logits_processor=LogitsProcessorList([proc]))
                gen_BN = seq_BT[:, Tp:].tolist()                                    # N = steps taken
                logp_BN = torch.stack(proc.logprobs, 1).tolist()
                for b, i in enumerate(rows):
                    out[i] = make_completion(gen_BN[b], logp_BN[b], set(self.stop), self.tokenizer, max_new_tokens)
                bar.update(len(rows))
        bar.close()
        return out


# --- one entry point ---

def __getattr__(name):
    """`lib.sampling.VLLMEngine` without importing vllm (or lib.sampling_vllm) until it is asked for."""
    if name == "VLLMEngine":
        from lib.sampling_vllm import VLLMEngine
        return VLLMEngine
    raise AttributeError(f"module 'lib.sampling' has no attribute {name!r}")


def load_engine(backend: str, path, tokenizer, **kw):
    """`hf` → HFEngine(path, tokenizer, **kw); `vllm` → VLLMEngine(path, tokenizer=tokenizer, **kw)."""
    if backend == "hf":
        return HFEngine(path, tokenizer, **kw)
    if backend == "vllm":
        from lib.sampling_vllm import VLLMEngine     # lazy: the main venv has no vllm
        return VLLMEngine(path, tokenizer=tokenizer, **kw)
    raise ValueError(f"unknown sampling backend {backend!r}; choose 'hf' or 'vllm'")


def sample(engine, prompts: list[list[int]], seeds: list[int], *, temperature: float, top_p: float,
           max_new_tokens: int, progress: bool | str = True) -> list[Completion]:
    """Sample one completion per (prompt ids, seed) with `engine`; results in input order.
    temperature 0 = greedy (top_p and seeds unused). Each output depends only on its own prompt, seed and the model."""
    if len(prompts) != len(seeds):
        raise ValueError(f"sample: {len(prompts)} prompts but {len(seeds)} seeds; give one seed per request")
    if temperature < 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(f"sample: need temperature ≥ 0, 0 < top_p ≤ 1, max_new_tokens ≥ 1; got "
                         f"{temperature}, {top_p}, {max_new_tokens}")
    if empty := [i for i, p in enumerate(prompts) if len(p) == 0]:
        raise ValueError(f"sample: prompts {empty[:5]} are empty; every request needs at least one prompt token")
    if not prompts:
        return []
    return engine.generate([list(p) for p in prompts], list(seeds), temperature=float(temperature),
                           top_p=float(top_p), max_new_tokens=int(max_new_tokens), progress=progress)
