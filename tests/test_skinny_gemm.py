"""lib/sample/skinny_gemm.py's Triton partials (Triton's interpreter on CPU, TRITON_INTERPRET=1, set before the import)
against a float64 F.linear on odd shapes: ragged M, N and K tiles (masked loads), K slices of unequal fill, full
tiles (the unmasked path), bias and none, fp32 and bf16; the tiling grammar and the decoder's defaults."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import DEV  # noqa: E402
from lib.sample.skinny_gemm import defaults, linear, skinny_partials, tiling  # noqa: E402


@pytest.mark.parametrize("M,N,K,t", [(5, 48, 40, "n16k16s2w4"), (3, 20, 33, "n16k32s3w4"),
                                     (16, 32, 64, "n16k16s4w4"), (32, 64, 64, "n32k16s1w4m16")],
                         ids=["ragged", "ragged-k-slices", "even", "even-m-tiles"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 8e-3)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_partials_sum_to_the_linear(M, N, K, t, dtype, tol, bias):
    g = torch.Generator().manual_seed(M * N + K)
    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    x, w, b = x.to(DEV, dtype), w.to(DEV, dtype), b.to(DEV, dtype) if bias else None
    ref = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    kw = tiling(t)
    y = linear(x, w, b, **kw)
    assert y.dtype == dtype and y.shape == (M, N)
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < tol
    p = skinny_partials(x, w, kw["bn"], kw["bk"], kw["split"], kw["warps"], kw["stages"], kw["bm"])
    assert p.shape == (kw["split"], M, N) and p.dtype == torch.float32     # each slice its own share of K
    ks = -(-(-(-K // kw["split"])) // kw["bk"]) * kw["bk"]
    s = kw["split"] - 1
    part = torch.nn.functional.linear(x[:, s * ks:].double(), w[:, s * ks:].double()) if s * ks < K else 0 * ref
    assert torch.allclose(p[s].double(), part, atol=1e-3 * max(1.0, ref.abs().max().item()))


def test_tiling_grammar_and_defaults():
    assert tiling("n64k128s4w4") == dict(bn=64, bk=128, split=4, warps=4, stages=0, bm=64)
    assert tiling("n32k64s8w8t3m128") == dict(bn=32, bk=64, split=8, warps=8, stages=3, bm=128)
    for bad in ("n64k128s16w4", "k128s4w4", "n64k128s4"):
        with pytest.raises(ValueError, match="tiling"):
            tiling(bad)
    assert defaults(64, cuda=False) == {} and defaults(4096, cuda=True) == {}
    # down_proj only, its tiling by the inner size measured nearest (1.5B: 8,960; 7B: 18,944; bench/RESULTS.md §5)
    assert defaults(8, cuda=True) == defaults(64, True, 8960) == {"down": tiling("n32k128s8w4")}
    assert defaults(64, True, 18944) == defaults(64, True, 16000) == {"down": tiling("n64k128s4w4")}
    assert defaults(64, True, 4864) == {"down": tiling("n32k128s8w4")}      # (0.5B's 4,864: the nearer, 1.5B's)


def test_the_benchs_sweep_names_tilings_the_kernel_reads_back():
    """bench/skinny_gemm.py's sweep: every name it times parses (tiling()) to the row tile, SPLIT and program count it
    was chosen for. Above 64 rows it adds row tiles of 128 and stops at SPLIT 4; at 64 rows and below it is unchanged."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "bench" / "skinny_gemm.py"
    spec = importlib.util.spec_from_file_location("bench_skinny_gemm", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sms = 132
    for M, N, K in [(64, 2048, 1536), (256, 2048, 1536), (256, 1536, 8960)]:
        names = bench.sweep(M, N, K, sms)
        got = [tiling(n) for n in names]
        assert names and len(set(names)) == len(names)
        for n, t in zip(names, got):
            programs = -(-M // t["bm"]) * t["split"] * -(-N // t["bn"])
            assert sms // 2 <= programs <= 16 * sms and K // t["split"] >= t["bk"], n
        assert {t["bm"] for t in got} == ({64, 128} if M > 64 else {64})
        assert max(t["split"] for t in got) == (4 if M > 64 else 8)
