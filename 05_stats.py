"""05_stats — the campaign's numbers (DESIGN.md §6): paired gains, gates, transfer ratios, sensitivity views,
diagnostics.

Reads every finished eval unit (`evals/<alias>/<benchmark>/<protocol>/`) and training run (`train/<run>/`, its
reward and training seed from summary.json, else manifest args, else the name `<reward>-seed<S>`, else seed 42) of
one campaign directory, each verified against its manifest, plus `raft/stats.json` when 07_raft has run and `gates/`
when 01_gates has. A run 03 stopped for its --time-limit (summary.json `stopped: time_limit`, no manifest) is final up
to its stop: its metrics and evaluated checkpoints are used, their sha256 recorded here. A run killed or still running
contributes its per-step record to training.json only; its units, and unfinished units, are pending, never read.
Runs are grouped into conditions (lib/report/conditions.py: identical settings but the seed); seeds are pooled within
a condition only. Writes `stats/`:

    teacher_gains.json     π_post − π_pre on every benchmark/protocol both have; the teacher-gain gate; `by_pair`: the
                           same for the pair of every condition (a collapse arm, the RAFT student)
    student_gains.json     every evaluated checkpoint − the student's init (paired, same seeds/problems), and beside a
                           seed-restricted pairing the naive one (`naive`, each side on all its seeds), beside every
                           one the unpaired one (`unpaired`: each side's problems resampled on their own); every
                           checkpoint − the π_post of its condition's pair, paired (`vs_post`); gain scan;
                           by_condition: each training seed's latest evaluated checkpoint and the gain pooled over the
                           condition's seeds (lib.report.stats.pooled_gain), one verdict per condition × benchmark ×
                           protocol, Holm-adjusted
    transfer.json          Direct-OPD runs only: student gain ÷ (π_post − π_pre) with the five guards, per checkpoint
    cap_sensitivity.json   π_post held to π_pre's max_new_tokens: over-cap-as-wrong and kept-only
    diagnostics.json       per unit: truncation, tokens, answer format, extraction/accuracy on truncated samples
    training.json          per run (status: finished, stopped by --stop-on-collapse or --time-limit, unfinished): its
                           condition, per-step curves of the DESIGN.md §7.4 metrics, the collapse watch, and snapshots
                           at its checkpoint steps and either side of a collapse onset
    conditions.json        the conditions (settings, runs, seeds); the cross-condition summary, one row per condition ×
                           benchmark at its primary protocol (gain, CI, onset and runaway steps, peak clip ratio,
                           truncation; a training-only row for a condition without an evaluated checkpoint); the
                           verdict of each of the pair's hypotheses (lib/registry.py HYPOTHESES), clause by clause
    roster.json            every training run and eval unit: found / pending / skipped / canceled, with its reason
    rollouts.json          what the students wrote (lib/report/rollouts.py): per unit and per condition, of the
                           truncated samples those whose answer still extracts and those of them correct (source
                           §8.3); up to three excerpts of each evaluated checkpoint and of the student's init
    raft.json              RAFT stage-1/SFT numbers passed through from raft/stats.json, and gate G2
    gates.json             the main pair's gates as 01_gates recorded them (gates/<gate>.json, gates/manifest.json),
                           with the cross-pair anatomy (gates/anatomy_cross.json) when 01 ran it
    pending.json           training runs without manifest.json, unit folders not finished, last checkpoints not
                           evaluated
    ledger.json            one row per stage run: the manifests on disk plus earlier runs whose manifest a rerun
                           overwrote (carried over from the previous ledger.json), so reruns add up
    manifest.json          every input file with its sha256

Every comparison is lib.report.stats.paired_bootstrap (10,000 resamples, default_rng(42)); a unit that cannot be paired
(missing problems, duplicated samples, mismatched seeds) stops the stage with a message naming it.

    python 05_stats.py --run-dir runs/toy [--pair toy]
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

from lib.artifacts import (ArtifactError, atomic_write_json, read_json, sha256_file, verify_dir, wall_clock,
                           write_manifest)
from lib import models, pairs
from lib.cli import ArgumentParser, HelpFormatter, nonnegative_int, positive_int
from lib.errors import UserError, refuse_in_one_line
from lib.registry import HYPOTHESES, PAIRS, PROTOCOLS
from lib.report import stats
from lib.report.campaign import (BUDGET_STOPPED, CURVE_KEYS, STOPPED_COLLAPSE, UNFINISHED, check_same_benchmark,
                                 collapse_watch, diagnostics, earlier_runs, find_runs, find_stopped_runs, load_run,
                                 load_stopped_run, load_unfinished, load_units, manifest_runs, pending_runs,
                                 pending_units, run_identity, unfinished_dirs)
from lib.report.conditions import build_conditions, run_settings, snapshots, summary_row
from lib.report.hypotheses import evaluate
from lib.report.rollouts import excerpts as rollout_excerpts, pool_truncated, reached_counts, truncated_extraction

# a changed input or a unit that cannot be paired is refused in one line naming it, not with a traceback
refuse_in_one_line("05_stats", ArtifactError, stats.AlignmentError)

# --- args ---
ap = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
ap.add_argument("--run-dir", required=True, help="campaign directory, e.g. runs/toy")
pairs.add_arguments(ap.add_argument, default=None)   # default: the pair recorded in the run summaries
ap.add_argument("--n-boot", type=positive_int, default=stats.N_BOOT, help="bootstrap resamples (DESIGN.md §6: 10,000)")
ap.add_argument("--seed", type=nonnegative_int, default=stats.SEED, help="bootstrap RNG seed (DESIGN.md §6: 42)")
args = ap.parse_args()
started, t0 = wall_clock()
run_dir = Path(args.run_dir)
out_dir = run_dir / "stats"

# --- inputs: units and runs, each verified against its manifest ---
units = load_units(run_dir)
# finished runs, and runs 03 stopped for their --time-limit (final up to their stop: their checkpoints count)
runs = [load_run(run_dir, d) for d in find_runs(run_dir)] + [load_stopped_run(run_dir, d)
                                                             for d in find_stopped_runs(run_dir)]
runs.sort(key=lambda r: r["name"])
unfinished = [load_unfinished(run_dir, d) for d in unfinished_dirs(run_dir)]    # killed or running: training only
pending = {"runs": pending_runs(run_dir), "units": [{"unit": u, "why": "unit folder without manifest.json (04_eval "
                                                    "still running or killed)"} for u in pending_units(run_dir)]}
if not units and not runs:
    raise SystemExit(f"{run_dir} holds no eval unit (evals/*/*/*/scores.json) and no training run; run 02/03/04 first")
inputs = {}
for u in units:
    for f in ("samples.jsonl", "scores.json"):
        inputs[f"{u.rel}/{f}"] = u.manifest["outputs"][f]
    inputs[f"{u.rel}/manifest.json"] = sha256_file(u.dir / "manifest.json")
for r in runs + unfinished:
    for f, sha in r["files"].items():
        inputs[f"{r['rel']}/{f}"] = sha


def recorded_pairs() -> set[str]:
    """The pair each stage says it ran for: run summaries, checkpoint/eval manifests' args."""
    found = {r["summary"].get("pair") for r in runs} | {u.manifest.get("args", {}).get("pair") for u in units}
    return {p for p in found if p and not pairs.is_pair_file(p)}      # a file's runs record its name too


recorded = recorded_pairs()
if args.pair is None and len(recorded) != 1:
    raise SystemExit(f"cannot tell the campaign's pair: recorded {sorted(recorded) or 'none'}; pass --pair NAME|FILE")
if args.pair is None and (only := next(iter(recorded))) not in PAIRS:
    raise SystemExit(f"the campaign's pair {only!r} is not registered: pass --pair with its .toml file")
lp = pairs.load(args.pair or next(iter(recorded)), args.pi_pre, args.pi_post)
pair_name = lp.name
if other := sorted({r["summary"]["pair_sha256"] for r in runs if r["summary"].get("pair") == pair_name
                    and r["summary"].get("pair_sha256", lp.sha256) != lp.sha256}):
    raise SystemExit(f"pair {pair_name}: training runs recorded it with sha256 {other[0][:12]}…, but the pair given "
                     f"now has {lp.sha256[:12]}…: the pair file changed since; restore it, or use another --run-dir")
# units are named by model alias: a pair's folder or hub id becomes the alias its units carry
pair = replace(lp.pair, **{k: models.model_spec(getattr(lp.pair, k), run_dir).alias for k in ("pi_pre", "pi_post")})
print(f"05_stats: {run_dir} pair={pair_name} units={len(units)} runs={len(runs)}")

# --- conditions: runs of identical settings but the seed (lib/report/conditions.py); only these are pooled ---
conditions, condition_of = build_conditions([{"name": r["name"], "reward": r["reward"], "seed": r["seed"],
                                              "status": r["status"], "settings": run_settings(r["settings"])}
                                             for r in runs + unfinished])
cond_by_id = {c["id"]: c for c in conditions}
duplicate_of = {d["run"]: c["name"] for c in conditions for d in c["duplicate_seeds"]}
for c in conditions:
    print(f"  condition {c['name']} ({c['id']}): runs {', '.join(c['runs'])}")

by_key = {(u.alias, u.benchmark, u.protocol): u for u in units}
by_rel = {u.rel: u for u in units}
by_key_unit = by_rel.__getitem__


def sampling(u) -> tuple:
    """A unit's sampling settings: units pair across protocols only when these agree (curve8 ⊂ sample32, not greedy)."""
    if u.protocol in PROTOCOLS:
        p = PROTOCOLS[u.protocol]
        return (p.temperature, p.top_p)
    g = u.scores.get("provenance", {}).get("generation", {})
    return (g.get("temperature"), g.get("top_p"))


def compare(a, b) -> dict:
    """Paired gain of unit b over unit a, both evaluated on the same benchmark bytes. A reduced unit (declared
    deviations) pairs on its own problem subset."""
    check_same_benchmark(a, b)
    ids = None
    ia, ib = {r["problem_id"] for r in a.rows}, {r["problem_id"] for r in b.rows}
    for small, big, u in ((ib, ia, b), (ia, ib, a)):
        if small < big and u.scores.get("deviations"):
            ids = sorted(small)
    res = stats.paired_bootstrap(a.correct(), b.correct(), args.n_boot, args.seed, (a.rel, b.rel), ids)
    res["audit"]["subset"] = None if ids is None else f"paired on the {len(ids)} problems of the reduced unit"
    return {"benchmark": b.benchmark, "protocol": b.protocol, "protocol_a": a.protocol, "unit_a": a.rel,
            "unit_b": b.rel, "alias_a": a.alias, "alias_b": b.alias, **res, "by_level": by_level(a, b, ids)}


def by_level(a, b, ids) -> dict:
    """The same paired bootstrap within each difficulty level (rows' `level`): where a shift's capability lives
    (the toy shift carries level 3; MATH-500 has levels 1–5). {} when the rows carry no level."""
    level = {r["problem_id"]: r.get("level") for r in a.rows}
    common = set(level) & {r["problem_id"] for r in b.rows} & (set(ids) if ids is not None else set(level))
    out = {}
    for lv in sorted({level[p] for p in common if level[p] is not None}):
        sub = sorted(p for p in common if level[p] == lv)
        r = stats.paired_bootstrap(a.correct(), b.correct(), args.n_boot, args.seed, (a.rel, b.rel), sub)
        out[str(lv)] = {k: r[k] for k in ("gain_pp", "ci95_pp", "p", "p_str", "ci_excludes_0", "n_problems",
                                          "acc_a", "acc_b")}
    return out


# --- teacher gains and the gate ---
teacher = []
for (alias, bench, proto), pre in sorted(by_key.items()):
    post = by_key.get((pair.pi_post, bench, proto))
    if alias == pair.pi_pre and post is not None:
        teacher.append(compare(pre, post))
# the gate is measured on the pair's first protocol for its gate benchmark; that unit missing is pending, never
# replaced by another protocol's gain
gate_protocols = [p for b, p in pair.evals if b == pair.gate_benchmark]
gate_protocols += sorted(t["protocol"] for t in teacher if t["benchmark"] == pair.gate_benchmark)
gate_proto = gate_protocols[0] if gate_protocols else None
gate_entry = next((t for t in teacher if (t["benchmark"], t["protocol"]) == (pair.gate_benchmark, gate_proto)), None)
gate = {"benchmark": pair.gate_benchmark, "protocol": gate_proto, **stats.teacher_gate(gate_entry)}
gate_missing = [f"evals/{a}/{pair.gate_benchmark}/{gate_proto}" for a in (pair.pi_pre, pair.pi_post)
                if gate_proto and (a, pair.gate_benchmark, gate_proto) not in by_key]
if gate_missing:
    gate.update(pending=True, missing=gate_missing,
                reason=f"pending: {' and '.join(gate_missing)} not evaluated (run 02_baselines.py); the gate is "
                       f"measured on {pair.gate_benchmark}/{gate_proto} only")
    pending["units"] += [{"unit": u, "why": "the teacher-gain gate's unit is not evaluated (02_baselines.py)"}
                         for u in gate_missing]
for t in teacher:
    print(f"  teacher {t['benchmark']}/{t['protocol']}: {stats.format_gain(t)}")
print(f"  teacher-gain gate ({gate['benchmark']}/{gate['protocol']}): "
      f"{'PENDING' if gate.get('pending') else 'PASS' if gate['pass'] else 'FAIL'} — {gate['reason']}")

# --- student gains: every evaluated checkpoint against the student's init ---
student, missing = [], []
finished = {r["name"]: r for r in runs}
in_progress = {r["run"] for r in pending["runs"]}
for u in units:
    m = u.model
    if m.get("train_run") is None:
        continue
    if m["train_run"] in in_progress:
        pending["units"].append({"unit": u.rel, "why": f"its training run train/{m['train_run']} has not finished"})
        continue
    init = m.get("student_init")
    if not init:
        raise SystemExit(f"unit {u.rel} is a checkpoint of {m['train_run']} but names no "
                         "provenance.model.student_init; re-run 04_eval with the checkpoint folder (its "
                         "checkpoint.json names the init)")
    cands = [b for b in units if b.alias == init and b.benchmark == u.benchmark and b.model.get("train_run") is None]
    base = next((b for b in cands if b.protocol == u.protocol), None)
    if base is None:   # e.g. an 8-seed curve unit against the 32-seed baseline: same sampling, nested seeds
        nested = [b for b in cands if sampling(b) == sampling(u) and set(u.scores["seeds"]) <= set(b.scores["seeds"])]
        base = min(nested, key=lambda b: len(b.scores["seeds"]), default=None)
    if base is None:
        missing.append({"unit": u.rel, "student_init": init, "benchmark": u.benchmark, "protocol": u.protocol})
        want = f"evals/{init}/{u.benchmark}/{u.protocol}"
        if all(x["unit"] != want for x in pending["units"]):
            pending["units"].append({"unit": want, "why": f"the student's init unit is not evaluated, so {u.rel} "
                                                          f"cannot be paired (02_baselines.py --models student)"})
        continue
    g = compare(base, u)
    if g["audit"]["restricted"]:     # beside a seed-restricted pairing: the naive one on each side's own seeds
        common = {r["problem_id"] for r in u.rows} & {r["problem_id"] for r in base.rows}
        g["naive"] = stats.naive_gain(base.correct(), u.correct(), args.n_boot, args.seed, (base.rel, u.rel), common)
    # beside every paired gain: the same two units compared with no pairing at all (each side's problems resampled
    # on their own), so the report can show what pairing by problem buys (lib.report.stats.unpaired_gain)
    shared = sorted({r["problem_id"] for r in u.rows} & {r["problem_id"] for r in base.rows})
    g["unpaired"] = stats.unpaired_gain(base.correct(), u.correct(), args.n_boot, args.seed, (base.rel, u.rel), shared)
    run = finished.get(m["train_run"])
    reward, seed = (run["reward"], run["seed"]) if run else run_identity({}, None, m["train_run"])
    # a checkpoint whose run folder is gone has no recorded settings: a condition of its own, never pooled
    cid = condition_of.get(m["train_run"], f"unrecorded:{m['train_run']}")
    cname = cond_by_id[cid]["name"] if cid in cond_by_id else f"{reward}+run-folder-absent={m['train_run']}"
    g.update(run=m["train_run"], step=int(m["train_step"]), student_init=init, reward=reward, training_seed=seed,
             condition=cname, condition_id=cid,
             run_last_checkpoint=run["checkpoints"][-1] if run and run["checkpoints"] else None)
    student.append(g)
student.sort(key=lambda g: (g["run"], g["step"], g["benchmark"], g["protocol"], g["alias_b"]))
latest = {}                           # (run, benchmark, protocol) → its latest evaluated step
for g in student:
    k = (g["run"], g["benchmark"], g["protocol"])
    latest[k] = max(latest.get(k, g["step"]), g["step"])
for g in student:
    g["latest"] = g["step"] == latest[(g["run"], g["benchmark"], g["protocol"])]
    print(f"  student {g['run']}@{g['step']} {g['benchmark']}/{g['protocol']}: {stats.format_gain(g)}")
scan = stats.gain_scan(student)
print(f"  gain scan: {scan}")
# the latest checkpoint of a finished run not yet evaluated where other runs' latest checkpoints were: pending
final_keys = {(g["benchmark"], g["protocol"]) for g in student if g["latest"]}
for r in runs:
    for b, p in sorted(final_keys):
        if r["checkpoints"] and not any(g["run"] == r["name"] and g["step"] == r["checkpoints"][-1] and
                                        (g["benchmark"], g["protocol"]) == (b, p) for g in student):
            pending["units"].append({"unit": f"evals/{r['name']}-step{r['checkpoints'][-1]}/{b}/{p}",
                                     "why": f"train/{r['name']}'s last checkpoint is not evaluated on {b}/{p} yet"})

# --- per condition: each training seed's latest evaluated checkpoint, and the gain pooled over seeds ---
# seeds are pooled only within a condition (identical settings but the seed); a second run of one condition and seed
# (a duplicate: the same trained student twice) is left out and named in the roster
by_condition = []
for cid, b, p in sorted({(g["condition_id"], g["benchmark"], g["protocol"]) for g in student if g["latest"]}):
    seeds = sorted((g for g in student if g["latest"] and g["run"] not in duplicate_of
                    and (g["condition_id"], g["benchmark"], g["protocol"]) == (cid, b, p)),
                   key=lambda g: g["training_seed"])
    entry = {"condition": seeds[0]["condition"], "condition_id": cid, "reward": seeds[0]["reward"], "benchmark": b,
             "protocol": p, "per_seed": seeds, "pooled": None, "training_seeds": [g["training_seed"] for g in seeds],
             "steps": [g["step"] for g in seeds]}
    if len(seeds) > 1:
        paired = [(by_key_unit(g["unit_a"]).correct(), by_key_unit(g["unit_b"]).correct()) for g in seeds]
        entry["pooled"] = stats.pooled_gain(paired, args.n_boot, args.seed, [(g["unit_a"], g["unit_b"]) for g in seeds])
    decided = entry["pooled"] or seeds[0]
    entry["decision"] = {"on": "pooled" if entry["pooled"] else f"seed {seeds[0]['training_seed']}",
                         **{k: decided[k] for k in ("gain_pp", "ci95_pp", "p", "p_str", "ci_excludes_0")}}
    by_condition.append(entry)
by_condition.sort(key=lambda e: (e["condition"], e["benchmark"], e["protocol"]))
# one verdict per (condition, benchmark, protocol): the family whose p-values are Holm-adjusted
for e, (p_adj, called) in zip(by_condition, stats.holm_verdicts([e["decision"] for e in by_condition])):
    d = e["decision"]
    d["p_holm"], d["verdict"] = p_adj, called
    print(f"  {e['condition']} {e['benchmark']}/{e['protocol']} seeds {e['training_seeds']}: {d['on']} "
          f"{stats.format_gain(d)} Holm p={p_adj:.4f} → {d['verdict']}")
family = {"n_verdicts": len(by_condition), "n_gains_tested": len(student), "adjustment": "holm",
          "alpha": stats.ALPHA}

# --- transfer ratio: student gain ÷ the pair's teacher gain on the same benchmark and sampling ---
transfer = []
for g in student:
    if g["reward"] == "opd":          # classic OPD distils one teacher: π_post − π_pre is not its premise
        continue
    same = [t for t in teacher if t["benchmark"] == g["benchmark"] and t["protocol"] == g["protocol"]]
    if not same:
        s_unit = by_key[(g["alias_b"], g["benchmark"], g["protocol"])]
        same = [t for t in teacher if t["benchmark"] == g["benchmark"]
                and sampling(by_key[(t["alias_b"], t["benchmark"], t["protocol"])]) == sampling(s_unit)]
    if not same:
        continue
    t = same[0]
    transfer.append({"run": g["run"], "reward": g["reward"], "step": g["step"], "latest": g["latest"],
                     "benchmark": g["benchmark"],
                     "protocol": g["protocol"], "teacher_protocol": t["protocol"],
                     "teacher_gain_pp": t["gain_pp"], "teacher_ci95_pp": t["ci95_pp"],
                     "student_gain_pp": g["gain_pp"], "student_ci95_pp": g["ci95_pp"],
                     **stats.transfer_ratio(t, g)})

# --- each condition's own pair: its teacher gain, and every checkpoint against its π_post (paired) ---
# A condition trained on another pair than the campaign's (a collapse arm, the RAFT student) is read against that
# pair's π_post − π_pre; a pair whose teachers were not evaluated here simply has no row.
def pair_aliases(name: str | None) -> tuple[str, str] | None:
    """(π_pre alias, π_post alias) of a recorded pair name; None if it cannot be resolved here."""
    if name is None or name == pair_name:
        return pair.pi_pre, pair.pi_post
    try:
        p = pairs.load(name).pair
        return tuple(models.model_spec(getattr(p, k), run_dir).alias for k in ("pi_pre", "pi_post"))
    except (UserError, KeyError, ValueError):
        return None


def matching_unit(alias: str, like) -> object | None:
    """alias's unit on like's benchmark at like's protocol, else one of the same sampling with nested seeds."""
    same = by_key.get((alias, like.benchmark, like.protocol))
    if same is not None:
        return same
    seeds = set(like.scores["seeds"])
    nested = [v for (a, b, _), v in sorted(by_key.items()) if a == alias and b == like.benchmark
              and sampling(v) == sampling(like)
              and (seeds <= set(v.scores["seeds"]) or set(v.scores["seeds"]) <= seeds)]
    return nested[0] if nested else None


condition_pair = {c["id"]: (c["settings"] or {}).get("pair", pair_name) for c in conditions}
vs_post, teacher_by_pair = [], {}
for g in student:
    pname = condition_pair.get(g["condition_id"], pair_name)
    aliases = pair_aliases(pname)
    ckpt = by_key_unit(g["unit_b"])
    post = matching_unit(aliases[1], ckpt) if aliases else None
    if post is not None:
        v = compare(post, ckpt)      # checkpoint − π_post: how far the student got towards (or past) its teacher
        v.update(run=g["run"], step=g["step"], condition=g["condition"], condition_id=g["condition_id"], pair=pname,
                 training_seed=g["training_seed"], latest=g["latest"])
        vs_post.append(v)
    if aliases and pname not in teacher_by_pair:
        teacher_by_pair[pname] = [compare(pre, by_key[(aliases[1], b, p)]) for (a, b, p), pre in sorted(by_key.items())
                                  if a == aliases[0] and (aliases[1], b, p) in by_key]
for v in vs_post:
    print(f"  {v['run']}@{v['step']} − π_post ({v['pair']}) {v['benchmark']}/{v['protocol']}: {stats.format_gain(v)}")

# --- cap sensitivity: π_post's stored samples held to π_pre's max_new_tokens ---
cap_views = []
for t in teacher:
    pre = by_key[(t["alias_a"], t["benchmark"], t["protocol"])]
    post = by_key[(t["alias_b"], t["benchmark"], t["protocol"])]
    if pre.max_new_tokens and post.max_new_tokens and post.max_new_tokens > pre.max_new_tokens:
        v = stats.cap_sensitivity(pre.correct(), post.correct(), post.tokens(), pre.max_new_tokens, args.n_boot,
                                  args.seed, (pre.rel, post.rel))
        v.update(benchmark=t["benchmark"], protocol=t["protocol"], unit_a=pre.rel, unit_b=post.rel,
                 post_cap=post.max_new_tokens, native=t)
        cap_views.append(v)

# --- diagnostics per unit ---
def role(u) -> str:
    if u.model.get("train_run") is not None:
        return "checkpoint"
    inits = {g["student_init"] for g in student} | {lp.student.model}
    return {"raft": "raft_teacher", pair.pi_pre: "pi_pre", pair.pi_post: "pi_post"}.get(u.alias) or \
        ("student_init" if u.alias in inits else "other")


diag = []
for u in units:
    d = diagnostics(u.rows)
    recorded = u.scores.get("accuracy")
    diag.append({"unit": u.rel,
                 "alias": u.alias,
                 "benchmark": u.benchmark,
                 "protocol": u.protocol,
                 "role": role(u),
                 "train_run": u.model.get("train_run"),
                 "train_step": u.model.get("train_step"),
                 "max_new_tokens": u.max_new_tokens,
                 "deviations": u.scores.get("deviations", []),
                 "n_seeds": len(u.scores["seeds"]),
                 "scores_accuracy_pct": recorded,
                 "accuracy_matches_scores": (recorded is None
                                             or math.isclose(recorded, d["accuracy_pct"], abs_tol=1e-6)),
                 **d,
                 **reached_counts(u.rows, u.benchmark)})      # the toy's "reached its answer" (lib/report/rollouts.py)


# --- what the students wrote: extraction on truncated samples (source §8.3), and excerpts per checkpoint ---
# (lib/report/rollouts.py). Every unit gets its §8.3 row; a condition's row sums the counts of its seeds' latest
# evaluated checkpoints (the units its verdict was drawn on, by_condition).
run_of_unit = {g["unit_b"]: g for g in student}
trunc_units = []
for d in diag:
    g = run_of_unit.get(d["unit"])
    trunc_units.append({"unit": d["unit"], "alias": d["alias"], "role": d["role"], "benchmark": d["benchmark"],
                        "protocol": d["protocol"], "run": d["train_run"], "step": d["train_step"],
                        "condition": g["condition"] if g else None, "training_seed": g["training_seed"] if g else None,
                        **truncated_extraction(d)})
trunc_by_unit = {t["unit"]: t for t in trunc_units}
trunc_conditions = [{"condition": e["condition"], "condition_id": e["condition_id"], "benchmark": e["benchmark"],
                     "protocol": e["protocol"], "units": [g["unit_b"] for g in e["per_seed"]],
                     "steps": e["steps"], "training_seeds": e["training_seeds"],
                     **pool_truncated([trunc_by_unit[g["unit_b"]] for g in e["per_seed"]])} for e in by_condition]
# excerpts: per evaluated checkpoint (run, step) and the student's init, the unit at the primary protocol of the
# first benchmark it was evaluated on (the pair's eval order), else its first unit
eval_order = {bp: i for i, bp in enumerate(pair.evals)}
shown = {}
for d in diag:
    if d["role"] not in ("checkpoint", "student_init"):
        continue
    key = (d["train_run"], d["train_step"]) if d["role"] == "checkpoint" else (None, d["alias"])
    rank = (eval_order.get((d["benchmark"], d["protocol"]), len(eval_order)), d["benchmark"], d["protocol"])
    if key not in shown or rank < shown[key][0]:
        shown[key] = (rank, d)
excerpt_sets = []
for key, (_, d) in sorted(shown.items(), key=lambda kv: (kv[0][0] is not None, str(kv[0][0]), str(kv[0][1]))):
    g = run_of_unit.get(d["unit"])
    excerpt_sets.append({"unit": d["unit"], "role": d["role"], "run": d["train_run"], "step": d["train_step"],
                         "condition": g["condition"] if g else None, "max_new_tokens": d["max_new_tokens"],
                         "excerpts": rollout_excerpts(by_rel[d["unit"]].rows)})

# --- training runs: curves and the collapse watch ---
def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


training = []
for r in runs + unfinished:
    met, summ = r["metrics"], r["summary"]
    if not met:                       # an unfinished run that logged no step yet: in the roster only
        continue
    watch = collapse_watch(met)
    curves = {k: [[m["step"], finite(m.get(k))] for m in met] for k in CURVE_KEYS if any(k in m for m in met)}
    wr = [finite(m.get("delta_opd/weighted_reward_mean")) for m in met]
    wr = [x for x in wr if x is not None]
    gn = [(finite(m.get("actor/grad_norm")), m["step"]) for m in met if finite(m.get("actor/grad_norm")) is not None]
    # the trainer's own live watch (summary.json: longest_clip90_run, a length) must agree with the metrics
    mine = {k: watch[k] for k in ("collapse_onset_step", "length_runaway_step", "longest_clip90_run")}
    recorded = {k: summ[k] for k in mine if k in summ}
    cid = condition_of[r["name"]]
    training.append({
        "run": r["name"], "dir": r["rel"], "pair": summ.get("pair"), "reward": r["reward"], "seed": r["seed"],
        "status": r["status"], "condition": cond_by_id[cid]["name"], "condition_id": cid,
        "student": summ.get("student"), "steps_planned": summ.get("steps", (r["settings"] or {}).get("steps")),
        "steps_logged": len(met),
        "first_step": met[0]["step"], "last_step": met[-1]["step"], "checkpoints": r["checkpoints"],
        "watch": watch, "summary_watch": recorded,
        "watch_agrees": all(recorded[k] == mine[k] for k in recorded),
        "weighted_reward": {"first": wr[0] if wr else None, "last": wr[-1] if wr else None,
                            "n_negative": sum(x < 0 for x in wr), "n": len(wr)},
        "step1_weighted_reward": (finite(met[0].get("delta_opd/weighted_reward_mean")) if met[0]["step"] == 1
                                  else None),
        "grad_norm_peak": {"value": max(gn)[0], "step": max(gn)[1]} if gn else None,
        "snapshots": snapshots(met, r["checkpoints"], watch["collapse_onset_step"]),
        "curves": curves})
    print(f"  run {r['name']}: {len(met)} steps, onset {watch['collapse_onset_step']}, band {watch['collapse_band']}")

# --- the cross-condition summary: one row per condition × benchmark (at its primary protocol) ---
# the decision row of each (condition, benchmark): the pair's first protocol for the benchmark, else the first
primary = {}
for b, p in list(pair.evals) + [(e["benchmark"], e["protocol"]) for e in by_condition]:
    primary.setdefault(b, p)
trunc_of = {d["unit"]: d["truncation_pct"] for d in diag}
cross = []
for c in conditions:
    c_runs = [t for t in training if t["condition_id"] == c["id"]]
    rows = [e for e in by_condition if e["condition_id"] == c["id"] and e["protocol"] == primary[e["benchmark"]]]
    if not rows and not c_runs:
        continue
    for e in rows or [None]:
        trunc = [trunc_of[g["unit_b"]] for g in e["per_seed"]] if e else []
        cross.append(summary_row(c, c_runs, e, trunc))
for row in cross:
    d = row["decision"]
    print(f"  summary {row['condition']} {row['benchmark'] or '(training only)'}: "
          f"{stats.format_gain(d) + ' → ' + d['verdict'] if d else 'no evaluated checkpoint'}; onsets "
          f"{row['onset_steps']}, runaway {row['runaway_steps']}, peak clip {row['peak_clip_ratio']}")

# --- hypotheses (lib/registry.py HYPOTHESES), clause by clause (lib/report/hypotheses.py): those of the campaign's
# pair and of every pair a condition here was trained on (a collapse arm's); the teacher-gain gate is this pair's only
trained_pairs = {pair_name} | {p for p in condition_pair.values() if p}
other_gate = {"pending": True, "pass": False, "reason": f"the teacher-gain gate is measured for pair {pair_name} only"}
hypotheses = [evaluate(h, conditions, training, cross, gate if h.pair == pair_name else other_gate)
              for h in HYPOTHESES if h.pair in trained_pairs]
for h in hypotheses:
    why = [c for c in h["clauses"] if c["result"] != "holds"]
    print(f"  hypothesis {h['name']}: {h['verdict']}" + "".join(f"\n    clause {c['clause']} ({c['text']}): "
                                                               f"{c['result']} — {c['detail']}" for c in why))

# --- RAFT (07_raft writes raft/stats.json; keys documented in 06_report.py's RAFT section) ---
raft = {"present": False}
raft_dir = run_dir / "raft"
if (raft_dir / "stats.json").exists():
    verify_dir(raft_dir, ["stats.json"])
    inputs["raft/stats.json"] = sha256_file(raft_dir / "stats.json")
    inputs["raft/manifest.json"] = sha256_file(raft_dir / "manifest.json")
    rs = read_json(raft_dir / "stats.json")
    base = rs.get("base", pair.pi_pre)
    g2 = [compare(by_key[(base, b, p)], u) for (a, b, p), u in sorted(by_key.items())
          if a == "raft" and (base, b, p) in by_key]
    g2_bench = ("math500", "sample4") if any(g["benchmark"] == "math500" for g in g2) else \
        (pair.gate_benchmark, gate_protocols[0] if gate_protocols else None)
    g2_entry = next((g for g in g2 if (g["benchmark"], g["protocol"]) == g2_bench), None)
    raft = {"present": True, "stats": rs, "base": base, "g2_gains": g2,
            "gate_g2": {"benchmark": g2_bench[0], "protocol": g2_bench[1],
                        "pass": stats.teacher_gate(g2_entry)["pass"]}}   # the teacher-gain gate's rule
elif raft_dir.exists():
    print(f"  note: {raft_dir} exists without stats.json (07_raft has not finished); RAFT section left empty")

# --- the main pair's gates (01_gates writes gates/<gate>.json and gates/manifest.json) ---
gates = {"present": False}
gates_dir = run_dir / "gates"
if (gates_dir / "manifest.json").exists():
    gm = verify_dir(gates_dir)
    inputs["gates/manifest.json"] = sha256_file(gates_dir / "manifest.json")
    rows = []
    for name, status in gm.get("gates", {}).items():
        rep = read_json(gates_dir / f"{name}.json")
        inputs[f"gates/{name}.json"] = gm["outputs"][f"{name}.json"]
        rows.append({"gate": name, "status": status, "allowed": name in gm.get("allowed", []),
                     "carried": name in gm.get("carried", []), "summary": rep.get("summary", ""),
                     "reasons": rep.get("reasons", []), "warnings": rep.get("warnings", [])})
        if name == "anatomy_cross" and "pairs" in rep:      # source §17: every pair on one frozen set of rollouts
            gates["anatomy_cross"] = {k: rep.get(k) for k in ("student", "pairs", "rollouts", "logprobs_file")}
            for f in (rep["rollouts"]["file"], rep["logprobs_file"]):
                inputs[f"gates/{f}"] = gm["outputs"][f]
        if name == "anatomy" and "token_mean_delta" in rep:
            gates["anatomy"] = {k: rep.get(k) for k in ("n_sequences", "n_tokens", "token_mean_delta", "tie_frac",
                                                        "student_weighted_mean", "pos_frac", "pos_frac_decided",
                                                        "tie_tol", "abs_mean_delta",
                                                        "interior_mean_delta", "stop", "logp_stop_at_answer_end",
                                                        "accuracy", "stop_rate", "mean_tokens", "auroc", "models")}
    gates.update(present=True, pair=gm.get("pair") or gm.get("args", {}).get("pair"), passed=gm.get("passed"),
                 gates=rows)
elif gates_dir.exists():
    print(f"  note: {gates_dir} has no manifest.json (01_gates has not finished); gates reported as pending")
    gates["pending"] = True

# --- the time ledger: the manifests on disk, plus earlier runs whose manifests a rerun overwrote ---
previous = []
if (out_dir / "ledger.json").exists() and (out_dir / "manifest.json").exists():
    try:
        verify_dir(out_dir, ["ledger.json"])
        previous = read_json(out_dir / "ledger.json")["runs"]
    except (ArtifactError, KeyError):
        print(f"  note: {out_dir}/ledger.json does not match its manifest; earlier reruns are not carried over")
current = manifest_runs(run_dir, exclude=("report",))
ledger = {"runs": sorted(current + earlier_runs(previous, current), key=lambda r: (r["dir"], r["started"] or ""))}

# --- the roster: every training run and eval unit, found / pending / skipped / canceled, with its reason ---
roster = {}
for t in training:
    last, planned, cond = t["last_step"], t["steps_planned"], t["condition"]
    if t["run"] in duplicate_of:
        first = next(c for c in conditions if c["id"] == t["condition_id"])["runs"]
        roster[t["dir"]] = ("training run", "skipped", f"condition {cond}, seed {t['seed']}: the same condition and "
                                                       f"seed as train/{first[0]}, so not pooled twice")
    elif t["status"] == UNFINISHED:
        roster[t["dir"]] = ("training run", "pending", f"no manifest.json (killed or still running): {last} of "
                                                       f"{planned or '?'} steps logged; its per-step record is shown")
    else:
        roster[t["dir"]] = ("training run", "found", f"{t['status']} after step {last} of {planned or '?'}; "
                                                     f"condition {cond}, seed {t['seed']}")
    rest = f"{t['dir']} steps {last + 1}–{planned}"
    if planned and last < planned and t["status"] == STOPPED_COLLAPSE:
        roster[rest] = ("training steps", "canceled", f"--stop-on-collapse: collapse onset at step "
                                                      f"{t['watch']['collapse_onset_step']}, the run saved and stopped")
    elif planned and last < planned and t["status"] == BUDGET_STOPPED:
        roster[rest] = ("training steps", "pending", "stopped by --time-limit; rerunning the same command continues "
                                                     "the run from its last checkpoint")
for r in pending["runs"]:           # an unfinished run that logged no complete step yet
    roster.setdefault(r["dir"], ("training run", "pending", "no manifest.json (killed or still running), no complete "
                                                            "step logged"))
paired_with = {g["unit_b"]: g for g in student}
unpaired = {m["unit"] for m in missing}
for d in diag:
    if d["unit"] in paired_with:
        g = paired_with[d["unit"]]
        roster[d["unit"]] = ("eval unit", "skipped" if g["run"] in duplicate_of else "found",
                             f"checkpoint of train/{g['run']} step {g['step']}, paired with {g['unit_a']}" +
                             (" (a duplicate seed of its condition: not pooled)" if g["run"] in duplicate_of else ""))
    elif d["unit"] in unpaired:
        roster[d["unit"]] = ("eval unit", "skipped", "no comparable student-init unit to pair it with (pending)")
    else:
        roster[d["unit"]] = ("eval unit", "found", {"pi_pre": "π_pre", "pi_post": "π_post", "student_init": "the "
                             "student's init", "raft_teacher": "the RAFT teacher (gate G2)", "checkpoint": "checkpoint",
                             "other": "a model outside the pair: diagnostics only"}[d["role"]])
for u in pending["units"]:
    roster[u["unit"]] = ("eval unit", "pending", u["why"])
roster = [{"item": k, "kind": v[0], "status": v[1], "reason": v[2]} for k, v in sorted(roster.items())]
counts = {st: sum(r["status"] == st for r in roster) for st in ("found", "pending", "skipped", "canceled")}
print("  roster: " + ", ".join(f"{n} {st}" for st, n in counts.items()))

# --- write ---
for name, obj in {
    "teacher_gains.json": {"pair": pair_name, "pair_sha256": lp.sha256, "evals": [list(e) for e in pair.evals],
                           "pi_pre": pair.pi_pre, "pi_post": pair.pi_post, "gate": gate,
                           "gains": teacher, "n_boot": args.n_boot, "seed": args.seed,
                           "by_pair": teacher_by_pair},
    "student_gains.json": {"pair": pair_name, "gains": student, "scan": scan, "missing_baselines": missing,
                           "by_condition": by_condition, "family": family, "vs_post": vs_post},
    "conditions.json": {"pair": pair_name, "conditions": conditions, "summary": cross, "hypotheses": hypotheses},
    "roster.json": {"counts": counts, "items": roster},
    "pending.json": pending,
    "gates.json": gates,
    "ledger.json": ledger,
    "transfer.json": {"pair": pair_name, "min_teacher_gain_pp": stats.MIN_TEACHER_GAIN_PP, "ratios": transfer},
    "cap_sensitivity.json": {"pair": pair_name, "views": cap_views},
    "diagnostics.json": {"units": diag},
    "training.json": {"runs": training},
    "raft.json": raft,
    "rollouts.json": {"truncated_extraction": {"units": trunc_units, "conditions": trunc_conditions},
                      "excerpts": excerpt_sets},
}.items():
    atomic_write_json(out_dir / name, obj)
write_manifest(out_dir, stage="05_stats", script=__file__, args=vars(args),
               inputs={k: {"path": k, "sha256": v} for k, v in sorted(inputs.items())},
               outputs=["teacher_gains.json", "student_gains.json", "transfer.json",   # relative to out_dir
                        "cap_sensitivity.json", "diagnostics.json", "training.json", "raft.json",
                        "pending.json", "gates.json", "ledger.json", "conditions.json", "roster.json",
                        "rollouts.json"],
               started=started, wall_s=time.monotonic() - t0, extra={"pair": pair_name})
print(f"05_stats: wrote {out_dir}")
