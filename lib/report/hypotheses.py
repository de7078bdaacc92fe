"""Hypotheses as data (lib/registry.py HYPOTHESES), evaluated clause by clause on 05_stats' records (DESIGN.md §6).

A hypothesis holds when every clause holds; it fails when any clause fails (the report names each failing clause and
the measurement that failed it); otherwise it is undecided, and the report says what is missing (a run not finished,
a checkpoint not evaluated, a gate unit not measured). Each clause reads the runs of the conditions its `where`
selects (lib/report/conditions.py): their collapse watch and step-1 reward from training.json, and their pooled
verdicts from the cross-condition summary (one row per condition × benchmark at the benchmark's primary protocol).
"""
from __future__ import annotations

from lib.train.collapse import CLIP_HELD, CLIP_ONSET

HOLDS, FAILS, UNDECIDED = "holds", "fails", "undecided"


def _selects(where: tuple, condition: dict, pair: str) -> bool:
    """Does a condition match every (setting, value) of `where`, and belong to `pair`? A condition without recorded
    settings is known only by its reward."""
    s = condition["settings"] if condition["settings"] is not None else {"reward": condition["reward"]}
    return s.get("pair", pair) == pair and all(s.get(k) == v for k, v in where)


def _where_text(where: tuple) -> str:
    return ", ".join(f"{k} = {v}" for k, v in where) or "every condition"


def clause_text(clause) -> str:
    """The clause in words, as the report prints it."""
    sel = _where_text(clause.where)
    through = f"step {clause.through_step}" if clause.through_step is not None else "the planned last step"
    return {"teacher_gate": "the teacher-gain gate passes",
            "no_collapse": f"no collapse (clip ratio > {CLIP_ONSET}) through {through} in any run of [{sel}]",
            "held": f"the clip ratio stays below {CLIP_HELD} through the planned last step in every run of [{sel}]",
            "collapse": f"a collapse onset (clip ratio > {CLIP_ONSET}) in every run of [{sel}]",
            "reward_negative": f"the weighted reward mean is negative at step 1 in every run of [{sel}]",
            "gain": f"a pooled gain whose CI excludes 0 (Holm-adjusted) on at least {clause.min_benchmarks} "
                    f"benchmark(s) for [{sel}]"}.get(clause.kind, f"unknown clause kind {clause.kind!r}")


def _no_collapse(clause, runs):
    failed, short = [], []
    for r in runs:
        last = clause.through_step if clause.through_step is not None else r["steps_planned"]
        onset = r["watch"]["collapse_onset_step"]
        if last is None:
            short.append(f"{r['run']} records no planned step count")
        elif onset is not None and onset <= last:
            failed.append(f"{r['run']}: clip ratio first exceeded {CLIP_ONSET} at step {onset}")
        elif r["last_step"] < last:
            short.append(f"{r['run']} logged {r['last_step']} of {last} steps ({r['status']})")
    if failed:
        return FAILS, "; ".join(failed)
    if short:
        return UNDECIDED, "; ".join(short)
    peak = max((r["watch"]["peak_clip_ratio"] or 0.0 for r in runs), default=0.0)
    return HOLDS, f"{len(runs)} run(s), peak clip ratio {peak:.3f}"


def _held(runs):
    """Every run's peak clip ratio below CLIP_HELD: a fix that only keeps a run under the onset while its rollouts run
    away (clip 0.45, length doubled) has delayed the collapse, not prevented it."""
    peak = {r["run"]: r["watch"]["peak_clip_ratio"] or 0.0 for r in runs}
    failed = [f"{r['run']}: peak clip ratio {peak[r['run']]:.3f}" for r in runs if peak[r["run"]] >= CLIP_HELD]
    if failed:
        return FAILS, "; ".join(failed)
    short = [f"{r['run']} logged {r['last_step']} of {r['steps_planned'] or '?'} steps ({r['status']})" for r in runs
             if r["steps_planned"] is None or r["last_step"] < r["steps_planned"]]
    if short:
        return UNDECIDED, "; ".join(short)
    return HOLDS, f"{len(runs)} run(s), peak clip ratio {max(peak.values()):.3f}"


def _collapse(runs):
    missing = [r for r in runs if r["watch"]["collapse_onset_step"] is None]
    if not missing:
        return HOLDS, "onset at step " + ", ".join(f"{r['watch']['collapse_onset_step']} ({r['run']})" for r in runs)
    # a run that reached its planned last step without an onset fails the clause; one that stopped short (killed,
    # budget-stopped, still running) may yet collapse
    done = [r for r in missing if r["steps_planned"] is not None and r["last_step"] >= r["steps_planned"]]
    if done:
        return FAILS, "; ".join(f"{r['run']}: no onset in {r['last_step']} steps (peak clip ratio "
                                f"{r['watch']['peak_clip_ratio'] or 0.0:.3f})" for r in done)
    return UNDECIDED, "; ".join(f"{r['run']} ({r['status']}) at step {r['last_step']} of "
                                f"{r['steps_planned'] or '?'}, no onset yet" for r in missing)


def _reward_negative(runs):
    unknown = [r["run"] for r in runs if r["step1_weighted_reward"] is None]
    if unknown:
        return UNDECIDED, f"no step-1 weighted reward logged by {', '.join(unknown)}"
    bad = [r for r in runs if r["step1_weighted_reward"] >= 0]
    if bad:
        return FAILS, "; ".join(f"{r['run']}: {r['step1_weighted_reward']:+.4f} at step 1" for r in bad)
    return HOLDS, "; ".join(f"{r['run']}: {r['step1_weighted_reward']:+.4f}" for r in runs)


def _gain(clause, chosen, rows):
    if len(chosen) != 1:
        names = ", ".join(c["name"] for c in chosen) or "none"
        return UNDECIDED, f"the clause selects {len(chosen)} conditions ({names}); it needs exactly one"
    cond = chosen[0]
    decided = [r for r in rows if r["condition_id"] == cond["id"] and r["decision"] is not None]
    if not decided:
        return UNDECIDED, f"no evaluated checkpoint of condition {cond['name']}"
    wins = [r for r in decided if r["decision"]["verdict"] == "gain"]
    shown = "; ".join(f"{r['benchmark']}/{r['protocol']} {r['decision']['gain_pp']:+.3f} "
                      f"[{r['decision']['ci95_pp'][0]:+.3f}, {r['decision']['ci95_pp'][1]:+.3f}] "
                      f"{r['decision']['verdict']}" for r in decided)
    if len(wins) >= clause.min_benchmarks:
        return HOLDS, shown
    return FAILS, f"{len(wins)} of {len(decided)} benchmark(s) show a gain: {shown}"


def evaluate(hypothesis, conditions: list[dict], runs: list[dict], rows: list[dict], gate: dict) -> dict:
    """The verdict of one hypothesis. `conditions` and `rows` are 05's conditions and cross-condition summary rows,
    `runs` its training records (each with condition_id, watch, status, last_step, steps_planned,
    step1_weighted_reward), `gate` the teacher-gain gate."""
    out = []
    for k, clause in enumerate(hypothesis.clauses, 1):
        chosen = [c for c in conditions if _selects(clause.where, c, hypothesis.pair)]
        ids = {c["id"] for c in chosen}
        sel = [r for r in runs if r["condition_id"] in ids]
        if clause.kind == "teacher_gate":
            res = (UNDECIDED, gate["reason"]) if gate.get("pending") else (HOLDS if gate["pass"] else FAILS,
                                                                           gate["reason"])
        elif clause.kind == "gain":
            res = _gain(clause, chosen, rows)
        elif not sel:
            res = (UNDECIDED, f"no training run of [{_where_text(clause.where)}] in this campaign")
        elif clause.kind == "no_collapse":
            res = _no_collapse(clause, sel)
        elif clause.kind == "held":
            if clause.through_step is not None:
                raise ValueError(f"hypothesis {hypothesis.name}: a held clause reads the whole run; drop its "
                                 "through_step")
            res = _held(sel)
        elif clause.kind == "collapse":
            res = _collapse(sel)
        elif clause.kind == "reward_negative":
            res = _reward_negative(sel)
        else:
            raise ValueError(f"hypothesis {hypothesis.name}: unknown clause kind {clause.kind!r}; use one of "
                             "teacher_gate, no_collapse, held, collapse, reward_negative, gain")
        out.append({"clause": k, "kind": clause.kind, "text": clause_text(clause), "result": res[0],
                    "detail": res[1], "conditions": sorted(c["name"] for c in chosen)})
    results = [c["result"] for c in out]
    verdict = FAILS if FAILS in results else UNDECIDED if UNDECIDED in results else HOLDS
    return {"name": hypothesis.name, "pair": hypothesis.pair, "claim": hypothesis.claim, "source": hypothesis.source,
            "verdict": verdict, "clauses": out,
            "failing": [c["clause"] for c in out if c["result"] == FAILS],
            "missing": [c["clause"] for c in out if c["result"] == UNDECIDED]}
