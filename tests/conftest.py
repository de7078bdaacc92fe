"""Fixtures shared by the test files."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread is as fast, and immune to the slowdown of two threads on two busy cores.
    A test file opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
