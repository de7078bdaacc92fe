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
