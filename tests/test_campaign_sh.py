"""campaign.sh's own logic, run for real with a stand-in `python` that records each stage call (its arguments, start
and end) instead of running the stage: which runs it starts, the pool's bound of JOBS at a time, the one order the
work needs (gates first, the RAFT teacher before its students, statistics and report after every run), and what a
failed job does (the campaign exits non-zero naming it, after the jobs already running, and starts nothing after).
Seconds, no toy world."""
import os
import subprocess
import sys
import textwrap

import pytest

from lib.artifacts import REPO

# The stand-in: "start|end <time> <argv>" lines in $FAKE_LOG; a 03 call makes the checkpoint folder campaign.sh then
# evaluates; 07 takes 14 s; a call whose argv holds $FAKE_FAIL exits 3 after its start line.
FAKE_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env bash
    ARGS="$*"
    echo "start $(date +%s.%N) $ARGS" >> "$FAKE_LOG"
    if [ "$1" = 03_opd_train.py ]; then
      while [ $# -gt 0 ]; do
        case $1 in --run-dir) RUN_DIR=$2 ;; --run-name) NAME=$2 ;; esac
        shift
      done
      mkdir -p "$RUN_DIR/train/$NAME/step_000001"
    fi
    sleep 0.05
    [ "$1" = 07_raft.py ] && sleep 14     # the RAFT teacher outlasts the spawns (1-s polls) before its students
    if [ -n "${FAKE_FAIL:-}" ] && grep -q -- "$FAKE_FAIL" <<< "$ARGS"; then exit 3; fi
    echo "end $(date +%s.%N) $ARGS" >> "$FAKE_LOG"
""")

SEEDS = ["42", "1"]
MAIN = [f"{r}{'' if s == '42' else f'-seed{s}'}" for r in ("opd", "delta-sampled", "delta-topk") for s in SEEDS]
RAFT = [f"delta-topk-raft{'' if s == '42' else f'-seed{s}'}" for s in SEEDS]
ARM = ([f"collapse-{c}{'' if s == '42' else f'-seed{s}'}" for c in ("raw", "eos-neutral", "eos-neutral-all")
        for s in SEEDS] + [f"collapse-{c}" for c in ("eos-clamp", "center", "stop-on-collapse", "kl-max", "low-lr")])


def campaign(tmp_path, fail: str = "", **env_vars) -> tuple[subprocess.CompletedProcess, list[dict]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RUN": str(tmp_path / "run"),
           "SEEDS": " ".join(SEEDS), "FAKE_LOG": str(log), "FAKE_FAIL": fail, **env_vars}
    p = subprocess.run(["bash", str(REPO / "campaign.sh")], env=env, capture_output=True, text=True, timeout=300)
    calls: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        kind, t, argv = line.split(" ", 2)
        calls.setdefault(argv, {"argv": argv})[kind] = float(t)
    return p, sorted(calls.values(), key=lambda c: c["start"])


def run_name(call: dict) -> str | None:
    argv = call["argv"].split()
    return argv[argv.index("--run-name") + 1] if "--run-name" in argv else None


def test_every_run_once_at_most_jobs_at_a_time_in_the_order_the_work_needs(tmp_path):
    p, calls = campaign(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "done in " in p.stdout.strip().splitlines()[-1]
    assert all("end" in c for c in calls)
    trained = [run_name(c) for c in calls if c["argv"].startswith("03_opd_train.py")]
    assert sorted(trained) == sorted(MAIN + RAFT + ARM)                     # each run once
    # at most JOBS (the toy's 2) stage calls at any moment: each job runs its calls one after another
    for c in calls:
        assert sum(o["start"] <= c["start"] < o["end"] for o in calls) <= 2, c["argv"]

    def first(pred):
        return next(c for c in calls if pred(c["argv"]))

    gates = first(lambda a: a.startswith("01_gates.py") and "anatomy_cross" not in a)
    pool = [c for c in calls if c["argv"].split()[0] in ("02_baselines.py", "03_opd_train.py", "04_eval.py",
                                                          "07_raft.py")]
    assert all(c["start"] >= gates["end"] for c in pool)                    # gates first
    raft_teacher_end = max(c["end"] for c in calls if c["argv"].startswith(("07_raft.py",
                                                                            "02_baselines.py --run-dir")) and
                           "toy-raft" in c["argv"])
    assert all(c["start"] >= raft_teacher_end for c in calls if "--pair toy-raft" in c["argv"]
               and c["argv"].startswith("03_opd_train.py"))                 # the RAFT teacher before its students
    after = [first(lambda a: "anatomy_cross" in a), first(lambda a: a.startswith("05_stats.py")),
             first(lambda a: a.startswith("06_report.py"))]
    assert all(a["start"] >= max(c["end"] for c in pool) for a in after)   # statistics after every run
    assert [a["start"] for a in after] == sorted(a["start"] for a in after)
    # the longer jobs first: the collapse arm's 40-step low-lr run before its 20-step ones
    arm = [run_name(c) for c in calls if (run_name(c) or "").startswith("collapse-")]
    assert arm[0] == "collapse-low-lr"
    # the arm's learning rates are lib/registry.py's, by which its hypotheses select the runs (of a flag given twice,
    # 03 reads the last); the low-lr condition is 5× lower and runs twice as long
    from lib.registry import TOY_COLLAPSE_LOW_LR, TOY_COLLAPSE_LR

    def last(call: dict, flag: str) -> str:
        argv = call["argv"].split()
        return argv[len(argv) - argv[::-1].index(flag)]

    arm_calls = [c for c in calls if c["argv"].startswith("03_opd_train.py") and "--pair toy-collapse" in c["argv"]]
    steps = int(last(next(c for c in arm_calls if run_name(c) == "collapse-raw"), "--steps"))
    for c in arm_calls:
        low = run_name(c) == "collapse-low-lr"
        assert float(last(c, "--lr")) == (TOY_COLLAPSE_LOW_LR if low else TOY_COLLAPSE_LR), c["argv"]
        assert int(last(c, "--steps")) == (2 * steps if low else steps), c["argv"]
    assert TOY_COLLAPSE_LOW_LR == pytest.approx(TOY_COLLAPSE_LR / 5)
    # bench/toy_step.py times the campaign's own step: its presets are the flags campaign.sh gives the arm's raw run
    # and the main delta-topk run (after their run-specific ones), whatever campaign.sh says today
    def own_flags(name: str) -> list[str]:
        argv = next(c["argv"] for c in calls if run_name(c) == name).split()
        rest = argv[argv.index("--run-name") + 2:]
        return (["--pair", "toy", "--reward", "delta-topk"] if name == "delta-topk" else []) + rest

    for preset, name in (("arm", "collapse-raw"), ("main", "delta-topk")):
        dry = subprocess.run([sys.executable, "bench/toy_step.py", "--out", str(tmp_path / "ts"), "--dry-run",
                              "--preset", preset, "--variants", "padded"], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
        assert dry.returncode == 0, dry.stderr[-2000:]
        argv = dry.stdout.split()
        assert argv[argv.index("--nproc") + 2:argv.index("--seed")] == own_flags(name), preset


@pytest.mark.parametrize("fail", ["--run-name opd-seed1", "07_raft.py"])
def test_a_failed_job_stops_the_campaign_naming_it(tmp_path, fail):
    p, calls = campaign(tmp_path, fail)
    assert p.returncode == 1
    name = "opd-seed1" if "opd" in fail else "raft-teacher"
    assert f"{name} failed: see " in p.stderr
    assert not any(c["argv"].startswith(("05_stats.py", "06_report.py")) for c in calls)   # no statistics
    assert all("end" in c for c in calls if fail not in c["argv"])        # the running jobs were waited for
    if name == "raft-teacher":                                              # its students never start
        assert not any("--pair toy-raft" in c["argv"] and c["argv"].startswith("03_opd_train.py") for c in calls)


def test_raft_0_runs_every_other_run_and_no_raft_stage(tmp_path):
    """RAFT=0: no 07, no RAFT-pair eval or training, every other run as by default, statistics and report still."""
    p, calls = campaign(tmp_path, RAFT="0")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not any(c["argv"].startswith("07_raft.py") or "toy-raft" in c["argv"] for c in calls)
    trained = [run_name(c) for c in calls if c["argv"].startswith("03_opd_train.py")]
    assert sorted(trained) == sorted(MAIN + ARM)
    assert [c["argv"].split()[0] for c in calls[-2:]] == ["05_stats.py", "06_report.py"]


def test_train_extra_reaches_every_training_run_last(tmp_path):
    """TRAIN_EXTRA: its flags on every 03 call (main, RAFT students, the arm), after the campaign's own and a
    condition's, so that a flag given there is the one 03 reads; no other stage gets them."""
    p, calls = campaign(tmp_path, TRAIN_EXTRA="--packing off --no-share-prompts")
    assert p.returncode == 0, p.stderr[-2000:]
    trained = [c["argv"] for c in calls if c["argv"].startswith("03_opd_train.py")]
    assert len(trained) == len(MAIN + RAFT + ARM)
    # the override last, after the toy's own layout (shared prompts) and any condition's flags
    assert all(a.split()[-3:] == ["--packing", "off", "--no-share-prompts"] for a in trained)
    assert all("--share-prompts" in a.split()[:-3] for a in trained)
    assert not any("share-prompts" in c["argv"] for c in calls if not c["argv"].startswith("03_opd_train.py"))
