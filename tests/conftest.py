"""Fixtures shared by the test files."""
import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when the first test module imports it. Set here, before
# any test module is collected, so that a subset of the files in any order runs the kernels in the interpreter too.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread is as fast, and immune to the slowdown of two threads on two busy cores.
    A test file opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
