"""07_raft.py and lib/train/raft.py: the SFT loss mask (exact labels, checked by decoding, on the toy and the real Qwen2.5
template), which sample is kept and why the others are not, round-robin chunks that resume without duplicates, the
stage-1 statistics, and end to end on the toy world: a resumed sampling run equals an uninterrupted one, the RAFT
checkpoint reloads with from_pretrained, its non-weight files hash-equal π_pre's and a tied lm_head is not written,
the EOS probe / shift sanity equal an independent plain-HF computation, and the SFT learns its kept samples (the toy
RAFT teacher of issue 32 learnt nothing). The toy fixture is the pair toy-raft, whose π_pre is the toy student
(DESIGN.md §9)."""
import random

import numpy as np
import pytest
import torch

from helpers import run_script
from lib import models, registry
from lib.artifacts import read_json, read_jsonl, sha256_file, verify_dir
from lib.data import assistant_header, prompt_ids
from lib.toy import builder, task
from lib.train import raft
from lib.train.sft import IGNORE, collate, completion_labels



# --- the loss mask ---

@pytest.fixture(scope="module")
def toy_tok():
    rng = random.Random(0)
    corpus = [f"user\n{task.problem_text(*task.sample_problem(rng, 2))}\nassistant\n3+5=8.\nAnswer: 8"
              for _ in range(50)]
    return task.build_tokenizer(corpus)


def assert_mask(tok, prompt, completion, completion_text):
    """The mask of completion_labels, checked against the definition and by decoding (independently of check_example)."""
    ids, labels = completion_labels(prompt, completion)
    n = len(prompt)
    assert ids == prompt + completion
    assert labels[:n] == [IGNORE] * n                                   # exactly -100 over the prompt …
    assert labels[n:] == ids[n:] == completion                           # … and the input ids over completion + stop
    assert all(y != IGNORE for y in labels[n:])
    assert tok.decode(ids[:n]).endswith(assistant_header(tok))           # the masked prefix ends with the header
    assert tok.decode(labels[n:]) == completion_text + tok.eos_token      # the supervised span: completion + stop
    check = raft.check_example(tok, ids, labels, n, assistant_header(tok), {tok.eos_token_id})
    assert check["supervised"] == completion_text + tok.eos_token
    # after right-padded collation the labels are unchanged where real and -100 on every pad
    batch = collate([(ids, labels), (ids[:n + 1], labels[:n + 1])], pad_id=tok.pad_token_id)
    assert batch["labels"][0].tolist() == labels
    assert batch["labels"][1].tolist() == labels[:n + 1] + [IGNORE] * (len(ids) - n - 1)
    return ids, labels


def test_loss_mask_toy_template(toy_tok):
    first, ops = task.parse_problem("Compute 7+6-4.")
    prompt = prompt_ids(toy_tok, task.problem_text(first, ops))
    completion = task.completion_ids(toy_tok, first, ops, "answer_line")
    assert_mask(toy_tok, prompt, completion, "7+6=13. 13-4=9.\nAnswer: 9")


def test_loss_mask_real_qwen_template():
    from lib import qwen_tokenizer
    tok = qwen_tokenizer.build("qwen2.5")
    prompt = prompt_ids(tok, "What is $1+1$?")
    assert tok.decode(prompt).startswith("<|im_start|>system\nYou are Qwen")    # the injected system prompt is masked
    text = "We add: $1+1=2$.\nAnswer: 2"
    completion = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert_mask(tok, prompt, completion, text)


def test_check_example_refuses_bad_masks(toy_tok):
    first, ops = task.parse_problem("Compute 2+3.")
    prompt = prompt_ids(toy_tok, task.problem_text(first, ops))
    completion = task.completion_ids(toy_tok, first, ops, "answer_line")
    header, stop = assistant_header(toy_tok), {toy_tok.eos_token_id}
    ids, labels = completion_labels(prompt, completion)
    n = len(prompt)
    with pytest.raises(ValueError, match="labels"):                          # one prompt token left unmasked
        raft.check_example(toy_tok, ids, [IGNORE] * (n - 1) + ids[n - 1:], n, header, stop)
    with pytest.raises(ValueError, match="labels"):                          # the first completion token masked
        raft.check_example(toy_tok, ids, [IGNORE] * (n + 1) + ids[n + 1:], n, header, stop)
    with pytest.raises(ValueError, match="assistant header"):                # prompt/completion boundary misplaced
        raft.check_example(toy_tok, ids, [IGNORE] * (n - 2) + ids[n - 2:], n - 2, header, stop)
    no_stop_ids, no_stop_labels = completion_labels(prompt, completion[:-1])
    with pytest.raises(ValueError, match="stop id"):                          # a truncated completion
        raft.check_example(toy_tok, no_stop_ids, no_stop_labels, n, header, stop)


# --- which sample is kept ---

def test_rejection_reasons_and_first_kept():
    assert raft.rejection(True, "answer_line", None, "stop") is None
    assert raft.rejection(True, "answer_line", None, "length") == "truncated"     # correct but never stopped
    assert raft.rejection(False, "boxed", "timeout", "stop") == "grader_timeout"
    assert raft.rejection(False, "none", "no answer extracted", "stop") == "no_answer_extracted"
    assert raft.rejection(False, "answer_line", "wrong", "stop") == "wrong_answer"
    s = [{"seed": 3, "rejection": None}, {"seed": 1, "rejection": "wrong_answer"}, {"seed": 2, "rejection": None},
         {"seed": 0, "rejection": "truncated"}]
    assert raft.first_kept(s) == 2                                # seed 2: the lowest seed that can be kept
    assert raft.first_kept([{"seed": 0, "rejection": "wrong_answer"}]) is None


# --- round-robin chunks, append + resume ---

class Killed(Exception):
    pass


def fake_draw(calls, kill_after=None):   # kill_after: items drawn before the "kill"
    def draw(batch):
        if kill_after is not None and len(calls) >= kill_after:
            raise Killed
        calls.extend(it["id"] for it in batch)
        return [{"i": it["i"], "id": it["id"], "level": it["level"], "value": it["i"] ** 2} for it in batch]
    return draw


def test_round_robin_chunks_resume_without_duplicates(tmp_path):
    levels = [1] * 10 + [2] * 10 + [3] * 10 + [4] * 10            # a file sorted by difficulty
    items = [{"i": i, "id": f"p{i:02d}", "level": lv} for i, lv in enumerate(levels)]
    full = raft.rejection_sample(items, fake_draw([]), tmp_path / "full", batch_prompts=3, log=None)

    calls = []
    with pytest.raises(Killed):                                   # killed during chunk 1
        raft.rejection_sample(items, fake_draw(calls, kill_after=13), tmp_path / "run", batch_prompts=3, log=None)
    c0 = read_jsonl(tmp_path / "run" / "chunk_0.jsonl")
    assert [r["i"] for r in c0] == list(range(0, 40, 4))           # chunk 0 finished first: prompts i % 4 == 0
    assert sorted({r["level"] for r in c0}) == [1, 2, 3, 4]        # … an evenly spaced, difficulty-stratified slice
    assert len(read_jsonl(tmp_path / "run" / "chunk_1.jsonl")) == 3 and not (tmp_path / "run" / "chunk_2.jsonl").exists()
    with open(tmp_path / "run" / "chunk_1.jsonl", "a") as f:     # a torn line from the kill
        f.write('{"i": 13, "id": "p1')
    done_before = list(calls)
    rows = raft.rejection_sample(items, fake_draw(calls), tmp_path / "run", batch_prompts=3, log=None)
    assert rows == full                                            # resumed = uninterrupted
    assert len(calls) == len(set(calls)) == 40                     # nothing drawn twice
    assert not set(done_before) & set(calls[len(done_before):])
    for c in range(4):
        ids = [r["i"] for r in read_jsonl(tmp_path / "run" / f"chunk_{c}.jsonl")]
        assert ids == list(range(c, 40, 4))                        # each chunk: exactly its prompts, once each
    again = raft.rejection_sample(items, fake_draw(calls), tmp_path / "run", batch_prompts=3, log=None)
    assert again == full and len(calls) == 40                      # a finished run draws nothing


def test_time_limit_stops_between_batches_and_the_rerun_continues(tmp_path):
    from lib.runs import Budget
    items = [{"i": i, "id": f"p{i:02d}", "level": 1} for i in range(20)]
    full = raft.rejection_sample(items, fake_draw([]), tmp_path / "full", batch_prompts=3, log=None)
    clock, calls = [0.0], []

    def slow_draw(batch):                                         # every batch takes 10 (fake) seconds
        clock[0] += 10.0
        return fake_draw(calls)(batch)

    budget = Budget(45.0, t0=0.0, clock=lambda: clock[0])
    rows = raft.rejection_sample(items, slow_draw, tmp_path / "run", batch_prompts=3, log=None, budget=budget)
    # the append takes no fake time, so one more batch stands in for it: a batch is predicted at 10 + 10 s; after 2
    # batches 20 + 20 ≤ 45 goes on, after 3 (t = 30) 30 + 20 > 45 stops, 3 batches on disk: chunk 0 = prompts 0, 4,
    # …, 16 (batches of 3 + 2), then the first batch of chunk 1
    assert calls == ["p00", "p04", "p08", "p12", "p16", "p01", "p05", "p09"]
    assert [r["id"] for r in rows] == sorted(calls)
    rows = raft.rejection_sample(items, fake_draw(calls), tmp_path / "run", batch_prompts=3, log=None)
    assert rows == full and len(calls) == len(set(calls)) == 20      # continued: nothing drawn twice


def test_a_changed_chunk_count_and_a_misordered_draw_are_refused(tmp_path):
    items = [{"i": i, "id": f"p{i:02d}", "level": 1} for i in range(8)]
    raft.rejection_sample(items, fake_draw([]), tmp_path / "four", batch_prompts=3, log=None)
    with pytest.raises(ValueError, match=r"prompts \[4\] of another chunk: the chunk count changed"):
        raft.rejection_sample(items, fake_draw([]), tmp_path / "four", n_chunks=3, batch_prompts=3, log=None)

    def swapped(batch):                       # the right rows, two of them out of order
        rows = fake_draw([])(batch)
        return rows[1:2] + rows[:1] + rows[2:]
    with pytest.raises(RuntimeError, match="one row per item, in order"):
        raft.rejection_sample(items, swapped, tmp_path / "swapped", batch_prompts=3, log=None)


def test_corrupt_middle_line_is_refused(tmp_path):
    p = tmp_path / "chunk_0.jsonl"
    p.write_text('{"i": 0, "id": "a"}\nnot json\n{"i": 4, "id": "b"}\n')
    with pytest.raises(ValueError, match="corrupt"):
        raft.read_rows(p)


# --- stage-1 statistics ---

def row(i, level, rejections):
    samples = [{"seed": s, "rejection": r, "correct": r is None, "finish_reason": "length" if r == "truncated" else "stop",
                "n_tokens": 10 + s, "extractor": "answer_line", "verify_method": "math_verify"}
               for s, r in enumerate(rejections)]
    j = raft.first_kept(samples)
    return {"i": i, "level": level, "samples": samples, "n_correct": sum(x["correct"] for x in samples),
            "kept_seed": None if j is None else samples[j]["seed"]}


def test_stage1_stats_hand_checked():
    W, T, N = "wrong_answer", "truncated", "no_answer_extracted"
    rows = [row(0, 1, [None, None]), row(1, 1, [W, None]), row(2, 2, [W, N]), row(3, 2, [T, W])]
    s = raft.stage1_stats(rows, k=2, g1_min=2)
    assert s["kept"] == 2 and s["keep_rate_pct"] == 50.0
    assert s["keep_rate_by_level_pct"] == {"1": 100.0, "2": 0.0}
    assert s["n_correct_of_k"] == {"0": 2, "1": 1, "2": 1}
    assert s["rejection_reasons"] == {"truncated": 1, "grader_timeout": 0, "no_answer_extracted": 1, "wrong_answer": 3}
    assert s["kept_by_seed"] == {"0": 1, "1": 1}
    assert s["kept_tokens"] == {"mean": 10.5, "p90": pytest.approx(10.9), "max": 11}
    assert s["truncation_rate_pct"] == 12.5 and s["pass_at_k_pct"] == 50.0 and s["sample_accuracy_pct"] == 37.5
    assert s["gate_g1"] == {"pass": True, "threshold": 2, "kept": 2}
    assert not raft.stage1_stats(rows, k=2, g1_min=3)["gate_g1"]["pass"]


def test_split_and_checkpoint_steps():
    tr, va = raft.split(100, 0.05, 42)
    assert len(va) == 5 and sorted(tr + va) == list(range(100)) and tr == sorted(tr)
    assert raft.split(100, 0.05, 42) == (tr, va) and raft.split(100, 0.05, 43) != (tr, va)
    assert raft.split(3, 0.05, 0)[1] != [] and len(raft.split(2, 0.9, 0)[0]) == 1
    assert raft.checkpoint_steps(124) == {"025": 31, "050": 62, "075": 93, "100": 124}
    assert raft.checkpoint_steps(1) == {"025": 1, "050": 1, "075": 1, "100": 1}
    assert raft.checkpoint_steps(7) == {"025": 2, "050": 4, "075": 5, "100": 7}      # 1.75, 3.5, 5.25: rounded


def test_weight_change_by_hand(tmp_path):
    from safetensors.torch import save_file
    pre, post = tmp_path / "pre", tmp_path / "post"
    pre.mkdir(), post.mkdir()
    save_file({"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[0.5, 0.5]])}, pre / "model.safetensors")
    save_file({"a": torch.tensor([1.0, 2.0, 3.0])}, post / "model-00001.safetensors")     # sharded differently
    save_file({"b": torch.tensor([[0.5, -1.5]])}, post / "model-00002.safetensors")
    w = raft.weight_change(pre, post)
    assert w == {"l2": pytest.approx(2.0), "frac_changed": 0.2, "max_abs": 2.0, "n_params": 5}
    save_file({"c": torch.tensor([0.5, 0.5])}, post / "model-00002.safetensors")
    with pytest.raises(ValueError, match="hold different tensors"):
        raft.weight_change(pre, post)


def test_shift_probe_reference():
    pre = np.array([-0.1, -0.2, -0.3, -1.0, -0.05])
    post = np.array([-0.2, -0.2, -0.1, -0.5, -0.01])
    last = np.array([False, False, True, False, True])             # two completions: 3 and 2 tokens
    p = raft.shift_probe(pre, post, last)
    assert p["shift"]["abs_mean"] == pytest.approx((0.1 + 0 + 0.2 + 0.5 + 0.04) / 5)
    assert p["eos_probe"] == pytest.approx({"pi_pre": -0.175, "raft": -0.055, "delta": 0.12, "n": 2})


# --- end to end on the toy world ---

SMALL = ["--pair=toy-raft", "--limit-prompts=24", "--k=2", "--g1-min=5", "--batch-prompts=4", "--batch-size=8",
         "--micro-batch=4", "--epochs=2", "--lr=3e-4", "--anatomy-prompts=8", "--anatomy-bootstrap=200"]


def run07(*args):
    return run_script("07_raft.py", *args)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    builder.build()
    run_dir = tmp_path_factory.mktemp("raft")
    run07(*SMALL, f"--run-dir={run_dir}")
    return run_dir


@pytest.mark.e2e
def test_e2e_stage1_files_and_stats(e2e):
    out = e2e / "raft"
    verify_dir(out)                                                    # every output hashes to its manifest
    rows = sorted((r for c in range(4) for r in raft.read_rows(out / "samples" / f"chunk_{c}.jsonl")),
                  key=lambda r: r["i"])
    assert [r["i"] for r in rows] == list(range(24))
    for c in range(4):
        assert all(r["i"] % 4 == c for r in read_jsonl(out / "samples" / f"chunk_{c}.jsonl"))
    stop_id = builder.world()["tokenizer"]["stop_id"]
    kept = read_jsonl(out / "kept.jsonl")
    for r in rows:                                                     # the kept seed is the first correct + stopped
        ok = [s["seed"] for s in r["samples"] if s["correct"] and s["finish_reason"] == "stop"]
        assert r["kept_seed"] == (min(ok) if ok else None)
    assert [k["id"] for k in kept] == [r["id"] for r in rows if r["kept_seed"] is not None]
    assert all(k["completion_ids"][-1] == stop_id for k in kept)
    stats = read_json(out / "stats.json")
    assert stats["base"] == "toy-student" and stats["k"] == 2 and stats["n_prompts"] == 24
    assert stats["kept"] == len(kept) and stats["gate_g1"] == {"pass": len(kept) >= 5, "threshold": 5, "kept": len(kept)}
    assert sum(stats["n_correct_of_k"].values()) == 24
    assert sum(stats["rejection_reasons"].values()) == 48 - sum(
        s["correct"] and s["finish_reason"] == "stop" for r in rows for s in r["samples"])
    for key in ("keep_rate_by_level_pct", "sft", "shift_abs_dlogp_per_token", "eos_probe", "anatomy"):
        assert key in stats
    assert [s for s, _ in stats["sft"]["val_loss"]] == [0] + sorted(set(stats["sft"]["checkpoints"].values()))


@pytest.mark.e2e
def test_e2e_sampling_resumes_to_the_same_rows(e2e, tmp_path):
    """Kill after some chunks (chunk 2 half done, a torn line, chunk 3 missing) → the resumed run's rows and kept
    samples are byte-identical to the uninterrupted run's (the hf sampler is batch-invariant)."""
    src, out = e2e / "raft", tmp_path / "raft"
    (out / "samples").mkdir(parents=True)
    for c in (0, 1):
        (out / "samples" / f"chunk_{c}.jsonl").write_bytes((src / "samples" / f"chunk_{c}.jsonl").read_bytes())
    half = (src / "samples" / "chunk_2.jsonl").read_text().splitlines(keepends=True)[:3]
    (out / "samples" / "chunk_2.jsonl").write_text("".join(half) + '{"i": 14, "id": "toy-tr')
    (out / "samples" / "config.json").write_bytes((src / "samples" / "config.json").read_bytes())
    p = run07(*SMALL, f"--run-dir={tmp_path}", "--stage=sample")
    assert "torn last line" in p.stdout and "chunk 2: 3 prompts already sampled" in p.stdout
    for c in range(4):
        assert (out / "samples" / f"chunk_{c}.jsonl").read_bytes() == (src / "samples" / f"chunk_{c}.jsonl").read_bytes()
    assert (out / "kept.jsonl").read_bytes() == (src / "kept.jsonl").read_bytes()
    with pytest.raises(AssertionError, match="other settings"):       # a changed config is refused, not mixed in
        run07(*[a for a in SMALL if not a.startswith("--k=")], "--k=3", f"--run-dir={tmp_path}", "--stage=sample")


@pytest.mark.e2e
def test_e2e_time_limit_stops_sampling_and_the_same_command_continues(e2e, tmp_path):
    """--time-limit 1 (the model load alone takes longer): one batch of 4 prompts is sampled and appended, then it
    stops, exit 0, no stage-1 outputs; the same command without the limit finishes byte-identical to one run."""
    src, out = e2e / "raft", tmp_path / "raft"
    p = run07(*SMALL, f"--run-dir={tmp_path}", "--stage=sample", "--time-limit=1")
    assert "stopped for the time budget (--time-limit 1s): 4 of 24 prompts sampled" in p.stdout
    assert not (out / "stage1.json").exists() and not (out / "kept.jsonl").exists()
    assert len(raft.read_rows(out / "samples" / "chunk_0.jsonl")) == 4
    run07(*SMALL, f"--run-dir={tmp_path}", "--stage=sample")
    for c in range(4):
        assert (out / "samples" / f"chunk_{c}.jsonl").read_bytes() == (src / "samples" / f"chunk_{c}.jsonl").read_bytes()
    assert (out / "kept.jsonl").read_bytes() == (src / "kept.jsonl").read_bytes()


@pytest.mark.e2e
def test_e2e_checkpoint_reloads_side_files_identical(e2e):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    out, pre = e2e / "raft", builder.model_dir("student")               # toy-raft's π_pre (DESIGN.md §9)
    assert models.resolve_model("raft", e2e).path == out / "model"
    assert models.model_spec("raft", e2e).eval_max_new_tokens == registry.MODELS["toy-student"].eval_max_new_tokens
    assert not (out / "model" / "checkpoint.json").exists()          # 04_eval must not take it for a training run
    for tag in ("025", "050", "075", "100"):
        ck = out / f"ckpt_{tag}"
        side = [f.name for f in pre.iterdir() if f.is_file() and not f.name.endswith(".safetensors")]
        assert side and all(sha256_file(ck / n) == sha256_file(pre / n) for n in side), tag
        with safe_open(ck / "model.safetensors", "pt") as f:
            keys = set(f.keys())
        with safe_open(pre / "model.safetensors", "pt") as f:
            assert keys == set(f.keys()) and "lm_head.weight" not in keys   # tied: no lm_head written
        assert read_json(ck / models.BASE_FILE)["base"] == "toy-student"
    assert all(sha256_file(out / "model" / f.name) == sha256_file(out / "ckpt_100" / f.name)
               for f in (out / "ckpt_100").iterdir())
    m = AutoModelForCausalLM.from_pretrained(out / "model")
    p = AutoModelForCausalLM.from_pretrained(pre)
    assert m.config.tie_word_embeddings and m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(m.model.embed_tokens.weight, p.model.embed_tokens.weight)   # it did train


@pytest.mark.e2e
def test_e2e_eos_probe_and_shift_match_plain_hf(e2e):
    """Independent reference: a plain HF forward, log_softmax in fp64, on the held-out completions."""
    from transformers import AutoModelForCausalLM
    out = e2e / "raft"
    stats, sft = read_json(out / "stats.json"), read_json(out / "sft.json")
    val = [r for r in read_jsonl(out / "kept.jsonl") if r["id"] in set(sft["val_ids"])]
    assert len(val) == sft["n_val"] >= 1
    lps = {}
    for name, path in (("pi_pre", builder.model_dir("student")), ("raft", out / "model")):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        per = []
        for r in val:
            ids = torch.tensor([r["prompt_ids"] + r["completion_ids"]])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            n = len(r["prompt_ids"])
            per.append(torch.stack([logp[t - 1, ids[0, t]] for t in range(n, ids.shape[1])]))
        lps[name] = per
    eos = {k: float(np.mean([x[-1] for x in v])) for k, v in lps.items()}
    shift = float(torch.cat([(a - b).abs() for a, b in zip(lps["raft"], lps["pi_pre"])]).mean())
    assert stats["eos_probe"]["pi_pre"] == pytest.approx(eos["pi_pre"], abs=1e-5)
    assert stats["eos_probe"]["raft"] == pytest.approx(eos["raft"], abs=1e-5)
    assert stats["shift_abs_dlogp_per_token"] == pytest.approx(shift, rel=1e-3, abs=1e-6)
    assert stats["shift"]["n_tokens"] == sum(len(r["completion_ids"]) for r in val)


def completion_logprobs(path, rows) -> list[torch.Tensor]:
    """Plain HF, fp64 log_softmax: log p of every completion token (stop token included) of each kept row."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    per = []
    for r in rows:
        ids = torch.tensor([r["prompt_ids"] + r["completion_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        n = len(r["prompt_ids"])
        per.append(torch.stack([logp[t - 1, ids[0, t]] for t in range(n, ids.shape[1])]))
    return per


# nats per token. Measured on this fixture (Intel Xeon @ 2.80GHz): +0.027 on the training completions, held-out
# |Δ| 0.063; with the optimizer step removed from lib/train/sft_fsdp.py, 0.000 and 0.000 (the test fails)
LEARNS = 0.01


@pytest.mark.e2e
def test_e2e_sft_learns_its_kept_samples(e2e):
    """Issue 32's toy RAFT teacher learnt nothing (held-out |Δ log p| 3e-6 per token, G2 +0.05 pp): its kept samples
    were π_pre's own near-certain text, so the SFT had nothing to fit. Here the SFT must raise the log-likelihood of
    the kept completions it trained on by more than LEARNS nats per token and move the held-out ones by more than
    LEARNS / 10, measured by a plain HF forward (not by 07's probe). It fails with the update broken (tried: no
    optimizer step) and would with a kept set the base model already writes at p ≈ 1 (toy π_pre's, whose SFT loss
    started at 0.002 nats per token)."""
    out = e2e / "raft"
    val_ids = set(read_json(out / "sft.json")["val_ids"])
    kept = read_jsonl(out / "kept.jsonl")
    pre, post = completion_logprobs(builder.model_dir("student"), kept), completion_logprobs(out / "model", kept)
    train = torch.cat([b - a for a, b, r in zip(pre, post, kept) if r["id"] not in val_ids])
    held = torch.cat([(b - a).abs() for a, b, r in zip(pre, post, kept) if r["id"] in val_ids])
    assert float(train.mean()) > LEARNS, f"the SFT raised its training completions by {float(train.mean()):.2e} nats"
    assert float(held.mean()) > LEARNS / 10, f"held-out |Δ log p| {float(held.mean()):.2e} nats per token"


@pytest.mark.e2e
@pytest.mark.slow
def test_e2e_sft_two_gloo_processes_match_one(e2e, tmp_path):
    """The SFT's global-batch token mean under FSDP2: 2 gloo processes (uneven shares, stand-in micro-batches) train
    the same weights as 1 process, in fp32 compute."""
    import shutil
    from safetensors.torch import load_file
    runs = {}
    for name, extra in (("one", []), ("two", ["--nproc=2"])):
        out = tmp_path / name / "raft"
        shutil.copytree(e2e / "raft", out, ignore=shutil.ignore_patterns("sft.json", "ckpt_*", "model", "probe.json",
                                                                          "anatomy", "sft_metrics.jsonl"))
        run07(*SMALL, f"--run-dir={tmp_path / name}", "--stage=sft", "--no-bf16", "--batch-size=5", "--micro-batch=2",
              *extra)
        runs[name] = load_file(out / "model" / "model.safetensors")
        assert read_json(out / "sft.json")["world_size"] == (2 if extra else 1)
    worst = max((runs["one"][k] - runs["two"][k]).abs().max().item() for k in runs["one"])
    assert worst < 1e-5, f"1 vs 2 processes: weights differ by {worst}"
    a, b = (read_jsonl(tmp_path / n / "raft" / "sft_metrics.jsonl") for n in ("one", "two"))
    assert [r.get("loss", r.get("val_loss")) for r in a] == pytest.approx([r.get("loss", r.get("val_loss")) for r in b],
                                                                          rel=1e-5)
