"""03 --offload-optimizer (lib/train/dist.OffloadAdamW): AdamW's moments in host memory, streamed through the device
chunk by chunk, must be torch's AdamW to the bit — alone on plain tensors, and inside 03 (FSDP2, gloo, 1 process)
where the offloaded run's weights and optimizer state equal the plain run's, also after a kill and a resume."""
import copy

import pytest
import torch
from safetensors.torch import load_file

from helpers import run_script
from lib.artifacts import read_jsonl
from lib.toy import builder
from lib.train import dist as D
from test_train import assert_same_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((7, 5), (300,), (4, 33), (1,), (64, 16))]


def _run(opt_cls, steps, seed=0, **kw):
    ps = _params(seed)
    opt = opt_cls(ps, lr=1e-2, weight_decay=0.1, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        ps[1].grad = None if _ == 1 else ps[1].grad          # a step where one parameter has no gradient
        opt.step()
        opt.zero_grad(set_to_none=True)
    return ps, opt


@pytest.mark.parametrize("chunk_bytes", [1, 600, D.OFFLOAD_CHUNK_BYTES])
def test_offloaded_adamw_equals_adamw_to_the_bit(chunk_bytes):
    """One parameter a chunk, a few a chunk, all in one: the same weights and moments as torch's AdamW, exactly."""
    ref, ref_opt = _run(torch.optim.AdamW, 4)
    got, got_opt = _run(D.OffloadAdamW, 4, chunk_bytes=chunk_bytes)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
        sa, sb = ref_opt.state[a], got_opt.state[b]
        assert sa.keys() == sb.keys() and float(sa["step"]) == float(sb["step"])
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert sb["exp_avg"].device.type == "cpu"
    assert len(got_opt._chunks(got)) == {1: 5, 600: 4}.get(chunk_bytes, 1)


def test_offloaded_state_dict_loads_into_either_optimizer():
    """The state_dict is AdamW's: loaded into a fresh OffloadAdamW (moments land in its host buffers) or into a plain
    AdamW, the next step is the uninterrupted run's."""
    ref, _ = _run(torch.optim.AdamW, 3)
    _, opt = _run(D.OffloadAdamW, 2, chunk_bytes=600)
    sd = opt.state_dict()
    for cls in (D.OffloadAdamW, torch.optim.AdamW):
        ps, src = _params(0), _params(0)
        fresh = cls(ps, lr=1e-2, weight_decay=0.1)
        fresh.load_state_dict(copy.deepcopy(sd))       # (a loaded step counter is the source's tensor)
        with torch.no_grad():                 # the weights after two steps, from the run that made the state
            for p, q in zip(ps, opt.param_groups[0]["params"]):
                p.copy_(q)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):                    # replay the generator: step 3's gradients
            grads = [torch.randn(p.shape, generator=g) for p in src]
        for p, gr in zip(ps, grads):
            p.grad = gr
        fresh.step()
        for a, b in zip(ref, ps):
            assert torch.equal(a, b), cls.__name__
        if cls is D.OffloadAdamW:
            assert fresh.state[ps[0]]["exp_avg"].data_ptr() == fresh._m.data_ptr()


SMALL = ["--pair=toy", "--batch-prompts=8", "--rollouts=2", "--lr=1e-3", "--micro-batch=4", "--topk=4",
         "--reward=delta-topk", "--steps=3", "--save-every=2"]


def _state(run):
    return load_file(run / "train" / "delta-topk" / "resume" / "state.safetensors")


@pytest.mark.e2e
def test_03_offloaded_equals_plain_and_resumes(tmp_path):
    """03 itself, FSDP2 on gloo: the offloaded run's metrics, fp32 master weights and AdamW state equal the plain
    run's to the bit (that run also with --sampler-sleep: the sampler rebuilt every step draws the same rollouts);
    killed after step 3 is logged (its last checkpoint step 2) and rerun, it still does."""
    builder.build()
    plain, off, killed = tmp_path / "plain", tmp_path / "off", tmp_path / "killed"
    run_script("03_opd_train.py", *SMALL, f"--run-dir={plain}")
    run_script("03_opd_train.py", *SMALL, f"--run-dir={off}", "--offload-optimizer", "--sampler-sleep")
    p = run_script("03_opd_train.py", *SMALL, f"--run-dir={killed}", "--offload-optimizer", check=False,
                   env={"OPD_KILL_AT": "step-logged:3"})
    assert p.returncode != 0
    run_script("03_opd_train.py", *SMALL, f"--run-dir={killed}", "--offload-optimizer")
    a = _state(plain)
    assert any(k.startswith("optim/") and k.endswith("exp_avg_sq") for k in a)
    for run in (off, killed):
        b = _state(run)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:5]
        assert_same_metrics(read_jsonl(plain / "train/delta-topk/metrics.jsonl"),
                            read_jsonl(run / "train/delta-topk/metrics.jsonl"), rel=0)
