"""bench/collapse_fixes.py — which fixes hold the collapse arm, over more seeds than campaign.sh gives them.

campaign.sh runs the toy's collapse arm (pair toy-collapse, DESIGN.md §10) raw and under `--eos-policy neutral` and
`neutral-all` for three seeds and the other fixes for one. This probe runs any set of conditions over any set of seeds with the
campaign's own COLLAPSE_FLAGS (read from campaign.sh by bench/nostop_probe.py, so the two cannot drift), --jobs runs
at a time, and prints one row per condition: for each seed the onset step (03's collapse watch: clip ratio first
> 0.5), the peak clip ratio and the mean length at the last step; how many seeds held (peak clip ratio < 0.1, issue
32's bar); and the token-mean reward over the last five steps (what the sink pays, as 03 logs it: before any fix).
Since b1a9577 COLLAPSE_FLAGS end in `--packing on --share-prompts` (the toy's layout); the rows committed before it
(DESIGN.md §10, bench/results/cpu_collapse_arm_*) ran padded, and a condition that adds `--packing off
--no-share-prompts` runs that layout again.

The default conditions are the stop-token fixes of DESIGN.md §7.6 that campaign.sh does not run for every seed:

    neutral            --eos-policy neutral         the reward where the student stopped set to 0 (the campaign's)
    neutral-all        --eos-policy neutral-all     and the stop token's own reward 0 wherever it is a candidate
    conditional        --eos-policy conditional     teachers conditioned on going on, the stop probability left alone
    neutral-all+mask   … --truncated-policy mask    and no reward on a response the cap cut
    neutral+low-lr     --eos-policy neutral --lr 1.5e-4 (campaign.sh's lr / 5)

    python bench/collapse_fixes.py --out /tmp/fixes                    # 5 conditions × seeds 42 1 2 3 4, ~20 min
    python bench/collapse_fixes.py --out /tmp/fixes --seeds 42 --conditions "raw:" "neutral:--eos-policy neutral"

`--eval` then evaluates each run's last checkpoint and the initial student at toy sample4 (04_eval.py, the arm's
pair) and prints a second table: what the collapsed students keep (the report's §5.3, source §8.3). Beside accuracy,
truncation and how many truncated samples still extract an answer, it counts, as the report does, the samples whose
FIRST answer begins with the gold answer (the toy's answers are one digit). A student that reached its answer and then
wrote on where it should have stopped (`Answer: 60000+1=1.`: the digits glue onto the answer, so the grader reads a
later line) counts as having reached it; one whose working broke does not.

    python bench/collapse_fixes.py --out /tmp/lowlr --seeds 42 1 2 3 4 --eval \
        --conditions "raw:" "low-lr:--lr 1.5e-4 --steps 40"

A run whose manifest exists is not run again, nor an eval unit that exists evaluated again (the same --out continues
an interrupted probe). Writes OUT/collapse_fixes.json (one row per run; with --eval each row has its "eval" and the
file an "initial_student" row) and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from nostop_probe import collapse_flags, run  # noqa: E402

from lib.train.collapse import CLIP_HELD  # noqa: E402  (a condition holds a seed whose peak clip stays below it)

CONDITIONS = (
    "neutral:--eos-policy neutral",
    "neutral-all:--eos-policy neutral-all",
    "conditional:--eos-policy conditional",
    "neutral-all+mask:--eos-policy neutral-all --truncated-policy mask",
    "neutral+low-lr:--eos-policy neutral --lr 1.5e-4",
)


def run_row(out: Path, name: str, seed: int) -> dict:
    """One finished run's row, from its metrics.jsonl and summary.json."""
    d = out / "run" / "train" / f"{name}-seed{seed}"
    steps = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    watch = json.loads((d / "summary.json").read_text())          # 03's collapse watch, at the top level
    clip = [m["response_length/clip_ratio"] for m in steps]
    return {"condition": name, "seed": seed, "steps": len(steps), "onset": watch.get("collapse_onset_step"),
            "peak_clip": max(clip), "last_length": steps[-1]["response_length/mean"],
            "step1_reward": steps[0]["delta_opd/weighted_reward_mean"],
            "sink_reward_token_mean": sum(m["delta_opd/weighted_reward_token_mean"] for m in steps[-5:]) / 5}


def eval_row(unit: Path) -> dict:
    """What one eval unit's samples keep, computed as the report's §5.3 computes it (lib/report/rollouts.py): accuracy,
    truncation, extraction on the truncated samples, and the samples whose first answer reached the gold one."""
    from lib.report.campaign import diagnostics
    from lib.report.rollouts import reached_counts, truncated_extraction
    rows = [json.loads(line) for line in (unit / "samples.jsonl").read_text().splitlines()]
    d = diagnostics(rows)
    t = truncated_extraction(d | reached_counts(rows, "toy"))
    return {"samples": len(rows), "accuracy_pct": d["accuracy_pct"], "truncated_pct": t["truncation_pct"],
            "extracted_of_truncated_pct": t["extracted_pct"],
            "correct_of_extracted_truncated_pct": t["correct_of_extracted_pct"],
            "reached_pct": t["reached_pct"], "truncated_reached_pct": t["truncated_reached_pct"]}


def evaluate(out: Path, names: list[str], jobs: int) -> dict:
    """04_eval at toy sample4 on the initial student and on each run's last checkpoint, `jobs` at a time; the
    alias → eval_row of each."""
    models = {"toy-student": "toy-student"}
    for name in names:
        ckpts = sorted((out / "run" / "train" / name).glob("step_*"))
        if not ckpts:
            raise SystemExit(f"collapse_fixes: {name} saved no checkpoint to evaluate (give the runs --save-every)")
        models[f"{name}-step{int(ckpts[-1].name.split('_')[1])}"] = str(ckpts[-1])
    procs = {}
    for alias, model in models.items():
        if (out / "run" / "evals" / alias / "toy" / "sample4" / "manifest.json").exists():
            continue
        while sum(q.poll() is None for q in procs.values()) >= jobs:
            time.sleep(1)
        procs[alias] = run([sys.executable, "04_eval.py", "--run-dir", str(out / "run"), "--model", model,
                            "--benchmark", "toy", "--protocol", "sample4", "--pair", "toy-collapse"],
                           out / "logs" / f"eval-{alias}.log")
    failed = [alias for alias, q in procs.items() if q.wait() != 0]
    if failed:
        raise SystemExit(f"collapse_fixes: 04_eval of {', '.join(failed)} failed; see {out / 'logs'}/eval-<alias>.log")
    return {alias: eval_row(out / "run" / "evals" / alias / "toy" / "sample4") for alias in models}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2, 3, 4])
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), metavar="NAME:FLAGS",
                   help="each a name and the 03 flags added to campaign.sh's COLLAPSE_FLAGS")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--eval", action="store_true",
                   help="then evaluate each run's last checkpoint and the initial student (toy sample4) and print what "
                        "the collapsed students keep")
    a = p.parse_args()
    conds = []
    for c in a.conditions:
        name, sep, flags = c.partition(":")
        if not sep or not name:
            raise SystemExit(f"collapse_fixes: condition {c!r} is not NAME:FLAGS (e.g. 'neutral:--eos-policy neutral')")
        conds.append((name, flags.split()))
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    todo = [(name, flags, s) for name, flags in conds for s in a.seeds
            if not (a.out / "run" / "train" / f"{name}-seed{s}" / "manifest.json").exists()]
    procs, t0 = {}, time.time()
    for name, flags, s in todo:
        while sum(q.poll() is None for q in procs.values()) >= a.jobs:
            time.sleep(1)
        cmd = [sys.executable, "03_opd_train.py", "--nproc", "1", "--run-dir", str(a.out / "run"), "--seed", str(s),
               "--run-name", f"{name}-seed{s}", *collapse_flags(), *flags]
        procs[f"{name}-seed{s}"] = run(cmd, a.out / "logs" / f"{name}-seed{s}.log")
    failed = [run_name for run_name, q in procs.items() if q.wait() != 0]
    if failed:
        raise SystemExit(f"collapse_fixes: {', '.join(failed)} failed; see {a.out / 'logs'}/<run>.log")
    rows = [run_row(a.out, name, s) for name, _ in conds for s in a.seeds]
    out = {"runs": rows}
    if a.eval:
        evals = evaluate(a.out, [f"{r['condition']}-seed{r['seed']}" for r in rows], a.jobs)
        out["initial_student"] = evals.pop("toy-student")
        for r in rows:
            r["eval"] = next(v for k, v in evals.items() if k.startswith(f"{r['condition']}-seed{r['seed']}-step"))
    (a.out / "collapse_fixes.json").write_text(json.dumps(out if a.eval else rows, indent=1) + "\n")
    print(f"{len(todo)} runs in {time.time() - t0:.0f} s; seeds {' / '.join(map(str, a.seeds))}\n")
    print("| condition | onsets | peak clip | last-step length | held (peak < 0.1) | sink reward (token mean, last 5) |")
    print("|---|---|---|---|---|---|")
    for name, _ in conds:
        rs = [r for r in rows if r["condition"] == name]

        def col(key, fmt):
            return " / ".join("—" if r[key] is None else format(r[key], fmt) for r in rs)
        print(f"| {name} | {col('onset', 'd')} | {col('peak_clip', '.2f')} | {col('last_length', '.1f')} "
              f"| {sum(r['peak_clip'] < CLIP_HELD for r in rs)} of {len(rs)} | {col('sink_reward_token_mean', '+.2f')} |")
    if a.eval:
        def pct(v):
            return "—" if v is None else f"{v:.1f}"
        print("\nWhat the students keep (toy sample4; each run's last checkpoint; per-seed values in seed order)\n")
        keys = ("accuracy_pct", "truncated_pct", "extracted_of_truncated_pct", "correct_of_extracted_truncated_pct",
                "reached_pct", "truncated_reached_pct")
        print("| condition | accuracy % | truncated % | truncated that extract % | correct of those % | reached % "
              "| truncated that reached % |")
        print("|---|---|---|---|---|---|---|")
        init = out["initial_student"]
        print("| initial student | " + " | ".join(pct(init[k]) for k in keys) + " |")
        for name, _ in conds:
            es = [r["eval"] for r in rows if r["condition"] == name]
            print(f"| {name} | " + " | ".join(" / ".join(pct(e[k]) for e in es) for k in keys) + " |")


if __name__ == "__main__":
    main()
