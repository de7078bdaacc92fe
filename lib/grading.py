"""The grader of SPEC §5: extract a completion's final answer, then check it against the gold with math-verify.

    grade(completion, gold) -> Grade(correct, extracted, extractor, verify_method, reason)

Extraction (regex, in the calling process): `answer_line` — the LAST line starting with `Answer:` (DAPO format;
`**Answer:**`, `### Final Answer:` tolerated; `$` delimiters dropped; a `\\boxed{…}` inside it is unwrapped; an empty
one takes the next paragraph); else `boxed` — the LAST `\\boxed{…}` whose braces balance (escaped `\\{ \\}`
do not count); else `none`, graded wrong.

Verification (in a worker process): `verify(parse(gold), parse(pred))`, gold first, each wrapped as `\\boxed{…}` so
math-verify's top-priority LaTeX extractor takes the whole string. On a miss both sides are `clean`ed and tried
again. `verify_method` names the attempt that matched; on a miss, the last attempt where both sides parsed to
sympy, else 'failed'.

Time bound: sympy can run for ever (`9^{9^{9^{9^9}}}`), and math-verify's own timeouts use SIGALRM, which works only
on a main thread. So math-verify runs with its timeouts off in long-lived worker subprocesses (JSON lines over
stdin/stdout; plain subprocesses, so they start from threads, torchrun ranks and daemonic pool workers alike).
One item is in flight per worker and the caller waits at most `timeout_s` for the reply; a worker that overruns
is killed and replaced, and the item is graded wrong with reason 'timeout'. `grade` is thread-safe; `grade_many`
keeps `workers` items in flight from a thread pool and preserves order.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

TIMEOUT_S = 5.0          # wall-clock bound on verifying one item (both attempts), worker start-up excluded
START_TIMEOUT_S = 120.0  # a worker must import sympy + math-verify and answer a warm-up item within this


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None
    extractor: str        # 'answer_line' | 'boxed' | 'none'
    verify_method: str    # 'math_verify' | 'math_verify_cleaned' | 'failed'
    reason: str | None    # None when correct; else 'no answer extracted' | 'timeout' | 'parse failed' | ...

    def as_dict(self) -> dict:
        return asdict(self)           # a samples.jsonl row stores `reason` as "grade_reason"


# --- extraction ---

_ANSWER_LINE = re.compile(r"^[\s>#*_]*(?:final\s+)?answer\s*[*_]*\s*:\s*[*_]*(.*)$", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\b")


def _balanced(text: str, i: int) -> str | None:
    """Content of the brace group opening at text[i] == '{', or None if it never closes (a truncated sample)."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2            # \{ \} \\ are escapes, not grouping
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
        j += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{…}` with balanced braces (or `\\boxed 5`), else None."""
    for m in reversed(list(_BOXED.finditer(text))):
        rest = text[m.end():]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            content = _balanced(text, m.end() + len(rest) - len(stripped))
        elif rest[:1].isspace():
            content = re.match(r"[^\s$]*", stripped).group(0)      # `\boxed 5`: up to the next space or `$`
        else:
            continue
        if content and content.strip():
            return content.strip()
    return None


def _strip_delimiters(s: str) -> str:
    """`$5$`, `\\(5\\)`, `\\[5\\]`, `**5**` -> `5`. An escaped `\\$` (a dollar amount) is kept."""
    s = re.sub(r"(?<!\\)\$", "", s).strip().strip("*").strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right):
            s = s[2:-2].strip()
    return s


def extract_answer(completion: str) -> tuple[str | None, str]:
    """(extracted answer, extractor) of a completion; (None, 'none') when it holds no answer."""
    lines = completion.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _ANSWER_LINE.match(lines[i])
        if not m:
            continue
        content = m.group(1).strip()
        if not _strip_delimiters(content):       # "Answer:" alone: the answer is the next paragraph
            content = " ".join("\n".join(lines[i + 1:]).strip().split("\n\n")[0].split("\n"))
        boxed = last_boxed(content)
        content = _strip_delimiters(boxed if boxed is not None else content)
        if content:
            return content, "answer_line"
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed, "boxed"
    return None, "none"


# --- verification (runs inside a worker) ---

def clean(s: str) -> str:
    """The retry form of an answer: no `$`, `\\text{}` wrappers, units, degrees, percent, thousands separators,
    `\\left`/`\\right`, `\\dfrac`, trailing period. Lists `1, 2, 3` and tuples `(1,2)` keep their commas."""
    s = re.sub(r"(?<!\\)\$", "", s).replace("\\$", "")
    s = re.sub(r"\\mbox\s*\{[^{}]*\}(?:\^\{?\d\}?)?", "", s)                  # units: 864 \mbox{ inches}^2
    s = re.sub(r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(?:left|right)(?:\.|(?![a-zA-Z]))", "", s)
    s = s.replace("\\displaystyle", "")
    # thousands separators between a digit and exactly three more: 10,\!080  10{,}080  10\,080  10\ 080
    s = re.sub(r"(\d)(?:,\s*\\!|\{,\}|\\[,;: ])\s*(?=\d{3}(?!\d))", r"\1", s)
    s = s.replace("\\!", "")
    if re.fullmatch(r"\s*-?\d{1,3}(?:,\d{3})+(?:\.\d+)?\s*", s):            # the whole answer is 1,000 or 1,234.5
        s = s.replace(",", "")
    s = s.strip().strip("*").strip()
    while s.endswith("."):                                                     # trailing period
        s = s[:-1].rstrip()
    return s


def _parse(s: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return parse("\\boxed{" + s + "}", extraction_config=config, parsing_timeout=None)   # None: no SIGALRM


def verify_answer(pred: str, gold: str) -> tuple[bool, str, str | None]:
    """(correct, verify_method, reason) of an extracted answer. Unbounded in time: call it through `grade`."""
    from math_verify import verify
    from sympy import Basic, MatrixBase

    def has_expr(parsed):                     # parse() falls back to the raw string when sympy parsing fails
        return any(isinstance(x, (Basic, MatrixBase)) for x in parsed)

    attempts = [("math_verify", gold, pred)]
    if (clean(gold), clean(pred)) != (gold, pred):
        attempts.append(("math_verify_cleaned", clean(gold), clean(pred)))
    parsed_method, gold_parsed = None, False
    for method, g, p in attempts:
        gold_p, pred_p = _parse(g), _parse(p)
        if verify(gold_p, pred_p, timeout_seconds=None):
            return True, method, None
        gold_parsed |= has_expr(gold_p)
        if has_expr(gold_p) and has_expr(pred_p):
            parsed_method = method
    if parsed_method:
        return False, parsed_method, "not equivalent"
    return False, "failed", "parse failed" if gold_parsed else "gold parse failed"


def _worker_main() -> None:
    """Worker loop: one JSON request per stdin line -> one JSON reply per line on the real stdout."""
    import logging
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the parent's business
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                                         # stray prints go to stderr, not into the protocol
    sys.stdout = sys.stderr
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # "timeout disabled" is by design here
    parent = os.getppid()

    def orphan_watch():                                   # a stuck worker whose parent died exits too
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)
    threading.Thread(target=orphan_watch, daemon=True).start()
    verify_answer("\\frac{1}{2}", "0.5")                  # warm-up: imports, regex and parser caches
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            correct, method, reason = verify_answer(req["pred"], req["gold"])
        except Exception as e:                            # math-verify swallows most errors; this is the rest
            correct, method, reason = False, "failed", f"error: {type(e).__name__}"
        out.write(json.dumps({"correct": correct, "verify_method": method, "reason": reason}) + "\n")
        out.flush()


# --- the worker pool ---

class _Worker:
    """A grading subprocess. `call` returns its reply, None on overrun; raises EOFError if it died."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[1])
        code = f"import sys; sys.path.insert(0, {root!r}); from lib.grading import _worker_main; _worker_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ready = False

    def _readline(self, timeout: float) -> bytes | None:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError(f"grading worker {self.proc.pid} exited with code {self.proc.poll()}")
        return line

    def call(self, request: dict, timeout: float) -> dict | None:
        self.sent = False                                 # True once this request is in the worker's hands
        if not self.ready:
            try:
                started = self._readline(START_TIMEOUT_S) is not None
            except EOFError:
                started = False
            if not started:
                raise RuntimeError(f"grading worker {self.proc.pid} did not start within {START_TIMEOUT_S:.0f} s; "
                                   f"see its stderr above and check that `{sys.executable} -c 'import math_verify'` works")
            self.ready = True
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        self.sent = True
        line = self._readline(timeout)
        return None if line is None else json.loads(line)

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class _Pool:
    """Idle workers on a stack; at most `max_workers` alive; one spawned eagerly for each one killed."""

    def __init__(self):
        self.max_workers = default_workers()
        self.forget()

    def forget(self):
        """Start empty. In a forked child the inherited workers (and a lock some thread held) are the parent's."""
        self.cond = threading.Condition()
        self.idle: list[_Worker] = []
        self.alive = 0

    def checkout(self) -> _Worker:
        with self.cond:
            while not self.idle and self.alive >= self.max_workers:
                self.cond.wait()
            if self.idle:                          # prefer a started worker over a replacement still importing
                ready = [i for i, w in enumerate(self.idle) if w.ready]
                return self.idle.pop(ready[-1] if ready else -1)
            self.alive += 1
        try:
            return _Worker()
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
            return self.checkin(_Worker())
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

def grade(completion: str, gold: str, timeout_s: float = TIMEOUT_S) -> Grade:
    """Grade one completion against its gold answer, never taking much more than `timeout_s` of verification."""
    extracted, extractor = extract_answer(completion)
    if extracted is None:
        return Grade(False, None, "none", "failed", "no answer extracted")
    while True:
        w = _POOL.checkout()
        try:
            reply = w.call({"pred": extracted, "gold": str(gold)}, timeout_s)
        except (BrokenPipeError, EOFError):
            _POOL.replace(w)
            if not w.sent:                                # found dead before the item reached it: try another
                continue
            return Grade(False, extracted, extractor, "failed", "worker crashed")
        except BaseException:                             # start-up failure, Ctrl-C mid-item: don't reuse it
            _POOL.replace(w, respawn=False)
            raise
        if reply is None:
            _POOL.replace(w)
            return Grade(False, extracted, extractor, "failed", "timeout")
        _POOL.checkin(w)
        return Grade(reply["correct"], extracted, extractor, reply["verify_method"], reply["reason"])


def grade_many(pairs, workers: int | None = None, progress: bool | str = True,
               timeout_s: float = TIMEOUT_S) -> list[Grade]:
    """Grade [(completion, gold), ...] with `workers` items in flight; results in input order. A string `progress`
    is the bar's label."""
    from tqdm import tqdm
    pairs = list(pairs)
    workers = workers or default_workers()
    with _POOL.cond:
        _POOL.max_workers = max(_POOL.max_workers, workers)
    with ThreadPoolExecutor(workers) as ex:
        results = ex.map(lambda p: grade(p[0], p[1], timeout_s), pairs)
        label = progress if isinstance(progress, str) else "grading"
        return list(tqdm(results, total=len(pairs), desc=label, disable=not progress))
