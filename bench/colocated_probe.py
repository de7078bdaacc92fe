"""bench/colocated_probe.py — 03_opd_train.py run unchanged in this process, colocated vLLM's calls timed (issue 14).

    python3 bench/colocated_probe.py PROBE.jsonl 03_opd_train.py --backend vllm …     (or PROBE=… vllm_colocated.sh)

Wraps lib.sampling_vllm.VLLMEngine's wake_up, update_weights, generate and sleep, and the engine's own
LLM.generate inside `generate`: each call appends {"call", "seconds", "gc_s", "cpu_s"} to PROBE.jsonl (seconds
between device syncs; gc_s = time inside Python's garbage collector meanwhile; cpu_s = CPU time of the calling
thread: close to `seconds` when the engine's host side, not the GPU, sets the pace). 03's timing_s/gen is wake (KV
cache) + generate + sleep; this says which of them, and how much of generate is vLLM's engine rather than our
wrapping. PROBE_CPROFILE=n runs the n-th LLM.generate call under cProfile (top 40 by cumulative time, written
beside PROBE.jsonl as PROBE.cprofile.txt).
"""
from __future__ import annotations

import cProfile
import functools
import gc
import io
import json
import os
import pstats
import runpy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GC = {"s": 0.0, "t": 0.0}
COUNT: dict[str, int] = {}
PROFILE_CALL = int(os.environ.get("PROBE_CPROFILE", "0"))    # the n-th LLM.generate call run under cProfile


def _gc_hook(phase, info):
    if phase == "start":
        GC["t"] = time.perf_counter()
    else:
        GC["s"] += time.perf_counter() - GC["t"]


def timed(fn, name, out: Path):
    @functools.wraps(fn)
    def run(*a, **k):
        import torch
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        COUNT[name] = COUNT.get(name, 0) + 1
        prof = cProfile.Profile() if name == "llm.generate" and COUNT[name] == PROFILE_CALL else None
        t, g, c = time.perf_counter(), GC["s"], time.thread_time()
        try:
            return prof.runcall(fn, *a, **k) if prof else fn(*a, **k)
        finally:
            sync()
            tags = k.get("tags")
            with out.open("a") as f:
                f.write(json.dumps({"call": name + (f"[{','.join(tags)}]" if tags else ""),
                                    "seconds": round(time.perf_counter() - t, 4), "gc_s": round(GC["s"] - g, 4),
                                    "cpu_s": round(time.thread_time() - c, 4)}) + "\n")
            if prof:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
                out.with_suffix(".cprofile.txt").write_text(text.getvalue())
    return run


def main():
    out, script, rest = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    gc.callbacks.append(_gc_hook)
    from lib import sampling_vllm
    E = sampling_vllm.VLLMEngine
    for name in ("wake_up", "update_weights", "sleep"):
        setattr(E, name, timed(getattr(E, name), name, out))
    gen = E.generate

    def generate(self, *a, **k):                       # the engine's own LLM.generate, timed inside ours
        if not getattr(self.llm.generate, "_probed", False):
            self.llm.generate = timed(self.llm.generate, "llm.generate", out)
            self.llm.generate._probed = True
        return gen(self, *a, **k)
    E.generate = timed(generate, "generate", out)
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
