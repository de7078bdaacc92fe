"""06_report — the campaign's report, rebuilt from files only (DESIGN.md §11; the source report is the model).

Reads `stats/*.json` (05_stats, verified against stats/manifest.json), re-checks the sha256 of every input 05_stats
recorded, and sums the time ledger from every manifest.json under the campaign directory (report/ excluded) plus the
earlier runs whose manifests a rerun overwrote (kept by 05_stats in stats/ledger.json).
Writes `report/`:

    README.md          TL;DR generated from the numbers (the verdict per condition on its latest evaluated checkpoint,
                       pooled over training seeds, Holm-adjusted), then tables: teacher gains and the gate, the main
                       pair's gates (01_gates), the cross-pair anatomy on one frozen set of student rollouts,
                       training dynamics and the collapse watch, the conditions, the cross-condition summary,
                       per-step snapshots, student gain per checkpoint, per condition each seed and the pooled gain,
                       the naive and the unpaired comparison beside the paired one, each checkpoint against its
                       pair's π_post, the hypotheses' verdicts
                       clause by clause, the Direct-OPD transfer ratio (five guards), gain scan, per-unit diagnostics,
                       answer-format split, truncation and extraction on truncated samples per unit and per
                       condition, cap sensitivity, rollout excerpts, RAFT, alignment audit, time ledger (reruns
                       included), pending runs and units, the roster of every run and unit. Each table names its
                       source.
    figures/*.png      teacher gains; per condition: student gain vs step (collapse bands shaded), its pooled
                       gain beside its pair's teacher gain, response length and clip ratio vs step; training curves
                       per run; answer-format split (left out when every bar is one extractor at 100 %); RAFT loss
    MANIFEST.json      every input file (relative to the campaign directory) with its sha256
    CHECKSUMS.sha256   sha256 of README.md, MANIFEST.json and every figure (`sha256sum -c` format)
    manifest.json      the stage manifest (the only file here that holds times)

A rebuild from the same inputs is byte-identical (README, figures, MANIFEST.json, CHECKSUMS.sha256). Verdicts follow
DESIGN.md §6: a gain counts only when its 95 % CI excludes 0.

RAFT section: reads stats/raft.json (raft/stats.json as 07_raft writes it; every key optional): keep rates, gate
G1, the SFT loss curves, |Δ log p| per token, the EOS probe, and the RAFT pair's shift anatomy (lib/gates/anatomy.py).
plus gate G2 computed by 05_stats (alias `raft` vs its base on the shared eval units).

    python 06_report.py --run-dir runs/toy
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from lib.artifacts import (ArtifactError, atomic_write_json, atomic_write_text, read_json, sha256_file, verify_dir,
                           wall_clock, write_manifest)
from lib.cli import ArgumentParser, HelpFormatter
from lib.errors import refuse_in_one_line
from lib.registry import PAIRS
from lib.report import figures
from lib.report.campaign import earlier_runs, find_runs, find_units, manifest_runs, time_ledger
from lib.report.stats import format_gain, verdict
from lib.train.collapse import CLIP_HELD

STATS = ("teacher_gains", "student_gains", "transfer", "cap_sensitivity", "diagnostics", "training", "raft", "pending",
         "gates", "ledger", "conditions", "roster", "rollouts")
# what each reward is, in its own terms: classic OPD has one teacher, Direct-OPD rewards the π_post − π_pre shift
REWARD_NAMES = {"opd": "classic OPD, one teacher", "delta-sampled": "Direct-OPD, sampled-token shift reward",
                "delta-topk": "Direct-OPD, weighted top-K shift reward"}
REWARD_SHORT = {"opd": "OPD reward", "delta-sampled": "shift reward", "delta-topk": "weighted shift reward"}

refuse_in_one_line("06_report", ArtifactError)   # a changed input: one line naming it, not a traceback

# --- args ---
ap = ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
ap.add_argument("--run-dir", required=True, help="campaign directory holding stats/ (run 05_stats.py first)")
args = ap.parse_args()
started, t0 = wall_clock()
run_dir = Path(args.run_dir)
out_dir, fig_dir = run_dir / "report", run_dir / "report" / "figures"

# --- inputs: stats verified, and every file the stats were computed from still what it was ---
stats_m = verify_dir(run_dir / "stats")
S = {k: read_json(run_dir / "stats" / f"{k}.json") for k in STATS}
files = {f"stats/{rel}": sha for rel, sha in stats_m["outputs"].items()}
files["stats/manifest.json"] = sha256_file(run_dir / "stats" / "manifest.json")
for rel, rec in stats_m["inputs"].items():
    p = run_dir / rel
    if not p.exists() or sha256_file(p) != rec["sha256"]:
        raise ArtifactError(f"{p} changed or vanished since 05_stats read it (sha256 recorded in stats/manifest.json); "
                            f"re-run 05_stats.py --run-dir {run_dir} before building the report")
    files[rel] = rec["sha256"]
unread = [d.relative_to(run_dir).as_posix() for d in find_units(run_dir) + find_runs(run_dir)
          if f"{d.relative_to(run_dir).as_posix()}/manifest.json" not in stats_m["inputs"]]
if unread:
    raise ArtifactError(f"{', '.join(unread[:5])} appeared after 05_stats ran, so stats/ does not cover them; "
                        f"re-run 05_stats.py --run-dir {run_dir} before building the report")
ledger = time_ledger(run_dir, earlier=earlier_runs(S["ledger"]["runs"], manifest_runs(run_dir)))
for r in ledger["runs"]:
    if r["kind"] == "latest":        # earlier runs' rows come from stats/ledger.json, already listed
        files.setdefault(r["manifest"], sha256_file(run_dir / r["manifest"]))

for old in fig_dir.glob("*.png"):   # figures are rebuilt from scratch; nothing stale survives
    old.unlink()
L: list[str] = []                   # README lines


# --- formatting: one spelling per kind of number ---
def pp(x):
    return "—" if x is None else f"{x:+.3f}"


def ci(c):
    return f"[{c[0]:+.3f}, {c[1]:+.3f}]"


def pct(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def ci3(c):
    return "—" if c is None else f"[{c[0]:.3f}, {c[1]:.3f}]"


def num(x, nd=3):
    return "—" if x is None else (str(x) if isinstance(x, int) else f"{x:.{nd}f}")


def cell(text: str) -> str:
    """Free text in a table cell: a `|` (e.g. in `<|im_start|>`) escaped so it does not split the cell; "—" if empty."""
    return text.replace("|", "\\|") or "—"


def table(head: list[str], rows: list[list], source: str) -> None:
    if not rows:
        L.extend(["_(no rows)_", ""])
        return
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join("---" for _ in head) + "|")
    L.extend("| " + " | ".join(str(c) for c in r) + " |" for r in rows)
    L.extend(["", f"Source: {source}", ""])


def figure(path: str, alt: str) -> None:
    L.extend([f"![{alt}](figures/{Path(path).name})", ""])


def level_table(entries: list[dict], label_head: list[str], label, source: str) -> None:
    """Per-level paired gains (`by_level` of each comparison): where on the difficulty scale a gain lives."""
    rows = [[*label(e), lv, pct(r["acc_a"], 2), pct(r["acc_b"], 2), pp(r["gain_pp"]), ci(r["ci95_pp"]), r["p_str"],
             verdict(r), r["n_problems"]] for e in entries for lv, r in e.get("by_level", {}).items()]
    if rows:
        table([*label_head, "level", "a acc", "b acc", "gain (pp)", "95 % CI", "p", "verdict", "problems"], rows,
              source)


def devices_cell(counts: dict) -> str:
    """{device string: runs} as "cpu (2 cores) × 61; NVIDIA H200 × 3"; "—" for a ledger 05 wrote before it counted
    devices."""
    return "; ".join(f"{d} × {n}" for d, n in counts.items()) or "—"


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)


T, SG, TR, CAP, DG, TRN, RAFT, PEND, GATES, LEDGER, COND, ROSTER, ROLL = (S[k] for k in STATS)
teacher, student, ratios, runs, diag = T["gains"], SG["gains"], TR["ratios"], TRN["runs"], DG["units"]
diag_by_unit = {d["unit"]: d for d in diag}
gate = T["gate"]
gate_entry = next((t for t in teacher if (t["benchmark"], t["protocol"]) == (gate["benchmark"], gate["protocol"])),
                  None)
primary = {}                         # benchmark → its primary protocol: the first the pair's eval list names for it
for bench, proto in T.get("evals") or PAIRS[T["pair"]].evals:     # a pair file's evals: recorded by 05
    primary.setdefault(bench, proto)
for t in teacher + student:
    primary.setdefault(t["benchmark"], t["protocol"])

# --- TL;DR, generated from the numbers ---
tldr = []
if gate_entry:
    tldr.append(f"**Teacher-gain gate ({gate['benchmark']}/{gate['protocol']}): {'PASS' if gate['pass'] else 'FAIL'}** "
                f"— π_post − π_pre = {format_gain(gate_entry)} ({gate['reason']}).")
elif gate.get("pending"):
    tldr.append(f"**Teacher-gain gate ({gate['benchmark']}/{gate['protocol']}): pending** — "
                f"{', '.join(f'`{u}`' for u in gate['missing'])} not evaluated yet; no other protocol stands in.")
else:
    tldr.append(f"**Teacher-gain gate: not measured** — no paired π_pre/π_post units on {gate['benchmark']}.")
if GATES.get("present"):
    tldr.append(f"Gates of pair `{GATES['pair']}` (01_gates): " + ", ".join(
        f"{g['gate']} **{g['status']}**" + (" (allowed)" if g["allowed"] and g["status"] == "FAIL" else "")
        for g in GATES["gates"]) + " (§1.1).")
else:
    tldr.append("Gates (01_gates): " + ("pending (gates/ has no manifest.json yet)." if GATES.get("pending")
                                        else "not run in this campaign directory."))
scan, fam = SG["scan"], SG["family"]
# (condition, benchmark) → its verdict row: the primary protocol, else the first evaluated
decided = {}
for e in SG["by_condition"]:
    k = (e["condition"], e["benchmark"])
    if k not in decided or (e["protocol"] == primary.get(e["benchmark"]) != decided[k]["protocol"]):
        decided[k] = e
decided = sorted(decided.values(), key=lambda e: (e["condition"], e["benchmark"]))
for e in decided:
    d, seeds = e["decision"], e["training_seeds"]
    steps = sorted(set(e["steps"]))
    on = (f"pooled over training seeds {', '.join(map(str, seeds))}" if e["pooled"] else f"training seed {seeds[0]}")
    tldr.append(f"`{e['condition']}` ({REWARD_NAMES.get(e['reward'], e['reward'])}) on "
                f"{e['benchmark']}/{e['protocol']}, latest evaluated checkpoint (step {', '.join(map(str, steps))}), "
                f"{on}: gain {format_gain(d)}, "
                f"Holm-adjusted p = {d['p_holm']:.4f} → **{d['verdict']}**.")
if student:
    tldr.append(f"Multiple comparisons: {fam['n_verdicts']} verdicts are drawn (one per condition × benchmark × "
                f"protocol at the latest evaluated checkpoint, pooled over seeds where there are several), their "
                f"p-values Holm-adjusted, a verdict needing adjusted p < {fam['alpha']} and a CI excluding 0. In all "
                f"{scan['n']} paired student gains were tested (every evaluated checkpoint); unadjusted, "
                f"{scan['positive_significant']} have a CI above 0 and {scan['negative_significant']} below 0.")
elif evaluated := sorted({(d["train_run"], d["train_step"]) for d in diag if d["role"] == "checkpoint"}):
    inits = sorted({f"evals/{m['student_init']}/{m['benchmark']}/{m['protocol']}" for m in SG["missing_baselines"]})
    tldr.append(f"{len(evaluated)} trained checkpoint(s) were evaluated (" + ", ".join(
        f"`{r}`@{s}" for r, s in evaluated) + "), but there is no student gain to report: " +
        (f"the student's init unit {', '.join(f'`{u}`' for u in inits)} is missing (pending, §9)." if inits else
         "none of them could be paired with the student's init unit."))
else:
    tldr.append("No trained checkpoint has been evaluated yet: there is no student gain to report.")
latest_ratios = [r for r in ratios if r["latest"]]
if latest_ratios:
    shown = [f"{r['run']}@{r['step']} {r['benchmark']}/{r['protocol']}: " +
             (f"ratio {r['ratio']:.3f}" if r["ratio"] is not None else "withheld (" + ", ".join(r["failed"]) + ")")
             for r in latest_ratios]
    tldr.append("Direct-OPD transfer ratio (student gain ÷ π_post − π_pre) at the latest evaluated checkpoint — "
                + "; ".join(shown) + ".")
for r in runs:
    if r["status"] == "unfinished":  # killed or still running: counted under Pending
        continue
    w = r["watch"]
    if w["collapse_onset_step"] is not None:
        state = (f"termination collapse, onset step {w['collapse_onset_step']} (band {w['collapse_band'][0]}–"
                 f"{w['collapse_band'][1]})")
    else:   # a run that ran away without crossing the onset is not one a fix held (the `held` clause, §3.3)
        state = f"no collapse onset (peak clip ratio {num(w['peak_clip_ratio'])}" + (
            f", not below the {CLIP_HELD} a held run stays under)" if (w["peak_clip_ratio"] or 0) >= CLIP_HELD else ")")
    tldr.append(f"Run `{r['run']}` ({r['steps_logged']} steps): {state}; {REWARD_SHORT.get(r['reward'], 'reward')} "
                f"mean negative on {r['weighted_reward']['n_negative']} of {r['weighted_reward']['n']} steps.")
if COND["hypotheses"]:
    hyp_pairs = dict.fromkeys(h["pair"] for h in COND["hypotheses"])
    tldr.append("Hypotheses of pair " + ", ".join(f"`{p}`" for p in hyp_pairs)
                + " (§3.3): " + "; ".join(
        f"`{h['name']}` **{h['verdict']}**" + (f" (clause {', '.join(map(str, h['failing']))} fails)" if h["failing"]
                                               else f" (clause {', '.join(map(str, h['missing']))} undecided)"
                                               if h["missing"] else "") for h in COND["hypotheses"]) + ".")
for v in CAP["views"]:
    if (v["benchmark"], v["protocol"]) == (gate["benchmark"], gate["protocol"]):
        tldr.append(f"Cap sensitivity on {v['benchmark']}/{v['protocol']}: π_post held to π_pre's {v['cap']} tokens, "
                    f"over-cap-as-wrong gain {format_gain(v['over_cap_as_wrong'])} "
                    f"(native {format_gain(v['native'])}).")
key = (gate["benchmark"], primary.get(gate["benchmark"]))
inits = [d for d in diag if d["role"] == "student_init" and (d["benchmark"], d["protocol"]) == key]
last_step = {(g["run"]): g["step"] for g in student if g["latest"] and (g["benchmark"], g["protocol"]) == key}
ckpts = sorted((d for d in diag if d["role"] == "checkpoint" and (d["benchmark"], d["protocol"]) == key and
                d["train_step"] == last_step.get(d["train_run"])), key=lambda d: (d["train_run"], d["alias"]))
if inits and ckpts:
    i = inits[0]
    tldr.append(f"Style and termination on {key[0]}/{key[1]}: " + "; ".join(
        f"`{d['train_run']}`@{d['train_step']} answer_line {pct(i['extractor_pct']['answer_line'])} % → "
        f"{pct(d['extractor_pct']['answer_line'])} %, boxed {pct(i['extractor_pct']['boxed'])} % → "
        f"{pct(d['extractor_pct']['boxed'])} %, truncation {pct(i['truncation_pct'])} % → {pct(d['truncation_pct'])} % "
        f"(student init → latest evaluated checkpoint)" for d in ckpts) + ".")
if PEND["runs"] or PEND["units"]:
    tldr.append(f"Pending: {len(PEND['runs'])} training run(s) and {len(PEND['units'])} eval unit(s) are not finished "
                f"and are not counted (§9).")
tot = ledger["total"]
tldr.append(f"Time: {tot['n_runs']} stage runs, {num(tot['wall_s'], 1)} s wall-clock, {num(tot['gpu_s'], 1)} "
            f"GPU-seconds; runs by the devices they saw: {devices_cell(tot.get('devices', {}))} (time ledger below).")

L += [f"# Direct-OPD campaign report — `{run_dir.name}`", "",
      f"Pair `{T['pair']}`: π_pre `{T['pi_pre']}` → π_post `{T['pi_post']}`. Every number below is read from a file "
      f"listed in MANIFEST.json ({len(files)} files with their sha256); this file is regenerated by 06_report.py and "
      f"nothing in it is typed by hand. Paired per-problem bootstrap, {T['n_boot']} resamples, "
      f"default_rng({T['seed']}), 95 % percentile CI, two-sided p; a gain counts only when its CI excludes 0.", "",
      "## 0. TL;DR", ""]
L += [f"{i}. {s}" for i, s in enumerate(tldr, 1)] + [""]

# --- 1. teacher gains ---
L += ["## 1. Teacher gains — the premise", ""]
table(["benchmark", "protocol", "π_pre acc", "π_post acc", "gain (pp)", "95 % CI", "p", "problems", "seeds"],
      [[t["benchmark"], t["protocol"], pct(t["acc_a"], 2), pct(t["acc_b"], 2), pp(t["gain_pp"]), ci(t["ci95_pp"]),
        t["p_str"], t["n_problems"], t["n_seeds"]] for t in teacher], "`stats/teacher_gains.json`")
L += [f"Teacher-gain gate (DESIGN.md §6: paired gain on {gate['benchmark']} > 0 with a CI excluding 0): "
      f"**{'PENDING' if gate.get('pending') else 'PASS' if gate['pass'] else 'FAIL'}** — {gate['reason']}.", ""]
L += ["By difficulty level (a = π_pre, b = π_post; descriptive: each verdict at its own 95 % CI, unadjusted):", ""]
level_table(teacher, ["benchmark", "protocol", "comparison"],
            lambda t: [t["benchmark"], t["protocol"], "π_post − π_pre"], "`stats/teacher_gains.json` (by_level)")
if teacher:
    figure(figures.gains_forest([(f"{t['benchmark']}/{t['protocol']}", t) for t in teacher],
                                "teacher gain π_post − π_pre", fig_dir / "teacher_gains.png"), "teacher gains")

# --- 1.1 the main pair's gates ---
L += ["### 1.1 Gates of the main pair (01_gates)", ""]
if GATES.get("present"):
    table(["gate", "verdict", "allowed", "kept from an earlier run", "summary", "failures", "warnings"],
          [[g["gate"], g["status"], "yes" if g["allowed"] else "no", "yes" if g["carried"] else "no",
            cell(g["summary"]), cell("; ".join(g["reasons"])), cell("; ".join(g["warnings"]))] for g in GATES["gates"]],
          "`stats/gates.json`")
    an = GATES.get("anatomy")
    if an:
        lp, auc, st = an["logp_stop_at_answer_end"], an["auroc"], an["stop"]
        models = ", ".join(f"{k} `{v}`" for k, v in sorted(an["models"].items()))
        L += [f"Shift anatomy (Δ = log π_post − log π_pre on the student's own samples; {models}):", ""]
        table(["measure", "value"],
              [["sequences", an["n_sequences"]],
               ["tokens", an["n_tokens"]],
               ["fraction of tokens with Δ > 0", num(an["pos_frac"], 4)],
               ["token-mean Δ", num(an["token_mean_delta"], 4)],
               ["student-weighted mean Δ", num(an["student_weighted_mean"], 4)],
               ["… of those with \\|Δ\\| ≥ the tie tolerance", num(an.get("pos_frac_decided"), 4)],
               ["mean abs Δ", num(an["abs_mean_delta"], 4)],
               ["interior-token mean Δ", num(an["interior_mean_delta"], 4)],
               ["Δ at the final stop token (mean)", num(st["mean_delta"], 4)],
               ["stopped sequences", st["n"]],
               ["log p(stop) at answer ends, π_pre", num(lp.get("pi_pre"), 4)],
               ["log p(stop) at answer ends, π_post", num(lp.get("pi_post"), 4)],
               ["student accuracy on these samples", num(an["accuracy"], 4)],
               ["stop rate", num(an["stop_rate"], 4)],
               ["AUROC of sequence-mean Δ, length-controlled", num(auc.get("length_controlled"), 4)]],
              "`stats/gates.json` (anatomy)")
else:
    L += ["pending: 01_gates has not finished in this campaign directory." if GATES.get("pending") else
          "01_gates has not run in this campaign directory: no gate to show.", ""]

# --- 1.2 the cross-pair anatomy (source §17) ---
XA = GATES.get("anatomy_cross")
if XA:
    ro = XA["rollouts"]
    L += ["### 1.2 Cross-pair anatomy — every pair on one frozen set of student rollouts", "",
          f"The student `{XA['student']}` sampled {ro['n_sequences']} rollouts once (`gates/{ro['file']}`, sha256 "
          f"`{ro['sha256'][:16]}…`, {'read back from an earlier run' if ro['reused'] else 'drawn in this run'}); "
          "each pair's π_pre and π_post scored exactly those tokens, so the rows differ only in which pair is "
          "subtracted (Δ = log π_post − log π_pre). log p(stop) is at the answer ends where the student really "
          "stopped; the AUROC is of the sequence-mean Δ for correctness within length-quantile bins (DESIGN.md §8.5).",
          ""]
    scored = [r for r in XA["pairs"] if r["status"] == "scored"]
    table(["pair", "π_pre", "π_post", "tokens", "mean Δ", "% Δ > 0", "% Δ > 0 where decided", "mean abs Δ",
           "Δ at stop", "stops", "log p(stop) student", "log p(stop) π_pre", "log p(stop) π_post", "AUROC", "AUROC CI"],
          [[r["pair"], r["pi_pre"], r["pi_post"], r["n_tokens"], num(r["token_mean_delta"], 4),
            pct(100 * r["pos_frac"] if r["pos_frac"] is not None else None),
            pct(100 * r["pos_frac_decided"] if r["pos_frac_decided"] is not None else None),
            num(r["abs_mean_delta"], 4), num(r["stop"]["mean_delta"], 4), r["stop"]["n"],
            num(r["logp_stop_at_answer_end"]["student"], 4), num(r["logp_stop_at_answer_end"]["pi_pre"], 4),
            num(r["logp_stop_at_answer_end"]["pi_post"], 4), num(r["auroc"].get("length_controlled"), 3),
            ci3(r["auroc"].get("ci95"))] for r in scored], "`stats/gates.json` (anatomy_cross, from "
          "`gates/anatomy_cross.json`)")
    for r in XA["pairs"]:
        if r["status"] != "scored":
            L += [f"Pair `{r['pair']}` not scored: {r['reason']}", ""]

# --- 2. training dynamics ---
L += ["## 2. Training dynamics and the collapse watch", "",
      "Collapse onset = first step with clip ratio > 0.5; length runaway = first step whose mean response length "
      "exceeds 2× step 1's; the collapse band (shaded) is the contiguous clip ratio > 0.5 stretch from the onset.", ""]


def ends(r, key):
    pts = [v for _, v in r["curves"].get(key, []) if v is not None]
    return (pts[0], pts[-1]) if pts else (None, None)


rows = []
for r in runs:
    w, wr = r["watch"], r["weighted_reward"]
    kl, ent = ends(r, "actor/kl_coef"), ends(r, "actor/entropy")
    band = f"{w['collapse_band'][0]}–{w['collapse_band'][1]}" if w["collapse_band"] else "—"
    c90 = f"{w['longest_clip90_span'][0]}–{w['longest_clip90_span'][1]}" if w["longest_clip90_span"] else "—"
    gn = r["grad_norm_peak"]
    rows.append([r["run"], r["reward"] or "—", r["seed"], r["status"], r["steps_logged"],
                 num(w["collapse_onset_step"]), num(w["length_runaway_step"]), band, c90, num(w["peak_clip_ratio"]),
                 num(wr["first"], 4), num(wr["last"], 4), f"{wr['n_negative']}/{wr['n']}", num(kl[0]), num(kl[1]),
                 num(ent[0]), num(ent[1]),
                 f"{num(gn['value'], 2)} @ {gn['step']}" if gn else "—", "yes" if r["watch_agrees"] else "**NO**"])
table(["run", "reward", "training seed", "status", "steps", "onset", "runaway", "band", "clip>0.9 span", "peak clip",
       "reward mean first", "reward mean last", "reward mean < 0", "KL coef first", "KL coef last", "entropy first",
       "entropy last", "grad-norm peak", "summary.json agrees"], rows, "`stats/training.json`")
for r in runs:
    figure(figures.training_curves(r, fig_dir / f"training_{slug(r['run'])}.png"), f"training curves {r['run']}")


def steps_list(xs) -> str:
    """A per-seed list of steps (None: the event did not occur), e.g. `28, —, 30`."""
    return ", ".join("—" if x is None else str(x) for x in xs) or "—"


# --- 2.1 conditions ---
L += ["### 2.1 Conditions", "",
      "A condition is a set of training runs whose recorded settings are identical but for the training seed and "
      "bookkeeping (paths, launcher, logger, time budget); only seeds of one condition are pooled. Its name is the "
      "reward plus the settings in which it differs from the other conditions of that reward; the id hashes its "
      "settings.", ""]
table(["condition", "id", "reward", "runs", "training seeds", "status"],
      [[f"`{c['name']}`", f"`{c['id']}`", c["reward"], ", ".join(c["runs"]), ", ".join(map(str, c["seeds"])),
        "; ".join(f"{k}: {v}" for k, v in sorted(c["statuses"].items()))] for c in COND["conditions"]],
      "`stats/conditions.json`")

# --- 2.2 the cross-condition summary ---
L += ["### 2.2 Cross-condition summary — one row per condition × benchmark", "",
      "The benchmark's primary protocol; the gain is the condition's decision row of §3.1 (pooled over its seeds). "
      "Onset and runaway steps are listed per run of the condition (— where the watch never fired); truncation is "
      "the share of each seed's evaluated checkpoint samples that hit the cap, averaged over seeds. A condition "
      "without an evaluated checkpoint (stopped, killed, budget-stopped) has one training-only row.", ""]
table(["condition", "benchmark", "protocol", "runs", "gain (pp)", "95 % CI", "Holm p", "verdict", "onset steps",
       "runaway steps", "collapsed", "peak clip", "eval truncation %"],
      [[f"`{x['condition']}`", x["benchmark"] or "(training only)", x["protocol"] or "—", len(x["runs"]),
        pp(x["decision"]["gain_pp"]) if x["decision"] else "—", ci(x["decision"]["ci95_pp"]) if x["decision"] else "—",
        num(x["decision"]["p_holm"], 4) if x["decision"] else "—", x["decision"]["verdict"] if x["decision"] else "—",
        steps_list(x["onset_steps"]), steps_list(x["runaway_steps"]), f"{x['n_collapsed']}/{len(x['runs'])}",
        num(x["peak_clip_ratio"]), pct(x["mean_truncation_pct"])] for x in COND["summary"]],
      "`stats/conditions.json` (summary)")
dyn = []
for c in COND["conditions"]:
    c_runs = {r["run"]: {"length": r["curves"].get("response_length/mean", []),
                         "clip": r["curves"].get("response_length/clip_ratio", [])}
              for r in runs if r["condition_id"] == c["id"]}
    if c_runs:
        dyn.append({"condition": c["name"], "runs": c_runs})
if dyn:
    figure(figures.dynamics_by_condition(dyn, fig_dir / "dynamics_by_condition.png"),
           "response length and clip ratio per condition")

# --- 2.3 per-step snapshots ---
L += ["### 2.3 Per-step snapshots", "",
      "Each run's metrics at its checkpoint steps and at the steps before, at and after a collapse onset, grouped "
      "by condition.", ""]
table(["condition", "run", "step", "shown at", "mean length", "clip ratio", "reward mean", "KL coef", "entropy",
       "grad norm"],
      [[f"`{r['condition']}`", r["run"], x["step"], ", ".join(x["why"]), num(x["response_length/mean"], 2),
        num(x["response_length/clip_ratio"]), num(x["delta_opd/weighted_reward_mean"], 4), num(x["actor/kl_coef"]),
        num(x["actor/entropy"]), num(x["actor/grad_norm"], 2)]
       for r in sorted(runs, key=lambda r: (r["condition"], r["run"])) for x in r["snapshots"]],
      "`stats/training.json` (snapshots, from each run's metrics.jsonl)")

# --- 3. student gains ---
L += ["## 3. Student gain per checkpoint", "",
      "Each row: the checkpoint's unit against the student's init, paired by problem; when the checkpoint unit has "
      "fewer seeds (curve protocol) the init is restricted to the same seeds; a reduced unit pairs on its own "
      "problems. Each verdict here is at its own 95 % CI, unadjusted; the verdicts the TL;DR draws (Holm-adjusted) "
      "are in §3.1.", ""]
table(["run", "step", "unit", "benchmark", "protocol", "init acc", "ckpt acc", "gain (pp)", "95 % CI", "p", "verdict",
       "problems", "seeds", "ckpt truncation %"],
      [[g["run"], g["step"], g["alias_b"], g["benchmark"], g["protocol"],
        pct(g["acc_a"], 2), pct(g["acc_b"], 2), pp(g["gain_pp"]),
        ci(g["ci95_pp"]), g["p_str"], verdict(g), g["n_problems"], g["n_seeds"],
        pct(diag_by_unit[g["unit_b"]]["truncation_pct"])] for g in student], "`stats/student_gains.json`, "
      "`stats/diagnostics.json` (truncation)")
L += ["By difficulty level (a = the student's init, b = the checkpoint; descriptive: each verdict at its own 95 % CI, "
      "unadjusted):", ""]
level_table(student, ["run", "step", "benchmark", "protocol"],
            lambda g: [g["run"], g["step"], g["benchmark"], g["protocol"]], "`stats/student_gains.json` (by_level)")
L += [f"Gain scan: {scan['n']} paired student gains — {scan['positive_significant']} positive-significant, "
      f"{scan['negative_significant']} negative-significant, {scan['not_significant']} not significant (each at its "
      f"own 95 % CI, before any multiple-comparison adjustment). Source: `stats/student_gains.json`", ""]
if SG["missing_baselines"]:
    L += ["Checkpoint units without a comparable student-init unit (not counted): " +
          ", ".join(f"`{m['unit']}`" for m in SG["missing_baselines"]), ""]
bands = {r["run"]: r["watch"]["collapse_band"] for r in runs}
for bench, proto in sorted({(g["benchmark"], g["protocol"]) for g in student}):
    panels = {}                     # one panel per condition, one line per run (seed) in it
    for g in student:
        if (g["benchmark"], g["protocol"]) == (bench, proto):
            p = panels.setdefault(g["condition"], {"condition": g["condition"], "series": {}, "bands": {}})
            p["series"].setdefault(g["run"], []).append((g["step"], g))
            p["bands"][g["run"]] = bands.get(g["run"])
    figure(figures.gain_vs_step_by_condition([panels[c] for c in sorted(panels)], f"student gain — {bench}/{proto}",
                                             fig_dir / f"student_gain_{slug(bench)}_{slug(proto)}.png"),
           f"student gain {bench}/{proto} per condition")

# --- 3.1 per condition: training seeds and the pooled gain ---
L += ["### 3.1 Per condition: each training seed's latest evaluated checkpoint, and the pooled gain", "",
      "Pooled = per problem the mean over training seeds of the paired difference (checkpoint − init), bootstrapped "
      f"over problems. Holm adjusts the p of the {fam['n_verdicts']} verdict rows (pooled where there are several "
      "seeds, else the one seed); a verdict needs adjusted p < 0.05 and a CI excluding 0.", ""]
rows = []
for e in SG["by_condition"]:
    for g in e["per_seed"]:
        rows.append([f"`{e['condition']}`", e["benchmark"], e["protocol"], f"seed {g['training_seed']}", g["step"],
                     pct(g["acc_a"], 2), pct(g["acc_b"], 2), pp(g["gain_pp"]), ci(g["ci95_pp"]), g["p_str"], "—",
                     verdict(g)])
    d = e["decision"]
    src = e["pooled"] or e["per_seed"][0]
    rows.append([f"`{e['condition']}`", e["benchmark"], e["protocol"], f"**{d['on']}** (decides)", "—",
                 pct(src["acc_a"], 2), pct(src["acc_b"], 2), pp(d["gain_pp"]), ci(d["ci95_pp"]), d["p_str"],
                 f"{d['p_holm']:.4f}", f"**{d['verdict']}**"])
table(["condition", "benchmark", "protocol", "row", "step", "init acc", "ckpt acc", "gain (pp)", "95 % CI", "p",
       "Holm p", "verdict"], rows, "`stats/student_gains.json` (by_condition)")

# --- 3.2 the naive and the unpaired comparison beside the paired one ---
L += ["### 3.2 Naive and unpaired comparisons beside the paired one", "",
      "The paired gain (the estimand, DESIGN.md §6) beside two comparisons that are not. Naive: where a checkpoint "
      "unit has fewer seeds than the init's (a curve unit against the 32-seed baseline) the paired gain restricts the "
      "init to the checkpoint's seeds; the naive one takes each side's per-problem accuracy over all its own seeds "
      "(paired in problems, unpaired in samples; — where no restriction was made, as it would equal the paired one). "
      "Unpaired: the same per-problem accuracies with each side's problems resampled on their own, as if the two "
      "models had answered different problems; its wider CI is what pairing by problem buys.", ""]


def width(c):
    return "—" if c is None else f"{c[1] - c[0]:.3f}"


table(["run", "step", "benchmark", "protocol", "paired gain", "paired CI", "paired CI width", "seeds paired",
       "naive gain", "naive CI", "init seeds naive", "unpaired CI", "unpaired CI width"],
      [[g["run"], g["step"], g["benchmark"], g["protocol"], pp(g["gain_pp"]), ci(g["ci95_pp"]), width(g["ci95_pp"]),
        g["n_seeds"], pp(g["naive"]["gain_pp"]) if "naive" in g else "—", ci(g["naive"]["ci95_pp"]) if "naive" in g
        else "—", g["naive"]["seeds_a"] if "naive" in g else "—", ci(g["unpaired"]["ci95_pp"]),
        width(g["unpaired"]["ci95_pp"])] for g in student],
      "`stats/student_gains.json` (gains: naive, unpaired)")

# --- 3.2.1 the student against its own pair's π_post, paired ---
L += ["### 3.2.1 Student against π_post, paired", "",
      "Every evaluated checkpoint against the π_post of its condition's pair (same problems, common seeds): how far "
      "the student got towards its teacher, or past it. A negative gain is the distance still to go.", ""]
table(["condition", "run", "step", "benchmark", "protocol", "pair", "π_post acc", "ckpt acc", "gain (pp)", "95 % CI",
       "p", "verdict", "seeds"],
      [[f"`{v['condition']}`", v["run"], v["step"], v["benchmark"], v["protocol"], v["pair"], pct(v["acc_a"], 2),
        pct(v["acc_b"], 2), pp(v["gain_pp"]), ci(v["ci95_pp"]), v["p_str"], verdict(v), v["n_seeds"]]
       for v in SG.get("vs_post", [])], "`stats/student_gains.json` (vs_post)")

# --- 3.3 hypotheses ---
L += ["### 3.3 Hypotheses", "",
      "Declared with the pairs (lib/registry.py `HYPOTHESES`), evaluated clause by clause on the records above "
      "(lib/report/hypotheses.py): a hypothesis holds when every clause holds, fails when any clause fails, and is "
      "undecided otherwise.", ""]
for h in COND["hypotheses"]:
    L += [f"**`{h['name']}`** — {h['claim']}" + (f" (source: {h['source']})" if h["source"] else "") +
          f": **{h['verdict']}**.", ""]
table(["hypothesis", "clause", "result", "what it says", "measured"],
      [[f"`{h['name']}`", c["clause"], f"**{c['result']}**", cell(c["text"]), cell(c["detail"])]
       for h in COND["hypotheses"] for c in h["clauses"]], "`stats/conditions.json` (hypotheses)")

# --- 4. transfer ratio ---
L += ["## 4. Transfer ratio of the Direct-OPD runs (five guards)", "",
      "Direct-OPD distils the shift π_post − π_pre, so its student gain is read against that teacher gain; classic "
      "OPD distils one teacher and has no such ratio. "
      f"Student gain ÷ teacher gain, printed only when |teacher gain| ≥ {TR['min_teacher_gain_pp']} pp, teacher "
      "gain > 0, its CI excludes 0, student gain > 0 and the student CI excludes 0; otherwise the failed guards are "
      "named.", ""]
table(["run", "step", "benchmark", "protocol", "teacher protocol", "teacher gain", "teacher CI", "student gain",
       "student CI", "ratio"],
      [[r["run"], r["step"], r["benchmark"], r["protocol"], r["teacher_protocol"], pp(r["teacher_gain_pp"]),
        ci(r["teacher_ci95_pp"]), pp(r["student_gain_pp"]), ci(r["student_ci95_pp"]),
        num(r["ratio"]) if r["ratio"] is not None else "withheld: " + ", ".join(r["failed"])]
       for r in ratios if r["latest"]],
      "`stats/transfer.json` (latest evaluated checkpoints; every checkpoint is in the file)")
# each condition's pooled student gain beside the teacher gain of its own pair (a collapse arm or a RAFT student is
# trained on another pair than the campaign's), at the benchmark's primary protocol
pair_of = {c["id"]: (c["settings"] or {}).get("pair", T["pair"]) for c in COND["conditions"]}
by_pair = T.get("by_pair") or {T["pair"]: teacher}
pts = []
for x in COND["summary"]:
    if x["decision"] is None:
        continue
    t = next((t for t in by_pair.get(pair_of.get(x["condition_id"]), [])
              if (t["benchmark"], t["protocol"]) == (x["benchmark"], x["protocol"])), None)
    pts.append({"label": f"{x['condition']} · {x['benchmark']}/{x['protocol']}", "teacher": t,
                "student": x["decision"]})
if pts:
    figure(figures.teacher_student_by_condition(pts, fig_dir / "teacher_vs_student.png"),
           "teacher gain vs student gain per condition")

# --- 5. diagnostics ---
L += ["## 5. Diagnostics", "", "### 5.1 Per unit: accuracy, truncation, length, answer format", "",
      "answer_line / boxed / none are the extractor's three branches (last `Answer:` line, else last `\\boxed{}`, "
      "else nothing; `none` is graded wrong).", ""]
table(["unit", "role", "cap", "samples", "acc %", "trunc %", "mean tokens", "answer_line %", "boxed %", "none %",
       "deviations"],
      [[f"`{d['unit']}`", d["role"], d["max_new_tokens"], d["n_samples"], pct(d["accuracy_pct"], 2),
        pct(d["truncation_pct"]), pct(d["mean_tokens"]), pct(d["extractor_pct"]["answer_line"]),
        pct(d["extractor_pct"]["boxed"]), pct(d["extractor_pct"]["none"]), "; ".join(d["deviations"]) or "—"]
       for d in diag], "`stats/diagnostics.json`")
bad = [d["unit"] for d in diag if not d["accuracy_matches_scores"]]
if bad:
    L += ["**Warning:** scores.json accuracy disagrees with samples.jsonl for " + ", ".join(bad), ""]
L += ["### 5.2 Answer-format split, primary protocol", ""]
fmt_rows = [d for d in diag if primary.get(d["benchmark"]) == d["protocol"]]
order = {"pi_pre": 0, "pi_post": 1, "raft_teacher": 2, "student_init": 3, "checkpoint": 4, "other": 5}
fmt_rows.sort(key=lambda d: (d["benchmark"], order[d["role"]], d["train_run"] or "", d["train_step"] or 0,
                            d["alias"]))
table(["benchmark", "model", "role", "step", "answer_line %", "boxed %", "none %"],
      [[d["benchmark"], d["alias"], d["role"], num(d["train_step"]), pct(d["extractor_pct"]["answer_line"]),
        pct(d["extractor_pct"]["boxed"]), pct(d["extractor_pct"]["none"])] for d in fmt_rows],
      "`stats/diagnostics.json`")
if fmt_rows and figures.all_one_extractor([d["extractor_pct"] for d in fmt_rows]):
    L += ["Every unit above answers through one extractor on all its samples: no chart is drawn.", ""]
elif fmt_rows:
    figure(figures.answer_format([(f"{d['benchmark']} · {d['alias']}", d["extractor_pct"]) for d in fmt_rows],
                                 "answer-format split (primary protocol)", fig_dir / "answer_format.png"),
           "answer format")
L += ["### 5.3 Truncation: what truncated samples still extract and score", "",
      "Source §8.3: a truncated sample that still ends in a gradeable answer is a student that reached its answer and "
      "then kept writing (a lost stop token); one with no answer never got there. Extracted % is of the truncated "
      "samples, correct % of those extracted. On a toy benchmark the grader cannot make that split: nothing closes "
      "the toy's answer line before its stop token, so a student that wrote its answer and then more digits instead "
      "of stopping (`Answer: 60000+1=1.`) extracts a wrong one. There, reached % counts the samples whose FIRST "
      "answer begins with the gold answer (the toy's answers are one digit), of all samples and of the truncated "
      "ones: a student that lost only its stop reaches its answer as often as its init did (lib/report/rollouts.py, "
      "DESIGN.md §10); — elsewhere.", ""]
TX = ROLL["truncated_extraction"]
table(["unit", "role", "condition", "step", "samples", "trunc %", "truncated samples", "extracted", "extracted %",
       "correct", "correct of extracted %", "acc on truncated %", "reached %", "truncated that reached %"],
      [[f"`{t['unit']}`", t["role"], f"`{t['condition']}`" if t["condition"] else "—", num(t["step"]), t["n_samples"],
        pct(t["truncation_pct"]), t["n_truncated"], t["n_extracted"], pct(t["extracted_pct"]),
        t["n_extracted_correct"], pct(t["correct_of_extracted_pct"]),
        pct(diag_by_unit[t["unit"]]["truncated_accuracy_pct"], 2), pct(t["reached_pct"]),
        pct(t["truncated_reached_pct"])] for t in TX["units"]],
      "`stats/rollouts.json` (truncated_extraction.units), `stats/diagnostics.json`")
L += ["Per condition, summed over its seeds' latest evaluated checkpoints (the units its verdict in §3.1 rests "
      "on):", ""]
table(["condition", "benchmark", "protocol", "seeds", "samples", "trunc %", "truncated samples", "extracted",
       "extracted %", "correct", "correct of extracted %", "reached %", "truncated that reached %"],
      [[f"`{c['condition']}`", c["benchmark"], c["protocol"], ", ".join(map(str, c["training_seeds"])), c["n_samples"],
        pct(c["truncation_pct"]), c["n_truncated"], c["n_extracted"], pct(c["extracted_pct"]), c["n_extracted_correct"],
        pct(c["correct_of_extracted_pct"]), pct(c["reached_pct"]), pct(c["truncated_reached_pct"])]
       for c in TX["conditions"]],
      "`stats/rollouts.json` (truncated_extraction.conditions)")
L += ["### 5.4 Cap sensitivity — π_post held to π_pre's cap", "",
      "kept-only: π_post's accuracy on its samples within π_pre's cap, on the problems that have one (conditional, "
      "biased towards easy problems); over-cap-as-wrong: every longer sample counted wrong (a lower bound).", ""]
rows = []
for v in CAP["views"]:
    for name, r in (("native", v["native"]),
                    ("over-cap-as-wrong", v["over_cap_as_wrong"]),
                    ("kept-only", v["kept_only"])):
        if r is not None:
            rows.append([v["benchmark"], v["protocol"], v["cap"], name, pct(r["acc_b"], 2), pp(r["gain_pp"]),
                         ci(r["ci95_pp"]), r["p_str"], r["n_problems"], pct(v["kept_sample_pct"])])
if rows:
    table(["benchmark", "protocol", "π_pre cap", "view", "π_post acc", "gain (pp)", "95 % CI", "p", "problems",
           "samples within cap %"], rows, "`stats/cap_sensitivity.json`")
else:
    L += ["π_post and π_pre share one token cap on every benchmark: no cap-sensitivity view applies.", ""]

# --- 5.5 rollout excerpts ---
L += ["### 5.5 Rollout excerpts", "",
      "Up to three samples of each evaluated checkpoint (and of the student's init), one of each kind in this order: "
      "truncated with an answer, truncated without, stopped and correct, stopped and wrong — the longest of each kind, "
      "the first by problem id and seed among equals (lib/report/rollouts.py). A long completion shows its head and "
      "tail with the characters left out counted, so a loop at the end stays visible; ⏎ marks a line break; "
      "repeats = how often the most frequent line occurs.", ""]


def excerpt_text(text: str) -> str:
    return "`" + cell(text.replace("`", "'").replace("\n", " ⏎ ")) + "`"


table(["unit", "role", "step", "kind", "problem", "seed", "tokens", "cap hit", "extractor", "extracted", "correct",
       "repeats", "chars left out", "excerpt"],
      [[f"`{x['unit']}`", x["role"], num(x["step"]), e["kind"], e["problem_id"], e["seed"], e["n_tokens"],
        "**truncated**" if e["truncated"] else "stopped", e["extractor"], cell(str(e["extracted"] or "—")),
        "yes" if e["correct"] else "no", e["max_line_repeats"], e["chars_left_out"], excerpt_text(e["excerpt"])]
       for x in ROLL["excerpts"] for e in x["excerpts"]], "`stats/rollouts.json` (excerpts, from each unit's "
      "samples.jsonl)")

# --- 6. RAFT ---
L += ["## 6. RAFT teacher", ""]
if not RAFT["present"]:
    L += ["No `raft/stats.json` in this campaign (07_raft.py has not run).", ""]
else:
    rs = RAFT["stats"]
    g1 = rs.get("gate_g1") or {}
    table(["prompts", "k", "kept", "keep rate %", "gate G1", "mean abs Δ log p per token", "EOS probe π_pre",
           "EOS probe RAFT"],
          [[num(rs.get("n_prompts")), num(rs.get("k")), num(rs.get("kept")), pct(rs.get("keep_rate_pct")),
            (("PASS" if g1.get("pass") else "FAIL") + (f" (≥ {g1['threshold']})" if "threshold" in g1 else "")
             if g1 else "—"),
            num(rs.get("shift_abs_dlogp_per_token"), 4), num((rs.get("eos_probe") or {}).get("pi_pre"), 6),
            num((rs.get("eos_probe") or {}).get("raft"), 6)]], "`stats/raft.json`")
    if rs.get("keep_rate_by_level_pct"):
        table(["level", "keep rate %"], [[k, pct(v)] for k, v in sorted(rs["keep_rate_by_level_pct"].items())],
              "`stats/raft.json`")
    if rs.get("n_correct_of_k"):
        table(["n correct of k", "prompts"], [[k, v] for k, v in sorted(rs["n_correct_of_k"].items())],
              "`stats/raft.json`")
    if rs.get("rejection_reasons"):
        table(["rejection reason", "samples"], [[k, v] for k, v in sorted(rs["rejection_reasons"].items())],
              "`stats/raft.json`")
    if (rs.get("sft") or {}).get("val_loss"):
        table(["SFT step", "val loss"], [[s, num(v, 5)] for s, v in rs["sft"]["val_loss"]], "`stats/raft.json`")
    an = rs.get("anatomy")
    if an:
        lp, auc = an.get("logp_stop_at_answer_end") or {}, an.get("auroc_ci95")
        L += [f"Shift anatomy of the RAFT pair `{an['pair']}` on its student `{an['student']}` (01_gates' anatomy, "
              f"Δ = log p_RAFT − log p_π_pre on the student's own samples): gate **{an['status']}**.", ""]
        table(["measure", an["pair"]],
              [["tokens", num(an.get("n_tokens"))],
               ["token-mean Δ", num(an.get("token_mean_delta"), 4)],
               ["student-weighted mean Δ", num(an.get("student_weighted_mean"), 4)],
               ["% tokens with Δ > 0", pct(an.get("pos_frac_pct"))],
               ["mean abs Δ (shift magnitude)", num(an.get("abs_mean_delta"), 4)],
               ["Δ at the terminal stop token", num(an.get("stop_mean_delta"), 4)],
               ["log p(stop) at answer ends, π_pre / RAFT",
                f"{num(lp.get('pi_pre'), 4)} / {num(lp.get('pi_post'), 4)}"],
               ["AUROC of sequence-mean Δ, length-controlled",
                num(an.get("auroc_length_controlled")) + (f" {ci(auc)}" if auc else "")]], "`stats/raft.json`")
    g2 = RAFT["gate_g2"]
    L += [f"Gate G2 (RAFT − `{RAFT['base']}` on {g2['benchmark']}/{g2['protocol']}, CI must exclude 0): "
          f"**{'PASS' if g2['pass'] else 'FAIL'}**.", ""]
    table(["benchmark", "protocol", "base acc", "RAFT acc", "gain (pp)", "95 % CI", "p", "problems"],
          [[g["benchmark"], g["protocol"], pct(g["acc_a"], 2), pct(g["acc_b"], 2), pp(g["gain_pp"]), ci(g["ci95_pp"]),
            g["p_str"], g["n_problems"]] for g in RAFT["g2_gains"]], "`stats/raft.json`")
    sft = {k: v for k, v in (rs.get("sft") or {}).items() if k in ("val_loss", "train_loss") and v}
    if sft:
        figure(figures.loss_curve(sft, "RAFT SFT loss", fig_dir / "raft_loss.png"), "RAFT loss")

# --- 7. alignment audit ---
L += ["## 7. Alignment audit", "",
      "Every comparison pairs identical problem ids; differing seed grids must be nested and the larger side is "
      "restricted to the common seeds. Units that fail this were refused by 05_stats.", ""]
audit_rows = [[f"`{g['unit_a']}`", f"`{g['unit_b']}`", g["audit"]["n_problems"], g["audit"]["seeds_a"],
               g["audit"]["seeds_b"], g["audit"]["grids"], g["audit"]["restricted"] or "—", g["audit"]["subset"] or "—"]
              for g in teacher + student + (RAFT.get("g2_gains") or [])]
table(["unit a", "unit b", "problems", "seeds a", "seeds b", "grids", "restricted side", "problem subset"], audit_rows,
      "`stats/teacher_gains.json`, `stats/student_gains.json`")

# --- 8. time ledger ---
L += ["## 8. Time ledger", "", "Summed from every manifest.json under the campaign directory (this report's own "
      "manifest excluded), as the source report summed its cost ledger. A run's devices are those its stage could "
      "see (the manifest's `devices`: the GPUs where CUDA was available, else the CPU; a toy stage hides the GPUs, "
      "lib/cpu_repro.py), so a reader knows where each number was computed.", ""]
table(["stage", "runs", "wall-clock s", "GPU-seconds", "devices (runs)"],
      [[k, v["n_runs"], num(v["wall_s"], 1), num(v["gpu_s"], 1), devices_cell(v.get("devices", {}))]
       for k, v in ledger["stages"].items()] +
      [["**total**", tot["n_runs"], num(tot["wall_s"], 1), num(tot["gpu_s"], 1), devices_cell(tot.get("devices", {}))]],
      "the manifests listed below")
table(["directory", "stage", "run", "started", "wall-clock s", "GPU-seconds", "devices"],
      [[f"`{r['dir']}`", r["stage"], r["kind"], r["started"] or "—", num(r["wall_s"], 1), num(r["gpu_s"], 1),
        r.get("devices", "—")] for r in ledger["runs"]],
      "each row's `manifest.json`; overwritten reruns from `stats/ledger.json`")

# --- 9. pending ---
L += ["## 9. Pending", "", "Training runs without manifest.json and eval units not finished (or not yet run) are "
      "left out of every number above; rerun the campaign's command to finish them, then 05 and 06.", ""]
if PEND["runs"] or PEND["units"]:
    table(["item", "what", "detail"],
          [[f"`{r['dir']}`", "training run", f"reward {r['reward']}, seed {r['seed']}, "
            f"{'?' if r['steps_logged'] is None else r['steps_logged']} steps logged"] for r in PEND["runs"]] +
          [[f"`{u['unit']}`", "eval unit", u["why"]] for u in PEND["units"]], "`stats/pending.json`")
else:
    L += ["Nothing pending: every training run and eval unit found is finished.", ""]

L += ["### 9.1 Roster: every training run and eval unit", "",
      "found = read and used; pending = not finished or not yet run; skipped = found but left out (the reason says "
      "why); canceled = training steps a --stop-on-collapse stop will never run.", ""]
table(["item", "kind", "status", "reason"],
      [[f"`{r['item']}`", r["kind"], r["status"], cell(r["reason"])] for r in ROSTER["items"]], "`stats/roster.json`")

# --- 10. reproduction ---
L += ["## 10. Rebuilding this report", "",
      "```",
      f"python 05_stats.py --run-dir runs/{run_dir.name} --pair {T['pair']}",
      f"python 06_report.py --run-dir runs/{run_dir.name}",
      "```", "",
      "`MANIFEST.json` lists every input with its sha256; `CHECKSUMS.sha256` covers this bundle (`sha256sum -c`).", ""]

# --- write ---
atomic_write_text(out_dir / "README.md", "\n".join(L))
atomic_write_json(out_dir / "MANIFEST.json", {"campaign": run_dir.name, "files": files})
bundle = ["README.md", "MANIFEST.json"] + sorted(f"figures/{p.name}" for p in fig_dir.glob("*.png"))
atomic_write_text(out_dir / "CHECKSUMS.sha256", "".join(f"{sha256_file(out_dir / b)}  {b}\n" for b in bundle))
write_manifest(out_dir, stage="06_report", script=__file__, args=vars(args),
               inputs={k: {"path": k, "sha256": v} for k, v in sorted(files.items())},
               outputs=bundle + ["CHECKSUMS.sha256"], started=started, wall_s=time.monotonic() - t0)
print(f"06_report: wrote {out_dir}/README.md ({len(L)} lines, {len(bundle) - 2} figures, {len(files)} inputs)")
