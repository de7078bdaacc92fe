"""lib/train/model_init.py: a model built on the meta device, sharded, then filled from its checkpoint equals, to the bit,
the `from_pretrained(...).to(device)` path it replaced in 03_opd_train — parameters, buffers (the rotary inv_freq
that to_empty leaves as garbage), tied embeddings, log-probs, top-K ids, entropies and gradients — for the toy
models and for tiny random Qwen2s saved to a temp dir (tied and untied, bf16 on disk), in 1 process and in 2 gloo
processes (uneven shards: vocab 101)."""
import json
import sys

import pytest
import torch

from helpers import run_script
from lib.toy import builder

WORKER = "tests/model_init_worker.py"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two tiny random Qwen2 folders: tied fp32, and untied saved in bf16 (loaded as fp32: the student's upcast)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    out = {}
    for name, tie, dtype in (("tied", True, torch.float32), ("untied-bf16", False, torch.bfloat16)):
        torch.manual_seed(1)
        cfg = Qwen2Config(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          tie_word_embeddings=tie, rope_theta=10_000.0)
        path = tmp_path_factory.mktemp(name)
        Qwen2ForCausalLM(cfg).to(dtype).save_pretrained(path)
        out[name] = path
    return out


def specs(tiny):
    builder.build()
    return [f"{builder.model_dir('student')}:float32:student", f"{builder.model_dir('post')}:float32:frozen",
            f"{builder.model_dir('student')}:float32:student-ac", f"{tiny['tied']}:float32:student",
            f"{tiny['untied-bf16']}:float32:student", f"{tiny['untied-bf16']}:bfloat16:frozen"]


def check(p, n_ranks):
    results = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("RESULTS "))[8:])
    assert len(results) == 6 * n_ranks
    for r in results:
        bad = [k for k in ("param_names", "params", "buffers", "tied", "training", "requires_grad",
                           "gathered_after_forward", "push_reshards") if not r[k]]
        bad += [f"outputs[{k}]" for k, ok in r["outputs"].items() if not ok]
        bad += [f"vs unsharded[{k}]" for k, ok in r["outputs_vs_unsharded"].items() if not ok]
        assert not bad, f"{r['spec']} rank {r['rank']}: differs in {bad}"
    assert any(k.startswith("grad/") for k in results[0]["outputs"])      # the student's gradients were compared


def test_meta_build_equals_from_pretrained_one_process(tiny):
    check(run_script(WORKER, *specs(tiny)), 1)


def test_meta_build_equals_from_pretrained_two_gloo_processes(tiny):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    check(run_script(WORKER, *specs(tiny), launcher=launcher), 2)


def test_unknown_non_persistent_buffer_is_refused():
    from torch import nn
    from lib.train.model_init import reinit_buffers
    m = nn.Module()
    m.register_buffer("scale", torch.ones(3), persistent=False)
    with pytest.raises(NotImplementedError, match="scale"):
        reinit_buffers(m, "cpu")
