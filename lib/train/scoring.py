"""Scoring the student's own tokens under a model: the one place the loop, the gates and RAFT touch logits.

A rollout batch is packed right-padded, prompt then response, into `input_ids_BT`. The hidden state at position p
predicts the token at p + 1, so the response token at (b, t) is scored by the hidden state at (b, t − 1). Only those
N response positions are ever projected to the vocabulary: `hidden_NH` → log-probs of K given ids per token, either
through the fused-linear kernel (the logits never exist) or through logits + the fused log-ratio kernel. On CPU the
same functions fall back to their pure-torch references (lib/kernels/logratio.py dispatches).

`TokenScorer` wraps a Hugging Face causal LM so that this whole computation is the module's `forward`: under FSDP2 it
is the root module, so its hooks gather the embedding, final norm and lm_head that the projection needs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn

from lib.kernels import linear_logratio, logratio, varlen


@dataclass
class Batch:
    """One micro-batch of sequences (prompt + response). N = number of response tokens.
    Padded: B rows, right-padded, `attention_mask_BT` marks the real tokens. Packed (lib/kernels/varlen.py): one row of
    every sequence end to end, no mask, `position_ids_BT` restarting at each sequence and `cu_seqlens` its
    boundaries. Packed with shared prompts: each distinct prompt once, followed by the responses drawn from it;
    `cu_seqlens` cuts the row into query segments (a prompt, a response), `kv_index` and `cu_seqlens_k` say which
    keys each segment attends to (lib/kernels/varlen.py's module docstring)."""
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor | None
    rows_N: torch.Tensor          # batch row of each response token
    cols_N: torch.Tensor          # position of the hidden state that predicts it (token position − 1)
    targets_N: torch.Tensor       # the realized response token ids
    seq_of_N: torch.Tensor        # index (within the micro-batch) of the sequence each token belongs to
    position_ids_BT: torch.Tensor | None = None     # packed only
    cu_seqlens: torch.Tensor | None = None          # packed only: [0, L_0, L_0 + L_1, …], int32 (shared: the segments)
    max_len: int = 0                                # packed only: the longest sequence (shared: segment)
    kv_index: torch.Tensor | None = None            # shared prompts only: the rows each segment's keys are read from
    cu_seqlens_k: torch.Tensor | None = None        # shared prompts only: the key segments' boundaries, int32
    max_len_k: int = 0                              # shared prompts only: the longest key segment
    tokens: int = 0                                 # tokens one forward runs, padding not counted (perf/ metrics)

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    def to(self, device):
        return Batch(**{f.name: to_device(v, device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v
                        for f in fields(self)})


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor onto `device`. To CUDA through pinned memory, non-blocking: a plain copy from pageable memory
    waits until the device has finished everything queued before it, which would drain the pipeline once per
    micro-batch. (PyTorch keeps the pinned block alive until the copy is done.)"""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def sampler_gap(sampler_Ns: list[torch.Tensor], scored_Ns: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """rollout/logprob_gap's two sums over micro-batches: Σ |sampler − scored| log-prob, and the number of tokens it
    is over: those with a sampler log-prob (NaN marks a rollout the engine returned none for, as VLLMEngine does with
    `logprob_every` > 1). Device tensors, no host sync."""
    return (sum((s - t).abs().nansum() for s, t in zip(sampler_Ns, scored_Ns, strict=True)),
            sum(s.isfinite().sum() for s in sampler_Ns))


def as_long(x):
    return torch.tensor(x, dtype=torch.long)


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int, packed: bool = False,
         share_prompts: bool = False) -> Batch:
    """Prompt+response pairs as one micro-batch, response tokens indexed: right-padded rows, or (`packed`) one row
    with no padding at all (lib/kernels/varlen.py), or (`share_prompts`, packed) one row in which equal prompts are
    laid out once (pack_shared). The same N response tokens in the same order every way."""
    if share_prompts:
        if not packed:
            raise ValueError("shared prompts need a packed batch: pack(..., packed=True, share_prompts=True)")
        return pack_shared(prompts, responses)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]

    rows, cols, targets, seq = [], [], [], []
    if packed:
        start = 0                                      # where sequence b begins in the one row
        for b, (p, r) in enumerate(zip(prompts, responses)):
            cols += range(start + len(p) - 1, start + len(p) + len(r) - 1)
            targets += r
            seq += [b] * len(r)
            start += len(p) + len(r)
        ids = as_long([t for p, r in zip(prompts, responses) for t in p + r])[None]
        pos = as_long([i for n in lengths for i in range(n)])[None]
        return Batch(ids, None, torch.zeros(len(targets), dtype=torch.long), as_long(cols), as_long(targets),
                     as_long(seq), pos, varlen.cu_seqlens(lengths), max(lengths), tokens=sum(lengths))
    T = max(lengths)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), T), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        mask[b, :len(p) + len(r)] = 1
        rows += [b] * len(r)
        cols += range(len(p) - 1, len(p) + len(r) - 1)
        targets += r
        seq += [b] * len(r)
    return Batch(ids, mask, as_long(rows), as_long(cols), as_long(targets), as_long(seq), tokens=sum(lengths))


def pack_shared(prompts: list[list[int]], responses: list[list[int]]) -> Batch:
    """The packed layout with each distinct prompt forwarded once: for every distinct prompt (in order of first
    appearance) the prompt, then each response drawn from it (in the micro-batch's order). Query segments: the
    prompt, then each response; a prompt segment's keys are its own tokens, a response segment's its prompt's and
    then its own, so every response token attends to exactly what it would in its own row, at the same positions.
    The N response tokens stay in the micro-batch's sequence order (rows_N, cols_N gather them from the row). Equal
    prompts need not be adjacent; a prompt drawn once costs a copy of its keys and nothing else."""
    groups: dict[tuple, list[int]] = {}
    for b, p in enumerate(prompts):
        if not p:
            raise ValueError(f"sequence {b} has an empty prompt: the first response token has no hidden state")
        groups.setdefault(tuple(p), []).append(b)
    ids, pos, seg_q, kv_index, seg_k = [], [], [], [], []
    first_col = {}                     # b → the row index of its response's first token's predictor (prompt's last)
    resp_start = {}                    # b → where its response begins in the row
    for prompt, members in groups.items():
        p0, L = len(ids), len(prompt)
        ids += prompt
        pos += range(L)
        seg_q.append(L)
        kv_index += range(p0, p0 + L)
        seg_k.append(L)
        for b in members:
            r = responses[b]
            first_col[b], resp_start[b] = p0 + L - 1, len(ids)
            if not r:
                continue
            ids += r
            pos += range(L, L + len(r))
            seg_q.append(len(r))
            kv_index += list(range(p0, p0 + L)) + list(range(resp_start[b], resp_start[b] + len(r)))
            seg_k.append(L + len(r))
    cols, targets, seq = [], [], []
    for b, r in enumerate(responses):          # N in the micro-batch's order, as pack() lays it out
        if r:         # its first token is predicted at the prompt's last position, each later one at the token before
            cols += [first_col[b], *range(resp_start[b], resp_start[b] + len(r) - 1)]
        targets += r
        seq += [b] * len(r)
    return Batch(as_long(ids)[None], None, torch.zeros(len(targets), dtype=torch.long), as_long(cols),
                 as_long(targets), as_long(seq), as_long(pos)[None], varlen.cu_seqlens(seg_q), max(seg_q),
                 as_long(kv_index), varlen.cu_seqlens(seg_k), max(seg_k), tokens=len(ids))


GATHER_CHUNK_ELEMS = 1 << 24          # gather_logits upcasts at most this many weight elements at a time


class GatherLogits(torch.autograd.Function):
    """x_NJ[n, j] = hidden_NH[n] · weight_VH[ids_NJ[n, j]] in fp32: the logits of J given ids, without the (N, V) row.

    Backward: grad_hidden[n] = Σ_j g_nj W[ids_nj],  grad_W[v] += Σ_{(n, j): ids_nj = v} g_nj hidden[n]."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, ids_NJ):
        ctx.save_for_backward(hidden_NH, weight_VH, ids_NJ)
        x_NJ = torch.empty(ids_NJ.shape, dtype=torch.float32, device=hidden_NH.device)
        for r in _gather_chunks(*ids_NJ.shape, hidden_NH.shape[1]):
            x_NJ[r] = torch.einsum("nh,njh->nj", hidden_NH[r].float(), weight_VH[ids_NJ[r]].float())
        return x_NJ

    @staticmethod
    def backward(ctx, g_NJ):
        hidden_NH, weight_VH, ids_NJ = ctx.saved_tensors
        H = hidden_NH.shape[1]
        grad_h = torch.empty(hidden_NH.shape, dtype=torch.float32, device=hidden_NH.device)
        # the weight gradient, accumulated in fp32 over all V rows: compacting to the ids scored first (torch.unique)
        # would wait for the device to learn how many there are, a host sync in every backward
        acc_VH = torch.zeros(weight_VH.shape, dtype=torch.float32, device=hidden_NH.device) \
            if ctx.needs_input_grad[1] else None
        for r in _gather_chunks(*ids_NJ.shape, H):
            g = g_NJ[r].float()
            grad_h[r] = torch.einsum("nj,njh->nh", g, weight_VH[ids_NJ[r]].float())
            if acc_VH is not None:
                outer = (g[:, :, None] * hidden_NH[r].float()[:, None]).reshape(-1, H)     # (n·J, H)
                acc_VH.index_add_(0, ids_NJ[r].reshape(-1), outer)
        grad_w = None if acc_VH is None else acc_VH.to(weight_VH.dtype)
        return grad_h.to(hidden_NH.dtype), grad_w, None


def _gather_chunks(N, J, H):
    step = max(1, GATHER_CHUNK_ELEMS // max(J * H, 1))
    return [slice(r, min(r + step, N)) for r in range(0, N, step)]


class TokenScorer(nn.Module):
    """A causal LM whose forward returns per-response-token log-probs instead of logits.

    forward(batch, ids_NK)                      → lp_NK: log π(ids) at each response position (teachers, ref)
    forward(batch, ids_NK, with_entropy=True)   → (lp_NK, entropy_N)
    forward(batch, None, topk=K)                → (lp_N, topk_ids_NK, topk_lp_NK, entropy_N): the student choosing
                                                  its top-K candidates (the scoring pass)
    forward(batch, None, topk_ids_NK=ids)       → the same four, the candidates given (the update pass: it scores
                                                  the ids the scoring pass chose, never re-selects them)
    lp_N and topk_lp_NK carry grad when grad is on; both student modes compute topk_lp_NK by the same code on the
    same shapes, so the update pass reproduces the scoring pass to the bit and the on-policy ratio is exactly 1.

    `temperature` divides the logits (verl scores the student and the reference at the rollout temperature; the
    teachers stay at 1). Given ids are scored as lp(id) = lp(sampled) + x_id − x_sampled: the fused kernels give the
    sampled token's log-prob and the entropy in one pass over V, and `GatherLogits` the J logits of the given ids.
    """

    def __init__(self, lm: nn.Module, fused_linear: bool = True, temperature: float = 1.0, packed: bool = False):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature {temperature} must be > 0 (the logits are divided by it)")
        self.lm = lm
        self.fused_linear = fused_linear
        self.temperature = temperature
        self.packed = packed              # takes packed batches only (its attention is lib/kernels/varlen.py's)
        if packed:
            varlen.use_packing(lm)
        head = lm.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("TokenScorer assumes an lm_head without bias (true of Qwen2/Llama-style models)")

    def hidden(self, batch: Batch) -> torch.Tensor:
        if batch.packed != self.packed:
            raise ValueError(f"a {'packed' if batch.packed else 'padded'} batch given to a scorer built for "
                             f"{'packed' if self.packed else 'padded'} ones: pack(..., packed={self.packed})")
        kw = dict(position_ids=batch.position_ids_BT, cu_seq_lens_q=batch.cu_seqlens, cu_seq_lens_k=batch.cu_seqlens,
                  max_length_q=batch.max_len, max_length_k=batch.max_len) if batch.packed else {}
        if batch.kv_index is not None:          # shared prompts: each segment's keys (lib/kernels/varlen.py)
            kw |= {"cu_seq_lens_k": batch.cu_seqlens_k, "max_length_k": batch.max_len_k,
                   varlen.KV_INDEX: batch.kv_index}
        out = self.lm.model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT, use_cache=False,
                            **kw)
        h = out.last_hidden_state[batch.rows_N, batch.cols_N]          # (N, H)
        return h if self.temperature == 1.0 else h / self.temperature   # logits / T = (h / T) @ W^T

    def _student(self, hidden_NH, weight_VH, targets_N, topk):
        if self.fused_linear:
            return linear_logratio.linear_student_logprobs(hidden_NH, weight_VH, targets_N, topk)
        return logratio.student_logprobs(hidden_NH @ weight_VH.T, targets_N, topk)

    def _given(self, hidden_NH, weight_VH, targets_N, lp_N, ids_NK):
        """lp(ids) = lp(sampled) + x_ids − x_sampled: exact (the log-sum-exp cancels), with grad through both parts."""
        if ids_NK.shape[1] == 0:
            return lp_N.new_zeros(len(lp_N), 0)
        x_NJ = GatherLogits.apply(hidden_NH, weight_VH, torch.cat([targets_N[:, None], ids_NK.long()], 1))
        return lp_N[:, None] + (x_NJ[:, 1:] - x_NJ[:, :1])

    def forward(self, batch: Batch, ids_NK: torch.Tensor | None = None, topk: int = 0, with_entropy: bool = False,
                topk_ids_NK: torch.Tensor | None = None):
        hidden_NH = self.hidden(batch)
        weight_VH = self.lm.get_output_embeddings().weight
        if ids_NK is None:   # the student: its sampled tokens and its top-K candidates, chosen here or given
            lp_N, chosen_NK, _, ent_N = self._student(hidden_NH, weight_VH, batch.targets_N,
                                                      topk if topk_ids_NK is None else 0)
            ids = chosen_NK if topk_ids_NK is None else topk_ids_NK
            return lp_N, ids, self._given(hidden_NH, weight_VH, batch.targets_N, lp_N, ids), ent_N
        if with_entropy:
            lp_N, _, _, ent_N = self._student(hidden_NH, weight_VH, batch.targets_N, 0)
            return self._given(hidden_NH, weight_VH, batch.targets_N, lp_N, ids_NK), ent_N
        if self.fused_linear:
            return linear_logratio.linear_token_logprobs(hidden_NH, weight_VH, ids_NK)
        return logratio.token_logprobs(hidden_NH @ weight_VH.T, ids_NK)


@torch.no_grad()
def score_ids(scorer: nn.Module, batch: Batch, ids_NK: torch.Tensor) -> torch.Tensor:
    """log π(ids_NK) under a frozen model (teacher or reference), fp32, shape (N, K)."""
    return scorer(batch, ids_NK)


def micro_batch_plan(lengths, max_seqs, max_tokens=None, n_micro=None):
    """Which sequences go together: a list of index lists. Without a token budget, groups of max_seqs in sampling
    order. With one, longest first, each group as many sequences as fit rows × longest ≤ max_tokens (a sequence over
    the budget goes alone), so little is spent on padding. n_micro: split the most-padded groups until there are that
    many (every rank must run the same number of forwards: FSDP gathers parameters collectively). The loss is a
    token-mean over the GLOBAL batch, so how sequences are grouped never changes it."""
    n = len(lengths)
    if max_tokens is None:
        plan = [list(range(c, min(c + max_seqs, n))) for c in range(0, n, max_seqs)]
    else:
        plan = []
        for i in sorted(range(n), key=lambda i: (-lengths[i], i)):
            if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= max_tokens:   # plan[-1][0]: its longest
                plan[-1].append(i)
            else:
                plan.append([i])
    while n_micro is not None and len(plan) < n_micro:
        j = max(range(len(plan)), key=lambda j: (len(plan[j]) > 1, len(plan[j]) * max(lengths[i] for i in plan[j])))
        if len(plan[j]) < 2:
            raise ValueError(f"cannot make {n_micro} micro-batches of {n} sequences")
        half = len(plan[j]) // 2
        plan[j:j + 1] = [plan[j][:half], plan[j][half:]]
    return plan


def regroup(parts: list[dict], plan_from: list[list[int]], plan_to: list[list[int]], n_tokens: list[int],
            skip: str | None = None) -> list[dict]:
    """Per-token results of micro-batches grouped by `plan_from`, regrouped as `plan_to` groups the same sequences:
    every tensor value (nested dicts of them too; None stays None; the top-level key `skip` dropped) is concatenated,
    its rows reordered sequence by sequence (`n_tokens[i]` rows for sequence i, in each micro-batch's order) and
    split again. Values are copied, never recomputed: scoring in big micro-batches and updating in small ones sees
    the very same numbers."""
    parts = [{k: v for k, v in p.items() if k != skip} for p in parts]
    if plan_from == plan_to:
        return parts
    start, off = {}, 0
    for idx in plan_from:
        for i in idx:
            start[i], off = off, off + n_tokens[i]
    perm = torch.tensor([t for idx in plan_to for i in idx for t in range(start[i], start[i] + n_tokens[i])],
                        dtype=torch.long)
    sizes, moved = [sum(n_tokens[i] for i in idx) for idx in plan_to], {}

    def split(values):
        if values[0] is None:
            return [None] * len(plan_to)
        if isinstance(values[0], dict):
            cols = {k: split([v[k] for v in values]) for k in values[0]}
            return [{k: cols[k][j] for k in cols} for j in range(len(plan_to))]
        dev = values[0].device
        moved[dev] = moved[dev] if dev in moved else to_device(perm, dev)          # copied once, not per value
        return list(torch.cat(values)[moved[dev]].split(sizes))

    return split(parts)
