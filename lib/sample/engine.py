"""Sampling completions from a causal LM: one `sample()` over two real backends, `hf` (built in) and `vllm`.

Both return, per request, a Completion (lib/sample/completion.py): the generated token ids (the stop token included when
the model stopped), the text, the log-prob of every generated token under the model's RAW distribution and whether
it stopped or hit the cap:

    logprob_t = log_softmax(logits_t)[y_t]          (unscaled logits: T = 1, no top-p), one per token id

so the trainer can compare sampler and trainer log-probs on the realized tokens (DESIGN.md §7.4 `rollout/logprob_gap`).

The `hf` backend is lib/sample/decode.py's decoder over the model's own modules: batched prefill, a static KV cache,
continuous batching, on CUDA one CUDA-graph replay per token. Its draws (lib/sample/draw.py) are keyed by (request seed,
step) only, so a request's sample depends on its prompt, its seed and the model, not on its batch-mates (up to
logit numerics), on CPU and GPU alike; T = 0 is greedy. `mode="exact"` (default) draws by Gumbel-max over the
vocabulary: the very draws this backend made before it had its own loop (measured on the toy student: 192 of 192
completions identical), so eval units and the toy campaign keep their samples; `mode="fast"` draws by inverse CDF
from one uniform per token, 1.2–1.9× the exact mode's tokens/s on an H200 (bench/RESULTS.md): pass it for GPU
rollouts. The engines an engine factory builds, `load_engine`, share one
interface: `update_weights(named_tensors)`, `sleep()`, `wake_up()`, `generate(...)` behind `sample(...)`.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from tqdm.auto import tqdm

from lib.sample import resident
from lib.sample.completion import Completion, make_completion, stop_ids
from lib.sample.decode import Decoder, runs, slot_bytes, workspace_bytes
from lib.sample.draw import MODES
from lib.sample.generate_fallback import GenerateDecoder

# --- the hf backend ---

@contextmanager
def _eval_mode(model):
    """eval() while sampling (no dropout anywhere), then the caller's training mode back."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class HFEngine:
    """The built-in sampler: lib/sample/decode.py's Decoder over `batch_size` slots, kept between calls (its cache and
    CUDA graphs are reused while the slot count and cap stay the same and its cache is long enough; `sleep()` frees
    them).

    `kv_reserve` (bytes, or a function returning them, called when the decoder is built) sizes the slots from memory
    on CUDA: every request of a call in one batch (up to `batch_size`, None = no cap) where the KV budget allows, else
    as many slots as it holds. The budget is what the device has free when the decoder is built (torch.cuda.
    mem_get_info, plus what torch's allocator holds unused; a cache held before counts as free) minus `kv_reserve`
    (what the caller, e.g. a trainer, will still allocate while the cache lives) minus one prefill pass's workspace;
    a slot costs lib/sample/decode.slot_bytes. The choice is printed when it is made ("sampler: N slots, KV budget
    X GiB"), again only if it changes. `kv_reserve=None` (the default; and off CUDA): `batch_size` slots, fixed.

    `model_or_path`: an nn.Module (the trainer's live student, sampled in place with its training mode restored, or
    a sampler copy kept current by `update_weights`) or a folder loaded with `dtype` ("auto" = the checkpoint's) onto
    `device` (default cuda if present). `mode`: "fast" | "exact" (lib/sample/draw.py says what each guarantees).
    `decoder_options`: more Decoder keywords (lib/sample/decode.py: fuse_gemms, compile_step, attn_impl, …;
    `candidates=k`: each Completion also carries the student's scores of its tokens, a StudentScores)."""
    backend = "hf"

    def __init__(self, model_or_path, tokenizer, *, batch_size: int | None = 64, dtype="auto", device=None,
                 stop_token_ids: list[int] | None = None, mode: str = "exact", cuda_graphs: bool | None = None,
                 decoder_options: dict | None = None, kv_reserve=None):
        if mode not in MODES:
            raise ValueError(f"HFEngine: unknown mode {mode!r}; choose one of {MODES}")
        if isinstance(model_or_path, torch.nn.Module):
            self.model = model_or_path
        else:
            from transformers import AutoModelForCausalLM
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.model = AutoModelForCausalLM.from_pretrained(model_or_path, dtype=dtype).to(device).eval()
        self.tokenizer, self.batch_size, self.mode, self.cuda_graphs = tokenizer, batch_size, mode, cuda_graphs
        self.decoder_options = decoder_options or {}
        self.stop = stop_token_ids or stop_ids(tokenizer, self.model)
        self.decoder, self.decoder_key = None, None
        self.kv_reserve, self.said, self.memory_cap = kv_reserve, None, None   # said: the slot count last printed

    def update_weights(self, named_tensors) -> None:
        """Copy trainer weights (HF names; tied aliases such as lm_head.weight accepted) into the sampler's model, in
        place (the decoder's CUDA graphs read these very tensors; its fused copies are rebuilt from them at the start
        of every run). Tensors that already are the model's own storage (a live student) are skipped."""
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, t in named_tensors:
                if name not in params:
                    raise KeyError(f"update_weights: {name!r} is not a weight of the sampler's model "
                                   f"({type(self.model).__name__}); push names as in its state_dict")
                if params[name].data_ptr() != t.data_ptr():
                    params[name].copy_(t)

    def sleep(self) -> None:
        """Free the decoder's KV cache and graphs (the trainer gets the memory back); the next call rebuilds them."""
        self.decoder = self.decoder_key = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        ...                                                          # the next call rebuilds what sleep freed

    def _free_bytes(self) -> int | None:
        """Device bytes free for the cache: the device's free memory plus what torch's allocator holds unused; None
        off CUDA."""
        p = next(self.model.parameters())
        if not p.is_cuda:
            return None
        return (torch.cuda.mem_get_info(p.device)[0] + torch.cuda.memory_reserved(p.device)
                - torch.cuda.memory_allocated(p.device))

    def _budget_slots(self, want: int, max_len: int, max_new_tokens: int) -> int:
        """min(want, the slots the KV budget holds) (class docstring); `want` off CUDA. Called with no decoder held."""
        free = self._free_bytes()
        if free is None:
            return want
        reserve = self.kv_reserve() if callable(self.kv_reserve) else self.kv_reserve
        prefill = self.decoder_options.get("prefill_tokens", Decoder.__init__.__kwdefaults__["prefill_tokens"])
        budget = free - reserve - workspace_bytes(self.model, prefill)
        slots = int(max(1, min(want, budget // slot_bytes(self.model, max_len, max_new_tokens))))
        if slots != self.said:
            print(f"sampler: {slots} slots, KV budget {budget / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free − "
                  f"{reserve / 2**30:.1f} reserved for the caller − the prefill workspace; {want} requests of ≤ "
                  f"{max_len} positions{': memory-bound' if slots < want else ''})", flush=True)
            self.said = slots
        return slots

    def _decoder(self, n: int, longest_prompt: int, max_new_tokens: int) -> Decoder | GenerateDecoder:
        round_to = 256 if next(self.model.parameters()).is_cuda else 64      # cache lengths shared across calls
        T = -(-(longest_prompt + max_new_tokens) // round_to) * round_to
        if self.decoder_key and self.decoder_key[2] == max_new_tokens and self.decoder_key[1] > T:
            # the held, longer cache serves this call: attention reads each slot's live length, so a longer cache
            # costs memory, not time, where a rebuild costs new CUDA graphs (03's steps, whose longest prompt
            # moves around a multiple of 256, rebuilt one every other step: 0.1-0.4 s of generation each time)
            T = self.decoder_key[1]
        want = n if self.batch_size is None else min(self.batch_size, n)
        key = (want, T, max_new_tokens)
        if self.kv_reserve is not None and runs(self.model):   # slots from memory: keep the held decoder if it fits
            held = self.decoder_key
            if held and held[1:] == key[1:] and held[0] == min(want, self.memory_cap or want):
                key = held
            else:
                self.decoder = self.decoder_key = None                         # its memory counts as free
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                slots = self._budget_slots(want, T, max_new_tokens)
                self.memory_cap = slots if slots < want else None              # None: memory was not the limit
                key = (slots, T, max_new_tokens)
        if key == self.decoder_key:
            return self.decoder
        self.decoder = None                                                    # free the old cache first
        if runs(self.model):
            self.decoder = Decoder(self.model, slots=key[0], max_len=key[1], max_new_tokens=max_new_tokens,
                                   stop_ids=self.stop, mode=self.mode, cuda_graphs=self.cuda_graphs,
                                   **self.decoder_options)
        else:
            if self.decoder_options.get("candidates") is not None:
                raise ValueError(f"the built-in decoder does not run {type(self.model).__name__} (model_type "
                                 f"{self.model.config.model_type!r}), and only it records the student's scores: "
                                 "drop --student-scores sampler (scores are then recomputed)")
            if self.decoder_key is None:                                       # said once per engine
                print(f"[sampler] the built-in decoder does not run {type(self.model).__name__} (model_type "
                      f"{self.model.config.model_type!r}): falling back to transformers' generate, one request at "
                      "a time (slow; the vLLM backend is the fast path for it)", flush=True)
            self.decoder = GenerateDecoder(self.model, max_new_tokens=max_new_tokens, stop_ids=self.stop,
                                           pad_id=self.tokenizer.pad_token_id)
        self.decoder_key = key
        return self.decoder

    def held_bytes(self) -> int:
        """Device bytes the held decoder's slots cost (lib/sample/decode.slot_bytes: its K and V rows and per-slot
        buffers); 0 when none is held (after `sleep()`) or under the generate fallback."""
        if not isinstance(self.decoder, Decoder):
            return 0
        slots, max_len, max_new_tokens = self.decoder_key
        return slots * slot_bytes(self.model, max_len, max_new_tokens)

    def record_resident(self) -> None:
        """Record the held cache (its GiB and slots) in lib.sample.resident, for a trainer that keeps it on the device
        through its other phases: an out-of-memory error there then names it and the fixes. While none is held,
        nothing is recorded."""
        if not self.held_bytes():
            resident.forget("hf")
            return
        slots = self.decoder_key[0]
        resident.record("hf", self.held_bytes() / 2**30, slots=slots,
                        what=f"the built-in sampler's KV cache for {slots} slots, resident through scoring and the "
                             f"update",
                        fix="add --sampler-sleep (it frees the cache outside generation), lower --micro-batch, or "
                            "leave more room with --sampler-kv-margin GIB")

    @torch.no_grad()
    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens, progress) -> list[Completion]:
        # disable=None: no bar where stderr is not a terminal (a log file gets no carriage-return lines)
        bar = tqdm(total=len(prompts), desc=progress if isinstance(progress, str) else "sampling (hf)",
                   unit="req", disable=None if progress else True)
        with _eval_mode(self.model):
            dec = self._decoder(len(prompts), max(map(len, prompts)), max_new_tokens)
            rows = dec.run(prompts, seeds, temperature=temperature, top_p=top_p, on_done=bar.update)
        bar.close()
        stop = set(self.stop)
        return [make_completion(row[0], row[1], stop, self.tokenizer, max_new_tokens, *row[2:]) for row in rows]


# --- one entry point ---

def load_engine(backend: str, path, tokenizer, **kw):
    """THE engine factory. `hf` → HFEngine(path or module, tokenizer, **kw); `vllm` → VLLMEngine(path,
    tokenizer=tokenizer, **kw), imported here only (the main venv has no vllm; lib.sample.vllm_engine never imports this
    module, so the imports stay one-way)."""
    if backend == "hf":
        return HFEngine(path, tokenizer, **kw)
    if backend == "vllm":
        from lib.sample.vllm_engine import VLLMEngine
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
