"""Evaluation (DESIGN.md §5): the grader and the eval unit.

    extract.py    answer extraction: pure functions, linear in the completion's length
    verify.py     math-verify on one item, as a grading worker runs it (unbounded in time, so only called through:)
    grading.py    the grader: extraction, then verification in workers bounded in time
    units.py      one (model, benchmark, protocol) → one folder of per-sample rows and scores

May import: the plumbing, and lib/report/ (an eval unit is checked with the same reader the statistics use).
"""
