"""Tests of lib/eval/extract.py (DESIGN.md §5): where the answer is looked for, the fallback paths of a prose Answer: line,
list boxes, the retry form, and the time a looping student's completion costs. Pure functions: no worker."""
import time

import pytest

from lib.eval.extract import candidates, clean, extract_answer, first_answer, is_prose, last_boxed

# --- a prose Answer: line: which paths are offered, in order (hand-written) ---

@pytest.mark.parametrize("completion, paths", [
    ("Answer: The answer is 9", [("math_verify_line", "The answer is 9")]),
    ("Answer: $9$ (the smallest such $n$)", [("answer_line_lead", "9"),
                                             ("math_verify_line", "$9$ (the smallest such $n$)")]),
    ("Answer: 9. This follows from the parity argument.", [("answer_line_lead", "9"), (
        "math_verify_line", "9. This follows from the parity argument.")]),
    ("so \\boxed{[2,5)}.\n\nFinal Answer: The final answer is $[2,5)$. I hope it is correct.",
     [("boxed", "[2,5)"), ("math_verify_line", "The final answer is $[2,5)$. I hope it is correct.")]),
    ("Answer: 9 (the smallest such n)", [("answer_line_lead", "9"), ("math_verify_line", "9 (the smallest such n)")]),
    ("Answer: The answer is \\boxed{9}", [("answer_line", "9"), ("boxed", "9"),      # a prose line with a box: the
                                          ("math_verify_line", "The answer is \\boxed{9}")]),   # box is its answer
    ("Answer: 5", [("answer_line", "5")]),                                          # not prose: as before
    ("Answer: 4\nso \\boxed{9}", [("answer_line", "4"), ("boxed", "9")]),           # the line first, the box after
    ("Answer: \\text{no solution}", [("answer_line", "\\text{no solution}")]),     # words inside \text{} are math
    ("I think it is 5.", []),
])
def test_candidates(completion, paths):
    assert candidates(completion) == paths


def test_prose_detection():
    assert is_prose("The answer is 9") and is_prose("9 (the smallest such n)")
    assert not is_prose("\\text{Monday}") and not is_prose("x \\in [-2,7]") and not is_prose("4:30 \\text{ p.m.}")
    assert not is_prose("1+\\sqrt{19}, 1-\\sqrt{19}") and not is_prose("$\\frac{a b}{c d}$")


# --- where to look ---

@pytest.mark.parametrize("completion, extracted, extractor", [
    ("<think>\nAnswer: 3\n</think>\nThe total is \\boxed{4}.", "4", "boxed"),          # a draft in the thinking
    ("<think>\n\\boxed{3}\n</think>\n\nAnswer: 4", "4", "answer_line"),
    ("thinking...\nAnswer: 3\n</think>\n\\boxed{4}", "4", "boxed"),                   # template opened the <think>
    ("```python\nprint('x')\nAnswer: 3\n```\nSo the answer is \\boxed{4}.", "4", "boxed"),   # a draft in code
    ("<think>\nAnswer: 3\nstill thinking", "3", "answer_line"),                       # truncated: nothing visible
    ("Answer: 1\n</think>\nAnswer: 2\n</think>\n\\boxed{5}", "5", "boxed"),           # visible: after the LAST </think>
    ("Answer: 3\n<think>\nAnswer: 4", "3", "answer_line"),                            # a trailing unclosed <think>
    ("Answer:\n5\nAnswer:", "5", "answer_line"),                                      # the paragraph ends at an Answer:
    ("We get \x0cAnswer: 3\nso \\boxed{4}", "4", "boxed"),                            # a form feed is not a line break
    ("Answer: \\frac{1}{2}\x0c", "\\frac{1}{2}", "answer_line"),
    ("\\boxed{-2}, \\boxed{1}", "-2, 1", "boxed"),                                    # several boxes: one list
    ("$x = \\boxed{3}$ and $\\boxed{-1}$", "3, -1", "boxed"),
    ("\\boxed{1} then \\boxed{2}", "2", "boxed"),                                     # prose between: the last
    ("\\boxed{5}\n\n\\boxed{5}", "5", "boxed"),                                       # a repeated box is one
])
def test_where_the_answer_is(completion, extracted, extractor):
    assert extract_answer(completion) == (extracted, extractor)


# --- the answer written first (the report's "reached its answer"; hand-written) ---

@pytest.mark.parametrize("completion, first, last", [
    # a toy student past its stop: the digits it wrote instead run into its answer; the grader reads the last line
    ("1-1=0. 0+6=6.\nAnswer: 60000+1=1.\nAnswer: 1", "60000+1=1.", "1"),
    ("so \\boxed{3}, checked.\nAnswer: 4", "3", "4"),                    # the box came first
    ("Answer: 5\nsee \\boxed{7}", "5", "5"),                              # the line came first
    ("Answer:\nAnswer: 2\nAnswer: 8", "2", "8"),                          # an empty Answer: line is no answer yet
    ("Answer: 6\nAnswer: 6\nAnswer: 6", "6", "6"),                        # a loop on the answer
    ("<think>Answer: 9</think> \\boxed{8} then \\boxed{1}", "8", "1"),    # the thinking's draft does not count
    ("<think>\nAnswer: 9\n</think>no answer outside", "9", "9"),          # … unless nothing is outside it
    ("I think it is 5.", None, None),
])
def test_first_answer_is_the_earliest_where_the_grader_reads_the_last(completion, first, last):
    assert first_answer(completion) == first
    assert extract_answer(completion)[0] == last


def test_last_boxed_nested_and_escaped():
    assert last_boxed("\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("\\boxed{\\left\\{ x \\right.}") == "\\left\\{ x \\right."    # an escaped brace left open
    assert last_boxed("\\boxed{2 + \\boxed{3}}") == "3"                               # a box inside a box: the inner
    assert last_boxed("\\boxed{3} and a cut-off \\boxed{\\frac{1}{") == "3"
    assert last_boxed("\\boxed{}") is None and last_boxed("so $\\boxed 5$") == "5"


def test_clean_collapses_whitespace():
    assert clean("4:30 \\text{ p.m.}") == clean("\\text{4:30 p.m.}") == "4:30 p.m"
    assert clean("x  =\t 5") == "x = 5"


# --- a looping student costs milliseconds: the cost grows linearly with the completion ---

ADVERSARIAL = {  # name → the text at scale n (the test runs n and 10 n; the old quadratic scans took minutes at 10 n)
    "open boxes": lambda n: "\\boxed{" * n,
    "unclosed boxes": lambda n: "\\boxed{1 " * n,
    "Answer + spaces": lambda n: "Answer" + " " * n + "x",
    "Answer: + stars": lambda n: "Answer" + "*" * n + "x",
    "one long word on an Answer line": lambda n: "Answer: " + "a" * n,
    "empty Answer lines": lambda n: "Answer:\n" * n,
    "dots and spaces": lambda n: ". " * n,
    "open braces in a box": lambda n: "\\boxed{" + "{" * n,
    "closed boxes": lambda n: "".join(f"\\boxed{{{i}}}" for i in range(n)),
    "spaced list boxes": lambda n: " \\quad\\text{and}\\quad ".join(f"\\boxed{{{i}}}" for i in range(n)),
}
SCALE = {"open boxes": 400, "unclosed boxes": 1000, "Answer + spaces": 5000, "Answer: + stars": 5000,
         "one long word on an Answer line": 10_000, "empty Answer lines": 2000, "dots and spaces": 5000,
         "open braces in a box": 10_000, "closed boxes": 1000, "spaced list boxes": 1000}


def cpu_cost(text: str, repeats: int = 3) -> float:
    """The least process CPU time of `repeats` extractions (the least: other jobs on the machine only add to it)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        extract_answer(text), candidates(text), clean(text)
        best = min(best, time.process_time() - t0)
    return best


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_extraction_is_linear(name):
    make, n = ADVERSARIAL[name], SCALE[name]
    small, big = cpu_cost(make(n)), cpu_cost(make(10 * n))
    ratio = big / max(small, 1e-3)
    assert ratio < 35, f"{name}: {big:.4f} s at {10 * n} vs {small:.4f} s at {n} (×{ratio:.0f}): not linear"


def test_the_linearity_check_catches_a_quadratic_scan():
    """The same measure on a deliberately quadratic scan (every box rescans the text before it) fails."""
    def quadratic(text):
        k = text.find("\\boxed")
        while k >= 0:
            text[:k].count("{")
            k = text.find("\\boxed", k + 1)

    def cost(text):
        t0 = time.process_time()
        quadratic(text)
        return time.process_time() - t0

    make, n = ADVERSARIAL["closed boxes"], 2000
    assert cost(make(10 * n)) / max(cost(make(n)), 1e-3) >= 35
