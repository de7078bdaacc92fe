"""A training run's checkpoints and its continuation (03_opd_train.py): the merged HF folder + resume state written
at each --save-every, and the auto-resume decision (finished / resume / fresh) with the settings check. Collective
where it says so: every rank calls it."""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

from lib import runs
from lib.artifacts import read_json, read_manifest
from lib.train import dist as D


def log(d: D.Dist, msg: str):
    if d.main:
        print(msg, flush=True)


def save(args, d, student, optim, kl, watch, step, out, resolved, sspec, run_dir, settings) -> float:
    """Merged HF folder step_<step>/ (+ keep-last pruning), then the resume state; returns its wall time. Collective.
    A full disk is one line that says so: the last complete checkpoint stays in place, the partial one is removed."""
    t0 = time.monotonic()
    runs.fault("before-checkpoint", step)
    meta = {"run": out.name, "step": step, "pair": settings.get("pair_name", args.pair), "reward": args.reward,
            "student_init": sspec.model, "campaign": run_dir.name}
    ck = out / f"step_{step:06d}"
    try:
        sd = D.full_state_dict(student)
        if d.main:
            D.save_hf(sd, resolved["student"].path, ck, D.config_dtype(resolved["student"].path), meta)
            done = sorted(p for p in out.glob("step_*") if p.name[5:].isdigit() and int(p.name[5:]) <= step)
            for old in done[:-args.keep_last] if args.keep_last else []:
                shutil.rmtree(old)
        D.save_resume(student, optim, {"step": step, "kl_coef": kl.coef, "watch": watch.__dict__,
                                       "torch_rng": torch.get_rng_state().tolist(), "args": settings},
                      out / runs.RESUME)
    except BaseException as e:      # torch.distributed.checkpoint's CheckpointException is a BaseException
        need = 3 * 4 * sum(p.numel() for p in student.parameters())      # fp32 weights + two Adam moments
        if isinstance(e, (KeyboardInterrupt, SystemExit)) or not runs.disk_full(e, out, need):
            raise
        for tmp in (ck.with_name(ck.name + ".tmp"), out / runs.RESUME_TMP):
            shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(f"[03] the disk is full: the step {step} checkpoint (~{need / 2**20:.0f} MiB) could not be written "
                 f"under {out} ({shutil.disk_usage(out).free / 2**20:.0f} MiB free once its partial files are "
                 f"removed); free space, then rerun the same command (it continues from the last complete checkpoint)")
    log(d, f"[03] saved {ck}")
    return time.monotonic() - t0


def decide(out: Path, settings: dict):
    """Auto-resume: ("finished" | "resume" | "fresh", resume state). Different settings are refused; a finished run
    asked for more steps continues from its last checkpoint."""
    mode, src = runs.decide(out)
    saved = read_manifest(out)["args"] if mode == "finished" else read_json(src / "loop_state.json")["args"] \
        if mode == "resume" else None
    if saved is not None and (diff := runs.settings_diff(saved, settings)):
        sys.exit(f"{out} was {'run' if mode == 'finished' else 'started'} with other settings; rerun with the old "
                 f"ones, or pass --run-name for a new run. Differing:\n" + "\n".join(diff))
    if mode == "finished" and settings["steps"] > saved["steps"]:
        mode, src = "resume", runs.resume_dir(out)
        if src is None:
            sys.exit(f"{out} is finished at --steps {saved['steps']} and holds no resume state to continue from; "
                     f"pass --run-name for a new run")
    if mode == "resume":
        if not (src / D.RESUME_TENSORS).exists():
            sys.exit(f"{src} holds no {D.RESUME_TENSORS}: a resume state of an older format (pickled "
                     f"torch.distributed.checkpoint metadata), which is never loaded; delete {out} to restart the run")
        verify_checkpoints(out, read_json(src / "loop_state.json")["step"])
    return mode, src


def verify_checkpoints(out: Path, upto: int | None = None):
    """Every HF checkpoint folder step_N/ (N ≤ upto) against its own integrity.json, before a run continues or is
    sealed: a damaged one is refused in one line, never carried into the manifest."""
    for ck in sorted(p for p in Path(out).glob("step_*") if p.is_dir() and p.name[5:].isdigit()):
        if upto is None or int(ck.name[5:]) <= upto:
            runs.verify_files(ck, f"checkpoint {ck.name}", f"the run is not sealed; delete {out} and rerun to train it "
                                                           f"again (or restore the file)")


def kept_metrics(out: Path, start: int) -> str:
    """metrics.jsonl of a resumed run cut back to its checkpoint: rows past step `start` belong to the killed run
    and are dropped, a last row torn by the kill among them; a malformed row before the end is refused in one line."""
    path, kept = Path(out) / "metrics.jsonl", []
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):          # the row being written when the run was killed
                break
            sys.exit(f"{path}:{i} is not valid JSON and not the last row; the file is damaged: delete {out} to "
                     f"restart the run")
        if row.get("step", start + 1) <= start:
            kept.append(json.dumps(row) + "\n")
    return "".join(kept)

