"""Conditions (DESIGN.md §6): which training runs are seeds of one experiment, and what the report says about each.

A training run's identity is its settings as 03_opd_train.py recorded them (the manifest's `args`; for a run with no
manifest yet, the settings its resume state holds) minus the training seed and the bookkeeping that does not change
what is computed: where it writes, how it is launched, logged, timed or stopped for time (lib.runs.MAY_DIFFER, the
flags a continued run may change). Runs whose remaining settings are identical are seeds of one *condition*; 05_stats
pools seeds within a condition only, so two runs of one reward that differ in any other setting (an EOS policy, a
learning rate, a KL mode, a pair, a step count) are never pooled. A run whose settings were never recorded is a
condition of its own.

Each condition is named by its reward plus the settings in which it differs from the other conditions of the same
reward (`delta-topk+eos-policy=neutral`, `delta-topk+eos-policy=raw`); a reward with one condition is named by the
reward alone. The id is the first 12 hex digits of the sha256 of the settings as canonical JSON.

Also here: the per-step snapshots of a run (its metrics at each checkpoint step and at the steps either side of a
collapse onset) and the cross-condition summary row of a condition × benchmark.
"""
from __future__ import annotations

import hashlib
import json
import re

from lib.runs import ADDED_WITH_DEFAULT, MAY_DIFFER

BOOKKEEPING = frozenset(MAY_DIFFER) | {"seed"}
# the per-step metrics a snapshot shows (DESIGN.md §7.4 names)
SNAPSHOT_KEYS = ("response_length/mean", "response_length/clip_ratio", "delta_opd/weighted_reward_mean",
                 "actor/kl_coef", "actor/entropy", "actor/grad_norm")


def run_settings(args: dict | None) -> dict | None:
    """The settings that identify a run's condition: its recorded args minus the seed and bookkeeping (None: none
    recorded)."""
    if args is None:
        return None
    args = ADDED_WITH_DEFAULT | args                      # a flag added since the run: the value it ran with
    return {k: args[k] for k in sorted(args) if k not in BOOKKEEPING}


def condition_id(settings: dict | None, run: str) -> str:
    """sha256 of the canonical settings JSON, 12 hex digits; a run without recorded settings gets `unrecorded:<run>`."""
    if settings is None:
        return f"unrecorded:{run}"
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


IMPLIED_BY_PAIR = ("pair_name", "pair_sha256")
SHA256 = re.compile(r"[0-9a-f]{64}")


def _flag(key: str, value) -> str:
    """One setting as a readable name part: a switch by its flag name, a value as flag=value (a sha256 by its first
    8 hex digits)."""
    name = key.replace("_", "-")
    if isinstance(value, str) and SHA256.fullmatch(value):
        return f"{name}={value[:8]}"
    if value is True:
        return name
    if value is False:
        return f"no-{name}"
    return f"{name}={'—' if value is None else value}"


def _follows_pair(settings: list[dict], key: str) -> bool:
    """Whether `key` has one value per pair across these settings (then naming the pair names it too)."""
    seen = {}
    for s in settings:
        if seen.setdefault(json.dumps(s.get("pair"), default=str), s.get(key)) != s.get(key):
            return False
    return True


def name_conditions(conditions: dict[str, dict]) -> dict[str, str]:
    """{id: name} for {id: {"reward", "settings", "runs"}}: the reward, plus each setting in which the condition
    differs from another condition of the same reward (absent settings compare as absent)."""
    by_reward = {}
    for cid, c in conditions.items():
        by_reward.setdefault(c["reward"], []).append(cid)
    names = {}
    for reward, ids in by_reward.items():
        known = [conditions[i]["settings"] for i in ids if conditions[i]["settings"] is not None]
        keys = sorted({k for s in known for k in s})
        differ = [k for k in keys if len({json.dumps(s.get(k, "(absent)"), default=str) for s in known}) > 1]
        # a pair's recorded name and file hash, where each pair here has one of each, are said by its name alone
        differ = [k for k in differ if not (k in IMPLIED_BY_PAIR and "pair" in differ and _follows_pair(known, k))]
        for i in ids:
            s = conditions[i]["settings"]
            if s is None:
                names[i] = f"{reward}+unrecorded={conditions[i]['runs'][0]}"
            else:
                names[i] = "+".join([str(reward)] + [_flag(k, s.get(k, "(absent)")) for k in differ])
    return names


def build_conditions(runs: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """Group runs ({"name", "reward", "seed", "settings", "status"}) into conditions. Returns (conditions sorted by
    name, {run name: condition id}). A second run of one condition with the same training seed is listed under
    `duplicate_seeds` and never pooled (it would count one trained student twice)."""
    groups, of_run = {}, {}
    for r in sorted(runs, key=lambda r: r["name"]):
        cid = condition_id(r["settings"], r["name"])
        of_run[r["name"]] = cid
        c = groups.setdefault(cid, {"id": cid, "reward": r["reward"], "settings": r["settings"], "runs": [],
                                    "seeds": [], "statuses": {}, "duplicate_seeds": []})
        c["runs"].append(r["name"])
        c["statuses"][r["name"]] = r["status"]
        if r["seed"] in c["seeds"]:
            c["duplicate_seeds"].append({"run": r["name"], "seed": r["seed"]})
        else:
            c["seeds"].append(r["seed"])
    for cid, name in name_conditions(groups).items():
        groups[cid]["name"] = name
    return sorted(groups.values(), key=lambda c: c["name"]), of_run


def snapshots(metrics: list[dict], checkpoints: list[int], onset: int | None) -> list[dict]:
    """The run's metrics at each checkpoint step and at the steps before, at and after a collapse onset (those that
    were logged), each row saying why it is shown."""
    why = {}
    for s in checkpoints:
        why.setdefault(s, []).append("checkpoint")
    if onset is not None:
        for s, label in ((onset - 1, "before onset"), (onset, "onset"), (onset + 1, "after onset")):
            why.setdefault(s, []).append(label)
    by_step = {m["step"]: m for m in metrics}
    return [{"step": s, "why": why[s], **{k: by_step[s].get(k) for k in SNAPSHOT_KEYS}}
            for s in sorted(why) if s in by_step]


def summary_row(condition: dict, runs: list[dict], decision: dict | None, truncation: list) -> dict:
    """One row of the cross-condition summary: a condition × benchmark (decision = its by_condition entry at the
    benchmark's primary protocol, None for a training-only condition), with the collapse watch of every run of the
    condition and the truncation rate of each seed's evaluated checkpoint."""
    watch = [r["watch"] for r in runs]
    clips = [w["peak_clip_ratio"] for w in watch if w["peak_clip_ratio"] is not None]
    row = {"condition": condition["name"], "condition_id": condition["id"], "reward": condition["reward"],
           "runs": [r["run"] for r in runs], "statuses": [r["status"] for r in runs],
           "steps_logged": [r["steps_logged"] for r in runs],
           "onset_steps": [w["collapse_onset_step"] for w in watch],
           "runaway_steps": [w["length_runaway_step"] for w in watch],
           "n_collapsed": sum(w["collapse_onset_step"] is not None for w in watch),
           "peak_clip_ratio": max(clips) if clips else None,
           "benchmark": None, "protocol": None, "training_seeds": None, "steps": None, "decision": None,
           "truncation_pct": truncation,
           "mean_truncation_pct": sum(truncation) / len(truncation) if truncation else None}
    if decision is not None:
        row.update(benchmark=decision["benchmark"], protocol=decision["protocol"],
                   training_seeds=decision["training_seeds"], steps=decision["steps"], decision=decision["decision"])
    return row
