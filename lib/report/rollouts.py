"""What the evaluated students actually wrote (DESIGN.md §6 diagnostics; the source report's §8.3 and its rollout
excerpts): extraction on truncated samples per checkpoint and condition, and a few rollouts of each checkpoint.

A truncated sample hit the token cap. Source §8.3 splits it in two: a sample that still ends in a gradeable answer
(the collapsed student reached its answer and then looped on it: a lost stop token) and one that never reached an
answer (a destroyed policy). So per unit: of the truncated samples, how many still extract an answer, and how many of
those are correct; and per condition the same counts summed over its seeds' latest evaluated checkpoints.

On the toy benchmarks the grader's split cannot tell the two apart (DESIGN.md §10): the toy's answer line has nothing
that closes it before the stop token (`Answer: 6<|im_end|>`, where a `\\boxed{6}` closes at its brace), so a student
that wrote its answer and then, instead of stopping, more digits (`Answer: 60000+1=1.`) extracts a wrong answer. So
for a toy benchmark each unit also counts the samples that REACHED the gold answer: their first answer (the row's
`first_answer`, which 04_eval writes by lib/eval/extract.first_answer) begins with it (`reached`; the toy's answers
are one digit, so this is the first answer's leading digit). Elsewhere, where a prefix proves nothing (gold 1,
first answer 12), it is not counted.

Excerpts: per evaluated checkpoint (and the student's init, for contrast), up to MAX_EXCERPTS samples of one unit,
chosen by a fixed rule so a rebuild picks the same ones: of each kind in KINDS that the unit has, the longest sample
(most tokens: the hardest problem solved, the longest loop), the first in (problem id, seed) order among equals. A
long completion is cut to its head and tail with the number of characters left out named, so the loop at its end
stays visible; `max_line_repeats` counts the most repeated line (a loop's signature).
"""
from __future__ import annotations

from collections import Counter

MAX_EXCERPTS = 3
HEAD_CHARS, TAIL_CHARS = 160, 160          # a completion longer than their sum (+ the marker) is cut in the middle
# the kinds of sample an excerpt shows, in the order they are looked for: truncated ones first (the loop)
KINDS = (("truncated, answer extracted", lambda r: r["truncated"] and r["extractor"] != "none"),
         ("truncated, no answer", lambda r: r["truncated"] and r["extractor"] == "none"),
         ("stopped, correct", lambda r: not r["truncated"] and bool(r["correct"])),
         ("stopped, wrong", lambda r: not r["truncated"] and not r["correct"]))


def reached(row: dict) -> bool:
    """The sample's first answer begins with its gold answer (spaces ignored): it got to the answer, whatever it wrote
    after it."""
    first = row["first_answer"]
    return first is not None and first.replace(" ", "").startswith(str(row["answer"]).replace(" ", ""))


def reached_counts(rows: list[dict], benchmark: str) -> dict:
    """How many samples, and how many truncated samples, reached the gold answer: counted on a toy benchmark whose
    rows carry their gold and first answers (units 04_eval wrote before it wrote them do not), else None (see the
    module docstring)."""
    if not benchmark.startswith("toy") or not rows or any("first_answer" not in r or "answer" not in r
                                                           for r in rows):
        return {"n_reached": None, "n_truncated_reached": None}
    return {"n_reached": sum(reached(r) for r in rows),
            "n_truncated_reached": sum(reached(r) for r in rows if r["truncated"])}


def _pct(k: int | None, n: int | None) -> float | None:
    return 100.0 * k / n if k is not None and n else None


def truncated_extraction(d: dict) -> dict:
    """The §8.3 numbers of one unit's diagnostics (lib.report.campaign.diagnostics, and reached_counts' two counts):
    counts and percentages."""
    n, ext, ok = d["n_truncated"], d["n_truncated_extracted"], d["n_truncated_extracted_correct"]
    return {"n_samples": d["n_samples"], "n_truncated": n, "n_extracted": ext, "n_extracted_correct": ok,
            "n_reached": d["n_reached"], "n_truncated_reached": d["n_truncated_reached"],
            "truncation_pct": d["truncation_pct"],
            "extracted_pct": _pct(ext, n),                            # of the truncated samples
            "correct_of_extracted_pct": _pct(ok, ext),
            "reached_pct": _pct(d["n_reached"], d["n_samples"]),      # of all samples
            "truncated_reached_pct": _pct(d["n_truncated_reached"], n)}


def pool_truncated(rows: list[dict]) -> dict:
    """The counts of several units (a condition's seeds) summed, then the same percentages (a reached count only
    when every unit has one)."""
    tot = {k: sum(r[k] for r in rows) for k in ("n_samples", "n_truncated", "n_extracted", "n_extracted_correct")}
    for k in ("n_reached", "n_truncated_reached"):
        tot[k] = None if any(r[k] is None for r in rows) else sum(r[k] for r in rows)
    return {**tot, "truncation_pct": _pct(tot["n_truncated"], tot["n_samples"]),
            "extracted_pct": _pct(tot["n_extracted"], tot["n_truncated"]),
            "correct_of_extracted_pct": _pct(tot["n_extracted_correct"], tot["n_extracted"]),
            "reached_pct": _pct(tot["n_reached"], tot["n_samples"]),
            "truncated_reached_pct": _pct(tot["n_truncated_reached"], tot["n_truncated"])}


def max_line_repeats(text: str) -> int:
    """How often the most frequent non-blank line occurs (1 for text without a repeated line, 0 for empty text)."""
    lines = Counter(ln.strip() for ln in text.splitlines() if ln.strip())
    return max(lines.values(), default=0)


def cut(text: str, head: int = HEAD_CHARS, tail: int = TAIL_CHARS) -> tuple[str, int]:
    """(the text, or its head and tail joined by a marker naming what was left out; characters left out)."""
    if len(text) <= head + tail + 40:
        return text, 0
    left_out = len(text) - head - tail
    return f"{text[:head]} [… {left_out} characters left out …] {text[-tail:]}", left_out


def excerpts(rows: list[dict], k: int = MAX_EXCERPTS) -> list[dict]:
    """Up to k samples of one unit, one per kind of KINDS in that order: the longest of its kind, the first in
    (problem id, seed) order among equally long ones."""
    ordered = sorted(rows, key=lambda r: (str(r["problem_id"]), int(r["seed"])))
    out = []
    for kind, test in KINDS:
        of_kind = [r for r in ordered if test(r)]
        if not of_kind:
            continue
        r = max(of_kind, key=lambda r: r["n_tokens"])          # max keeps the first of equal keys
        text, left_out = cut(r["completion"])
        out.append({"kind": kind, "problem_id": r["problem_id"], "seed": int(r["seed"]), "n_tokens": r["n_tokens"],
                    "truncated": bool(r["truncated"]), "extractor": r["extractor"], "extracted": r.get("extracted"),
                    "correct": bool(r["correct"]), "n_chars": len(r["completion"]), "chars_left_out": left_out,
                    "max_line_repeats": max_line_repeats(r["completion"]), "excerpt": text})
        if len(out) == k:
            break
    return out
