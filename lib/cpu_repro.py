"""The same float bytes run after run (DESIGN.md §10): the toy world and the toy campaign pin the CPU math paths.

Measured: repeated builds on one machine, and builds on machines of one CPU model (AMD EPYC), gave the same bytes;
an Intel Xeon (AVX-512 and AMX) built different ones with the same pins and library versions, so the pins do not
make bytes vendor-independent (which library rounds differently there is not established: MKL's AVX2 branch on a
non-Intel CPU is the first suspect). lib/toy/world.sha256 therefore holds one block of sha256 per CPU model.

One thread fixes the order of every reduction on one machine, but the kernels themselves are picked per CPU: ATen
dispatches its vectorised ops (softmax, exp, norms, reductions) to AVX2 or AVX-512 code with FMA and SLEEF, MKL's
sgemm picks its code path by CPU, and oneDNN by ISA. Each rounds differently, so a build on an AVX2 machine and one
on an AVX-512 machine gave different models. Pinned here, in the project's code and not in the user's shell, to the
AVX2 + FMA level (x86-64-v3: every Intel CPU since Haswell, 2013, and every AMD CPU since Zen, 2017):

    ATEN_CPU_CAPABILITY=avx2       ATen's AVX2 kernels, also on an AVX-512 CPU
    MKL_CBWR=AVX2                  MKL's conditional numerical reproducibility: its AVX2 code path on every such CPU
    OMP_NUM_THREADS=1, MKL_NUM_THREADS=1, torch.set_num_threads(1): one thread, one reduction order
    ONEDNN_MAX_CPU_ISA=AVX2 and torch.backends.mkldnn.enabled = False: oneDNN off (and pinned were it used)
    deterministic algorithms on, warn-only (the flag torch.use_deterministic_algorithms sets; see pin())

Why AVX2 and not the baseline: measured on the 2-core AMD EPYC (AVX-512) this project is built on, a toy model's
forward+backward runs 3–4× faster on the AVX2 paths than on ATen's `default` kernels with MKL's COMPATIBLE branch
(SSE2, no FMA), which made the toy campaign 40 minutes instead of ~15; each of the four settings gives its own bytes,
and the AVX2 one the same bytes run after run. A CPU without AVX2 or FMA cannot take these paths: ATen falls back to
its baseline kernels, `record()` says so (`cpu_capability`, `isa_flags`) and the toy build reports that its bytes
differ from the committed ones (and still works).

ATen and MKL read their variables once, when torch is imported: `pin()` must run before the first `import torch`
of the process (a stage script calls `pin_if_toy(sys.argv)` first thing; the toy build trains in fresh worker
processes started with `pinned_env()`). `record()` says what was pinned and on which CPU, for world.json and every
manifest. What stays machine-dependent: the library versions (torch, MKL, glibc's libm), recorded there too.
"""
from __future__ import annotations

import os
import re
import sys

PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}
REQUIRED_FLAGS = ("avx2", "fma")                     # the CPU features the pinned paths need
ISA_FLAG = re.compile(r"^(sse\d\w*|ssse3|avx\w*|fma\w*|f16c|amx\w*)$")   # the flags that pick a kernel


def pinned_env(base: dict | None = None) -> dict:
    """`base` (default os.environ) with the pinned variables forced, whatever the caller had set."""
    return {**(os.environ if base is None else base), **PINNED_ENV}


def pin() -> None:
    """Pin this process's CPU math. Before torch is imported it sets the variables; after, it can only check them:
    a process that imported torch under other settings gets a one-line error naming the fix."""
    if "torch" in sys.modules:
        wrong = {k: os.environ.get(k) for k, v in PINNED_ENV.items() if os.environ.get(k) != v}
        if wrong:
            raise RuntimeError(f"cpu_repro.pin(): torch was imported before the CPU math was pinned ({wrong}); "
                               f"call lib.cpu_repro.pin() before the first `import torch` of the process")
    os.environ.update(PINNED_ENV)
    import torch
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    # torch.use_deterministic_algorithms(True, warn_only=True) sets exactly this flag, and also torch._inductor's
    # `deterministic` option, for which it imports the compiler stack: 2.3 s at every stage's start on the 2-core AMD
    # EPYC, some 60 starts a toy campaign. Nothing is compiled on the pinned CPU path (--compile is off on CPU).
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def names_toy(argv: list[str]) -> bool:
    """Whether a stage's command line runs the toy world: a --pair, --benchmark or --model value starting `toy`."""
    for flag, value in zip(argv, argv[1:]):
        if flag in ("--pair", "--benchmark", "--model") and value.startswith("toy"):
            return True
    return any(a.startswith(("--pair=toy", "--benchmark=toy", "--model=toy")) for a in argv)


def pin_if_toy(argv: list[str]) -> None:
    """A stage script's first call: the toy pair (CPU-sized, byte-reproducible by design) runs pinned, on the CPU.

    On a machine with a GPU the stages would otherwise train and evaluate the toy there (bf16, the sampler's fast
    draws): other arithmetic than the pinned CPU path that the committed bytes and the README's toy numbers come from.
    Six toy campaigns meant for a lent GPU host's 16 cores did exactly that until 2026-12-07, while their records named
    only the host's CPU (bench/RESULTS.md §15), so the GPUs are hidden from a toy stage."""
    if names_toy(argv):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""       # read when CUDA initialises: torch.cuda.is_available() is False
        pin()


def cpu_info() -> dict:
    """This CPU's model name, its kernel-selecting ISA flags and its generation, from /proc/cpuinfo's first processor
    (empty where there is none). The name alone can hide the generation, which a timing needs: this project's 2-core
    machines named just "AMD EPYC" build the same toy bytes (the pinned AVX2 paths), but one has AVX-512 and another
    is family 23 model 1 (Zen, 2017; AVX2 only), and the toy campaign's times differ with them (README.md)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break                                  # the first processor's block only
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    generation = " ".join(f"{k.split()[-1]} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    return {"model": fields.get("model name", ""), "generation": generation,
            "isa_flags": sorted(x for x in fields.get("flags", "").split() if ISA_FLAG.match(x)),
            "cores": os.cpu_count()}


def record() -> dict:
    """What this process pinned and where it ran: the variables, torch's kernel choice, the CPU, the versions."""
    out = {"env": {k: os.environ.get(k) for k in PINNED_ENV}, "pinned": all(os.environ.get(k) == v
                                                                          for k, v in PINNED_ENV.items()),
           "cpu": cpu_info()}
    torch = sys.modules.get("torch")
    if torch is not None:
        config = torch.__config__.show()
        mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", config)
        dnnl = re.search(r"MKL-DNN v([\w.]+)", config)
        out.update(torch=torch.__version__, cpu_capability=torch.backends.cpu.get_cpu_capability(),
                   threads=torch.get_num_threads(), mkldnn_enabled=torch.backends.mkldnn.enabled,
                   deterministic=torch.are_deterministic_algorithms_enabled(),
                   mkl=mkl.group(1) if mkl else None, onednn=dnnl.group(1) if dnnl else None)
    return out
