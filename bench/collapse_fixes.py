"""bench/collapse_fixes.py — which fixes hold the collapse arm, over more seeds than campaign.sh gives them.

campaign.sh runs the toy's collapse arm (pair toy-collapse, DESIGN.md §10) raw and under `--eos-policy neutral` and
`neutral-all` for three seeds and the other fixes for one. This probe runs any set of conditions over any set of seeds with the
campaign's own COLLAPSE_FLAGS (read from campaign.sh by bench/nostop_probe.py, so the two cannot drift), --jobs runs
at a time, and prints one row per condition: for each seed the onset step (03's collapse watch: clip ratio first
> 0.5), the peak clip ratio and the mean length at the last step; how many seeds held (peak clip ratio < 0.1, issue
32's bar); and the token-mean reward over the last five steps (what the sink pays, as 03 logs it: before any fix).

The default conditions are the stop-token fixes of DESIGN.md §7.6 that campaign.sh does not run for every seed:

    neutral            --eos-policy neutral         the reward where the student stopped set to 0 (the campaign's)
    neutral-all        --eos-policy neutral-all     and the stop token's own reward 0 wherever it is a candidate
    conditional        --eos-policy conditional     teachers conditioned on going on, the stop probability left alone
    neutral-all+mask   … --truncated-policy mask    and no reward on a response the cap cut
    neutral+low-lr     --eos-policy neutral --lr 5e-4 (campaign.sh's lr / 5)

    python bench/collapse_fixes.py --out /tmp/fixes                    # 5 conditions × seeds 42 1 2 3 4, ~20 min
    python bench/collapse_fixes.py --out /tmp/fixes --seeds 42 --conditions "raw:" "neutral:--eos-policy neutral"

A run whose manifest exists is not run again (the same --out continues an interrupted probe). Writes
OUT/collapse_fixes.json (one row per run) and prints the table.
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

CONDITIONS = (
    "neutral:--eos-policy neutral",
    "neutral-all:--eos-policy neutral-all",
    "conditional:--eos-policy conditional",
    "neutral-all+mask:--eos-policy neutral-all --truncated-policy mask",
    "neutral+low-lr:--eos-policy neutral --lr 5e-4",
)
HOLDS_BELOW = 0.1          # a condition holds in a seed whose peak clip ratio stays below this (issue 32)


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2, 3, 4])
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), metavar="NAME:FLAGS",
                   help="each a name and the 03 flags added to campaign.sh's COLLAPSE_FLAGS")
    p.add_argument("--jobs", type=int, default=2)
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
    (a.out / "collapse_fixes.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{len(todo)} runs in {time.time() - t0:.0f} s; seeds {' / '.join(map(str, a.seeds))}\n")
    print("| condition | onsets | peak clip | last-step length | held (peak < 0.1) | sink reward (token mean, last 5) |")
    print("|---|---|---|---|---|---|")
    for name, _ in conds:
        rs = [r for r in rows if r["condition"] == name]

        def col(key, fmt):
            return " / ".join("—" if r[key] is None else format(r[key], fmt) for r in rs)
        print(f"| {name} | {col('onset', 'd')} | {col('peak_clip', '.2f')} | {col('last_length', '.1f')} "
              f"| {sum(r['peak_clip'] < HOLDS_BELOW for r in rs)} of {len(rs)} | {col('sink_reward_token_mean', '+.2f')} |")

if __name__ == "__main__":
    main()
