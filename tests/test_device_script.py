"""bench/device.sh's plumbing on a CPU, with a stand-in `python3` first on PATH (no model runs, no GPU): the `step`
part with OLD runs the old tree's 03 from that tree beside ours, both on the same data and the same cached random
weights (absolute paths), in the order OLD_FIRST says, each with its own metrics and floors, and device.txt names the
old commit. A same-call comparison whose two runs read different weights would compare nothing."""
import os
import subprocess

from helpers import REPO

# records each call (its directory, its arguments, the data and cache it was given); 03 writes one metrics row
SHIM = r"""#!/bin/bash
if [ "$1" = -c ] || [ "$1" = - ]; then exit 0; fi
echo "cwd=$PWD data=$OPD_DATA_DIR cache=$OPD_CACHE args=$*" >> "$SHIM_LOG"
if [ "$1" = 03_opd_train.py ]; then
  run=$(echo "$*" | sed 's/.*--run-dir \([^ ]*\).*/\1/'); mkdir -p "$run/train/delta-topk"
  echo "{\"step\": 1, \"tree\": \"$PWD\"}" > "$run/train/delta-topk/metrics.jsonl"
fi
"""


def device_step(tmp_path, **env) -> str:
    """bench/device.sh step under the stand-in python3; its stdout (the calls go to tmp_path/calls.log)."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").write_text(SHIM)
    (shim / "python3").chmod(0o755)
    (tmp_path / "calls.log").unlink(missing_ok=True)
    full = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "SHIM_LOG": str(tmp_path / "calls.log"),
            "STEPS": "2", "HOME": str(tmp_path), "SITE": str(tmp_path / "site"), **env}
    full.pop("OPD_CACHE", None)
    full.pop("OPD_DATA_DIR", None)
    out = subprocess.run(["bash", "bench/device.sh", "step"], cwd=REPO, env=full, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def run_step(tmp_path, **env) -> list[str]:
    device_step(tmp_path, **env)
    return (tmp_path / "calls.log").read_text().splitlines()


def test_step_with_old_runs_both_trees_on_the_same_data_and_weights(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for first in ("0", "1"):
        out = tmp_path / f"out{first}"
        calls = [c for c in run_step(tmp_path, OUT=str(out), OLD=str(old), OLD_COMMIT="abc1234", OLD_FIRST=first,
                                     EXTRA="--share-prompts") if "03_opd_train.py" in c]
        trees = [c.split()[0] for c in calls]
        ours, theirs = f"cwd={REPO}", f"cwd={old}"
        assert trees == ([theirs, ours] if first == "1" else [ours, theirs])
        want = f"data={REPO / '.device' / 'data'} cache={REPO / '.cache'}"
        assert all(want in c and c.endswith("--share-prompts") for c in calls)
        assert '"tree": "%s"' % old in (out / "step_builtin_old_metrics.jsonl").read_text()
        assert '"tree": "%s"' % REPO in (out / "step_builtin_metrics.jsonl").read_text()
        assert "old abc1234" in (out / "device.txt").read_text().splitlines()


def test_step_without_old_runs_ours_alone(tmp_path):
    calls = [c for c in run_step(tmp_path, OUT=str(tmp_path / "out")) if "03_opd_train.py" in c]
    assert len(calls) == 1 and calls[0].startswith(f"cwd={REPO} ")
    assert not (tmp_path / "out" / "step_builtin_old_metrics.jsonl").exists()


def test_step_warns_when_the_disk_cannot_hold_the_final_checkpoint(tmp_path):
    """A full disk ends 03 with status 1 after its last step (it happened on the device: the source step's cached 7B
    weights left too little room), so the part says so before it starts, naming what to remove."""
    out = str(tmp_path / "out")
    lines = device_step(tmp_path, OUT=out, DISK_GIB="1000000").splitlines()
    warned = [ln for ln in lines if ln.startswith("!! /tmp has")]
    assert len(warned) == 1 and "qwen2.5-7b-*" in warned[0] and "status 1" in warned[0]
    assert "!! /tmp has" not in device_step(tmp_path, OUT=out, DISK_GIB="0")
    assert "host CPU: " in (tmp_path / "out" / "device.txt").read_text()
