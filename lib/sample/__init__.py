"""The sampler: completions from a causal LM through one `sample()` (engine.py) over two real backends.

    engine.py          the engine interface, `sample()`, `load_engine()` and the built-in `hf` engine
    vllm_engine.py     the `vllm` backend: a colocated vLLM engine
    completion.py      what every backend returns, and the stop ids they all stop on
    decode.py          the built-in decoder: a loop that owns its KV cache (prefill, refill, CUDA-graph decode)
    decode_step.py     the decode step's layer math, compiled as wholes on CUDA
    decode_triton.py   split-K decode attention as Triton kernels
    skinny_gemm.py     a Triton GEMM for decode products with few rows
    draw.py            the exact, counter-seeded token draw (temperature, top-p)
    generate_fallback.py  transformers' `generate` for architectures decode.py does not run (named in the log)

May import: lib/kernels/ (the packed prefill's varlen attention, varlen.py) and nothing else of the project (torch,
transformers, Triton and, lazily, vLLM), so the sampler is one folder to read and to swap; lib/kernels/ imports nothing
of the project, so the stack stays one-way.
"""
