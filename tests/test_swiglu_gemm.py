"""bench/swiglu_gemm.py's fused kernel (Triton's interpreter on CPU, TRITON_INTERPRET=1, set before the import)
against a float64 silu(x · W_gateᵀ) · (x · W_upᵀ) on odd shapes: ragged row and column tiles, a K that is not a whole
number of BK (the masked tail), several groups of row tiles (the swizzle), fp32 and bf16; leading dimensions; the
refusals."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

from helpers import DEV, REPO  # noqa: E402

_spec = importlib.util.spec_from_file_location("swiglu_gemm_bench", REPO / "bench" / "swiglu_gemm.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
swiglu, swiglu_gemm, tiling = _mod.swiglu, _mod.swiglu_gemm, _mod.tiling


def reference(x, wg, wu):
    x, wg, wu = x.double(), wg.double(), wu.double()
    return torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)


@pytest.mark.parametrize("M,N,K,t", [(37, 40, 24, "m16n16k16w4g2"), (16, 32, 32, "m16n16k16w4g1"),
                                     (50, 24, 40, "m32n16k32w4g8"), (5, 48, 16, "m16n32k16w4g4")],
                         ids=["ragged-k-tail", "even", "ragged-groups", "one-row-tile"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_matches_the_unfused_product(M, N, K, t, dtype, tol):
    g = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    x, wg, wu = (torch.randn(*s, generator=g).to(DEV, dtype) for s in ((M, K), (N, K), (N, K)))
    ref = reference(x, wg, wu)
    a = swiglu(x, wg, wu, t)
    assert a.dtype == dtype and a.shape == (M, N)
    err = ((a.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < tol, f"relative error {err:.2e}"
    # gate and up are not interchangeable: the kernel must apply silu to the gate product only
    swapped = reference(x, wu, wg)
    assert ((a.double() - swapped).abs().max() / ref.abs().max()).item() > 10 * tol


def test_every_output_tile_is_written_once_with_its_own_rows_and_columns():
    """Rows and columns past the edges read row / column 0 and must never be stored: each output row equals its own
    row's product, including the last ragged tile's, and a permuted input permutes the output's rows."""
    g = torch.Generator().manual_seed(7)
    x, wg, wu = (torch.randn(*s, generator=g).to(DEV) for s in ((45, 24), (33, 24), (33, 24)))
    a = swiglu(x, wg, wu, "m16n16k16w4g2")
    perm = torch.randperm(45, generator=g).to(DEV)
    assert torch.allclose(swiglu(x[perm], wg, wu, "m16n16k16w4g2"), a[perm], atol=1e-5)
    assert torch.allclose(a[-1], reference(x[-1:], wg, wu)[0].float(), atol=1e-4)
    assert torch.allclose(a[:, -1], reference(x, wg[-1:], wu[-1:])[:, 0].float(), atol=1e-4)


def test_leading_dimensions_and_empty_rows():
    g = torch.Generator().manual_seed(3)
    x, wg, wu = (torch.randn(*s, generator=g).to(DEV) for s in ((2, 3, 16), (24, 16), (24, 16)))
    a = swiglu(x, wg, wu, "m16n16k16w4")
    assert a.shape == (2, 3, 24)
    assert torch.allclose(a, reference(x, wg, wu).float(), atol=1e-5)
    assert swiglu(x[:0], wg, wu, "m16n16k16w4").shape == (0, 3, 24)


def test_refusals_and_tiling_grammar():
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="two \\(N, K\\) weights"):
        swiglu(x, w, torch.randn(8, 12))
    with pytest.raises(ValueError, match="forward only"):
        swiglu(x.requires_grad_(), w, w)
    assert tiling("m128n64k64w8t3g8") == dict(bm=128, bn=64, bk=64, warps=8, stages=3, group=8)
    assert tiling("m64n128k32w4") == dict(bm=64, bn=128, bk=32, warps=4, stages=0, group=8)
    with pytest.raises(ValueError, match="is not m<BM>"):
        tiling("n64k64w4")


def test_opaque_to_torch_compile_as_a_custom_op():
    """The fake implementation gives torch.compile the output's shape and dtype without running the kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x, w = torch.empty(10, 16, dtype=torch.bfloat16), torch.empty(24, 16, dtype=torch.bfloat16)
        a = swiglu_gemm(x, w, w, 16, 16, 16, 4, 0, 8)
        assert a.shape == (10, 24) and a.dtype == torch.bfloat16
