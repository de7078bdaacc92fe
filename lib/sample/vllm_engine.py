"""The `vllm` sampling backend: a real vLLM (v1) engine behind `lib.sample.engine.sample`, built by
`lib.sample.engine.load_engine`.

Per request: SamplingParams(temperature, top_p, max_tokens, seed, logprobs=0) — logprobs=0 returns the sampled
token's log-prob only, and the engine is built with logprobs_mode="raw_logprobs" (log_softmax of the unscaled
logits, before temperature and top-p), the same quantity the `hf` backend records. Prompts go in as token ids
(TokensPrompt); vLLM does not detokenize: the text is decoded by our tokenizer, exactly as for `hf`. Samples differ
from the `hf` backend's (a different RNG); greedy outputs do not. Each request carries its seed and draws from its
own torch.Generator, so it does not depend on its batch neighbours (up to logit numerics); on one H200 (vLLM 0.26,
in process) seeded requests ran as fast as unseeded ones (bench/RESULTS.md, fourth run). The log-probs are what
cost there: a third of the generation time when every request returns them. `logprob_every=k` asks only every
k-th request for them (the others' Completion.logprobs is None), for a caller that only monitors them; 0 asks none
(evaluation, which never reads them).

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that `update_weights` hands tensors to the
model without serialisation: it calls the worker's `reload_weights` (vLLM's in-place reload, which also redoes the
post-load processing — on CPU a plain `model.load_weights` fails on repacked GEMM weights), repacks the vocab GEMMs
that reload misses (a tied lm_head, see `_repack_vocab_gemms`), then drops the prefix cache, whose KV blocks were
computed with the old weights. Push the FULL state dict (HF names, full tensors —
`DTensor.full_tensor()` under FSDP2). Sleep mode exists on CUDA only; elsewhere sleep()/wake_up() are no-ops and
`sleep_note` says why. A resident CUDA engine (sleep mode off) records its footprint in lib.sample.resident,
whose `explain_oom` around the trainer turns an out-of-memory error beside it into one line naming it and the
fixes. Scripts that build an engine need an `if __name__ == "__main__":` guard.
"""
from __future__ import annotations

import os
from functools import partial

from tqdm.auto import tqdm

from lib.sample.completion import Completion, make_completion, stop_ids
from lib.sample.resident import record

def _repack_vocab_gemms(worker) -> None:
    """vLLM-CPU packs each vocab matrix's GEMM weight after loading; reload_weights repacks only modules whose
    weights arrived, so a TIED lm_head (Qwen2.5-1.5B, SmolLM2) would keep projecting with the OLD embedding (measured:
    greedy tokens then differ from transformers). Repack every vocab embedding / lm_head; a no-op on GPU."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod, VocabParallelEmbedding
    for m in worker.model_runner.model.modules():
        if isinstance(m, VocabParallelEmbedding) and isinstance(m.quant_method, UnquantizedEmbeddingMethod):
            m.quant_method.process_weights_after_loading(m)


def record_footprint(gib: float, share: float) -> None:
    """A resident CUDA engine's footprint, in lib.sample.resident: an out-of-memory error beside it then names it."""
    record("vllm", gib, share=share,
           what=f"the resident vLLM engine at --gpu-memory-utilization {share:g} (--no-vllm-sleep)",
           fix="let it sleep (drop --no-vllm-sleep) or lower --gpu-memory-utilization")


class VLLMEngine:
    backend = "vllm"

    def __init__(self, path, *, dtype="auto", max_model_len: int, tokenizer=None, gpu_memory_utilization: float = 0.5,
                 enable_sleep_mode: bool = False, seed: int = 0, cpu_kv_cache_gib: int = 4,
                 stop_token_ids: list[int] | None = None, logprob_every: int = 1, **llm_kwargs):
        if logprob_every < 0:
            raise ValueError(f"VLLMEngine: logprob_every={logprob_every}; use 1 (every request), k > 1, or 0 (none)")
        self.logprob_every = logprob_every
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))   # GiB; read by the CPU worker only
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"                         # in-process: see the docstring
        from vllm import LLM
        from vllm.platforms import current_platform
        on_cpu = current_platform.is_cpu()
        self.sleep_note = (None if enable_sleep_mode and current_platform.is_cuda() else
                           "enable_sleep_mode=False" if not enable_sleep_mode else
                           f"vLLM sleep mode needs CUDA; platform is {current_platform.device_type}")
        llm_kwargs.setdefault("enforce_eager", on_cpu)                            # no graph capture on CPU
        resident = not enable_sleep_mode and current_platform.is_cuda()
        if resident:
            import torch
            free_before = torch.cuda.mem_get_info()[0]
        self.llm = LLM(model=str(path), dtype=dtype, max_model_len=max_model_len, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_note is None,
                       logprobs_mode="raw_logprobs", **llm_kwargs)
        if resident:
            record_footprint((free_before - torch.cuda.mem_get_info()[0]) / 2**30, gpu_memory_utilization)
        if tokenizer is None:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer = tokenizer
        self.stop = stop_token_ids or stop_ids(tokenizer, path)

    def update_weights(self, named_tensors) -> None:
        """Load trainer weights (iterable of (HF name, tensor)) into the engine in place, streamed: in-process, the
        iterable reaches the model loader as is, so a gathering generator (lib.train.dist.full_params) is not
        materialised."""
        weights = ((name, t.detach()) for name, t in named_tensors)
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights, is_checkpoint_format=True))
        self.llm.collective_rpc(_repack_vocab_gemms)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update (requests in flight?); "
                               "call update_weights only between sample() calls")

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer works; no-op (see sleep_note) where unsupported.

        Level 1: the weights are copied to host memory and back, the KV cache is dropped. Level 2, which discards the
        weights for the next push to restore, failed bench/vllm_smoke.py on one H200 with vLLM 0.26 (one level-2
        sleep and push passed; after the next, greedy tokens differed from transformers'), so it is not offered
        (bench/RESULTS.md, fourth run). How much sleeping frees is measured and kept for `wake_up`."""
        if self.sleep_note is None:
            import torch
            before = torch.cuda.mem_get_info()[0]
            self.llm.sleep(level=1)
            self.footprint = max(getattr(self, "footprint", 0), torch.cuda.mem_get_info()[0] - before)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Colocated wake, as verl and TRL do it: first hand the trainer's cached but unused blocks back to the device
        (vLLM allocates outside PyTorch's caching allocator, which otherwise still holds the update's activations),
        then check that what the engine freed at `sleep` fits, and refuse with the numbers if it does not.
        `tags`: ["weights"] before a weight push, then ["kv_cache"]; None wakes both."""
        if self.sleep_note is not None:
            return
        import torch
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        need = getattr(self, "footprint", 0) if tags in (None, ["weights"]) else 0
        if need > free:
            gib = 2 ** 30
            raise RuntimeError(f"vLLM cannot wake: it needs {need / gib:.1f} GiB, {free / gib:.1f} GiB of "
                               f"{total / gib:.1f} are free (the trainer holds "
                               f"{torch.cuda.memory_allocated() / gib:.1f} GiB). Lower --gpu-memory-utilization, or "
                               "the trainer's peak (--micro-batch, --max-tokens-per-micro, "
                               "--activation-checkpointing)")
        self.llm.wake_up(tags=tags)

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens, progress) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        greedy, k = temperature == 0, self.logprob_every
        params = [SamplingParams(temperature=temperature, top_p=1.0 if greedy else top_p, max_tokens=max_new_tokens,
                                 seed=None if greedy else int(s) & (2**63 - 1),     # mod 2^63: torch's seed range
                                 logprobs=0 if k and i % k == 0 else None, stop_token_ids=self.stop, ignore_eos=False,
                                 detokenize=False, skip_special_tokens=True)
                  for i, s in enumerate(seeds)]
        label = progress if isinstance(progress, str) else "sampling (vllm)"
        bar = partial(tqdm, desc=label, disable=None) if progress else False      # None: no bar off a terminal
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=bar)
        stop, done = set(self.stop), []
        for i, o in enumerate(outs):
            c = o.outputs[0]
            ids = list(c.token_ids)
            logps = None if c.logprobs is None else [pos[tok].logprob for pos, tok in zip(c.logprobs, ids)]
            comp = make_completion(ids, logps, stop, self.tokenizer, max_new_tokens)
            if comp.finish_reason != c.finish_reason or len(comp.token_ids) != len(ids):
                raise RuntimeError(f"vLLM request {i} finished as {c.finish_reason!r} after {len(ids)} tokens; "
                                   f"expected {comp.finish_reason!r} for stop ids {sorted(stop)}")
            done.append(comp)
        return done
