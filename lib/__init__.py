"""The shared library of the Direct-OPD campaign, in rooms named after the pipeline's parts.

    lib/*.py       plumbing every stage shares: errors, command lines, artifacts and manifests, run folders, the
                   registry and the resolvers of its names (models, benchmarks), problem data, the pinned CPU math,
                   real-shape random models, trackers
    lib/kernels/   the loop's fused log-prob and log-ratio kernels (Triton, with their torch references) and
                   padding-free packing
    lib/sample/    the sampler: one `sample()` over the built-in decoder (its step, attention and GEMM kernels,
                   its exact token draw) and vLLM
    lib/train/     the training loop's numerics (the OPD and Direct-OPD losses, the collapse watch), scoring,
                   FSDP2 and checkpoints, SFT and RAFT
    lib/eval/      the grader (extraction, math-verify in bounded workers) and eval units
    lib/gates/     the pre-GPU gates and the shift anatomy
    lib/report/    the paired bootstrap, reading a campaign folder, and the report's figures
    lib/toy/       the toy world: a fixture that only the resolvers (lib/models.py, lib/benchmarks.py) reach

Each sub-package's docstring says what it owns and what it may import; tests/test_imports.py holds every rule.
"""
