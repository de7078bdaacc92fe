"""Supervised fine-tuning on completions: the toy world's builder and 07_raft.py (SFT of π_pre on its own samples).

An example is a prompt (the rendered chat, generation prompt included) followed by a completion (the response and
its stop token). Only the completion is learned; the loss is the mean negative log-likelihood over the supervised
tokens of a batch:

    L(θ) = -(1/N) Σ_{b,t : y_bt ≠ -100} log p_θ(x_bt | x_b<t),      N = #{(b,t) : y_bt ≠ -100}

with labels y = -100 over the prompt and the padding and y = x over the completion. A causal LM predicts token t
from position t-1, so the logits are shifted one place against the labels. Every token of the batch weighs the same
(token-mean), so a long completion counts for more than a short one, as in the OPD trainer's token-mean loss.

Batches are right-padded: under causal attention a real token never sees a pad that comes after it, and the pads
carry label -100, so padding changes neither the loss nor its gradient.
"""
from __future__ import annotations

import math
import random
import time

import torch
import torch.nn.functional as F

IGNORE = -100  # the label of a position that is not learned (prompt, padding); F.cross_entropy's ignore_index
ADAM_BETAS = (0.9, 0.95)   # AdamW (β1, β2) of every SFT here: the toy world's and RAFT's (07_raft.py)


# --- examples and batches ---

def completion_labels(prompt_ids: list[int], completion_ids: list[int]) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one example: labels are -100 over the prompt and the input ids over the completion.

    `completion_ids` must already end with the stop token (e.g. `<|im_end|>`) if the model is to learn to stop."""
    if not prompt_ids or not completion_ids:
        raise ValueError(f"an SFT example needs a prompt and a completion, got {len(prompt_ids)} prompt and "
                         f"{len(completion_ids)} completion tokens")
    return list(prompt_ids) + list(completion_ids), [IGNORE] * len(prompt_ids) + list(completion_ids)


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad (input_ids, labels) pairs to the longest: input_ids_BT (pad_id on pads), labels_BT (-100 on pads),
    attention_mask_BT (1 on real tokens)."""
    B, T = len(examples), max(len(ids) for ids, _ in examples)
    input_ids_BT = torch.full((B, T), pad_id, dtype=torch.long)
    labels_BT = torch.full((B, T), IGNORE, dtype=torch.long)
    attention_mask_BT = torch.zeros((B, T), dtype=torch.long)
    for b, (ids, labels) in enumerate(examples):
        if len(ids) != len(labels):
            raise ValueError(f"example {b}: {len(ids)} input ids but {len(labels)} labels; "
                             "build it with completion_labels")
        input_ids_BT[b, :len(ids)] = torch.tensor(ids)
        labels_BT[b, :len(ids)] = torch.tensor(labels)
        attention_mask_BT[b, :len(ids)] = 1
    return {"input_ids": input_ids_BT, "labels": labels_BT, "attention_mask": attention_mask_BT}


def completion_loss(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Token-mean NLL of the supervised tokens: position t-1 predicts label t. Computed in fp32."""
    V = logits_BTV.shape[-1]
    logits_NV = logits_BTV[:, :-1].reshape(-1, V).float()   # N = B·(T-1) predicting positions
    targets_N = labels_BT[:, 1:].reshape(-1)
    if not (targets_N != IGNORE).any():
        raise ValueError("a batch without a single supervised token: every label is -100 (empty completions?)")
    return F.cross_entropy(logits_NV, targets_N, ignore_index=IGNORE)


# --- the schedule ---

def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str = "cosine") -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup over `warmup_steps`, then
    `cosine` decay to 0 at the last step, `linear` decay to 0, or `constant`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)   # 0 → 1 over the decay
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    raise ValueError(f"unknown lr schedule {schedule!r}; choose cosine, linear or constant")


def batch_plan(n_examples: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Example indices of every optimizer step: each epoch is a fresh seeded shuffle cut into batches (the last
    batch of an epoch may be smaller)."""
    rng = random.Random(seed)
    plan = []
    for _ in range(epochs):
        order = list(range(n_examples))
        rng.shuffle(order)
        plan += [order[i:i + batch_size] for i in range(0, n_examples, batch_size)]
    return plan


# --- the loop ---

def train_sft(model, examples: list[tuple[list[int], list[int]]], *, lr: float, epochs: int, batch_size: int,
              warmup_frac: float = 0.05, schedule: str = "cosine", seed: int = 0, log_every: int = 50,
              pad_id: int | None = None, weight_decay: float = 0.0, betas: tuple[float, float] = ADAM_BETAS,
              grad_clip: float = 1.0, loss_fn=None, log=print) -> list[dict]:
    """Fine-tune `model` in place on (input_ids, labels) examples with AdamW and the completion loss, or with
    `loss_fn(logits_BTV, batch)` where one is given (batch: collate's tensors; the toy's π_post-nostop is fitted to
    another model's log-probs that way, lib/toy/builder.py).

    Returns one record per optimizer step ({"step", "loss", "lr", "grad_norm", "tokens"}); every `log_every`
    steps (0: never) one line goes to `log`. Deterministic given `seed`, the model's initial weights and the
    number of torch threads."""
    if not examples:
        raise ValueError("train_sft got no examples")
    if pad_id is None:
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    plan = batch_plan(len(examples), batch_size, epochs, seed)
    warmup_steps = int(warmup_frac * len(plan))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    device = next(model.parameters()).device
    model.train()
    history, t0 = [], time.monotonic()
    for step, idx in enumerate(plan):
        for group in opt.param_groups:
            group["lr"] = lr * lr_factor(step, len(plan), warmup_steps, schedule)
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in idx], pad_id).items()}
        logits_BTV = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = completion_loss(logits_BTV, batch["labels"]) if loss_fn is None else loss_fn(logits_BTV, batch)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"sft step {step + 1}: loss {loss.item()} grad norm {grad_norm.item()}; "
                                     f"lower the lr (now {opt.param_groups[0]['lr']:.2e}) or check the examples")
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec = {"step": step + 1, "loss": loss.item(), "lr": opt.param_groups[0]["lr"],
               "grad_norm": grad_norm.item(), "tokens": int((batch["labels"] != IGNORE).sum())}
        history.append(rec)
        if log is not None and log_every and ((step + 1) % log_every == 0 or step + 1 == len(plan)):
            log(f"sft step {step + 1}/{len(plan)} loss {rec['loss']:.4f} lr {rec['lr']:.2e} "
                f"grad_norm {rec['grad_norm']:.3f} ({time.monotonic() - t0:.0f}s)")
    model.eval()
    return history
