"""Every kill resumable, one command continues anything (lib/runs.py, 03_opd_train.py, campaign.sh).

A SIGKILL at each point of the checkpoint sequence (before the first, during the first, between the renames, after
the swap, after the last before the manifest), and a trainer killed while a second one is refused by the run lock:
the same command continues, and the final weights and metrics are bit-identical (CPU) to an unkilled run. A finished
run says so; different settings are refused flag by flag; a flipped byte in the resume state or an HF checkpoint is
refused naming the file; a full disk says so; the time budget stops after a checkpoint; TensorBoard events hold the
logged metrics."""
import errno
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, run_script
from lib import runs
from lib.artifacts import read_json, read_jsonl
from lib.toy import builder
from test_train import assert_same_metrics, assert_same_weights

pytestmark = pytest.mark.e2e
CMD = ["--pair=toy", "--batch-prompts=8", "--rollouts=2", "--lr=1e-4", "--micro-batch=4", "--reward=delta-sampled",
       "--steps=4", "--save-every=2"]
RUN = "train/delta-sampled"


def train(run_dir, *extra, check=True, env=None):
    return run_script("03_opd_train.py", *CMD, f"--run-dir={run_dir}", *extra, check=check, env=env)


def one_line(p):
    """The refusal is one line on stderr, no traceback."""
    err = p.stderr.strip().splitlines()
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    return err[-1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    builder.build()
    d = tmp_path_factory.mktemp("reference")
    train(d)
    return d / RUN


# --- pure parts: the settings diff, the budget, the lock, the disk-full test ---

def test_settings_diff_lists_each_flag():
    saved = {"lr": 1e-4, "reward": "opd", "rollouts": 4, "steps": 10, "nproc": 1, "time_limit": None}
    now = {"lr": 2e-4, "reward": "delta-topk", "rollouts": 4, "steps": 12, "nproc": 4, "time_limit": 60.0}
    assert runs.settings_diff(saved, now) == ["  --lr: was 0.0001, now 0.0002", "  --reward: was 'opd', now 'delta-topk'"]
    assert runs.settings_diff(saved, now | {"steps": 8})[-1] == "  --steps: was 10, now 8"      # fewer steps: refused
    assert runs.settings_diff(saved, now, steps_may_grow=False)[-1] == "  --steps: was 10, now 12"
    assert runs.settings_diff(saved, saved | {"keep_last": 2, "logger": "tensorboard"}) == []
    # a flag added to 03 since a run started: the run ran with its default, so only another value is a change
    assert runs.settings_diff(saved, saved | {"truncated_policy": "raw"}) == []
    assert runs.settings_diff(saved, saved | {"truncated_policy": "mask"}) == ["  --truncated-policy: was 'raw', now 'mask'"]
    # what a step samples and trains on does not depend on these two (a diagnostic's coverage, vLLM's memory)
    assert runs.settings_diff(saved | {"logprob_gap_every": 4, "vllm_sleep": True},
                              saved | {"logprob_gap_every": 1, "vllm_sleep": False}) == []
    # the pair's sha256, recorded since a later version: a run that lacks it continues, one that holds it is checked
    assert runs.settings_diff(saved, saved | {"pair_sha256": "b" * 64}) == []
    assert runs.settings_diff(saved | {"pair_sha256": "a" * 64}, saved | {"pair_sha256": "b" * 64}) == [
        f"  --pair-sha256: was {'a' * 64!r}, now {'b' * 64!r}"]


def test_integrity_records_every_file_and_refuses_a_changed_or_missing_one(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 8)
    (tmp_path / "loop_state.json").write_text('{"step": 2}')
    runs.write_integrity(tmp_path)
    assert sorted(read_json(tmp_path / runs.INTEGRITY)) == ["loop_state.json", "model.safetensors"]
    runs.verify_files(tmp_path, "the resume state", "delete it")
    (tmp_path / "loop_state.json").write_text('{"step": 3}')                  # the JSON counts as much as the weights
    with pytest.raises(SystemExit, match=r"loop_state\.json has sha256 .* the resume state is damaged"):
        runs.verify_files(tmp_path, "the resume state", "delete it")
    runs.write_integrity(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(SystemExit, match=r"model\.safetensors is missing from the resume state"):
        runs.verify_files(tmp_path, "the resume state", "delete it")


def test_a_finished_run_asked_for_more_steps_continues_from_its_resume_state(tmp_path):
    """lib/train/checkpoint.decide on a sealed run folder built by hand: the same --steps is finished, one more step
    continues from resume/, fewer is refused."""
    from lib.artifacts import atomic_write_json, write_manifest
    from lib.train import checkpoint
    settings = {"steps": 2, "lr": 1e-4}
    state = tmp_path / runs.RESUME
    state.mkdir()
    (state / "state.safetensors").write_bytes(b"\x00")
    atomic_write_json(state / "loop_state.json", {"step": 2, "args": settings})
    runs.write_integrity(state)
    write_manifest(tmp_path, stage="03_opd_train", script=__file__, args=settings, inputs={}, outputs=[],
                   started="", wall_s=0.0)
    assert checkpoint.decide(tmp_path, settings) == ("finished", None)
    assert checkpoint.decide(tmp_path, settings | {"steps": 3}) == ("resume", state)
    with pytest.raises(SystemExit, match="--steps: was 2, now 1"):
        checkpoint.decide(tmp_path, settings | {"steps": 1})
    ck = tmp_path / "step_000002"                    # a checkpoint damaged after the seal: found before continuing
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"\x00")
    runs.write_integrity(ck)
    (ck / "model.safetensors").write_bytes(b"\x01")
    with pytest.raises(SystemExit, match=r"model\.safetensors has sha256 .* checkpoint step_000002 is damaged"):
        checkpoint.decide(tmp_path, settings | {"steps": 3})

def test_a_fresh_restart_clears_the_killed_runs_files_and_a_resume_keeps_its_source(tmp_path):
    for d in ("step_000002", "step_000002.tmp", "resume.tmp", "resume.old", "tensorboard", "resume"):
        (tmp_path / d).mkdir()
    for f in ("metrics.jsonl", "summary.json", "run.lock", "notes.txt"):
        (tmp_path / f).write_text("x")
    gone = runs.clear_partial(tmp_path)
    assert gone == ["metrics.jsonl", "resume.old", "resume.tmp", "step_000002", "step_000002.tmp", "summary.json",
                    "tensorboard"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "resume", "run.lock"]
    for d in ("resume.tmp", "resume.old"):
        (tmp_path / d).mkdir()
    runs.tidy(tmp_path, tmp_path / "resume.old")        # continuing from resume.old: it stays, resume.tmp goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "resume", "resume.old", "run.lock"]
    runs.tidy(tmp_path, tmp_path / "resume")            # from resume/: the superseded resume.old goes too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "resume", "run.lock"]


def test_budget_predicts_max_of_recent_steps_plus_checkpoint():
    t = [0.0]
    b = runs.Budget(100.0, t0=0.0, window=3, clock=lambda: t[0])
    for s in (5.0, 9.0, 4.0, 6.0):                     # the window is the last 3: max 9 → then 6 once 9 leaves
        b.step(s)
    assert b.predicted() == 9.0 + 9.0                   # no checkpoint timed yet: one more step stands in for it
    b.checkpoint(3.0)
    b.step(2.0)                                         # last three: 4, 6, 2
    assert b.predicted() == 6.0 + 3.0
    t[0] = 91.0
    assert not b.exhausted()                            # 91 + 9 = 100: still fits
    t[0] = 91.5
    assert b.exhausted()
    assert not runs.Budget(None, clock=lambda: 1e9).exhausted()


def test_run_lock_refuses_a_second_holder_naming_the_pid(tmp_path):
    first = runs.RunLock(tmp_path)
    with pytest.raises(SystemExit, match=f"in use by another trainer \\(pid {os.getpid()}"):
        runs.RunLock(tmp_path)
    assert (tmp_path / runs.LOCK).read_text().strip() == str(os.getpid())   # the failed attempt erased nothing
    first.release()
    runs.RunLock(tmp_path).release()                    # free again


def test_disk_full_is_recognised_through_the_exception_chain(tmp_path):
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from e
    except RuntimeError as e:
        assert runs.disk_full(e)
    assert not runs.disk_full(RuntimeError("metadata is None"))
    torch_says = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # no errno
    free = shutil.disk_usage(tmp_path).free
    assert runs.disk_full(torch_says, tmp_path, need_bytes=free + 2**30)
    assert not runs.disk_full(torch_says, tmp_path, need_bytes=free // 2)
    assert not runs.disk_full(OSError(errno.EACCES, "Permission denied"))
    assert runs.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))      # a quota is a full disk too
    try:
        try:
            raise OSError(errno.ENOSPC, "")
        except OSError:
            raise RuntimeError("while saving the checkpoint")                 # no `from`: only __context__ holds it
    except RuntimeError as e:
        assert runs.disk_full(e)


def test_a_torn_last_metrics_row_is_dropped_a_torn_middle_row_refused(tmp_path):
    from lib.train import checkpoint
    rows = "".join(f'{{"step": {i}, "x": {i}}}\n' for i in (1, 2, 3))
    (tmp_path / "metrics.jsonl").write_text(rows + '{"step": 4, "x"')           # killed mid-write
    assert checkpoint.kept_metrics(tmp_path, 2) == '{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n'
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "x"\n' + rows)
    with pytest.raises(SystemExit, match="metrics.jsonl:1 is not valid JSON and not the last row"):
        checkpoint.kept_metrics(tmp_path, 2)
    (tmp_path / "metrics.jsonl").write_text(rows.replace('"x": 2}', '"x"'))    # torn, then one more row
    with pytest.raises(SystemExit, match="metrics.jsonl:2 is not valid JSON and not the last row"):
        checkpoint.kept_metrics(tmp_path, 2)


# --- SIGKILL at each point of the checkpoint sequence: the same command continues, bit-identically ---

KILLS = {   # point → (what the folder holds after the kill, what the rerun says)
    "before-checkpoint:2": ({"metrics.jsonl"}, "restarting it"),
    "resume-written:2": ({"metrics.jsonl", "step_000002", "resume.tmp"}, "restarting it"),
    "renamed-old:4": ({"metrics.jsonl", "step_000002", "step_000004", "resume.old", "resume.tmp"},
                      "resumed .* at step 2 from resume.old/"),
    "renamed-new:4": ({"metrics.jsonl", "step_000002", "step_000004", "resume", "resume.old"},
                      "resumed .* at step 4 from resume/"),
    "before-manifest:4": ({"metrics.jsonl", "step_000002", "step_000004", "resume"}, "sealing it without retraining"),
}


@pytest.mark.parametrize("point", list(KILLS))
def test_sigkill_then_same_command_equals_uninterrupted(reference, tmp_path, point):
    import re
    p = train(tmp_path, check=False, env={"OPD_KILL_AT": point})
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    run = tmp_path / RUN
    held, said = KILLS[point]
    assert {q.name for q in run.iterdir()} == held | {runs.LOCK}
    p = train(tmp_path)
    assert re.search(said, p.stdout), p.stdout[-2000:]
    if point.startswith("before-manifest"):
        assert "step    " not in p.stdout                                   # sealed, nothing retrained
    assert_same_metrics(read_jsonl(reference / "metrics.jsonl"), read_jsonl(run / "metrics.jsonl"), rel=0)
    assert_same_weights(reference / "step_000004", run / "step_000004", atol=0)
    assert not (run / "resume.old").exists() and not (run / "resume.tmp").exists()
    assert (run / "manifest.json").exists()


def test_finished_run_says_so_and_other_settings_are_refused(reference):
    before = (reference / "metrics.jsonl").read_bytes()
    p = train(reference.parent.parent)
    assert "is finished (manifest.json verified): nothing to do" in p.stdout
    assert (reference / "metrics.jsonl").read_bytes() == before
    p = train(reference.parent.parent, "--lr=3e-4", "--rollouts=3", "--nproc=1", "--time-limit=100", check=False)
    last = p.stderr.strip().splitlines()
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert last[-2:] == ["  --lr: was 0.0001, now 0.0003", "  --rollouts: was 2, now 3"]
    assert "with other settings" in last[-3]


def test_resume_with_other_settings_is_refused(tmp_path):
    train(tmp_path, check=False, env={"OPD_KILL_AT": "before-manifest:4"})
    p = train(tmp_path, "--reward=opd", "--run-name=delta-sampled", check=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1] == "  --reward: was 'delta-sampled', now 'opd'"


# --- the resume state: safetensors + JSON, gathered to rank 0 and broadcast back into the shards ---

def test_two_gloo_processes_continue_from_a_state_that_holds_no_pickle(tmp_path):
    """2 gloo processes (FSDP2 shards): a run sealed at step 2 and asked for 4 continues from its resume state and
    equals the uninterrupted 2-process run bit for bit; the state is safetensors + JSON only (no pickle anywhere)."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    train(full, "--nproc=2")
    train(cut, "--nproc=2", "--steps=2")
    assert "resumed" in train(cut, "--nproc=2").stdout
    assert_same_metrics(read_jsonl(full / RUN / "metrics.jsonl"), read_jsonl(cut / RUN / "metrics.jsonl"), rel=0)
    assert_same_weights(full / RUN / "step_000004", cut / RUN / "step_000004", atol=0)
    held = sorted(p.name for p in (cut / RUN / "resume").iterdir())
    assert held == ["integrity.json", "loop_state.json", "optim_groups.json", "state.safetensors"]


def test_an_old_format_resume_state_is_refused_not_unpickled(tmp_path):
    """A resume state holding a pickle (torch.distributed.checkpoint's .metadata), its integrity.json rewritten to
    match: refused in one line, the pickle never executed."""
    train(tmp_path, check=False, env={"OPD_KILL_AT": "before-manifest:4"})
    state, marker = tmp_path / RUN / "resume", tmp_path / "pwned"
    (state / "state.safetensors").unlink()
    (state / ".metadata").write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    runs.write_integrity(state)
    line = one_line(train(tmp_path, check=False))
    assert "an older format" in line and "never loaded" in line and not marker.exists()


# --- integrity: a flipped byte is refused, naming the file ---

def flip_byte(path: Path, at: int = -100):
    b = bytearray(path.read_bytes())
    b[at] ^= 0x01
    path.write_bytes(bytes(b))


def test_flipped_byte_in_resume_state_or_checkpoint_is_refused(tmp_path):
    import importlib
    train(tmp_path, check=False, env={"OPD_KILL_AT": "before-manifest:4"})
    run = tmp_path / RUN
    shard = run / "resume" / "state.safetensors"
    flip_byte(shard)
    line = one_line(train(tmp_path, check=False))
    assert str(shard) in line and "the resume state is damaged" in line
    flip_byte(shard)                                                        # restored: accepted again
    ck = run / "step_000004" / "model.safetensors"
    flip_byte(ck)
    eval04 = importlib.import_module("04_eval")
    with pytest.raises(SystemExit, match=f"{ck} has sha256 .* the checkpoint is damaged"):
        eval04.plan_unit(tmp_path, str(run / "step_000004"), "toy", "sample4")
    flip_byte(ck)
    eval04.plan_unit(tmp_path, str(run / "step_000004"), "toy", "sample4")  # intact: planned


# --- the run lock: two trainers, two campaigns ---

def test_second_trainer_refused_then_killed_holder_continued(reference, tmp_path):
    env = os.environ | {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPD_HANG_AT": "step-logged:1"}
    a = subprocess.Popen([sys.executable, str(REPO / "03_opd_train.py"), *CMD, f"--run-dir={tmp_path}"], cwd=REPO,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmp_path / RUN
    try:
        deadline = time.monotonic() + 300
        while not ((run / "metrics.jsonl").exists() and read_jsonl(run / "metrics.jsonl")):   # a is at step 1
            assert a.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        line = one_line(train(tmp_path, check=False))
        assert f"in use by another trainer (pid {a.pid}" in line
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
    p = train(tmp_path)                          # killed before its first checkpoint: the same command restarts it
    assert "restarting it" in p.stdout
    assert_same_weights(reference / "step_000004", run / "step_000004", atol=0)


def test_second_campaign_on_one_run_dir_is_refused(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".campaign.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write(f"{os.getpid()}\n")
        f.flush()
        p = subprocess.run(["bash", str(REPO / "campaign.sh")], cwd=REPO, env=os.environ | {"RUN": str(tmp_path)},
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"pid {os.getpid()}" in p.stderr.strip().splitlines()[-1]
    assert "== 0." not in p.stdout                                         # refused before any stage ran


# --- a full disk, the time budget, keep-last, TensorBoard ---

def test_full_disk_during_first_checkpoint_says_so(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs CAP_SYS_ADMIN")
    try:                       # 8 MiB: the HF folder (3.3 MiB) fits, model + Adam state (11 MiB) does not
        line = one_line(train(mnt, check=False))
        assert line.startswith("[03] the disk is full: the step 2 checkpoint (~")
        assert not (mnt / RUN / "resume.tmp").exists() and not (mnt / RUN / "step_000002.tmp").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_time_limit_stops_after_a_checkpoint_and_the_rerun_continues(reference, tmp_path):
    extra = ["--keep-last=1", "--logger=tensorboard"]
    p = train(tmp_path, *extra, "--time-limit=1")       # the model load alone takes longer: stop after step 1
    run = tmp_path / RUN
    assert "stopped for the time budget" in p.stdout
    summary = read_json(run / "summary.json")
    assert summary["stopped"] == "time_limit" and summary["last_step"] == 1
    assert not (run / "manifest.json").exists()
    assert read_json(run / "resume" / "loop_state.json")["step"] == 1
    assert sorted(q.name for q in run.glob("step_*")) == ["step_000001"]
    train(tmp_path, *extra)                              # no budget: continues to the end
    assert sorted(q.name for q in run.glob("step_*")) == ["step_000004"]   # keep-last 1
    assert_same_metrics(read_jsonl(reference / "metrics.jsonl"), read_jsonl(run / "metrics.jsonl"), rel=0)
    assert_same_weights(reference / "step_000004", run / "step_000004", atol=0)
    assert read_json(run / "summary.json")["stopped"] is None
    assert_tensorboard_equals_metrics(run)


def assert_tensorboard_equals_metrics(run):
    """Every step's metrics exactly once in the TensorBoard events, equal to metrics.jsonl's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    rows = read_jsonl(run / "metrics.jsonl")
    for k in ("actor/kl_loss", "delta_opd/weighted_reward_mean", "response_length/mean", "actor/grad_norm"):
        assert [e.step for e in acc.Scalars(k)] == [r["step"] for r in rows], k
        assert [e.value for e in acc.Scalars(k)] == pytest.approx([r[k] for r in rows], rel=1e-6), k


def test_tensorboard_events_past_the_checkpoint_are_purged_on_resume(reference, tmp_path):
    p = train(tmp_path, "--logger=tensorboard", check=False, env={"OPD_KILL_AT": "before-checkpoint:4"})
    assert p.returncode == -signal.SIGKILL                  # steps 3 and 4 logged, then killed: resumed at 2
    train(tmp_path, "--logger=tensorboard")
    assert_tensorboard_equals_metrics(tmp_path / RUN)
    assert_same_metrics(read_jsonl(reference / "metrics.jsonl"), read_jsonl(tmp_path / RUN / "metrics.jsonl"), rel=0)
