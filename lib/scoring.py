"""Scoring the student's own tokens under a model: the one place the loop, the gates and RAFT touch logits.

A rollout batch is packed right-padded, prompt then response, into `input_ids_BT`. The hidden state at position p
predicts the token at p + 1, so the response token at (b, t) is scored by the hidden state at (b, t − 1). Only those
N response positions are ever projected to the vocabulary: `hidden_NH` → log-probs of K given ids per token, either
through the fused-linear kernel (the logits never exist) or through logits + the fused log-ratio kernel. On CPU the
same functions fall back to their pure-torch references (lib/logratio.py dispatches).

`TokenScorer` wraps a Hugging Face causal LM so that this whole computation is the module's `forward`: under FSDP2 it
is the root module, so its hooks gather the embedding, final norm and lm_head that the projection needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lib import linear_logratio, logratio


@dataclass
class Batch:
    """One micro-batch of sequences (prompt + response), right-padded. N = number of response tokens."""
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    rows_N: torch.Tensor          # batch row of each response token
    cols_N: torch.Tensor          # position of the hidden state that predicts it (token position − 1)
    targets_N: torch.Tensor       # the realized response token ids
    seq_of_N: torch.Tensor        # index (within the micro-batch) of the sequence each token belongs to

    def to(self, device):
        return Batch(*(t.to(device) for t in (self.input_ids_BT, self.attention_mask_BT, self.rows_N, self.cols_N,
                                                self.targets_N, self.seq_of_N)))


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> Batch:
    """Right-pad prompt+response pairs into one batch and index the response tokens."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    T = max(lengths)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), T), dtype=torch.long)
    rows, cols, targets, seq = [], [], [], []
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        mask[b, :len(p) + len(r)] = 1
        rows += [b] * len(r)
        cols += range(len(p) - 1, len(p) + len(r) - 1)
        targets += r
        seq += [b] * len(r)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return Batch(ids, mask, as_long(rows), as_long(cols), as_long(targets), as_long(seq))


class TokenScorer(nn.Module):
    """A causal LM whose forward returns per-response-token log-probs instead of logits.

    forward(batch, ids_NK)        → lp_NK (and entropy_N): log π(ids) at each response position (teachers, ref)
    forward(batch, None, topk=K)  → (lp_N, topk_ids_NK, topk_lp_NK, entropy_N) with grad: the student
    """

    def __init__(self, lm: nn.Module, fused_linear: bool = True):
        super().__init__()
        self.lm = lm
        self.fused_linear = fused_linear
        head = lm.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("TokenScorer assumes an lm_head without bias (true of Qwen2/Llama-style models)")

    def hidden(self, batch: Batch) -> torch.Tensor:
        out = self.lm.model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT, use_cache=False)
        return out.last_hidden_state[batch.rows_N, batch.cols_N]          # (N, H)

    def forward(self, batch: Batch, ids_NK: torch.Tensor | None = None, topk: int = 0):
        hidden_NH = self.hidden(batch)
        weight_VH = self.lm.get_output_embeddings().weight
        if ids_NK is None:   # the student: sampled-token log-probs (+ its own top-K), differentiable
            if self.fused_linear:
                return linear_logratio.linear_student_logprobs(hidden_NH, weight_VH, batch.targets_N, topk)
            return logratio.student_logprobs(hidden_NH @ weight_VH.T, batch.targets_N, topk)
        if self.fused_linear:
            return linear_logratio.linear_token_logprobs(hidden_NH, weight_VH, ids_NK)
        return logratio.token_logprobs(hidden_NH @ weight_VH.T, ids_NK)


@torch.no_grad()
def score_ids(scorer: nn.Module, batch: Batch, ids_NK: torch.Tensor) -> torch.Tensor:
    """log π(ids_NK) under a frozen model (teacher or reference), fp32, shape (N, K)."""
    return scorer(batch, ids_NK)
