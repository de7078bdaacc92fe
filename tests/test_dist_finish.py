"""lib/train/dist.finish: the ranks leave the process group together. Two gloo processes on the CPU; rank 0 arrives
late (as it does in 03 and 07, checking its checkpoints and writing the manifest while the other ranks are done), and
rank 1 must not get past finish() before rank 0 has reached it. Seconds, no toy world."""
import json
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

LATE_S = 1.0


def worker(rank: int, store: str, out: str) -> None:
    from lib.train import dist as D
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    marker = Path(out, "rank1-arrived")
    if rank == 0:                                  # late by construction: only once rank 1 is inside finish()
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(LATE_S)
    arrived = time.monotonic()                     # CLOCK_MONOTONIC: one clock for every process of the machine
    if rank == 1:
        marker.touch()
    D.finish()
    left = time.monotonic()
    Path(out, f"{rank}.json").write_text(json.dumps({"arrived": arrived, "left": left,
                                                     "initialized": dist.is_initialized()}))


def test_a_rank_leaves_only_once_every_rank_has_arrived(tmp_path):
    mp.start_processes(worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    assert r1["arrived"] + LATE_S <= r0["arrived"]  # rank 1 came first, rank 0 at least LATE_S later
    assert r1["left"] >= r0["arrived"]             # and rank 1 waited for rank 0 before destroying its group
    assert not r0["initialized"] and not r1["initialized"]


ALONE = """
import os, socket, sys, json
sys.path.insert(0, sys.argv[1])
for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(k, None)
taken = socket.socket()                       # the port the old code derived from this process id, held by another
taken.bind(("127.0.0.1", 29500 + os.getpid() % 1000))
taken.listen()
import torch, torch.distributed as dist
from lib.train import dist as D
d = D.init()
x = torch.ones(3)
dist.all_reduce(x)
first = (d.rank, d.world, x.tolist())
D.finish()
d = D.init()                                  # again, in the same process (a test, a resumed stage)
D.finish()
print(json.dumps({"first": first, "again": [d.rank, d.world]}))
"""


def test_a_plain_launch_needs_no_port():
    """A plain `python` launch (no torchrun variables) forms its group of one without a TCP port: with the port its
    process id once mapped to already taken by another socket, init() works, a collective runs, and the group can be
    left and formed again in the same process. (15 campaign jobs at once once failed with EADDRINUSE.)"""
    import subprocess
    import sys
    repo = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", ALONE, repo], capture_output=True, text=True, timeout=120, cwd=repo)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"first": [0, 1, [1.0, 1.0, 1.0]], "again": [0, 1]}, got
