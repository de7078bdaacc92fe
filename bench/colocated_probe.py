"""bench/colocated_probe.py — 03_opd_train.py run unchanged in this process, colocated vLLM's calls timed (issue 14).

    python3 bench/colocated_probe.py PROBE.jsonl 03_opd_train.py --backend vllm …
    PROBE=1 bash bench/device.sh colocated       (the colocated step of bench/RESULTS.md, rows in $OUT/vllm_probe.jsonl)

Wraps lib.sample.vllm_engine.VLLMEngine's wake_up, update_weights, generate and sleep, and the engine's own
LLM.generate inside `generate`: each call appends {"call", "seconds", "gc_s", "cpu_s", "proc_cpu_s", "host_busy",
"steal_s", "host_ms"} to PROBE.jsonl:
- seconds: between device syncs; gc_s: inside Python's garbage collector meanwhile;
- cpu_s / proc_cpu_s: CPU time of the calling thread / of all this process's threads (a thread that waits on the GPU
  spins, so cpu_s ≈ seconds does not by itself say the host sets the pace);
- host_busy / steal_s: from /proc/stat over the call, the share of all the machine's CPUs busy (anyone's work) and
  the seconds the hypervisor took from them (0 where the kernel does not count it);
- host_ms: a fixed pure-Python loop timed just before the call, the host's speed at that moment. If LLM.generate's
  seconds swing with host_ms, the host, not the GPU or our code, sets vLLM's pace.
03's timing_s/gen is wake (KV cache) + generate + sleep; this says which of them, and how much of generate is vLLM's
engine rather than our wrapping. PROBE_CPROFILE=n runs the n-th LLM.generate call under cProfile (top 40 by
cumulative time, written beside PROBE.jsonl as PROBE.cprofile.txt; that call's seconds are the profiler's, leave it
out of statistics). PROBE_LLM_KWARGS='{"enable_prefix_caching": false}' (JSON) adds keywords to the engine's vLLM
LLM(...), for measuring an engine setting inside 03 without a flag for it.
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


def _cpu_jiffies() -> tuple[int, int, int]:
    """(busy, total, steal) jiffies of all CPUs so far, from /proc/stat's first line; zeros where it is absent."""
    try:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
    except (OSError, ValueError):
        return 0, 0, 0
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait, steal


def _host_ms(n: int = 200_000) -> float:
    """Milliseconds for a fixed pure-Python loop: the host's single-thread speed now (median of 3)."""
    times = []
    for _ in range(3):
        t = time.perf_counter()
        acc = 0
        for i in range(n):
            acc += i & 7
        times.append(time.perf_counter() - t)
    return 1000 * sorted(times)[1]


def timed(fn, name, out: Path):
    @functools.wraps(fn)
    def run(*a, **k):
        import torch
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        COUNT[name] = COUNT.get(name, 0) + 1
        prof = cProfile.Profile() if name == "llm.generate" and COUNT[name] == PROFILE_CALL else None
        host = _host_ms() if name == "llm.generate" else None
        j0 = _cpu_jiffies()
        t, g, c, pc = time.perf_counter(), GC["s"], time.thread_time(), time.process_time()
        try:
            return prof.runcall(fn, *a, **k) if prof else fn(*a, **k)
        finally:
            sync()
            j1, tags = _cpu_jiffies(), k.get("tags")
            with out.open("a") as f:
                f.write(json.dumps({"call": name + (f"[{','.join(tags)}]" if tags else ""),
                                    "seconds": round(time.perf_counter() - t, 4), "gc_s": round(GC["s"] - g, 4),
                                    "cpu_s": round(time.thread_time() - c, 4),
                                    "proc_cpu_s": round(time.process_time() - pc, 4),
                                    "host_busy": round((j1[0] - j0[0]) / max(j1[1] - j0[1], 1), 4),
                                    "steal_s": round((j1[2] - j0[2]) / os.sysconf("SC_CLK_TCK"), 3),
                                    **({"host_ms": round(host, 2)} if host is not None else {})}) + "\n")
            if prof:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
                out.with_suffix(".cprofile.txt").write_text(text.getvalue())
    return run


def main():
    out, script, rest = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    gc.callbacks.append(_gc_hook)
    from lib.sample import vllm_engine
    E = vllm_engine.VLLMEngine
    for name in ("wake_up", "update_weights", "sleep"):
        setattr(E, name, timed(getattr(E, name), name, out))
    extra = json.loads(os.environ.get("PROBE_LLM_KWARGS", "{}"))
    if extra:
        init = E.__init__

        def __init__(self, *a, **k):
            init(self, *a, **k, **extra)
            print(f"[probe] vLLM LLM(...) given {extra}", flush=True)
        E.__init__ = __init__
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
