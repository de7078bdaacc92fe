"""Artifacts and manifests (DESIGN.md §11): atomic writes, sha256 of everything, and refusal on a hash mismatch.

Every stage writes its outputs into one directory and finishes with `manifest.json` there:

    {"stage": "04_eval", "argv": [...], "args": {...}, "git_commit": "...",
     "code": {"script": sha256, "lib": sha256},
     "inputs":  {"<name>": {"path": ..., "sha256": ...}},
     "outputs": {"<relative path>": sha256},
     "started": iso, "ended": iso, "wall_s": float, "gpu_s": float, "host": ..., "devices": [...], ...}

A consumer names the exact directory it reads and calls `verify_dir(dir)`: any output whose bytes no longer hash to
what the manifest recorded is refused with a message that names the file and the fix. Nothing guesses "the latest".
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from lib import cpu_repro
from lib.errors import UserError

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """An artifact on disk is missing, changed since it was written, or would be silently overwritten."""


class DamagedJSON(UserError, ValueError):
    """A JSON file that does not parse (cut off, overwritten with other bytes): one line naming it and the fix, at
    any depth of any stage (a UserError), and still a ValueError for a caller that refuses it in its own words."""


# --- hashing ---

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_tree(root: str | Path, pattern: str = "*") -> str:
    """One hash for a folder: sha256 over the sorted (relative path, file sha256) pairs."""
    root = Path(root)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob(pattern) if q.is_file() and "__pycache__" not in q.parts):
        h.update(f"{p.relative_to(root).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def code_hashes(script: str | Path) -> dict:
    """sha256 of the stage script and of the whole `lib/` package: the code that produced an artifact."""
    return {"script": Path(script).name,
            "script_sha256": sha256_file(script),
            "lib_sha256": sha256_tree(REPO / "lib", "*.py")}


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


# --- atomic writes: a temp file in the same directory, fsync, then rename ---

def current_umask() -> int:
    """The process umask, read without changing it (os.umask can only be read by setting it, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(*paths: str | Path) -> None:
    """Give files written by a library that creates them private (safetensors: 0600) the mode an ordinary open()
    would give them (0644 under umask 022), as every other file of a run has."""
    mode = 0o666 & ~current_umask()
    for p in paths:
        os.chmod(p, mode)


def follow_umask(root: str | Path) -> None:
    """Widen a cached folder built private (mkdtemp's 0700 folder, safetensors' 0600 files) to the modes the umask
    gives an ordinary folder and file (0755 / 0644 under umask 022), as every other artifact has; a mode already as
    wide is left as it is, and so is what this user does not own or cannot change (a shared, read-only cache)."""
    mask, uid = current_umask(), os.geteuid()
    for p in [Path(root), *Path(root).rglob("*")]:
        try:
            st = os.lstat(p)
            want = (0o777 if stat.S_ISDIR(st.st_mode) else 0o666) & ~mask
            if st.st_uid == uid and not stat.S_ISLNK(st.st_mode) and want & ~st.st_mode:
                os.chmod(p, stat.S_IMODE(st.st_mode) | want)
        except OSError:
            continue


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` so that a reader sees the old file or the new one, never a part. The file gets the
    mode an ordinary open() would give it (0644 under umask 022), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def dumps_json(obj) -> str:
    """The one JSON spelling of the project: sorted keys, 2-space indent, trailing newline (byte-stable rebuilds)."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, dumps_json(obj))


def atomic_write_jsonl(path: str | Path, rows) -> Path:
    return atomic_write_text(path, "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows))


def read_json(path: str | Path):
    """The JSON value of `path`; a file that does not parse is refused in one line (DamagedJSON), not a traceback."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except ValueError as e:                        # JSONDecodeError, UnicodeDecodeError
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e).splitlines()[0]
            raise DamagedJSON(f"{path} is not valid JSON ({why}): it was cut off or damaged after it was written; "
                              f"restore it, or delete its folder and rerun the stage that wrote it") from None


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ArtifactError(f"{path}:{i} is not valid JSON ({e}); the file is corrupt — "
                                        "re-run the stage that wrote it") from e
    return rows


# --- manifests ---

def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def devices() -> list[str]:
    try:
        import torch
        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return [f"cpu ({os.cpu_count()} cores)"]


def input_record(path: str | Path) -> dict:
    """How a manifest names an input: its path and sha256 (a folder gets a tree hash)."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"input {p} does not exist")
    return {"path": str(p), "sha256": sha256_tree(p) if p.is_dir() else sha256_file(p)}


def write_manifest(out_dir: str | Path, *, stage: str, script: str | Path, args: dict, inputs: dict,
                   outputs: list[str | Path], started: str, wall_s: float, gpu_s: float = 0.0,
                   extra: dict | None = None) -> Path:
    """Write `out_dir/manifest.json`, hashing every output (paths relative to out_dir). Call it last."""
    out_dir = Path(out_dir)
    out = {}
    for o in outputs:
        p = Path(o)
        p = p if p.is_absolute() else out_dir / p
        rel = p.relative_to(out_dir).as_posix()
        if p.is_dir():
            for q in sorted(p.rglob("*")):
                if q.is_file():
                    out[q.relative_to(out_dir).as_posix()] = sha256_file(q)
        else:
            out[rel] = sha256_file(p)
    manifest = {
        "stage": stage, "argv": sys.argv, "args": {k: _jsonable(v) for k, v in args.items()},
        "git_commit": git_commit(), "code": code_hashes(script),
        "inputs": {k: v if isinstance(v, dict) else input_record(v) for k, v in inputs.items()},
        "outputs": out, "started": started, "ended": now_iso(), "wall_s": round(wall_s, 3),
        "gpu_s": round(gpu_s, 3), "host": platform.node(), "devices": devices(),
        "python": sys.version.split()[0], "cpu_repro": cpu_repro.record(), **(extra or {}),
    }
    return atomic_write_json(out_dir / MANIFEST, manifest)


def _jsonable(v):
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def read_manifest(out_dir: str | Path) -> dict:
    p = Path(out_dir) / MANIFEST
    if not p.exists():
        raise ArtifactError(f"{out_dir} has no {MANIFEST}: the stage that writes it did not finish; re-run it")
    m = read_json(p)
    if not isinstance(m, dict) or not isinstance(m.get("outputs"), dict) or not isinstance(m.get("stage"), str):
        raise ArtifactError(f"{p} is not a manifest (no stage name or outputs table): it was replaced after it was "
                            f"written; delete {out_dir} and rerun the stage that wrote it")
    return m


def verify_dir(out_dir: str | Path, files: list[str] | None = None) -> dict:
    """Check every output (or just `files`) of a stage directory against its manifest; return the manifest."""
    out_dir = Path(out_dir)
    m = read_manifest(out_dir)
    for rel in files if files is not None else sorted(m["outputs"]):
        want = m["outputs"].get(rel)
        p = out_dir / rel
        if want is None:
            raise ArtifactError(f"{p} is not listed in {out_dir / MANIFEST}; it was not written by that stage")
        if not p.exists():
            raise ArtifactError(f"{p} is listed in its manifest but missing; re-run {m['stage']} for {out_dir}")
        got = sha256_file(p)
        if got != want:
            raise ArtifactError(
                f"{p} has sha256 {got[:12]}… but {out_dir / MANIFEST} recorded {want[:12]}…: the file changed after "
                f"{m['stage']} wrote it. Re-run {m['stage']} for this directory (delete it first) "
                "— it is not used as is.")
    return m


def wall_clock() -> tuple[str, float]:
    """(iso start time, monotonic start) for a stage's manifest."""
    import time
    return now_iso(), time.monotonic()
