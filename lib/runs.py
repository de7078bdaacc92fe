"""A training run folder that survives any kill (DESIGN.md §7.7): one command continues anything.

- `RunLock(folder)`: an fcntl.flock on `<folder>/run.lock`, held for the life of the process; a second trainer on the
  same folder is refused at once, naming the pid that holds it. The kernel drops the lock when its holder dies.
- `decide(out, args)`: rerunning the same command is verl's `resume_mode: auto` — "finished" (a valid manifest.json:
  nothing to do), "resume" (the last complete checkpoint; the loader looks at resume/, then resume.old/), or "fresh"
  (no complete checkpoint: a run killed before or during its first one restarts cleanly).
- `settings_diff(saved, now)`: a continued run must have the settings it started with; one line per differing flag.
- `Budget(limit_s)`: the wall-clock guard of `--time-limit`: stop (after a checkpoint) when the next step plus a
  checkpoint is predicted not to fit.
- `write_integrity(folder)` / `verify_files(folder)`: the sha256 of every file of a resume state or an HF checkpoint,
  recorded when written and verified on load; a changed byte is refused with a one-line message naming the file.
- `disk_full(exc)`: is this failure a full disk (ENOSPC / EDQUOT anywhere in the exception chain or its message)?
- `fault(point, step)`: the kill points of the resume tests (`OPD_KILL_AT=point[:step]`, `OPD_HANG_AT=…`); no-ops
  unless those variables are set.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import time
from pathlib import Path

from lib.artifacts import ArtifactError, atomic_write_json, read_json, sha256_file, verify_dir

LOCK = "run.lock"
RESUME, RESUME_OLD, RESUME_TMP = "resume", "resume.old", "resume.tmp"
INTEGRITY = "integrity.json"
# flags that may differ between the start of a run and its continuation: how it is launched, watched, or stopped,
# not what it computes (the data order and every rollout seed are fixed by --seed, whatever the process count)
MAY_DIFFER = ("resume", "nproc", "time_limit", "logger", "wandb_project", "keep_last", "peak_tflops", "save_every",
              "run_dir", "run_name", "logprob_gap_every", "vllm_sleep")
# (the last two: a diagnostic's coverage, and memory)
# settings recorded only since a later version: compared when the saved run holds them (a run started before 03
# recorded its pair's sha256 continues, its pair still checked by --pair's value)
RECORDED_SINCE = ("pair_name", "pair_sha256")
# flags added to 03 after runs were recorded, with the value every run before them ran with: a run that does not
# record one ran with that value (settings_diff; lib/report/conditions.run_settings, so that such a run and a new run
# of the same settings are one condition)
ADDED_WITH_DEFAULT = {"truncated_policy": "raw", "student_scores": "recompute", "share_prompts": False}


# --- the run lock ---

class RunLock:
    """Exclusive flock on `<folder>/<name>` for as long as this object lives (or until `release()`)."""

    def __init__(self, folder: Path, name: str = LOCK, what: str = "trainer"):
        folder = Path(folder)
        self.path = folder / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self.f = open(self.path, "a+")       # append: a failed attempt must not erase the holder's pid
        except OSError as e:
            raise SystemExit(f"{folder} cannot be written ({e.strerror}): a {what} needs a writable run folder; "
                             f"make it writable or pass another --run-dir") from None
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.seek(0)
            holder = self.f.read().strip() or "unknown"
            self.f.close()
            raise SystemExit(f"{folder} is in use by another {what} (pid {holder}, lock {self.path}); wait for it to "
                             f"finish or stop that process, then rerun this command") from None
        self.f.truncate(0)
        self.f.write(f"{os.getpid()}\n")
        self.f.flush()

    def release(self):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


# --- the auto-resume decision ---

def resume_dir(out: Path) -> Path | None:
    """The last complete checkpoint's resume state: resume/, else resume.old/ (a kill between the two renames)."""
    for name in (RESUME, RESUME_OLD):
        if (Path(out) / name / INTEGRITY).exists():
            return Path(out) / name
    return None


def decide(out: Path) -> tuple[str, Path | None]:
    """("finished", None) | ("resume", resume state) | ("fresh", None) for the run folder `out`."""
    out = Path(out)
    if (out / "manifest.json").exists():
        try:
            verify_dir(out)
        except ArtifactError as e:
            raise SystemExit(f"{out} is a finished run whose files changed since: {e}") from None
        return "finished", None
    if (out / RESUME).is_dir() and not (out / RESUME / INTEGRITY).exists():
        raise SystemExit(f"{out / RESUME} has no {INTEGRITY}: written by an older version of this code or damaged; "
                         f"delete {out} to restart the run from scratch")
    src = resume_dir(out)
    return ("resume", src) if src is not None else ("fresh", None)


def clear_partial(out: Path) -> list[str]:
    """A fresh restart: remove what a run killed before its first complete checkpoint left (metrics, partial state,
    half-written HF folders). Returns the names removed."""
    out, gone = Path(out), []
    for p in sorted(out.glob("*")):
        if (p.name in ("metrics.jsonl", "summary.json", RESUME_TMP, RESUME_OLD, "tensorboard")
                or p.name.startswith("step_")):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            gone.append(p.name)
    return gone


def tidy(out: Path, src: Path) -> None:
    """A resumed run: drop the partial state of the kill (resume.tmp) and a superseded resume.old."""
    shutil.rmtree(Path(out) / RESUME_TMP, ignore_errors=True)
    if src.name != RESUME_OLD:
        shutil.rmtree(Path(out) / RESUME_OLD, ignore_errors=True)


def settings_diff(saved: dict, now: dict, may_differ=MAY_DIFFER, steps_may_grow: bool = True) -> list[str]:
    """One line per flag whose value differs (flags in `may_differ` ignored; a continued run's `steps` may grow:
    the data order is fixed, so more steps only go further down the same pass)."""
    lines = []
    saved, now = ADDED_WITH_DEFAULT | saved, ADDED_WITH_DEFAULT | now
    for k in sorted(saved.keys() | now.keys()):
        if k in may_differ or saved.get(k) == now.get(k) or (k in RECORDED_SINCE and k not in saved):
            continue
        if (k == "steps" and steps_may_grow and isinstance(saved.get(k), int) and isinstance(now.get(k), int)
                and now[k] >= saved[k]):
            continue
        lines.append(f"  --{k.replace('_', '-')}: was {saved.get(k, '(absent)')!r}, now {now.get(k, '(absent)')!r}")
    return lines


# --- the wall-clock budget ---

class Budget:
    """`--time-limit`: the next step is predicted to take the max of the last `window` steps, plus the longest
    checkpoint seen (or, before the first, one more step's time); stop when that would cross the limit."""

    def __init__(self, limit_s: float | None, t0: float | None = None, window: int = 3, clock=time.monotonic):
        self.limit_s, self.clock, self.window = limit_s, clock, window
        self.t0 = clock() if t0 is None else t0
        self.steps: list[float] = []
        self.ckpt_s = 0.0

    def step(self, seconds: float):
        self.steps.append(seconds)

    def checkpoint(self, seconds: float):
        self.ckpt_s = max(self.ckpt_s, seconds)

    def predicted(self) -> float:
        last = max(self.steps[-self.window:]) if self.steps else 0.0
        return last + (self.ckpt_s if self.ckpt_s else last)

    def exhausted(self) -> bool:
        """True when the next step + a checkpoint would not end before the limit (never without a limit)."""
        if self.limit_s is None:
            return False
        return self.clock() - self.t0 + self.predicted() > self.limit_s


# --- integrity: sha256 of every file of a checkpoint folder, recorded when written, verified on load ---

def write_integrity(folder: Path) -> None:
    """`folder/integrity.json` = {file name: sha256} of the folder's files; written last, it marks the folder
    complete."""
    folder = Path(folder)
    atomic_write_json(folder / INTEGRITY, {p.name: sha256_file(p) for p in sorted(folder.iterdir())
                                           if p.is_file() and p.name != INTEGRITY})


def verify_files(folder: Path, what: str, fix: str) -> None:
    """Every file `folder/integrity.json` lists must hash to its recorded sha256; a one-line refusal names the file."""
    folder = Path(folder)
    sums = folder / INTEGRITY
    if not sums.exists():
        raise SystemExit(f"{folder} has no {INTEGRITY}: {what} is incomplete or predates integrity records; {fix}")
    for name, want in read_json(sums).items():
        p = folder / name
        if not p.exists():
            raise SystemExit(f"{p} is missing from {what} ({sums} lists it); {fix}")
        if (got := sha256_file(p)) != want:
            raise SystemExit(f"{p} has sha256 {got[:12]}… but {sums} recorded {want[:12]}…: {what} is damaged "
                             f"and is not used; {fix}")


# --- failures ---

def disk_full(exc: BaseException, folder: Path | None = None, need_bytes: int = 0) -> bool:
    """Was this write failure a full disk? ENOSPC / EDQUOT anywhere in the exception chain, or (torch's zip writer
    reports it only as `[enforce fail at inline_container.cc] unexpected pos …`) less room left in `folder` than the
    write needed."""
    e = exc
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return folder is not None and shutil.disk_usage(folder).free < need_bytes


def fault(point: str, step: int | None = None):
    """Test hook: `OPD_KILL_AT=point[:step]` SIGKILLs this process here; `OPD_HANG_AT=…` sleeps here (a live holder)."""
    for var, act in (("OPD_KILL_AT", "kill"), ("OPD_HANG_AT", "hang")):
        want = os.environ.get(var)
        if not want:
            continue
        name, _, at = want.partition(":")
        if name == point and (not at or step is None or int(at) == step):
            if act == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
