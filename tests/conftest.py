"""Fixtures shared by the test files."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when the first test module imports it. Set here, before
# any test module is collected, so that a subset of the files in any order runs the kernels in the interpreter too.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (the README's `-n 2`: one worker per core) each worker and the stages it starts compute on one
# thread: two workers of two threads each on two cores would oversubscribe them, and torch's threads then wait on
# each other. A test or stage that pins its own thread count still does.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread is as fast, and immune to the slowdown of two threads on two busy cores.
    A test file opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The files that take longest on 2 cores go first. Under `-n 2 --dist loadfile --no-loadscope-reorder` each worker
# takes the next file in this order as it finishes one (without the last flag xdist orders the files by their number
# of tests), so a long file does not start last and run alone at the end. test_real_assets needs no toy world and
# test_install waits on pypi.org more than on the CPU; test_report fabricates its campaigns: they run while a fresh
# clone's world is built (pytest_configure below). A file not named keeps its place after them.
LONGEST_FIRST = ("test_real_assets.py", "test_install.py", "test_report.py", "test_train.py", "test_resume.py",
                 "test_report_anatomy_cross.py", "test_sampling_vllm.py", "test_train_vllm.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))      # stable: a file's tests keep their order


def pytest_configure(config):
    """Under `-n 2` the controller starts building the toy world at once, in the background, where it is not built yet
    (a fresh clone; ≈ 18 min on 2 AVX2 cores, its longest chain of models on one thread). The first test that needs the
    world then waits on the build's lock (lib/toy/builder.build) instead of starting it, and the files that need no
    world (the real assets, the install sets, the report's fabricated campaigns) run beside it."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    from lib.toy import builder
    if (builder.cache_root() / builder.world_hash() / "world.json").exists():
        return
    config.world_builder = subprocess.Popen(
        [sys.executable, "-c", "from lib.toy import builder; builder.build()"], cwd=repo, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)     # its errors resurface in the test that needs it


def pytest_unconfigure(config):
    """A background build still running when the session ends (a subset that never needed the world) is stopped with
    its chain processes; its temp folder is removed by the next build."""
    proc = getattr(config, "world_builder", None)
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
