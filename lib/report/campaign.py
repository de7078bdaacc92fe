"""Reading a campaign directory (DESIGN.md §11) for the statistics and the report: eval units, training runs, manifests.

Every reader verifies the directory against its manifest first (`lib.artifacts.verify_dir`) and refuses a unit
whose samples cannot be paired honestly: a (problem, seed) that appears twice, a problem whose seeds differ from the
unit's declared grid, or a problem count that disagrees with scores.json. The errors name the unit and the ids.

A training run is finished (manifest.json, written last by 03; `stopped by --stop-on-collapse` when its summary says
so), `stopped by --time-limit` (no manifest, but a summary.json saying so and nothing logged past it: final up to its
stop), or unfinished (killed, or still running: its per-step record is read, a torn last line dropped). Its settings
are its manifest's args, else those its resume state holds.

Also here, because both 05_stats and 06_report need them: per-unit diagnostics (truncation, length, answer format,
extraction and accuracy on truncated samples), the collapse watch of DESIGN.md §7.5 recomputed from metrics.jsonl, and
the time ledger summed from every manifest under the campaign directory.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from lib.artifacts import ArtifactError, read_json, read_jsonl, sha256_file, verify_dir
from lib.train.collapse import CLIP_ONSET, CLIP_SINK      # the collapse watch's thresholds, declared once

DEFAULT_SEED = 42                     # a run that records no seed was trained with 03's default

EXTRACTORS = ("answer_line", "boxed", "none")
# DESIGN.md §7.4 per-step metrics the report draws; the first six are the training-curve panels
CURVE_KEYS = ("response_length/mean", "response_length/clip_ratio", "delta_opd/weighted_reward_mean",
              "actor/kl_coef", "actor/entropy", "actor/grad_norm", "delta_opd/log_ratio_mean",
              "response_length/max", "timing_s/step", "rollout/logprob_gap")


class UnitError(ArtifactError):
    """An eval unit is present but cannot be used: duplicated samples, mismatched seeds, missing problems."""


@dataclass
class Unit:
    dir: Path
    rel: str                          # path relative to the campaign directory: evals/<alias>/<benchmark>/<protocol>
    scores: dict
    rows: list = field(repr=False)
    manifest: dict = field(repr=False, default_factory=dict)

    alias = property(lambda self: self.scores["alias"])
    benchmark = property(lambda self: self.scores["benchmark"])
    protocol = property(lambda self: self.scores["protocol"])
    model = property(lambda self: self.scores.get("provenance", {}).get("model", {}))
    max_new_tokens = property(lambda self: self.scores.get("max_new_tokens"))

    def correct(self) -> dict[str, dict[int, int]]:
        """{problem_id: {seed: 0/1}} — the input of lib.report.stats.paired_bootstrap."""
        out = defaultdict(dict)
        for r in self.rows:
            out[r["problem_id"]][int(r["seed"])] = int(bool(r["correct"]))
        return dict(out)

    def tokens(self) -> dict[str, dict[int, int]]:
        out = defaultdict(dict)
        for r in self.rows:
            out[r["problem_id"]][int(r["seed"])] = int(r["n_tokens"])
        return dict(out)


def _first(xs, k: int = 5) -> str:
    xs = sorted(map(str, xs))
    return ", ".join(xs[:k]) + (f" … (+{len(xs) - k} more)" if len(xs) > k else "")


def check_unit(rel: str, scores: dict, rows: list[dict]) -> None:
    """Refuse a unit whose samples are not one row per (problem, seed) on the declared seed grid."""
    seen = Counter((r["problem_id"], int(r["seed"])) for r in rows)
    dup = [f"{p}@seed{s}" for (p, s), n in seen.items() if n > 1]
    if dup:
        raise UnitError(f"unit {rel}: duplicated samples {_first(dup)} (each problem × seed must appear once); "
                        f"re-run the unit into an empty folder")
    grid = set(int(s) for s in scores["seeds"])
    per_problem = defaultdict(set)
    for p, s in seen:
        per_problem[p].add(s)
    odd = [p for p, ss in per_problem.items() if ss != grid]
    if odd:
        ex = sorted(odd)[0]
        raise UnitError(f"unit {rel}: mismatched seeds — problems {_first(odd)} do not carry exactly the declared "
                        f"seeds {sorted(grid)} (e.g. {ex} has {sorted(per_problem[ex])}); re-run the unit")
    if len(per_problem) != scores["n_problems"]:
        raise UnitError(f"unit {rel}: samples.jsonl holds {len(per_problem)} problems but scores.json says "
                        f"n_problems = {scores['n_problems']}: missing problems; re-run the unit")


def benchmark_sha256(scores: dict) -> str | None:
    """The sha256 of the benchmark file a unit was evaluated on, as 04_eval recorded it (None if it recorded none)."""
    return scores.get("config", {}).get("benchmark_sha256") or scores.get("provenance", {}).get("benchmark_sha256")


def check_same_benchmark(a: Unit, b: Unit) -> None:
    """Refuse to pair two units evaluated on different bytes of their benchmark (a corrected gold answer, another
    revision of the file): their per-problem scores are not about the same problems. Names both units and hashes."""
    ha, hb = benchmark_sha256(a.scores), benchmark_sha256(b.scores)
    if ha and hb and ha != hb:
        raise UnitError(f"units {a.rel} and {b.rel} were evaluated on different files of benchmark {b.benchmark!r} "
                        f"(benchmark_sha256 {ha[:16]}… vs {hb[:16]}…): they cannot be paired; re-evaluate one of them "
                        f"on the other's file (04_eval.py into a fresh --run-dir or after removing its folder)")


def load_unit(run_dir: Path, unit_dir: Path) -> Unit:
    m = verify_dir(unit_dir)
    rel = unit_dir.relative_to(run_dir).as_posix()
    for f in ("scores.json", "samples.jsonl"):
        if f not in m["outputs"]:
            raise UnitError(f"unit {rel}: {f} is not listed in its manifest.json; re-run the unit")
    scores, rows = read_json(unit_dir / "scores.json"), read_jsonl(unit_dir / "samples.jsonl")
    check_unit(rel, scores, rows)
    return Unit(unit_dir, rel, scores, rows, m)


def find_units(run_dir: Path) -> list[Path]:
    """Every finished evals/<alias>/<benchmark>/<protocol>/ (04 writes its manifest.json last), sorted."""
    return sorted(p.parent for p in (run_dir / "evals").glob("*/*/*/manifest.json"))


def pending_units(run_dir: Path) -> list[str]:
    """Unit folders still being written (or killed): no manifest.json yet. Reported as pending, never read."""
    return sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "evals").glob("*/*/*")
                  if p.is_dir() and not (p / "manifest.json").exists())


def load_units(run_dir: Path) -> list[Unit]:
    units = [load_unit(run_dir, d) for d in find_units(run_dir)]
    keys = Counter((u.alias, u.benchmark, u.protocol) for u in units)
    dup = [k for k, n in keys.items() if n > 1]
    if dup:
        raise UnitError(f"two units claim {dup[0]} (alias, benchmark, protocol); keep one folder per unit")
    return units


# --- diagnostics per unit (DESIGN.md §6) ---

def diagnostics(rows: list[dict]) -> dict:
    """Truncation, length, answer format, and what truncated samples still extract and score. Percentages."""
    n = len(rows)
    trunc = [r for r in rows if r["truncated"]]

    def pct(k, m):
        return 100.0 * k / m if m else None

    ext = Counter(r["extractor"] for r in rows)
    by_level = defaultdict(list)
    for r in rows:
        if r.get("level") is not None:
            by_level[str(r["level"])].append(bool(r["correct"]))
    return {
        "n_samples": n, "n_problems": len({r["problem_id"] for r in rows}),
        "accuracy_pct": pct(sum(bool(r["correct"]) for r in rows), n),
        "truncation_pct": pct(len(trunc), n),
        "mean_tokens": sum(r["n_tokens"] for r in rows) / n if n else None,
        "max_tokens": max((r["n_tokens"] for r in rows), default=None),
        "extractor_pct": {e: pct(ext.get(e, 0), n) for e in EXTRACTORS},
        "n_truncated": len(trunc),
        "truncated_extracted_pct": pct(sum(r["extractor"] != "none" for r in trunc), len(trunc)),
        "truncated_accuracy_pct": pct(sum(bool(r["correct"]) for r in trunc), len(trunc)),
        # source §8.3's two numbers: of the truncated samples, how many still extract an answer, and how many of those
        # are right (a collapsed student that reaches its answer and then loops extracts; a destroyed one does not)
        "n_truncated_extracted": sum(r["extractor"] != "none" for r in trunc),
        "n_truncated_extracted_correct": sum(r["extractor"] != "none" and bool(r["correct"]) for r in trunc),
        "verify_method": dict(sorted(Counter(r["verify_method"] for r in rows).items())),
        "accuracy_by_level_pct": {k: pct(sum(v), len(v)) for k, v in sorted(by_level.items())},
    }


# --- training runs ---

def collapse_watch(metrics: list[dict]) -> dict:
    """DESIGN.md §7.5 from per-step metrics: onset (first clip_ratio > CLIP_ONSET), length runaway (first mean length
    > 2× step 1's), the longest stretch of clip_ratio > CLIP_SINK as [first, last] step (`longest_clip90_span`; its
    length is lib.train.opd.CollapseWatch's `longest_clip90_run`), and the collapse band = the contiguous
    clip_ratio > CLIP_ONSET stretch that starts at the onset (what the report shades)."""
    steps = [m["step"] for m in metrics]
    clip = [m.get("response_length/clip_ratio") for m in metrics]
    length = [m.get("response_length/mean") for m in metrics]
    onset = next((s for s, c in zip(steps, clip) if c is not None and c > CLIP_ONSET), None)
    runaway = None
    if length and length[0]:
        runaway = next((s for s, x in zip(steps, length) if x is not None and x > 2 * length[0]), None)
    best, cur = None, None                   # longest clip > 0.9 run as [first, last]
    for s, c in zip(steps, clip):
        if c is not None and c > CLIP_SINK:
            cur = [cur[0], s] if cur else [s, s]
            if best is None or cur[1] - cur[0] > best[1] - best[0]:
                best = list(cur)
        else:
            cur = None
    band = None
    if onset is not None:
        end = onset
        for s, c in zip(steps, clip):
            if s > onset:
                if c is None or c <= CLIP_ONSET:
                    break
                end = s
        band = [onset, end]
    return {"collapse_onset_step": onset, "length_runaway_step": runaway, "longest_clip90_span": best,
            "longest_clip90_run": (best[1] - best[0] + 1) if best else 0, "collapse_band": band,
            "peak_clip_ratio": max((c for c in clip if c is not None), default=None)}


def run_identity(summary: dict, manifest: dict | None, name: str) -> tuple[str | None, int]:
    """(reward, training seed) of a run: summary.json first, then the manifest's args, then the campaign's naming
    (`<reward>` is seed DEFAULT_SEED, `<reward>-seed<S>` seed S), and finally DEFAULT_SEED."""
    args = (manifest or {}).get("args", {})
    m = re.fullmatch(r"(.+)-seed(\d+)", name)
    reward = summary.get("reward") or args.get("reward") or (m.group(1) if m else name)
    seed = summary.get("seed", args.get("seed"))
    return reward, int(seed if seed is not None else (m.group(2) if m else DEFAULT_SEED))


# 03's resume state: the loop state of the last complete checkpoint, with the settings the run was started with
RESUME_STATE = "resume/loop_state.json"
# a run's status, as the report names it
FINISHED, STOPPED_COLLAPSE, BUDGET_STOPPED, UNFINISHED = ("finished", "stopped by --stop-on-collapse",
                                                         "stopped by --time-limit", "unfinished")


def _metrics(train_dir: Path, torn_ok: bool = False) -> list[dict]:
    """metrics.jsonl, its steps strictly increasing. `torn_ok`: a half-written last line (a run killed or still
    writing) is dropped instead of refused."""
    path = train_dir / "metrics.jsonl"
    if not path.exists():
        return []
    try:
        metrics = read_jsonl(path)
    except (ArtifactError, ValueError):
        if not torn_ok:
            raise
        lines = path.read_text(encoding="utf-8").splitlines()
        metrics = _jsonl_lines(lines[:-1], path)
    steps = [r["step"] for r in metrics]
    if steps != sorted(set(steps)):
        raise ArtifactError(f"{train_dir}/metrics.jsonl: steps are not strictly increasing (duplicates or resume "
                            f"overlap near step {next(b for a, b in zip(steps, steps[1:]) if b <= a)}); repair the log")
    return metrics


def _jsonl_lines(lines: list[str], path: Path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in lines if ln.strip()]
    except ValueError as e:
        raise ArtifactError(f"{path}: a line before the last is not valid JSON ({e}); the log is damaged") from None


def _checkpoints(train_dir: Path) -> list[int]:
    return sorted(read_json(c)["step"] for c in train_dir.glob("step_*/checkpoint.json"))


def load_run(run_dir: Path, train_dir: Path) -> dict:
    """A finished training run folder: verified manifest, metrics.jsonl, summary.json, checkpoint list, and the
    settings its manifest records (lib/report/conditions.py: a run's identity)."""
    m = verify_dir(train_dir)
    metrics = _metrics(train_dir)
    if not metrics:
        raise ArtifactError(f"{train_dir}/metrics.jsonl is empty; the run logged no step")
    summary = read_json(train_dir / "summary.json") if (train_dir / "summary.json").exists() else {}
    reward, seed = run_identity(summary, m, train_dir.name)
    files = {f: m["outputs"][f] for f in ("metrics.jsonl", "summary.json") if f in m["outputs"]}
    files["manifest.json"] = sha256_file(train_dir / "manifest.json")
    return {"name": train_dir.name, "rel": train_dir.relative_to(run_dir).as_posix(), "metrics": metrics,
            "summary": summary, "checkpoints": _checkpoints(train_dir), "manifest": m, "reward": reward,
            "seed": seed, "settings": m.get("args"), "files": files,
            "status": STOPPED_COLLAPSE if summary.get("stopped") == "collapse" else FINISHED}


def _resume_settings(train_dir: Path) -> tuple[dict | None, int | None]:
    """(settings, step) of the run's last complete checkpoint as its resume state records them, else (None, None)."""
    p = train_dir / RESUME_STATE
    if not p.exists():
        return None, None
    state = read_json(p)
    return state.get("args"), state.get("step")


def budget_stopped(train_dir: Path) -> bool:
    """A run 03 stopped for its --time-limit: no manifest (the same command continues it), a summary.json saying
    `stopped: time_limit`, and nothing logged past the step that summary names (else it is being continued)."""
    if (train_dir / "manifest.json").exists() or not (train_dir / "summary.json").exists():
        return False
    summary = read_json(train_dir / "summary.json")
    if summary.get("stopped") != "time_limit":
        return False
    metrics = _metrics(train_dir, torn_ok=True)
    return bool(metrics) and metrics[-1]["step"] == summary.get("last_step") == _resume_settings(train_dir)[1]


def load_stopped_run(run_dir: Path, train_dir: Path) -> dict:
    """A budget-stopped run: everything it wrote up to its stop (metrics, summary, checkpoints) is final, so its
    evaluated checkpoints count. No manifest hashes these files; 05_stats records their sha256 as its inputs."""
    summary = read_json(train_dir / "summary.json")
    settings, _ = _resume_settings(train_dir)
    reward, seed = run_identity(summary, {"args": settings or {}}, train_dir.name)
    files = {f: sha256_file(train_dir / f) for f in ("metrics.jsonl", "summary.json", RESUME_STATE)}
    return {"name": train_dir.name, "rel": train_dir.relative_to(run_dir).as_posix(), "metrics": _metrics(train_dir),
            "summary": summary, "checkpoints": _checkpoints(train_dir), "manifest": None, "reward": reward,
            "seed": seed, "settings": settings, "files": files, "status": BUDGET_STOPPED}


def load_unfinished(run_dir: Path, train_dir: Path) -> dict:
    """A run without manifest that is not budget-stopped (killed, or still running): its per-step record so far (a
    torn last line dropped) and the settings of its resume state, for the training tables only: it is never pooled
    and its checkpoints' units stay pending."""
    settings, _ = _resume_settings(train_dir)
    summary = read_json(train_dir / "summary.json") if (train_dir / "summary.json").exists() else {}
    reward, seed = run_identity({}, {"args": settings or {}}, train_dir.name)
    files = {f: sha256_file(train_dir / f) for f in ("metrics.jsonl", RESUME_STATE) if (train_dir / f).exists()}
    return {"name": train_dir.name, "rel": train_dir.relative_to(run_dir).as_posix(),
            "metrics": _metrics(train_dir, torn_ok=True), "summary": summary, "checkpoints": _checkpoints(train_dir),
            "manifest": None, "reward": reward, "seed": seed, "settings": settings, "files": files,
            "status": UNFINISHED}


def find_runs(run_dir: Path) -> list[Path]:
    """Finished training runs: train/<name>/ folders that hold their manifest.json (03 writes it last)."""
    return sorted(p.parent for p in (run_dir / "train").glob("*/manifest.json"))


def find_stopped_runs(run_dir: Path) -> list[Path]:
    """Budget-stopped training runs (`budget_stopped`)."""
    return sorted(p for p in (run_dir / "train").glob("*") if p.is_dir() and budget_stopped(p))


def unfinished_dirs(run_dir: Path) -> list[Path]:
    """train/<name>/ folders without manifest.json that are not budget-stopped: killed, or still running."""
    return sorted(p for p in (run_dir / "train").glob("*")
                  if p.is_dir() and not (p / "manifest.json").exists() and not budget_stopped(p))


def pending_runs(run_dir: Path) -> list[dict]:
    """Training runs still in progress (or killed): a train/<name>/ folder without manifest.json that is not
    budget-stopped. Reported as pending with what they logged so far; never pooled."""
    out = []
    for d in unfinished_dirs(run_dir):
        try:
            steps = len(read_jsonl(d / "metrics.jsonl")) if (d / "metrics.jsonl").exists() else 0
        except (ArtifactError, ValueError):
            steps = None                       # a half-written last line: the trainer is still writing it
        settings, _ = _resume_settings(d)
        reward, seed = run_identity({}, {"args": settings or {}}, d.name)
        out.append({"run": d.name, "dir": d.relative_to(run_dir).as_posix(), "reward": reward, "seed": seed,
                    "steps_logged": steps, "checkpoints": sorted(c.name for c in d.glob("step_*"))})
    return out


# --- the time ledger ---

NO_DEVICES = "not recorded"    # a run whose record names no devices: an earlier run a manifest lists, an older ledger


def devices_text(devices) -> str:
    """A manifest's `devices` (lib/artifacts.devices: the GPUs the stage could see, else the CPU) as one cell."""
    return ", ".join(devices) if devices else NO_DEVICES


def _ledger_row(rel: str, manifest_rel: str, stage: str, rec: dict, kind: str) -> dict:
    return {"dir": rel, "manifest": manifest_rel, "stage": stage, "started": rec.get("started"),
            "ended": rec.get("ended"), "kind": kind, "wall_s": float(rec.get("wall_s", 0.0)),
            "gpu_s": float(rec.get("gpu_s", 0.0)), "devices": devices_text(rec.get("devices"))}


def _run_key(r: dict) -> tuple:
    """One stage run: its folder, stage, start and end (second resolution) and wall-clock (millisecond)."""
    return r["dir"], r["stage"], r["started"], r.get("ended"), r["wall_s"]


def manifest_runs(run_dir: Path, exclude=("report",)) -> list[dict]:
    """One ledger row per stage run whose manifest.json is on disk, plus the earlier runs a manifest lists itself
    under `previous_runs` ([{started, wall_s, gpu_s}], a stage that keeps its reruns' times)."""
    rows = []
    for p in sorted(run_dir.rglob("manifest.json")):
        rel = p.parent.relative_to(run_dir).as_posix()
        if rel.split("/")[0] in exclude:
            continue
        m, mrel = read_json(p), p.relative_to(run_dir).as_posix()
        rows += [_ledger_row(rel, mrel, m.get("stage", "?"), r, "earlier run (in its manifest)")
                 for r in m.get("previous_runs", [])]
        rows.append(_ledger_row(rel, mrel, m.get("stage", "?"), m, "latest"))
    return rows


def earlier_runs(previous: list[dict], current: list[dict]) -> list[dict]:
    """Rows of an older ledger (05's stats/ledger.json) whose manifest has since been overwritten by a rerun: the
    same directory and stage, another run (start, end, wall-clock), or a folder since removed. They stay in the ledger
    so reruns add up."""
    now, dirs = {_run_key(r) for r in current}, {r["dir"] for r in current}
    return [dict(r, kind="earlier run (overwritten manifest)" if r["dir"] in dirs else "earlier run (folder removed)")
            for r in previous if _run_key(r) not in now]


def time_ledger(run_dir: Path, earlier: list[dict] = (), exclude=("report",)) -> dict:
    """Wall-clock and GPU-seconds of every stage run under the campaign: the manifests on disk plus `earlier` rows
    (reruns whose manifest was overwritten), summed per stage; and the devices the runs saw, per stage and in all
    (each device string with its count of runs), so that a report says where its numbers were computed."""
    # rows of an older ledger (05 before it recorded devices) get NO_DEVICES like an earlier run a manifest lists
    rows = [dict(r, devices=r.get("devices") or NO_DEVICES) for r in manifest_runs(run_dir, exclude) + list(earlier)]
    rows.sort(key=lambda r: (r["dir"], r["started"] or "", r["kind"]))

    def devices(of):             # {device string: runs}, sorted by device
        return dict(sorted(Counter(r["devices"] for r in of).items()))

    stages = {}
    for name in sorted({r["stage"] for r in rows}):
        of = [r for r in rows if r["stage"] == name]
        stages[name] = {"n_runs": len(of), "wall_s": sum(r["wall_s"] for r in of), "gpu_s": sum(r["gpu_s"] for r in of),
                        "devices": devices(of)}
    total = {"n_runs": len(rows), "wall_s": sum(r["wall_s"] for r in rows), "gpu_s": sum(r["gpu_s"] for r in rows),
             "devices": devices(rows)}
    return {"runs": rows, "stages": stages, "total": total}
