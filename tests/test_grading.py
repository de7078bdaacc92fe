"""Tests of lib/eval/grading.py (DESIGN.md §5): extraction (more in test_extract.py), math-verify equivalence on every
MATH-500 answer shape, the real benchmarks' gold answers (self-match and cross-problem mismatch), prose fallbacks and
what decided, the CPU-time bound (a starved worker is no timeout; the wall cap), adversarial inputs on a loaded
machine, workers dying with a killed caller, and thread/process safety."""
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from lib.benchmarks import data_dir
from lib.eval import grading
from lib.eval.extract import clean, extract_answer
from lib.eval.grading import TIMEOUT_S, Grade, grade, grade_many

BENCHMARKS = ("math500", "aime24", "aime25")


# --- extraction (pure, no worker) ---

@pytest.mark.parametrize("completion, extracted, extractor", [
    ("work...\nAnswer: 5", "5", "answer_line"),
    ("work...\n**Answer:** 5", "5", "answer_line"),
    ("work...\n**Answer**: $\\frac{1}{2}$", "\\frac{1}{2}", "answer_line"),
    ("### Final Answer: $$x=3$$", "x=3", "answer_line"),
    ("Answer: $\\boxed{7}$", "7", "answer_line"),                              # box inside the Answer: line
    ("Answer: 3\nmore thought\nAnswer: 4", "4", "answer_line"),                 # last Answer: line wins ...
    ("Answer: 4\nso \\boxed{9}", "4", "answer_line"),                           # ... also over a later box
    ("Answer:\n\n$12$", "12", "answer_line"),                                   # the answer on the next line
    ("**Final Answer:**\n\\[\n\\boxed{70}\n\\]\n\nDone.", "70", "answer_line"),   # ... or display math
    ("</think>\n\n**Final Answer**\n\\[\n\\boxed{70}\n\\]", "70", "boxed"),     # no colon: the box
    ("Answer: \\$18.90", "\\$18.90", "answer_line"),                           # an escaped dollar is content
    ("The answer is \\boxed{\\frac{1}{\\sqrt{2}}}.", "\\frac{1}{\\sqrt{2}}", "boxed"),   # nested braces
    ("\\boxed{1} then \\boxed{\\{1,2\\}}", "\\{1,2\\}", "boxed"),                 # last box; escaped braces
    ("\\boxed{3} and a cut-off \\boxed{\\frac{1}{", "3", "boxed"),              # unbalanced last box skipped
    ("so $\\boxed 5$", "5", "boxed"),
    ("the answer: 5 is my guess", None, "none"),                                # 'answer:' mid-line is prose
    ("I think it is 5.", None, "none"),
    ("", None, "none"),
])
def test_extract_answer(completion, extracted, extractor):
    assert extract_answer(completion) == (extracted, extractor)


def test_clean_keeps_lists_and_tuples():
    assert clean("(1,2)") == "(1,2)" and clean("1, 2, 3") == "1, 2, 3" and clean("1,-2") == "1,-2"
    assert clean("10,\\!080") == "10080" and clean("1,000") == "1000" and clean("10\\,080") == "10080"
    assert clean("$30^{\\circ}$.") == "30" and clean("\\text{(C)}") == "(C)" and clean("\\dfrac{1}{2}") == "\\frac{1}{2}"
    assert clean("864 \\mbox{ inches}^2") == "864" and clean("\\left( 1, 2 \\right)") == "( 1, 2 )"


# --- hand-checked equivalences: every answer shape of MATH-500 ---

HAND_CASES = [  # (gold, completion, correct?) — the truth decided by hand, not by running the grader
    # fractions and decimals
    ("\\frac{1}{2}", "Answer: 0.5", True), ("\\frac{1}{2}", "Answer: 1/2", True),
    ("\\dfrac{17}{50}", "Answer: \\frac{17}{50}", True), ("\\frac{1}{2}", "Answer: \\tfrac12", True),
    ("\\frac{14}{3}", "Answer: 4\\frac{2}{3}", True), ("\\frac{1}{2}", "Answer: \\frac{1}{3}", False),
    (".35625", "Answer: 0.35625", True), ("1.25", "Answer: 1.2", False),
    # radicals
    ("2\\sqrt{3}", "Answer: \\sqrt{12}", True), ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}", True),
    ("2\\sqrt{3}", "Answer: 3\\sqrt{2}", False), ("1 \\pm \\sqrt{19}", "Answer: 1+\\sqrt{19}, 1-\\sqrt{19}", True),
    # degrees
    ("30^\\circ", "Answer: 30", True), ("30", "Answer: 30^{\\circ}", True), ("30^\\circ", "Answer: 30°", True),
    ("30^\\circ", "Answer: 60^\\circ", False),
    # \text{}: multiple choice, words
    ("\\text{(C)}", "Answer: C", True), ("\\text{(C)}", "Answer: (C)", True), ("\\text{(C)}", "Answer: \\textbf{(C)}", True),
    ("\\text{(C)}", "Answer: (B)", False), ("\\text{Monday}", "Answer: \\text{Monday}", True),
    ("\\text{Monday}", "Answer: Monday", True), ("\\text{Monday}", "Answer: \\text{Tuesday}", False),
    # intervals: open vs closed ends matter
    ("(-\\infty, 3]", "Answer: (-\\infty,3]", True), ("(-\\infty, 3]", "Answer: (-\\infty, 3)", False),
    ("[2,5)", "Answer: [2, 5)", True), ("(2,5)", "Answer: [2,5]", False), ("[2,5]", "Answer: (2,5)", False),
    ("(0,9) \\cup (9,36)", "Answer: (0,9)\\cup(9,36)", True), ("x \\in [-2,7]", "Answer: [-2,7]", True),
    # tuples / points: order matters
    ("(1,2)", "Answer: (2,1)", False), ("(8,-2)", "Answer: (8, -2)", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "Answer: (3, \\pi/2)", True), ("(6,31,-1)", "Answer: (6,31,1)", False),
    # matrices / vectors
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "Answer: \\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "Answer: \\begin{bmatrix} 1 \\\\ 2 \\end{bmatrix}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "Answer: \\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", False),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}}", True),
    # base subscripts: the digits in that base are the answer, not the decimal value
    ("1011_2", "Answer: 1011_2", True), ("1011_2", "Answer: 1011_{2}", True), ("1011_2", "Answer: 1011", True),
    ("1011_2", "Answer: 11", False),
    # thousands separators
    ("10,\\!080", "Answer: 10080", True), ("10080", "Answer: 10,\\!080", True), ("10,\\!080", "Answer: 10\\,080", True),
    ("1,000", "Answer: 1000", True), ("1000", "Answer: 1,000", True), ("\\$32,\\!348", "Answer: \\$32,348", True),
    ("10,\\!080", "Answer: 10,\\!081", False),
    # lists of roots: order-free, but every root needed
    ("1, -2", "Answer: -2, 1", True), ("1,-2", "Answer: 1", False), ("3, 5, 7", "Answer: 7, 5, 3", True),
    ("\\{1\\pm\\sqrt{5},-2\\}", "Answer: -2, 1+\\sqrt5, 1-\\sqrt5", True),
    # signs
    ("-5", "Answer: -5", True), ("-5", "Answer: 5", False), ("-\\frac{35}{9}", "Answer: -35/9", True),
    # percent
    ("25\\%", "Answer: 25\\%", True), ("25\\%", "Answer: 0.25", True), ("25\\%", "Answer: 26\\%", False),
    # pi and symbolic expressions, equations, complex numbers, money, units
    ("\\frac{\\pi}{2}", "Answer: \\pi/2", True), ("288 \\pi", "Answer: 288\\pi", True), ("\\pi", "Answer: 3.14", False),
    ("p - q", "Answer: -q + p", True), ("x^3+3x-6", "Answer: x^3+3x+6", False), ("6 - 5i", "Answer: 6-5i", True),
    ("y = 2x + 3", "Answer: y=3+2x", True), ("x=5", "Answer: 5", True), ("\\$18.90", "Answer: 18.90", True),
    ("864 \\mbox{ inches}^2", "Answer: 864", True), ("5.4 \\text{ cents}", "Answer: 5.4", True),
    # trailing period and markdown
    ("5", "Answer: 5.", True), ("(1,2)", "Answer: (1, 2).", True), ("\\text{Monday}", "Answer: \\text{Monday.}", True),
    ("5", "**Answer:** 5", True), ("5", "**Answer:** 6", False),
    # extractor interplay: the last Answer: line is graded, not an earlier one or a box
    ("4", "Answer: 3\nwait, recheck\nAnswer: 4", True), ("3", "Answer: 3\nwait, recheck\nAnswer: 4", False),
    ("9", "Answer: 4\nso \\boxed{9}", False),
    # a final answer split over boxes joined by "and" / spacing: the joined set is graded (issue 34)
    ("1,-2", "so $x = \\boxed{-2} \\quad\\text{and} \\quad \\boxed{1}$", True),
    ("(2, 2), (6, 2)", "\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}", True),
    ("1,-2", "\\boxed{1},\\ \\boxed{-2}", True),
    ("1,-2", "Try \\boxed{1} first. It fails the check, so the answer is \\boxed{-2}", False),   # a scratch box
    ("-2", "\\boxed{-2} \\quad\\text{and} \\quad \\boxed{1}", False),                       # the set is not -2
    ("(2, 2), (6, 2)", "\\boxed{(2, 2)} \\quad \\text{or rather} \\quad \\boxed{(6, 2)}", False),
    # Unicode digits are the digits they mean (issue 34)
    ("5", "Answer: ５", True), ("5", "Answer: ٥", True), ("12", "Answer: ١٢", True), ("125", "\\boxed{۱۲۵}", True),
    ("5", "Answer: ６", False), ("25", "Answer: ２５０", False),
    ("５", "Answer: 5", True),                                                   # ... in the gold answer too
]


@pytest.fixture(scope="module")
def hand_grades():
    return grade_many([(c, g) for g, c, _ in HAND_CASES], progress=False)


def test_hand_cases(hand_grades):
    wrong = [(g, c, want, r) for (g, c, want), r in zip(HAND_CASES, hand_grades) if r.correct != want]
    assert not wrong, "\n".join(f"gold {g!r} vs {c!r}: want {w}, got {r}" for g, c, w, r in wrong)
    assert all(r.reason is None for r in hand_grades if r.correct)
    assert all(r.reason == "not equivalent" for r in hand_grades if not r.correct)


def test_cleaned_retry_is_recorded(hand_grades):
    """Answers math-verify misses as written (trailing period, °, thin-space separators) match on the cleaned retry."""
    by_case = {(g, c): r for (g, c, _), r in zip(HAND_CASES, hand_grades)}
    for g, c in [("5", "Answer: 5."), ("30^\\circ", "Answer: 30°"), ("10,\\!080", "Answer: 10\\,080"),
                 ("\\text{Monday}", "Answer: \\text{Monday.}")]:
        assert by_case[g, c].verify_method == "math_verify_cleaned", (g, c, by_case[g, c])
    assert by_case["\\frac{1}{2}", "Answer: 0.5"].verify_method == "math_verify"


def test_no_answer_and_unparseable():
    assert grade("I am not sure.", "5") == Grade(False, None, "none", "failed", "no answer extracted")
    d = grade("Answer: @@@", "5").as_dict()
    assert d.pop("cpu_s") < TIMEOUT_S and d.pop("wall_s") < TIMEOUT_S * grading.WALL_CAP_FACTOR
    assert d == {"correct": False, "extracted": "@@@", "extractor": "answer_line", "verify_method": "failed",
                 "reason": "parse failed", "decided_by": "answer_line"}
    assert grade("Answer: 5", "").reason == "gold parse failed"
    # no path decides (neither parses): the verdict reports the first answer tried, the Answer: line's
    d = grade("Answer: @@@\nso \\boxed{##}", "5")
    assert (d.extracted, d.decided_by, d.reason) == ("@@@", "answer_line", "parse failed")


def test_extraction_runs_in_the_worker(monkeypatch):
    """The caller never extracts (a stall there would escape the bound): broken in the caller, grading still works."""
    def broken(*_):
        raise AssertionError("extraction ran in the calling process")
    monkeypatch.setattr(grading, "extract_answer", broken)
    r = grade("Answer: The answer is $\\frac{1}{2}$.", "0.5")
    assert (r.correct, r.extractor, r.decided_by, r.extracted) == (True, "answer_line", "math_verify_line", "\\frac{1}{2}")


def test_none_gold_is_an_error_naming_the_item():
    with pytest.raises(ValueError, match="grade_many item 1: gold answer is None"):
        grade_many([("Answer: 1", "1"), ("Answer: None", None)], progress=False)
    with pytest.raises(ValueError, match="gold answer is None"):
        grade("Answer: None", None)
    with pytest.raises(ValueError, match="gold answer is True, not a string or number"):
        grade("Answer: True", True)                                 # a JSON boolean is no number (nor "True")
    assert grade("Answer: 7", 7).correct                            # an integer gold (AIME) is its digits


# --- prose on the Answer line, lists, whitespace, drafts: (gold, completion, correct, decided_by) by hand ---

FALLBACK_CASES = [
    ("9", "Answer: The answer is 9", True, "math_verify_line"),
    ("9", "Answer: $9$ (the smallest such $n$)", True, "answer_line_lead"),
    ("9", "Answer: 9. This follows from the parity argument.", True, "answer_line_lead"),
    ("[2,5)", "so \\boxed{[2,5)}.\n\nFinal Answer: The final answer is $[2,5)$. I hope it is correct.", True, "boxed"),
    ("[2,5)", "Final Answer: The final answer is $[2,5)$. I hope it is correct.", True, "math_verify_line"),
    ("7", "Answer: The answer is 9", False, "math_verify_line"),     # the fallback reads 9: still wrong
    ("9", "Answer: $4$ (or maybe $9$)", False, "answer_line_lead"),  # a hedge: the leading answer decides
    ("9", "Answer: 4\nso \\boxed{9}", False, "answer_line"),         # a plain line is never overruled by a box
    ("\\text{4:30 p.m.}", "Answer: 4:30 \\text{ p.m.}", True, "answer_line"),
    ("-2, 1", "So $x = \\boxed{-2}$, $\\boxed{1}$.", True, "boxed"),
    ("-2, 1", "\\boxed{1}", False, "boxed"),
    ("4", "<think>\nAnswer: 3\n</think>\nThe total is \\boxed{4}.", True, "boxed"),
    ("4", "```\nAnswer: 3\n```\nSo \\boxed{4}.", True, "boxed"),
]


def test_fallback_paths_and_what_decided():
    got = grade_many([(c, g) for g, c, _, _ in FALLBACK_CASES], progress=False)
    wrong = [(g, c, want, path, r) for (g, c, want, path), r in zip(FALLBACK_CASES, got)
             if (r.correct, r.decided_by) != (want, path)]
    assert not wrong, "\n".join(f"gold {g!r} vs {c!r}: want {w} by {p}, got {r}" for g, c, w, p, r in wrong)


# --- the real benchmarks ---

def _load_benchmarks():
    d = data_dir()
    if d is None:
        pytest.skip("no benchmark data: set OPD_DATA_DIR to the folder holding math500/aime24/aime25.jsonl")
    rows = {}
    for b in BENCHMARKS:
        if not (d / f"{b}.jsonl").exists():
            pytest.skip(f"{d / b}.jsonl missing: set OPD_DATA_DIR to the folder holding the benchmark files")
        rows[b] = [json.loads(line) for line in (d / f"{b}.jsonl").read_text().splitlines() if line.strip()]
    return rows


def _simple_value(s: str):
    """Independent normal form: a Fraction for plain numerics (ints, decimals, a/b, \\frac{a}{b}), else the string
    without spaces, `\\left`/`\\right`, `\\dfrac`, and a leading `x=` (an answer "x=5" to "find x" is 5)."""
    s = re.sub(r"\s+|\\left|\\right|\\!", "", s).replace("\\dfrac", "\\frac")
    s = re.sub(r"^[a-z]=", "", s)
    m = re.fullmatch(r"(-?)\\frac\{?(\d+)\}?\{?(\d+)\}?", s)
    if m:
        return Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1)
    try:
        return Fraction(s)
    except ValueError:
        return s


@pytest.fixture(scope="module")
def benchmark_grades():
    rows = _load_benchmarks()
    golds = [r["answer"] for b in BENCHMARKS for r in rows[b]]
    # gold of the next problem of the same benchmark: a wrong answer of realistic shape
    others = [rows[b][(i + 1) % len(rows[b])]["answer"] for b in BENCHMARKS for i in range(len(rows[b]))]
    boxed = golds[::5]
    cases = ([(f"Some work.\nAnswer: {g}", g) for g in golds]
             + [(f"Some work.\nAnswer: {o}", g) for o, g in zip(others, golds)]
             + [(f"So the answer is $\\boxed{{{g}}}$.", g) for g in boxed])
    t0 = time.time()
    grades = grade_many(cases, progress=False)
    print(f"\ngrade_many: {len(cases)} cases in {time.time() - t0:.1f} s")
    n = len(golds)
    return golds, others, boxed, grades[:n], grades[n:2 * n], grades[2 * n:]


def test_every_gold_answer_grades_correct(benchmark_grades):
    golds, _, boxed, own, _, own_boxed = benchmark_grades
    assert len(golds) == 560
    bad = [(g, r) for g, r in zip(golds, own) if not (r.correct and r.extractor == "answer_line" and r.extracted == g)]
    assert not bad, bad
    bad = [(g, r) for g, r in zip(boxed, own_boxed) if not (r.correct and r.extractor == "boxed" and r.extracted == g)]
    assert not bad, bad


def test_other_problems_gold_is_wrong_unless_equal(benchmark_grades):
    golds, others, _, _, cross, _ = benchmark_grades
    equal = [(g, o) for g, o in zip(golds, others) if _simple_value(g) == _simple_value(o)]
    disagree = [(g, o, r) for g, o, r in zip(golds, others, cross) if r.correct != (_simple_value(g) == _simple_value(o))]
    assert not disagree, disagree
    print(f"\n{len(equal)} of {len(golds)} neighbouring gold pairs are genuinely equal: {equal}")
    assert len(equal) < 10                    # neighbours almost always differ: this test is about wrong answers


# --- the time bound ---

ADVERSARIAL = "9^{9^{9^{9^{9}}}}"       # sympy evaluates the power tower while comparing it with the gold 1


def test_timeout_is_bounded_and_the_pool_recovers():
    grade("Answer: 1", "1")                                        # a started worker, so start-up is off the clock
    # unbounded, the same check runs past the bound: run it in a bare process for TIMEOUT_S + 2 s (1 s of imports)
    t_bare = time.time()
    bare = subprocess.Popen([sys.executable, "-c", f"from lib.eval.verify import verify_answer; "
                             f"verify_answer({ADVERSARIAL!r}, '1')"], cwd=Path(grading.__file__).resolve().parents[2],
                            stderr=subprocess.DEVNULL)
    pids_before = {w.proc.pid for w in grading._POOL.idle}
    t0 = time.time()
    r = grade(f"Answer: {ADVERSARIAL}", "1")
    elapsed = time.time() - t0
    assert (r.correct, r.reason, r.extracted, r.extractor) == (False, "timeout", ADVERSARIAL, "answer_line")
    cap = TIMEOUT_S * grading.WALL_CAP_FACTOR
    assert r.cpu_s < TIMEOUT_S + 0.5 and (r.cpu_s >= TIMEOUT_S or r.wall_s >= cap), r   # the worker's CPU time ...
    assert TIMEOUT_S - 0.1 < elapsed < cap + 1.0, elapsed          # ... or, on a starved machine, the wall cap
    killed = pids_before - {w.proc.pid for w in grading._POOL.idle}
    assert len(killed) == 1                                        # the stuck worker was replaced ...
    with pytest.raises(ProcessLookupError):
        os.kill(killed.pop(), 0)                                   # ... and is gone
    t0 = time.time()
    assert grade("Answer: 2", "2").correct                         # the next call is not blocked behind it
    after = time.time() - t0
    try:
        bare.wait(timeout=max(0.1, t_bare + TIMEOUT_S + 2.0 - time.time()))
        pytest.fail(f"the unbounded check finished: {ADVERSARIAL} no longer demonstrates a stall")
    except subprocess.TimeoutExpired:
        pass
    finally:
        bare.kill()
        bare.wait()
    print(f"\ntimeout returned after {elapsed:.2f} s (bound {TIMEOUT_S} s CPU, {r.cpu_s} s used); next call {after:.2f} s")
    assert after < TIMEOUT_S


def _stop_idle_workers_for(seconds: float) -> list[int]:
    """SIGSTOP every idle grading worker (ours, by pid) and SIGCONT them after `seconds`: a starved machine."""
    pids = [w.proc.pid for w in grading._POOL.idle]
    for pid in pids:
        os.kill(pid, 19)                                           # SIGSTOP

    def resume():
        for pid in pids:
            try:
                os.kill(pid, 18)                                   # SIGCONT
            except ProcessLookupError:                             # killed as overrunning meanwhile
                pass
    threading.Timer(seconds, resume).start()
    return pids


def test_a_starved_worker_is_not_a_timeout():
    """Under load an item waits for CPU; its verdict must not change. A wall-clock bound of 1 s would time it out."""
    grade_many([("Answer: 1", "1")] * 2, workers=2, progress=False)
    _stop_idle_workers_for(2.5)
    t0 = time.time()
    r = grade("Answer: \\frac{1}{2}", "0.5", timeout_s=1.0)
    assert time.time() - t0 > 2.0                                  # it really waited on a stopped worker
    assert (r.correct, r.reason) == (True, None) and r.cpu_s < 1.0 and r.wall_s > 2.0, r


def test_a_worker_without_cpu_is_cut_at_the_wall_cap():
    grade_many([("Answer: 1", "1")] * 2, workers=2, progress=False)
    cap = 0.5 * grading.WALL_CAP_FACTOR
    _stop_idle_workers_for(cap + 2.0)
    t0 = time.time()
    r = grade("Answer: 3", "3", timeout_s=0.5)
    elapsed = time.time() - t0
    assert (r.correct, r.reason, r.extracted) == (False, "timeout", None) and r.cpu_s < 0.5, r
    assert cap - 0.1 < elapsed < cap + 1.0, elapsed
    time.sleep(2.5)                                                # the replaced ones resume and are killed by then


def test_adversarial_inputs_return_within_the_bound_on_a_loaded_machine():
    from test_extract import ADVERSARIAL, SCALE
    LOOPING = {name: make(10 * SCALE[name]) for name, make in ADVERSARIAL.items()}   # the large side of each
    grade("Answer: 1", "1")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        took = {}
        for name, text in LOOPING.items():
            t0 = time.time()
            r = grade(text + "\n" + "Answer: 9", "9")             # the item's own answer comes after the loop
            took[name] = time.time() - t0
            assert r.correct and r.reason is None, (name, r)
        assert max(took.values()) < TIMEOUT_S + 1.0, took
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print("\nunder 2 CPU hogs, seconds per item: " + ", ".join(f"{k} {v:.2f}" for k, v in took.items()))


CALLER = f"""
import sys, threading
from lib.eval import grading
threading.Thread(target=grading.grade, args=({"Answer: " + ADVERSARIAL!r}, "1", 600.0), daemon=True).start()
print("grading", flush=True)
threading.Event().wait()
"""


def _children(ppid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == ppid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [9, 15])
def test_workers_die_with_a_killed_caller(sig):
    """A caller killed (SIGKILL / SIGTERM) while its worker is stuck on a power tower leaves no worker running."""
    caller = subprocess.Popen([sys.executable, "-c", CALLER], cwd=Path(grading.__file__).resolve().parents[2],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout.readline().strip() == "grading"
        deadline = time.time() + 60
        while time.time() < deadline:                              # wait until the worker is busy on the item
            busy = [p for p in _children(caller.pid) if (grading.cpu_seconds(p) or 0) > 1.5]
            if busy:
                break
            time.sleep(0.2)
        assert busy, "the caller's worker never got busy"
        workers = _children(caller.pid)
    finally:
        os.kill(caller.pid, sig)
        caller.wait()
    t0 = time.time()
    while any(_alive(p) for p in workers) and time.time() - t0 < 5.0:
        time.sleep(0.1)
    left = [p for p in workers if _alive(p)]
    for p in left:                                                 # do not leave them burning CPU for others
        os.kill(p, 9)
    assert not left, f"grading workers {left} outlived their caller (signal {sig})"


def test_dead_idle_workers_are_replaced():
    # from an empty pool: replacements that earlier tests left still importing (not yet `ready`) are checked out
    # after every started worker, so one killed here could outlive the single grade() below
    grading.shutdown()
    grade_many([("Answer: 1", "1")] * 4, workers=2, progress=False)
    time.sleep(0.5)
    assert all(w.proc.poll() is None for w in grading._POOL.idle)   # the pool's threads are gone; its workers not
    for w in list(grading._POOL.idle):                             # our own grading workers, killed by pid
        os.kill(w.proc.pid, 9)
        w.proc.wait()
    assert grade("Answer: 2", "2").correct
    assert all(w.proc.poll() is None for w in grading._POOL.idle)


# --- thread and process safety ---

def test_threads_agree_with_sequential():
    cases = [(c, g) for g, c, _ in HAND_CASES]
    sequential = [grade(c, g) for c, g in cases]
    results = [None] * len(cases)

    def run(k):
        for i in range(k, len(cases), 4):
            results[i] = grade(*cases[i])
    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == sequential


def _grade_in_child(cases):
    return [grade(c, g) for c, g in cases], {w.proc.pid for w in grading._POOL.idle}


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_grade_inside_a_daemonic_pool_worker(start_method):
    """multiprocessing pool workers are daemonic and may not start multiprocessing children; grade still works. A
    forked child must use grading workers of its own, not the parent's through the pipes it inherited."""
    cases = [("Answer: 0.5", "\\frac{1}{2}"), ("Answer: (2,1)", "(1,2)"), ("nothing", "3")]
    local = [grade(c, g) for c, g in cases]
    parent_pids = {w.proc.pid for w in grading._POOL.idle}
    with multiprocessing.get_context(start_method).Pool(1) as pool:
        remote, child_pids = pool.apply(_grade_in_child, (cases,))
    assert remote == local
    assert child_pids and not child_pids & parent_pids
    assert {w.proc.pid for w in grading._POOL.idle} == parent_pids


def test_workers_start_whatever_the_callers_working_directory(tmp_path):
    """A stage run from another folder (`python /path/to/04_eval.py`) still starts its grading workers: they find
    the repository by the grader's own path, not by the working directory."""
    repo = str(Path(grading.__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {repo!r}); from lib.eval.grading import grade; print(grade('Answer: 1', '1').correct)"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr[-2000:]
