"""What the evaluated students actually wrote (DESIGN.md §6 diagnostics; the source report's §8.3 and its rollout
excerpts): extraction on truncated samples per checkpoint and condition, and a few rollouts of each checkpoint.

A truncated sample hit the token cap. Source §8.3 splits it in two: a sample that still ends in a gradeable answer
(the collapsed student reached its answer and then looped on it: a lost stop token) and one that never reached an
answer (a destroyed policy). So per unit: of the truncated samples, how many still extract an answer, and how many of
those are correct; and per condition the same counts summed over its seeds' latest evaluated checkpoints.

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


def truncated_extraction(d: dict) -> dict:
    """The §8.3 numbers of one unit's diagnostics (lib.report.campaign.diagnostics): counts and percentages."""
    n, ext, ok = d["n_truncated"], d["n_truncated_extracted"], d["n_truncated_extracted_correct"]
    return {"n_samples": d["n_samples"], "n_truncated": n, "n_extracted": ext, "n_extracted_correct": ok,
            "truncation_pct": d["truncation_pct"],
            "extracted_pct": 100.0 * ext / n if n else None,          # of the truncated samples
            "correct_of_extracted_pct": 100.0 * ok / ext if ext else None}


def pool_truncated(rows: list[dict]) -> dict:
    """The counts of several units (a condition's seeds) summed, then the same percentages."""
    tot = {k: sum(r[k] for r in rows) for k in ("n_samples", "n_truncated", "n_extracted", "n_extracted_correct")}
    return {**tot, "truncation_pct": 100.0 * tot["n_truncated"] / tot["n_samples"] if tot["n_samples"] else None,
            "extracted_pct": 100.0 * tot["n_extracted"] / tot["n_truncated"] if tot["n_truncated"] else None,
            "correct_of_extracted_pct": (100.0 * tot["n_extracted_correct"] / tot["n_extracted"]
                                         if tot["n_extracted"] else None)}


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
