"""What a sampling engine keeps on the GPU through a trainer's other phases, and the one line an out-of-memory error
there becomes.

Two engines can stay resident beside scoring and the update in 03_opd_train.py: the built-in sampler's KV cache
(`--backend hf` without `--sampler-sleep`) and a colocated vLLM engine (`--backend vllm --no-vllm-sleep`). Each
records what it holds when it starts holding it (`record`), and `explain_oom` around the trainer's main turns a CUDA
out-of-memory error into one line that names what is held, its GiB and the flags that free it. Both backends import
this module and it imports neither, so lib.sample.engine and lib.sample.vllm_engine stay independent.
"""
from __future__ import annotations

from contextlib import contextmanager

# engine name → {"gib": GiB held, "what": what it is, with its size, "fix": the flags that free it, and its own
# fields (the sampler's "slots", vLLM's "share")}
RESIDENT: dict[str, dict] = {}


def record(engine: str, gib: float, what: str, fix: str, **fields) -> None:
    """`engine` now holds `gib` GiB through the trainer's other phases (replacing its earlier record)."""
    RESIDENT[engine] = dict(gib=gib, what=what, fix=fix, **fields)


def forget(engine: str) -> None:
    """`engine` holds nothing on the device any more."""
    RESIDENT.pop(engine, None)


@contextmanager
def explain_oom():
    """Around a trainer: a CUDA out-of-memory error beside a recorded resident engine becomes one line naming it and
    its fixes. With nothing recorded, an OOM passes through unchanged, as does any other error."""
    import torch
    try:
        yield
    except torch.OutOfMemoryError as e:
        if not RESIDENT:
            raise
        held = "; and beside ".join(f"{r['what']} ({r['gib']:.1f} GiB): {r['fix']}" for r in RESIDENT.values())
        raise SystemExit(f"CUDA out of memory beside {held}. {str(e).splitlines()[0][:200]}") from e
