"""The grader of DESIGN.md §5: extract a completion's final answer, then check it against the gold with math-verify.

    grade(completion, gold) -> Grade(correct, extracted, extractor, verify_method, reason, decided_by, cpu_s, wall_s)

Extraction (lib/eval/extract.py, linear in the completion): the last `Answer:` line, else the last `\\boxed{…}`, else
`none` (graded wrong). A prose Answer: line ("Answer: The answer is 9") falls back to its leading answer, then the
last box, then math-verify's own extraction of the line; `decided_by` names the path whose answer was graded.

Verification: `verify(parse(gold), parse(pred))`, gold first, each wrapped as `\\boxed{…}` so math-verify's
top-priority LaTeX extractor takes the whole string. On a miss both sides are `clean`ed and tried again.
`verify_method` names the attempt that matched; on a miss, the last attempt where both sides parsed to sympy, else
'failed'. A candidate decides when it matches or parses to a different expression; one that does not parse hands
over to the next path.

Time bound: sympy can run for ever (`9^{9^{9^{9^9}}}`), and math-verify's own timeouts use SIGALRM, which works only
on a main thread. So the whole grading of an item (extraction included) runs in long-lived worker subprocesses
(JSON lines over stdin/stdout; plain subprocesses, so they start from threads, torchrun ranks and daemonic pool
workers alike). The bound is the worker's CPU time (`timeout_s`, read from /proc), so a verdict does not depend on
how busy the machine is; a worker starved of CPU is still cut off after `WALL_CAP_FACTOR × timeout_s` of wall clock.
An overrunning worker is killed and replaced, and the item is graded wrong with reason 'timeout' (its `cpu_s` and
`wall_s` say which bound hit). Workers die with their caller: PR_SET_PDEATHSIG (they are started from one pool
thread that lives as long as the process) plus a parent-pid check. `grade` is thread-safe; `grade_many` keeps
`workers` items in flight from a thread pool and preserves order.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lib.eval.extract import extract_answer  # callers (01_gates) count extractors through lib.eval.grading

TIMEOUT_S = 5.0          # CPU-time bound on grading one item (all paths, both attempts each), worker start-up excluded
WALL_CAP_FACTOR = 6.0    # ... and a wall-clock cap for a worker that gets no CPU at all
START_TIMEOUT_S = 120.0  # a worker must import sympy + math-verify and answer a warm-up item within this


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None
    extractor: str        # 'answer_line' | 'boxed' | 'none': the primary extractor
    verify_method: str    # 'math_verify' | 'math_verify_cleaned' | 'failed'
    reason: str | None    # None when correct; else 'no answer extracted' | 'timeout' | 'parse failed' | ...
    decided_by: str = "none"   # 'answer_line' | 'answer_line_lead' | 'boxed' | 'math_verify_line' | 'none'
    cpu_s: float | None = field(default=None, compare=False)    # worker CPU / wall seconds spent on the item
    wall_s: float | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        return asdict(self)           # a samples.jsonl row stores `reason` as "grade_reason"


# --- the worker pool ---

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()       # after "(comm)": state is field 3, utime 14, stime 15
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


class _Worker:
    """A grading subprocess. `call` returns (reply, cpu_s, wall_s), reply None on overrun; EOFError if it died."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])                  # the repository root (lib/eval/ is two below)
        code = (f"import sys; sys.path.insert(0, {root!r}); from lib.eval.verify import worker_main; "
                f"worker_main({os.getpid()})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ready, self.buf = False, b""

    def _readline(self, timeout: float) -> bytes | None:
        """One line within `timeout` seconds, else None (own buffer: select() cannot see Python's)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError(f"grading worker {self.proc.pid} exited with code {self.proc.poll()}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def call(self, request: dict, timeout: float):
        self.sent = False                                 # True once this request is in the worker's hands
        if not self.ready:
            try:
                started = self._readline(START_TIMEOUT_S) is not None
            except EOFError:
                started = False
            if not started:
                raise RuntimeError(f"grading worker {self.proc.pid} did not start within {START_TIMEOUT_S:.0f} s; "
                                   "see its stderr above and check that "
                                   f"`{sys.executable} -c 'import math_verify'` works")
            self.ready = True
        cpu0, t0 = cpu_seconds(self.proc.pid), time.monotonic()
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        self.sent, reply = True, {}
        while True:
            wall = time.monotonic() - t0
            cpu_now = cpu_seconds(self.proc.pid) if cpu0 is not None else None
            cpu = wall if cpu_now is None else cpu_now - cpu0      # no /proc: the bound is wall clock
            if cpu >= timeout or wall >= WALL_CAP_FACTOR * timeout:
                return (reply or None), cpu, wall                 # no verdict: the caller kills this worker
            line = self._readline(max(0.01, min(timeout - cpu, WALL_CAP_FACTOR * timeout - wall)))
            if line is not None:
                reply = reply | json.loads(line)
                if "correct" in reply:
                    return reply, cpu, time.monotonic() - t0

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class _Pool:
    """Idle workers on a stack; at most `max_workers` alive; one spawned eagerly for each one killed. Workers are
    started from one long-lived thread: PR_SET_PDEATHSIG fires when the *thread* that started a worker exits."""

    def __init__(self):
        self.max_workers = default_workers()
        self.forget()

    def forget(self):
        """Start empty. In a forked child the inherited workers (and a lock some thread held) are the parent's."""
        self.cond = threading.Condition()
        self.idle: list[_Worker] = []
        self.alive = 0
        self.spawner = ThreadPoolExecutor(1, thread_name_prefix="grading-spawner")

    def spawn(self) -> _Worker:
        try:
            return self.spawner.submit(_Worker).result()
        except RuntimeError:                       # interpreter shutting down: start it from this thread
            return _Worker()

    def checkout(self) -> _Worker:
        with self.cond:
            while not self.idle and self.alive >= self.max_workers:
                self.cond.wait()
            if self.idle:                          # prefer a started worker over a replacement still importing
                ready = [i for i, w in enumerate(self.idle) if w.ready]
                return self.idle.pop(ready[-1] if ready else -1)
            self.alive += 1
        try:
            return self.spawn()
        except BaseException:                      # could not even start a process: give the slot back
            with self.cond:
                self.alive -= 1
                self.cond.notify()
            raise

    def checkin(self, w: _Worker):
        with self.cond:
            self.idle.append(w)
            self.cond.notify()

    def replace(self, w: _Worker, respawn: bool = True):
        """Kill `w`; its replacement starts importing now, off the clock of whoever needs it next."""
        w.kill()
        if respawn:
            return self.checkin(self.spawn())
        with self.cond:
            self.alive -= 1
            self.cond.notify()

    def shutdown(self):
        with self.cond:
            workers, self.idle, self.alive = self.idle, [], self.alive - len(self.idle)
        for w in workers:
            w.kill()


def default_workers() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, 16))


_POOL = _Pool()
atexit.register(_POOL.shutdown)
os.register_at_fork(after_in_child=_POOL.forget)
shutdown = _POOL.shutdown    # kill idle workers now (they are restarted on demand)


# --- public entry points ---

def gold_text(gold, item: str = "item") -> str:
    """A gold answer as the grader reads it; None (or a non-scalar) is an error, never the string "None"."""
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(f"{item}: gold answer is {gold!r}, not a string or number; every graded row needs an "
                         f"'answer' — fix the data file or drop the row")
    return str(gold)


def grade(completion: str, gold, timeout_s: float = TIMEOUT_S) -> Grade:
    """Grade one completion against its gold answer within `timeout_s` of worker CPU time."""
    request = {"completion": completion, "gold": gold_text(gold)}
    while True:
        w = _POOL.checkout()
        try:
            reply, cpu, wall = w.call(request, timeout_s)
        except (BrokenPipeError, EOFError):
            _POOL.replace(w)
            if not w.sent:                                # found dead before the item reached it: try another
                continue
            extracted, extractor = extract_answer(completion)
            return Grade(False, extracted, extractor, "failed", "worker crashed", extractor)
        except BaseException:                             # start-up failure, Ctrl-C mid-item: don't reuse it
            _POOL.replace(w, respawn=False)
            raise
        cpu, wall = round(cpu, 3), round(wall, 3)
        if reply is None or "correct" not in reply:
            _POOL.replace(w)
            extracted, extractor = (reply or {}).get("extracted"), (reply or {}).get("extractor", "none")
            return Grade(False, extracted, extractor, "failed", "timeout", extractor, cpu, wall)
        _POOL.checkin(w)
        return Grade(reply["correct"], reply["extracted"], reply["extractor"], reply["verify_method"],
                     reply["reason"], reply["decided_by"], cpu, wall)


def grade_many(pairs, workers: int | None = None, progress: bool | str = True,
               timeout_s: float = TIMEOUT_S) -> list[Grade]:
    """Grade [(completion, gold), ...] with `workers` items in flight; results in input order. A string `progress`
    is the bar's label."""
    from tqdm import tqdm
    pairs = [(c, gold_text(g, f"grade_many item {i}")) for i, (c, g) in enumerate(pairs)]
    workers = workers or default_workers()
    with _POOL.cond:
        _POOL.max_workers = max(_POOL.max_workers, workers)
    with ThreadPoolExecutor(workers) as ex:
        results = ex.map(lambda p: grade(p[0], p[1], timeout_s), pairs)
        label = progress if isinstance(progress, str) else "grading"
        # disable=None: no bar where stderr is not a terminal (a log file gets no carriage-return lines)
        return list(tqdm(results, total=len(pairs), desc=label, disable=None if progress else True))
