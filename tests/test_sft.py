"""lib/train/sft.py: the completion mask (checked by decoding), right-padded collation, the token-mean completion loss
against a per-token reference, the lr schedule, the batch plan, and the training loop (learns, is deterministic)."""
import math
import random

import pytest
import torch

from lib.data import prompt_ids
from lib.toy import task
from lib.train.sft import IGNORE, batch_plan, collate, completion_labels, completion_loss, lr_factor, train_sft


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    corpus = [f"user\n{task.problem_text(*task.sample_problem(rng, 2))}\nassistant\n3+5=8.\nAnswer: 8"
              for _ in range(50)]
    return task.build_tokenizer(corpus)


def tiny_model(tok, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64 * (len(tok) // 64 + 1), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                                        max_position_embeddings=256, tie_word_embeddings=True,
                                        pad_token_id=tok.pad_token_id))


def test_completion_labels_mask_by_decoding(tok):
    first, ops = task.parse_problem("Compute 7+6-4.")
    p = prompt_ids(tok, task.problem_text(first, ops))
    c = task.completion_ids(tok, first, ops, "answer_line")
    ids, labels = completion_labels(p, c)
    assert ids == p + c and len(labels) == len(ids)
    n_masked = sum(1 for y in labels if y == IGNORE)
    assert n_masked == len(p) and labels[:len(p)] == [IGNORE] * len(p)      # exactly the prompt is masked
    assert labels[len(p):] == ids[len(p):]                                    # the completion is learned as is
    prefix = tok.decode(ids[:n_masked])
    supervised = tok.decode([y for y in labels if y != IGNORE])
    assert prefix.endswith("<|im_start|>assistant\n") and "Compute 7+6-4." in prefix
    assert supervised == "7+6=13. 13-4=9.\nAnswer: 9<|im_end|>"               # completion + stop token
    with pytest.raises(ValueError):
        completion_labels(p, [])


def test_collate_right_pads(tok):
    batch = collate([([5, 6, 7], [IGNORE, 6, 7]), ([8, 9], [IGNORE, 9])], pad_id=42)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 42]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7], [IGNORE, 9, IGNORE]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    with pytest.raises(ValueError):
        collate([([1, 2], [IGNORE])], pad_id=0)


def test_completion_loss_matches_per_token_reference():
    torch.manual_seed(0)
    B, T, V = 3, 7, 11
    logits_BTV = torch.randn(B, T, V)
    labels_BT = torch.randint(0, V, (B, T))
    labels_BT[0, :4] = IGNORE
    labels_BT[1, :2] = IGNORE
    labels_BT[2, 5:] = IGNORE
    nll = []
    for b in range(B):                       # position t-1 predicts token t
        for t in range(1, T):
            if labels_BT[b, t] != IGNORE:
                nll.append(-torch.log_softmax(logits_BTV[b, t - 1], -1)[labels_BT[b, t]])
    ref = torch.stack(nll).mean()
    assert torch.allclose(completion_loss(logits_BTV, labels_BT), ref, atol=1e-6)
    # logits at positions that predict a masked token do not matter: no gradient reaches them
    x = logits_BTV.clone().requires_grad_(True)
    completion_loss(x, labels_BT).backward()
    assert x.grad[0, :3].abs().sum() == 0 and x.grad[2, 4:].abs().sum() == 0
    assert x.grad[0, 3].abs().sum() > 0
    with pytest.raises(ValueError):
        completion_loss(logits_BTV, torch.full((B, T), IGNORE))


def test_lr_factor():
    assert lr_factor(0, 100, 10) == pytest.approx(0.1) and lr_factor(9, 100, 10) == pytest.approx(1.0)
    assert lr_factor(10, 100, 10) == pytest.approx(1.0)
    assert lr_factor(55, 100, 10) == pytest.approx(0.5)                      # half way through the decay
    assert lr_factor(99, 100, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    assert lr_factor(55, 100, 10, "linear") == pytest.approx(0.5)
    assert lr_factor(99, 100, 0, "constant") == 1.0
    with pytest.raises(ValueError):
        lr_factor(50, 100, 10, "exp")


def test_batch_plan_covers_each_epoch_once():
    plan = batch_plan(10, 4, 3, seed=1)
    assert [len(b) for b in plan] == [4, 4, 2] * 3
    for e in range(3):
        assert sorted(i for b in plan[3 * e:3 * e + 3] for i in b) == list(range(10))
    assert plan == batch_plan(10, 4, 3, seed=1) and plan != batch_plan(10, 4, 3, seed=2)
    assert plan[:3] != plan[3:6]                                              # reshuffled each epoch


def test_train_sft_learns_completions_and_is_deterministic(tok):
    problems = ["Compute 3+5.", "Compute 9-4+2."]
    examples = [completion_labels(prompt_ids(tok, p),
                                  task.completion_ids(tok, *task.parse_problem(p), "answer_line"))
                for p in problems]
    runs = []
    for _ in range(2):
        model = tiny_model(tok)
        hist = train_sft(model, examples, lr=1e-2, epochs=60, batch_size=2, warmup_frac=0.1, schedule="constant",
                         seed=3, log_every=0)
        runs.append((model, hist))
    (model, hist), (model2, _) = runs
    n_supervised = sum(1 for _, labels in examples for y in labels[1:] if y != IGNORE)
    assert len(hist) == 60 and hist[0]["tokens"] == n_supervised
    assert hist[-1]["loss"] < 0.02 * hist[0]["loss"]
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)                                              # same seed → same weights
    # teacher-forced argmax reproduces every completion token (= greedy decoding would write it)
    batch = collate(examples, tok.pad_token_id)
    with torch.no_grad():
        pred_BT = model(input_ids=batch["input_ids"]).logits[:, :-1].argmax(-1)
    target_BT = batch["labels"][:, 1:]
    assert bool(((pred_BT == target_BT) | (target_BT == IGNORE)).all())
