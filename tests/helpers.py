"""Shared by the end-to-end tests: run a stage script the way a user does."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

# A Triton kernel given a CPU model runs only under the interpreter, which conftest.py sets on a machine without CUDA
# only: on a CUDA host the tests that push a CPU model through a kernel skip, and the kernel tests (tensors on the GPU
# there) and bench/device.sh's `checks` run those kernels instead.
# Where the Triton kernels' own tests put their tensors: the GPU where there is one, else the CPU (the interpreter).
DEV = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU model through Triton's interpreter, unset "
                                 "on a CUDA host (the kernel tests run these kernels on its GPU)")


def run_script(script: str, *args, check: bool = True, launcher=(), env: dict | None = None, timeout: int = 900):
    """`python <script> <args>` from the repository root (or `<launcher> <script> <args>`, e.g. torchrun), unbuffered,
    one OpenMP thread unless `env` says otherwise. With `check`, a non-zero exit raises with the output's tails."""
    env = os.environ | {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"} | (env or {})
    p = subprocess.run([*(launcher or [sys.executable]), str(REPO / script), *map(str, args)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{script} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-4000:]}")
    return p
