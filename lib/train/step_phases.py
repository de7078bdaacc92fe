"""How 03_opd_train's step is cut into phases and micro-batches on each device (DESIGN.md §7.4, §7.7).

- `PhaseClock`: the wall time, the peak PyTorch memory and the seconds spent in Python's cyclic garbage collector of
  each phase of a step (sync, gen, score, update, optimizer); on CUDA each phase boundary first waits for the device
  (`torch.cuda.synchronize`), so a phase is charged with its own kernels and not with those still queued from the
  one before. (The GC seconds test one explanation of colocated vLLM's generation varying 4–8 s from step to step:
  vLLM builds Python objects per token, and a full collection walks every object the process holds.)
- `equal_plan`: micro-batches (lib/train/scoring.py's micro_batch_plan) whose count is the same on every rank (FSDP2
  gathers parameters collectively: every rank must run the same number of forwards).
- `micro_batch_arg`, `auto_tokens_per_micro`, `update_token_bytes`, `resolve_micro_batch`: `--micro-batch auto`, the
  update's micro-batch chosen by memory (below). An explicit `--micro-batch N` or `--max-tokens-per-micro` wins.
- `score_limits`: scoring's own micro-batch limits. Scoring is forward-only with no grad, so on CUDA it packs
  SCORE_MICRO_MULT × the update's micro-batch (tokens or sequences); on CPU it uses the update's plan, so the toy's
  numbers stay what they are. `--score-tokens-per-micro` sets a token budget anywhere.
- `resolve_auto`: `--compile auto` and `--packing auto` are on on CUDA, off on CPU (packing: lib/kernels/varlen.py;
  off on CPU keeps the toy campaign's bytes what they were, and its reference attention is slower there).
- `peak_tflops`: the bf16 peak perf/mfu divides by.
- `sampler_slots`: the built-in sampler's slots: on CUDA all of a rank's rollouts at once (B·n/W), on CPU
  `--micro-batch` × 8 as before. On CUDA that is a cap: `sampler_reserve` gives the sampler the memory its KV cache
  must leave to the trainer, and the sampler takes fewer slots where the rest does not hold them all
  (lib/sample/engine.HFEngine's `kv_reserve`). `--sampler-slots` fixes the count instead.
"""
from __future__ import annotations

import gc
import time

import torch

from lib.train import dist as D
from lib.train.scoring import micro_batch_plan

SCORE_MICRO_MULT = 4        # on CUDA, a scoring micro-batch holds this many update micro-batches' worth
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}   # dense bf16, vendor datasheets


def peak_tflops(explicit: float | None, device, cuda: bool) -> float | None:
    """The per-device bf16 peak perf/mfu divides by: --peak-tflops, else by device name on CUDA (None on CPU)."""
    if explicit or not cuda:
        return explicit
    return next((v for k, v in PEAK_TFLOPS.items() if k in torch.cuda.get_device_name(device)), None)


def resolve_auto(value: str, cuda: bool, flag: str = "--compile") -> bool:
    if value not in ("auto", "on", "off"):
        raise ValueError(f"{flag} {value!r}: choose auto, on or off")
    return cuda if value == "auto" else value == "on"


AUTO_SHARE = 0.75           # of the memory left once the trainer's state is counted, given to the update's activations
AUTO_QUANTUM = 1024         # the automatic token budget is a multiple of this many tokens
CPU_MICRO_BATCH = 8         # `--micro-batch auto` off CUDA: the flag's default, so CPU runs keep their bytes


def micro_batch_arg(text: str) -> int | str:
    """argparse `type=` for --micro-batch: a count ≥ 1, or `auto` (the update's micro-batch chosen by memory)."""
    from lib.cli import positive_int
    return "auto" if text == "auto" else positive_int(text)


def update_token_bytes(hidden: int, intermediate: int, layers: int, activation_checkpointing: bool) -> int:
    """An upper estimate of the bytes the update keeps for backward per packed token (bf16 activations):
    a decoder layer saves about 8 hidden-sized rows (norms, q/k/v, attention output, residuals) and 4 MLP-sized ones
    (gate, up, their product, its gradient), 2 bytes each. Without activation checkpointing every layer's are live at
    once; with it, each layer's input (counted at 4 bytes a value) plus one layer's worth twice (its recompute and its
    gradients). At the 1.5B shape this says 2.69 MB a token; bench/RESULTS.md §8 measured 2.07 (the update's peak
    rose 18.7 GiB from 16 to 32 sequences of ≈ 565 tokens a micro-batch)."""
    layer = 2 * (8 * hidden + 4 * intermediate)
    return layers * 4 * hidden + 2 * layer if activation_checkpointing else layers * layer


def auto_tokens_per_micro(free_bytes: int, reserve_bytes: int, token_bytes: int, share: float = AUTO_SHARE,
                          quantum: int = AUTO_QUANTUM) -> int:
    """The update's token budget per micro-batch from memory: `share` of what is free once `reserve_bytes` (what the
    trainer has yet to allocate) is set aside, divided by the bytes a token's activations take, rounded down to a
    multiple of `quantum`, and never under `quantum` (a sequence longer than the budget still forms a micro-batch of
    its own, as with --max-tokens-per-micro)."""
    room = max(0, free_bytes - reserve_bytes)
    return max(quantum, int(share * room) // token_bytes // quantum * quantum)


def balanced_token_budget(lengths: list[int], max_tokens: int) -> int:
    """The smallest token budget ≤ max_tokens that micro_batch_plan splits `lengths` into as few micro-batches as
    max_tokens does. The plan packs longest first into contiguous groups, so its count only falls as the budget grows,
    and this is the least "rows × longest" of the largest group over every plan with that count: the groups come out
    even instead of full ones and a small tail (a micro-batch of 1–3 sequences costs nearly a whole forward and
    backward's weight traffic)."""
    k = len(micro_batch_plan(lengths, 1, max_tokens))
    lo, hi = 1, max_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(micro_batch_plan(lengths, 1, mid)) <= k else (mid + 1, hi)
    return hi


def trainer_pending_bytes(student, optim, offload_optimizer: bool) -> int:
    """Bytes the trainer has yet to allocate for the student: its gradients where they do not exist now, AdamW's two
    moments where they do not exist yet (never on the device with --offload-optimizer), and, on one rank, the bf16
    compute copy FSDP2 keeps gathered through scoring and the update (counted whether or not it exists now)."""
    pending, numel = 0, 0
    for p in student.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        size = local.numel() * local.element_size()
        pending += size * (p.grad is None) + 2 * size * (not optim.state.get(p) and not offload_optimizer)
        numel += p.numel()
    one_rank = not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1
    return pending + (2 * numel if one_rank else 0)


def resolve_micro_batch(args, student, optim, d: D.Dist, cuda: bool, lengths: list[int] | None = None):
    """(max sequences, max tokens or None) of the update's micro-batches. An explicit --micro-batch N (with or
    without --max-tokens-per-micro) is used as given. `auto`: off CUDA CPU_MICRO_BATCH sequences; on CUDA a token
    budget (`auto_tokens_per_micro`) from the device's free memory at this moment (torch.cuda.mem_get_info plus what
    torch's allocator holds unused), less the trainer's pending bytes and SAMPLER_WORKSPACE, at the student's
    `update_token_bytes`, the smallest over ranks; --max-tokens-per-micro, if given, is the budget instead. 03 calls
    it once, at its first step's planning (the sampler's KV cache then exists: generation sized it first), and keeps
    the answer for the run; each step then plans with `balanced_token_budget` under it. Collective on CUDA with
    `auto`."""
    if args.micro_batch != "auto":
        return args.micro_batch, args.max_tokens_per_micro
    if not cuda:
        return CPU_MICRO_BATCH, args.max_tokens_per_micro
    seqs = args.batch_prompts * args.rollouts // d.world
    if args.max_tokens_per_micro is not None:
        return seqs, args.max_tokens_per_micro
    free, _ = torch.cuda.mem_get_info(d.device)
    free += torch.cuda.memory_reserved(d.device) - torch.cuda.memory_allocated(d.device)
    reserve = SAMPLER_WORKSPACE + trainer_pending_bytes(student, optim, args.offload_optimizer)
    cfg = student.lm.config
    per_token = update_token_bytes(cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                                   args.activation_checkpointing)
    tokens = auto_tokens_per_micro(free, reserve, per_token)
    if torch.distributed.is_initialized():                                  # the smallest budget of any rank
        tokens = -int(D.all_max(-tokens, device=d.device)[0])
    if d.main:
        print(f"[03] --micro-batch auto: {tokens} tokens an update micro-batch ({AUTO_SHARE:g} × ({free / 2**30:.1f} "
              f"GiB free − {reserve / 2**30:.1f} reserved) / {per_token / 2**20:.2f} MiB a token)", flush=True)
    return seqs, tokens


def score_limits(args, cuda: bool) -> tuple[int, int | None] | None:
    """(max sequences, max padded tokens) of a scoring micro-batch, or None: the update's plan."""
    if args.score_tokens_per_micro is not None:
        return args.micro_batch, args.score_tokens_per_micro
    if not cuda:
        return None
    if args.max_tokens_per_micro is not None:
        return args.micro_batch, SCORE_MICRO_MULT * args.max_tokens_per_micro
    return SCORE_MICRO_MULT * args.micro_batch, None


def equal_plan(lengths: list[int], max_seqs: int, max_tokens: int | None, device) -> list[list[int]]:
    """micro_batch_plan, split until every rank has as many micro-batches as the rank with the most. Collective."""
    plan = micro_batch_plan(lengths, max_seqs, max_tokens)
    return micro_batch_plan(lengths, max_seqs, max_tokens, n_micro=int(D.all_max(len(plan), device=device)[0]))


def sampler_slots(args, world: int, cuda: bool) -> int:
    return args.batch_prompts * args.rollouts // world if cuda else args.micro_batch * 8


SAMPLER_WORKSPACE = 4 * 2**30   # beside the sampler's cache: its CUDA graphs' pool, compiled kernels' scratch, slack
ACTIVATION_SHARE = 0.2          # of the device's memory: the update's activations, while the cache stays resident.
                                # At the 1.5B shape, --micro-batch 16, the update peaked 27 GiB above generation
                                # (bench/RESULTS.md §8, fourth run): 0.2 of an H200 is 28 GiB


def sampler_reserve(args, student, optim, cuda: bool):
    """The built-in sampler's `kv_reserve` on CUDA (None elsewhere, and with --sampler-slots): a function the sampler
    calls when it sizes its KV cache, at a step's generation. What the cache must leave free then:
    - `--sampler-kv-margin` GiB, if given;
    - with `--sampler-sleep` (the cache is freed before scoring): SAMPLER_WORKSPACE only — everything the trainer
      holds across steps is resident by then, or allocated after the cache is gone;
    - else the cache lives through scoring and the update, so also what the trainer has yet to allocate: the
      student's fp32 gradients and AdamW's two moments where they do not exist yet (the first step; the moments
      not at all with --offload-optimizer), the bf16 compute copy of a student kept gathered on one rank, and
      ACTIVATION_SHARE of the device for the activations."""
    if not cuda or args.sampler_slots:
        return None

    def reserve() -> int:
        if args.sampler_kv_margin is not None:
            return int(args.sampler_kv_margin * 2**30)
        if args.sampler_sleep:
            return SAMPLER_WORKSPACE
        total = torch.cuda.mem_get_info()[1]
        return (SAMPLER_WORKSPACE + trainer_pending_bytes(student, optim, args.offload_optimizer)
                + int(ACTIVATION_SHARE * total))
    return reserve


_gc = {"seconds": 0.0, "since": None}      # seconds inside gc collections since import (the collecting thread's)


def _time_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc["since"] = time.perf_counter()
    elif _gc["since"] is not None:
        _gc["seconds"] += time.perf_counter() - _gc["since"]
        _gc["since"] = None


gc.callbacks.append(_time_gc)


def freeze_heap() -> None:
    """Collect, then gc.freeze() what survived: after a loop's first step that is the models, their compiled graphs
    and the engine, which live to the end. Later collections (the oldest generation's included) stop rescanning
    them. An in-process vLLM engine freezes the heap at its own start, but that is before the first step compiles."""
    gc.collect()
    gc.freeze()


class PhaseClock:
    """`start()` at the top of a step, `mark(name)` at the end of each phase: `seconds[name]`, `peak_gb[name]`
    (None on CPU), `gc_seconds[name]` (inside gc collections) and `total()` since start."""

    def __init__(self, d: D.Dist, cuda: bool):
        self.d, self.cuda = d, cuda
        self.seconds: dict[str, float] = {}
        self.peak_gb: dict[str, float | None] = {}
        self.gc_seconds: dict[str, float] = {}

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.d.device)
        return time.monotonic()

    def start(self) -> None:
        self.seconds, self.peak_gb, self.gc_seconds = {}, {}, {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.d.device)
        self.t0 = self.t = self._now()
        self.gc0 = _gc["seconds"]

    def mark(self, name: str) -> None:
        now = self._now()
        self.seconds[name], self.t = now - self.t, now
        self.peak_gb[name] = D.phase_peak_gb(self.d, self.cuda)
        self.gc_seconds[name], self.gc0 = _gc["seconds"] - self.gc0, _gc["seconds"]

    def total(self) -> float:
        return time.monotonic() - self.t0
