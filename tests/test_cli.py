"""Every stage's `--help` works and shows the defaults; one flag name per concept across the stages."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import REPO

STAGES = ("01_gates.py", "02_baselines.py", "03_opd_train.py", "04_eval.py", "05_stats.py", "06_report.py", "07_raft.py")


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    out = {}
    for s in STAGES:
        p = subprocess.run([sys.executable, s, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"{s} --help failed:\n{p.stderr[-2000:]}"
        out[s] = p.stdout
    return out


def flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def test_help_shows_defaults(helps):
    for s, text in helps.items():
        assert "(default: " in text, f"{s} --help shows no defaults"


def test_one_flag_name_per_concept(helps):
    """The campaign directory, vLLM's memory share and the sampler's batch are spelled the same in every stage."""
    every = {s: flags(t) for s, t in helps.items()}
    assert all("--run-dir" in f for f in every.values())
    for s in ("02_baselines.py", "03_opd_train.py", "04_eval.py", "07_raft.py"):
        assert "--gpu-memory-utilization" in every[s], s
        assert "--vllm-gpu-memory" not in every[s], s
    for s in ("02_baselines.py", "04_eval.py", "07_raft.py"):
        assert "--sample-batch" in every[s], s
    assert "--batch-size" not in every["02_baselines.py"] | every["04_eval.py"]   # 07's is the SFT batch only


# --- the shared validators: argparse types, so a bad number or name is refused before anything loads ---

def test_numeric_types_refuse_nonsense_and_keep_sense():
    import argparse
    import math
    from lib import cli
    good = {cli.positive_float: ["1e-6", "0.2", "3"], cli.nonnegative_float: ["0", "2.5"],
            cli.fraction: ["1", "0.95", "1e-3"], cli.open_fraction: ["0", "0.05"], cli.nonnegative_int: ["0", "42"],
            cli.positive_int: ["1", "64"]}
    bad = {cli.positive_float: ["0", "-1e-3", "inf", "nan", "-inf", "x"], cli.nonnegative_float: ["-0.2", "nan", "inf"],
           cli.fraction: ["0", "1.5", "-0.1", "nan"], cli.open_fraction: ["1", "1.5", "-0.1", "nan"],
           cli.nonnegative_int: ["-1", "1.5", "x"], cli.positive_int: ["0", "-3", "2.0"]}
    for t, texts in good.items():
        for x in texts:
            assert math.isclose(t(x), float(x)), (t.__name__, x)
    for t, texts in bad.items():
        for x in texts:
            with pytest.raises(argparse.ArgumentTypeError):
                t(x)


@pytest.mark.parametrize("name", ["../x", "../../../x", "a/b", "/abs", ".", "..", ".hidden", "-flag", "a..b", "",
                                  "sp ace", "tab\tx", "x" * 201, "new\nline"])
def test_a_name_that_is_not_one_folder_is_refused(name):
    import argparse
    from lib import cli
    assert cli.name_error(name) is not None
    with pytest.raises(argparse.ArgumentTypeError):
        cli.path_name(name)


@pytest.mark.parametrize("name", ["delta-topk", "opd-seed1", "toy-student_sub16", "run.v2", "a+b@c=d", "Qwen2.5"])
def test_an_ordinary_name_is_accepted(name):
    from lib import cli
    assert cli.name_error(name) is None and cli.path_name(name) == name


@pytest.mark.parametrize("script,flag", [("03_opd_train.py", "--grad-clip=0"), ("03_opd_train.py", "--clip-eps=-0.2"),
                                         ("03_opd_train.py", "--kl-coef=nan"), ("03_opd_train.py", "--lr=inf"),
                                         ("03_opd_train.py", "--top-p=1.5"), ("03_opd_train.py", "--temperature=0"),
                                         ("03_opd_train.py", "--run-name=../../x"), ("07_raft.py", "--lr=-1"),
                                         ("07_raft.py", "--val-frac=1"), ("04_eval.py", "--alias=../../x"),
                                         ("04_eval.py", "--grade-timeout=0"), ("01_gates.py", "--top-p=1.5"),
                                         ("01_gates.py", "--temperature=0"), ("01_gates.py", "--tie-tol=-1"),
                                         ("01_gates.py", "--min-stop-delta=nan"), ("02_baselines.py",
                                                                                   "--max-new-tokens=0")])
def test_stages_refuse_a_bad_flag_in_one_line_before_anything(script, flag, tmp_path):
    required = ["--model=toy-pre", "--benchmark=toy", "--protocol=greedy"] if script == "04_eval.py" else []
    args = [sys.executable, script, f"--run-dir={tmp_path / 'run'}", *required, flag]
    p = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and flag.split("=")[0] in err[0] and "(see --help)" in err[0], p.stderr
    assert not (tmp_path / "run").exists()


_LOAD_A_MODEL = """
import sys
from transformers import AutoModelForCausalLM, Qwen2Config
from lib.cli import ArgumentParser
config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1)
AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[1])
if sys.argv[2] == "stage":
    ArgumentParser(prog="stage")           # what every stage does first
AutoModelForCausalLM.from_pretrained(sys.argv[1])
"""


def test_a_stage_writes_no_progress_bar_into_a_log(tmp_path):
    """Off a terminal, a stage's model loads draw no "Loading weights" bar (issue 33: a redrawn bar became lines of
    1,800 characters in log files); the same load without the stage's parser does draw it, so the check can fail."""
    def stderr(mode):
        env = {k: v for k, v in __import__("os").environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
        r = subprocess.run([sys.executable, "-c", _LOAD_A_MODEL, str(tmp_path / mode), mode], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stderr

    assert "Loading weights" in stderr("plain")
    assert "Loading weights" not in stderr("stage")
