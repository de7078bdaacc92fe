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
