"""Verification of one item, as a grading worker runs it (DESIGN.md §5): pure but unbounded in time — sympy can run
for ever — so it is called only through lib.eval.grading, which bounds the worker's CPU time.

    verify_answer(pred, gold) -> (correct, verify_method, reason)
    decide(completion, gold)  -> the verdict dict: extraction paths tried in order (lib.eval.extract.candidates)
    worker_main(parent)       -> the worker loop: JSON lines in, an 'extracted' line then the verdict line out
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from lib.eval.extract import ascii_digits, candidates, clean, extract_answer


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

    gold, pred = ascii_digits(gold), ascii_digits(pred)        # fullwidth ５, Arabic-Indic ٥: the digit 5
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


def _own_extraction(line: str) -> str | None:
    """math-verify's own extraction of a prose line ("The final answer is $[2,5)$. I hope it is correct.")."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    found = parse(line, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)
    return found[1] if len(found) > 1 and str(found[1]).strip() else None


def decide(completion: str, gold: str) -> dict:
    """The verdict of one completion (Grade's fields but the timings): the first path whose answer matches or
    parses to a different expression decides; when none does, the first answer tried is reported."""
    primary, extractor = extract_answer(completion)
    if primary is None:
        return {"correct": False, "extracted": None, "extractor": "none", "verify_method": "failed",
                "reason": "no answer extracted", "decided_by": "none"}
    first = None
    for path, answer in candidates(completion):
        if path == "math_verify_line" and (answer := _own_extraction(answer)) is None:
            continue
        correct, method, reason = verify_answer(answer, gold)
        verdict = {"correct": correct, "extracted": answer, "extractor": extractor, "verify_method": method,
                   "reason": reason, "decided_by": path}
        if correct or reason == "not equivalent":
            return verdict
        first = first or verdict
    if first is None:                                  # a prose line nothing could read: grade it as written
        correct, method, reason = verify_answer(primary, gold)
        first = {"correct": correct, "extracted": primary, "extractor": extractor, "verify_method": method,
                 "reason": reason, "decided_by": extractor}
    return first


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker when the thread that started it exits (Linux), and exit now if the parent is gone."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)        # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):                                 # not Linux: a watch thread is the fallback
        def orphan_watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)
        threading.Thread(target=orphan_watch, daemon=True).start()
    if os.getppid() != parent:                         # the parent died before prctl took effect
        os._exit(1)


def worker_main(parent: int) -> None:
    """Worker loop: one JSON request per stdin line -> an 'extracted' line, then the verdict line, on the real
    stdout."""
    import logging
    import signal
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the parent's business
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                                         # stray prints go to stderr, not into the protocol
    sys.stdout = sys.stderr
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # "timeout disabled" is by design here
    decide("Answer: The answer is $\\frac{1}{2}$.", "0.5")     # warm-up: imports, regex and parser caches
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        primary, extractor = extract_answer(req["completion"])
        out.write(json.dumps({"extracted": primary, "extractor": extractor}) + "\n")   # kept if it then times out
        out.flush()
        try:
            verdict = decide(req["completion"], req["gold"])
        except Exception as e:                            # math-verify swallows most errors; this is the rest
            verdict = {"correct": False, "extracted": primary, "extractor": extractor, "verify_method": "failed",
                       "reason": f"error: {type(e).__name__}", "decided_by": extractor}
        out.write(json.dumps(verdict) + "\n")
        out.flush()
