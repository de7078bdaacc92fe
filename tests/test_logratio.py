"""lib/kernels/logratio.py and lib/kernels/linear_logratio.py: the Triton kernels against the pure-torch reference, and the reference
against a naive log_softmax + autograd computation.

On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before they are defined) on tiny odd
shapes: V not a multiple of the block, K > 1, rows with -inf logits, tied logits. With CUDA the same tests run on the
GPU in bf16, plus full-vocabulary shapes.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lib.kernels import linear_logratio as LL          # noqa: E402
from lib.kernels import logratio as L                  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CASES = [("cpu", torch.float32), ("cpu", torch.bfloat16)] if INTERPRET else []
if torch.cuda.is_available():
    CASES += [("cuda", torch.bfloat16)]
# outputs are fp32 computed from the same (exactly upcast) inputs; gradients are rounded once to the logits' dtype
LP_TOL = {torch.float32: dict(atol=5e-5, rtol=1e-5), torch.bfloat16: dict(atol=5e-5, rtol=1e-5)}
GRAD_TOL = {torch.float32: dict(atol=1e-6, rtol=1e-4), torch.bfloat16: dict(atol=1e-6, rtol=8e-3)}
N, V = 7, 100                                   # tiny, odd: 4 slices of 32 with a ragged last one


@pytest.fixture
def kernels(monkeypatch, request):
    """Small blocks and tiles so every code path (several slices, several tiles, ragged ends) runs."""
    import lib.kernels.logratio_triton as kt
    for kernel in kt.CONFIG:
        monkeypatch.setitem(kt.CONFIG, kernel, dict(block=32, num_warps=1))
    monkeypatch.setitem(LL.TILES, "rows", 4)
    monkeypatch.setitem(LL.TILES, "cols", 40)
    monkeypatch.setenv("LOGRATIO_FORCE_TRITON", "1")
    return kt


def make_logits(device, dtype, seed, n=N, v=V, ties=False):
    """Random logits with rows partly -inf (every 3rd entry; all but 2; the whole first slice), optional ties."""
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(n, v, generator=g)
    if ties:
        x = (x * 2).round() / 2                                    # values on a 0.5 grid: many exact ties
    x[1, ::3] = float("-inf")
    x[2, 2:] = float("-inf")
    x[3, :40] = float("-inf")
    return x.to(dtype).to(device)


def make_ids(device, seed, n=N, k=1, v=V):
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, v, (n, k), generator=g)
    ids[1, 0] = 3                                                  # a sampled id at a -inf logit: lp = -inf
    ids[2, 0] = 1
    return ids.to(device)


def assert_close(a, b, tol):
    torch.testing.assert_close(a.float().cpu(), b.float().cpu(), equal_nan=True, **tol)


def naive_student(logits, ids_N, k):
    """Independent check of the reference: autograd through log_softmax in fp32, top-K by a stable sort."""
    lsm = torch.log_softmax(logits.float(), dim=-1)
    topk_ids = torch.sort(logits.detach().float(), dim=-1, descending=True, stable=True).indices[:, :k]
    ent = -(lsm.exp() * lsm.nan_to_num(neginf=0.0)).sum(-1)
    return lsm.gather(1, ids_N[:, None])[:, 0], topk_ids, lsm.gather(1, topk_ids), ent.detach()


# --- the reference against naive torch ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_matches_naive(monkeypatch, dtype):
    monkeypatch.setattr(L, "REF_CHUNK_ELEMS", 3 * V)              # several row chunks
    x = make_logits("cpu", dtype, seed=1, ties=True)
    ids = make_ids("cpu", 1, k=4)
    assert_close(L.reference_token_logprobs(x, ids), torch.log_softmax(x.float(), -1).gather(1, ids), LP_TOL[dtype])
    xr, xn = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, naive = L.reference_student_logprobs(xr, ids[:, 0], 5), naive_student(xn, ids[:, 0], 5)
    assert torch.equal(ref[1], naive[1])
    for a, b in zip(ref[::2] + ref[3:], naive[::2] + naive[3:]):
        assert_close(a, b, LP_TOL[dtype])
    g_lp, g_topk = torch.randn(N), torch.randn(N, 5)
    (ref[0] @ g_lp + (ref[2] * g_topk).sum()).backward()
    (naive[0] @ g_lp + (naive[2] * g_topk).sum()).backward()
    assert xr.grad.dtype == dtype
    assert_close(xr.grad, xn.grad, GRAD_TOL[dtype])


def test_topk_ties_go_to_the_lower_id(kernels):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [-0.0, 0.0, -0.0, 0.0, 0.0],
                      [float("-inf"), 5.0, float("-inf"), float("-inf"), float("-inf")]])
    want = torch.tensor([[1, 2], [0, 1], [1, 0]])                  # -0.0 ties +0.0; -inf ties go to the lower id
    for fn in (L.student_logprobs, L.reference_student_logprobs):
        assert torch.equal(fn(x, torch.zeros(3, dtype=torch.long), 2)[1], want)


# --- kernels against the reference --------------------------------------------------------------------------------

@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # the interpreter's numpy on the all -inf row
def test_teacher_and_token_logprobs(kernels, device, dtype, k):
    post, pre = make_logits(device, dtype, seed=2), make_logits(device, dtype, seed=3)
    post[4] = float("-inf")                                        # a fully -inf row: NaN, as log_softmax gives
    ids = make_ids(device, 2, k=k)
    got, want = L.teacher_logprobs(post, pre, ids), L.reference_teacher_logprobs(post, pre, ids)
    for a, b in zip(got, want):
        assert a.shape == (N, k) and a.dtype == torch.float32
        assert_close(a, b, LP_TOL[dtype])
    assert torch.isneginf(got[1][1, 0]) and got[0][4].isnan().all()
    assert_close(L.token_logprobs(pre, ids), want[1], LP_TOL[dtype])


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("k,ties", [(0, False), (4, False), (4, True)])
def test_student_forward_backward(kernels, device, dtype, k, ties):
    x = make_logits(device, dtype, seed=4, ties=ties)
    ids = make_ids(device, 4)[:, 0]
    xk, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = L.student_logprobs(xk, ids, k), L.reference_student_logprobs(xr, ids, k)
    assert got[1].shape == (N, k) and torch.equal(got[1], want[1])           # identical ids, ties included
    for a, b in zip(got[::2] + got[3:], want[::2] + want[3:]):
        assert_close(a, b, LP_TOL[dtype])
    g = torch.Generator().manual_seed(5)
    g_lp, g_topk = torch.randn(N, generator=g).to(device), torch.randn(N, k, generator=g).to(device)
    (got[0] @ g_lp + (got[2] * g_topk).sum()).backward()
    (want[0] @ g_lp + (want[2] * g_topk).sum()).backward()
    assert xk.grad.dtype == dtype
    assert_close(xk.grad, xr.grad, GRAD_TOL[dtype])


@pytest.mark.parametrize("device,dtype", CASES)
def test_linear_variant(kernels, device, dtype):
    g = torch.Generator().manual_seed(6)
    H, k = 24, 3
    h = torch.randn(N, H, generator=g).to(dtype).to(device)
    w = torch.randn(V, H, generator=g).to(dtype).to(device)
    h2, w2 = torch.randn(N, H, generator=g).to(dtype).to(device), torch.randn(V, H, generator=g).to(dtype).to(device)
    ids = make_ids(device, 6, k=2)
    got = LL.linear_teacher_logprobs(h, w, h2, w2, ids)
    want = [LL.reference_linear_token_logprobs(h, w, ids), LL.reference_linear_token_logprobs(h2, w2, ids)]
    want.append(want[0] - want[1])
    tol = LP_TOL[dtype] if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)   # bf16 logits of two matmuls
    for a, b in zip(got, want):
        assert_close(a, b, tol)
    hk, wk = h.clone().requires_grad_(), w.clone().requires_grad_()
    hr, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
    got = LL.linear_student_logprobs(hk, wk, ids[:, 0], k)
    want = LL.reference_linear_student_logprobs(hr, wr, ids[:, 0], k)
    # the top-K sets must agree in value; ids may differ only where bf16 matmuls of different shapes round apart
    assert_close(got[2], want[2], tol)
    assert_close(got[2], torch.log_softmax((h @ w.T).float(), -1).gather(1, got[1]), tol)
    for a, b in [(got[0], want[0]), (got[3], want[3])]:
        assert_close(a, b, tol)
    g_lp, g_topk = torch.randn(N, generator=g).to(device), torch.randn(N, k, generator=g).to(device)
    (got[0] @ g_lp + (got[2] * g_topk).sum()).backward()
    (want[0] @ g_lp + (want[2] * g_topk).sum()).backward()
    gtol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    assert_close(hk.grad, hr.grad, gtol)
    assert_close(wk.grad, wr.grad, gtol)


@pytest.mark.parametrize("device,dtype", CASES)
def test_rewards_equal_on_both_paths(kernels, monkeypatch, device, dtype):
    """The three rewards as 03_opd_train's step 3 builds them (opd.advantages, the function the loop calls, on the
    loop's [sampled | top-K] layout) from the kernels (CUDA / interpreter) equal those from the reference (CPU)."""
    from lib.train import opd

    def rewards(student, post, pre, ids_N, k=4):
        lp, topk_ids, topk_lp, _ = L.student_logprobs(student, ids_N, k)
        ids_NJ = torch.cat([ids_N[:, None], topk_ids], 1)
        lp_post, lp_pre, _ = L.teacher_logprobs(post, pre, ids_NJ)
        out = {"topk_ids": topk_ids}
        for reward in opd.REWARDS:
            lp_t = {"teacher": lp_post} if reward == "opd" else {"pi_post": lp_post, "pi_pre": lp_pre}
            cand = topk_lp if reward == "delta-topk" else topk_lp[:, :0]
            out[reward] = opd.advantages(reward, lp_t, lp, cand)[0]
        return out

    x = [make_logits(device, dtype, seed=s) for s in (7, 8, 9)]
    for t in x:
        t[1:4] = torch.randn(3, V).to(dtype)                                 # finite rewards on every row
    ids = make_ids(device, 7)[:, 0]
    kernel_side = rewards(*x, ids)
    monkeypatch.setenv("LOGRATIO_FORCE_TRITON", "0")
    reference_side = rewards(*[t.cpu() for t in x], ids.cpu())
    assert torch.equal(kernel_side["topk_ids"].cpu(), reference_side["topk_ids"])
    # and both equal the rewards' definitions written out on plain log_softmax (a reversed sign fails here)
    s_V, post_V, pre_V = (torch.log_softmax(t.cpu().float(), -1) for t in x)
    y, c = ids.cpu()[:, None], reference_side["topk_ids"]
    plain = {"delta-sampled": post_V.gather(1, y) - pre_V.gather(1, y),
             "delta-topk": torch.softmax(s_V.gather(1, c), -1) * (post_V.gather(1, c) - pre_V.gather(1, c)),
             "opd": -(s_V.gather(1, y) - post_V.gather(1, y)).clamp(-10, 10)}
    for name in ("delta-sampled", "delta-topk", "opd"):
        assert kernel_side[name].isfinite().all()
        assert_close(kernel_side[name], reference_side[name], LP_TOL[dtype])
        assert_close(reference_side[name], plain[name], LP_TOL[dtype])


def test_errors_name_the_fix():
    x = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match="reshape"):
        L.token_logprobs(x, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="same positions"):
        L.student_logprobs(x[0], torch.zeros(4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="k = 9"):
        L.student_logprobs(x[0], torch.zeros(3, dtype=torch.long), 9)


# --- full-vocabulary shapes on the GPU -----------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_vocab_cuda():
    n, v, k = 300, 151_936, 16
    post, pre = (torch.randn(n, v, device="cuda") * 4).bfloat16(), (torch.randn(n, v, device="cuda") * 4).bfloat16()
    ids = torch.randint(0, v, (n, k), device="cuda")
    for a, b in zip(L.teacher_logprobs(post, pre, ids), L.reference_teacher_logprobs(post, pre, ids)):
        assert_close(a, b, LP_TOL[torch.bfloat16])
    xk, xr = post.clone().requires_grad_(), post.clone().requires_grad_()
    got, want = L.student_logprobs(xk, ids[:, 0], k), L.reference_student_logprobs(xr, ids[:, 0], k)
    assert torch.equal(got[1], want[1])
    for a, b in zip(got[::2] + got[3:], want[::2] + want[3:]):
        assert_close(a, b, LP_TOL[torch.bfloat16])
    (got[0].sum() - got[2].sum()).backward()
    (want[0].sum() - want[2].sum()).backward()
    assert_close(xk.grad, xr.grad, GRAD_TOL[torch.bfloat16])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    L.teacher_logprobs(post, pre, ids)
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < 0.01 * post.numel() * post.element_size(), f"teacher scoring used {extra} extra bytes"
