"""The SFT loop of 07_raft.py's stage 2 on an FSDP2-sharded model: lib/sft.train_sft's method (the completion-only
token-mean NLL, AdamW with its betas, linear warmup then decay) with the global batch split over the processes.

Every optimizer step takes one batch of `plan` (example indices); each process runs its share in micro-batches, and
the loss is a token-mean over the GLOBAL batch (FSDP averages gradients over the W processes; × W undoes that), so
1 process and W processes take the same step to float tolerance. fp32 master weights, bf16 autocast optional.
"""
from __future__ import annotations

import math
import time

import torch

from lib.train import dist as D
from lib.train.sft import IGNORE, collate, completion_loss, lr_factor


def train(model, optim, examples, train_idx, val_idx, plan, d: D.Dist, *, lr: float, warmup: int, schedule: str,
          grad_clip: float, micro_batch: int, bf16: bool, pad_id: int, saves: dict, save, record, log) -> dict:
    """Run `plan` (one list of example indices per optimizer step). At each step in `saves` (step → checkpoint
    tags): the val loss, then `save(step, val_loss, tags)` (collective). `record(row)` gets each metrics row.
    Returns the val and train curves, the supervised tokens seen and the largest grad norm."""
    total = len(plan)
    autocast = torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=bf16)

    def micro_batches(idx):
        """This rank's share of `idx` in micro-batches. Every rank runs the same number of forwards (FSDP gathers
        are collective): a rank short of examples runs a stand-in with weight 0."""
        mine, per_rank = idx[d.rank::d.world], math.ceil(len(idx) / d.world)
        for c in range(0, max(per_rank, 1), micro_batch):
            part = mine[c:c + micro_batch]
            yield collate([examples[i] for i in (part or idx[:1])], pad_id), float(bool(part))

    def n_supervised(batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE).sum())

    def forward_loss(batch):
        batch = {k: v.to(d.device) for k, v in batch.items()}
        with autocast:
            logits_BTV = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return completion_loss(logits_BTV, batch["labels"])       # token-mean NLL over this micro-batch, fp32

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        nll = tokens = 0.0
        for batch, w in micro_batches(val_idx):
            n = n_supervised(batch) * w
            nll += forward_loss(batch).item() * n
            tokens += n
        model.train()
        nll, tokens = D.all_sum(nll, tokens, device=d.device)
        return nll / tokens

    val_curve, train_curve, tokens_seen, max_gn = [[0, val_loss()]], [], 0, 0.0
    record({"step": 0, "val_loss": val_curve[0][1]})
    log(f"[07] step 0: val loss {val_curve[0][1]:.4f}")
    model.train()
    for step, idx in enumerate(plan, 1):
        ts = time.monotonic()
        lr_now = lr * lr_factor(step - 1, total, warmup, schedule)
        for group in optim.param_groups:
            group["lr"] = lr_now
        mbs = list(micro_batches(idx))
        n_tok, = D.all_sum(sum(n_supervised(b) * w for b, w in mbs), device=d.device)
        nll = 0.0
        for batch, w in mbs:
            n = n_supervised(batch) * w
            loss = forward_loss(batch)
            # token-mean over the GLOBAL batch; FSDP averages gradients over the W ranks, × W undoes that
            (loss * (n / n_tok * d.world)).backward()
            nll += loss.item() * n
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        if math.isfinite(gn):
            optim.step()
        else:
            log(f"[07] step {step}: non-finite grad norm ({gn}); optimizer step skipped")
        optim.zero_grad(set_to_none=True)
        train_loss = D.all_sum(nll, device=d.device)[0] / n_tok
        tokens_seen, max_gn = tokens_seen + int(n_tok), max(max_gn, gn)
        train_curve.append([step, train_loss])
        record({"step": step, "loss": train_loss, "lr": lr_now, "grad_norm": gn, "tokens": int(n_tok),
                "timing_s": time.monotonic() - ts})
        line = (f"[07] step {step}/{total} loss {train_loss:.4f} lr {lr_now:.2e} gn {gn:.3f} "
                f"({time.monotonic() - ts:.1f}s)")
        if step in saves:                              # val loss + merged HF checkpoint at 25/50/75/100 %
            v = val_loss()
            val_curve.append([step, v])
            record({"step": step, "val_loss": v})
            line += f" | val loss {v:.4f} → " + ", ".join(f"ckpt_{t}" for t in saves[step])
            save(step, v, saves[step])
        log(line)
    return {"val_curve": val_curve, "train_curve": train_curve, "tokens_seen": tokens_seen, "max_gn": max_gn}
