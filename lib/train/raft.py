"""RAFT (DESIGN.md §9) as plain functions: rejection sampling bookkeeping, its statistics, and the SFT-side checks.

Stage 1 keeps, per training prompt, the first sample in seed order that is graded correct AND stopped (it ends with
the stop token; a truncated sample never teaches the model to stop). Every other sample gets one rejection reason,
checked in this order:

    truncated            hit the token cap (graded all the same, but never kept)
    grader_timeout       the grader's wall-clock bound fired
    no_answer_extracted  neither an `Answer:` line nor a `\\boxed{}`
    wrong_answer         extracted, verified wrong

Prompts are processed in round-robin chunks: prompt i belongs to chunk i % C (C = 4); chunk 0 is finished first,
then chunk 1, … Each chunk is a 1/C evenly spaced slice of the prompt list, so a partial run is a stratified sample of
the whole (difficulty included, whatever the file's order). Rows are appended to `chunk_<c>.jsonl` one batch at a
time with fsync; a killed run resumes by skipping the prompt ids already on disk (a torn last line is dropped).

Gate G1: at least `g1_min` prompts kept (DESIGN.md §9: 2,000).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np

from lib.artifacts import DamagedJSON, atomic_write_text

REASONS = ("truncated", "grader_timeout", "no_answer_extracted", "wrong_answer")
FRACTIONS = (0.25, 0.50, 0.75, 1.00)           # SFT checkpoints and val loss, as fractions of the optimizer steps


# --- stage 1: which sample is kept ---

def rejection(correct: bool, extractor: str, grade_reason: str | None, finish_reason: str) -> str | None:
    """Why a sample cannot be kept (None: it can): one of REASONS."""
    if finish_reason != "stop":
        return "truncated"
    if correct:
        return None
    if grade_reason == "timeout":
        return "grader_timeout"
    if extractor == "none":
        return "no_answer_extracted"
    return "wrong_answer"


def first_kept(samples: list[dict]) -> int | None:
    """Index of the first keepable sample in seed order (samples carry "seed" and "rejection"), or None."""
    order = sorted(range(len(samples)), key=lambda j: samples[j]["seed"])
    return next((j for j in order if samples[j]["rejection"] is None), None)


# --- stage 1: round-robin chunks, appended and resumable ---

def chunk_of(i: int, n_chunks: int) -> int:
    return i % n_chunks


def read_rows(path: Path) -> list[dict]:
    """Rows of a chunk file; a torn LAST line (a run killed mid-write) is dropped, a corrupt earlier one is an error."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise DamagedJSON(f"{path}:{n} is not valid JSON and is not the last line: the file is corrupt; delete "
                              f"{path.parent} and sample again") from None     # one line in 07, a ValueError here
    return rows


def append_rows(path: Path, rows: list[dict]) -> None:
    """Append rows and fsync: once this returns, a kill loses nothing of them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def rejection_sample(items: list[dict], draw, samples_dir: Path, *, n_chunks: int = 4, batch_prompts: int = 64,
                     log=print, budget=None) -> list[dict]:
    """Run `draw` over every item in round-robin chunk order and return all rows sorted by item index "i".

    items: [{"i": int, "id": str, ...}], "i" = position in the prompt list. draw(batch) → one row per item (same
    order), each with "i" and "id". Rows already in `samples_dir/chunk_<c>.jsonl` are not drawn again.
    budget (lib.runs.Budget, `--time-limit`): before each batch, stop if the next one is predicted not to end in
    time; the rows returned are then fewer than the items, every one of them on disk (a rerun continues)."""
    log = log or (lambda *_: None)
    rows, out_of_time = [], False
    now = budget.clock if budget is not None else time.monotonic
    for c in range(n_chunks):
        if out_of_time:
            rows += read_rows(Path(samples_dir) / f"chunk_{c}.jsonl")
            continue
        path = Path(samples_dir) / f"chunk_{c}.jsonl"
        have = read_rows(path)
        wrong = [r["i"] for r in have if chunk_of(r["i"], n_chunks) != c]
        if wrong:
            raise ValueError(f"{path} holds prompts {wrong[:5]} of another chunk: the chunk count changed; delete "
                             f"{samples_dir} to sample again")
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if text and (not text.endswith("\n") or text.count("\n") != len(have)):
            log(f"[raft] {path.name}: dropping a torn last line left by a killed run")
            atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in have))
        done = {r["id"] for r in have}
        todo = [it for it in items if chunk_of(it["i"], n_chunks) == c and it["id"] not in done]
        if have:
            log(f"[raft] chunk {c}: {len(have)} prompts already sampled, {len(todo)} to go")
        for b in range(0, len(todo), batch_prompts):
            if budget is not None and budget.steps and budget.exhausted():
                out_of_time = True
                break
            batch, t0 = todo[b:b + batch_prompts], now()
            new = draw(batch)
            if [r["id"] for r in new] != [it["id"] for it in batch]:
                raise RuntimeError("draw() must return one row per item, in order")
            t1 = now()
            append_rows(path, new)
            have += new
            if budget is not None:
                budget.step(t1 - t0)
                budget.checkpoint(now() - t1)
        rows += have
    return sorted(rows, key=lambda r: r["i"])


# --- stage 1: statistics ---

def _pct(a: int, b: int) -> float | None:
    return 100.0 * a / b if b else None


def stage1_stats(rows: list[dict], k: int, g1_min: int) -> dict:
    """DESIGN.md §9's numbers: keep rate (overall, by level, by seed), n-correct-of-k histogram, rejection reasons
    (over every sample that could not be kept), truncation, kept-completion lengths, gate G1."""
    samples = [s for r in rows for s in r["samples"]]
    kept = [r for r in rows if r["kept_seed"] is not None]
    by_level: dict[str, list] = {}
    for r in rows:
        by_level.setdefault(str(r.get("level")), []).append(r["kept_seed"] is not None)
    kept_s = [r["samples"][next(j for j, s in enumerate(r["samples"]) if s["seed"] == r["kept_seed"])] for r in kept]
    lengths = np.array([s["n_tokens"] for s in kept_s]) if kept_s else np.zeros(0)
    return {
        "n_prompts": len(rows), "k": k, "n_samples": len(samples), "kept": len(kept),
        "keep_rate_pct": _pct(len(kept), len(rows)),
        "keep_rate_by_level_pct": {lv: _pct(sum(v), len(v)) for lv, v in sorted(by_level.items())},
        "prompts_by_level": {lv: len(v) for lv, v in sorted(by_level.items())},
        "kept_by_seed": {str(s): n for s, n in sorted(Counter(r["kept_seed"] for r in kept).items())},
        "n_correct_of_k": {str(n): sum(r["n_correct"] == n for r in rows) for n in range(k + 1)},
        "sample_accuracy_pct": _pct(sum(s["correct"] for s in samples), len(samples)),
        "pass_at_k_pct": _pct(sum(r["n_correct"] > 0 for r in rows), len(rows)),
        "rejection_reasons": {x: sum(s["rejection"] == x for s in samples) for x in REASONS},
        "truncation_rate_pct": _pct(sum(s["finish_reason"] != "stop" for s in samples), len(samples)),
        "kept_extractors": dict(sorted(Counter(s["extractor"] for s in kept_s).items())),
        "kept_verify_methods": dict(sorted(Counter(s["verify_method"] for s in kept_s).items())),
        "kept_tokens": {"mean": float(lengths.mean()) if len(lengths) else None,
                        "p90": float(np.percentile(lengths, 90)) if len(lengths) else None,
                        "max": int(lengths.max()) if len(lengths) else None},
        "gate_g1": {"pass": len(kept) >= g1_min, "threshold": g1_min, "kept": len(kept)},
    }


# --- stage 2: split, mask check, checkpoint schedule ---

def split(n: int, val_frac: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) indices: a seeded shuffle, the first round(val_frac·n) (at least 1) held out; both sorted."""
    if n < 2:
        raise ValueError(f"a train/val split needs at least 2 kept samples, got {n}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = min(n - 1, max(1, round(val_frac * n)))
    return sorted(order[n_val:]), sorted(order[:n_val])


def check_example(tok, input_ids: list[int], labels: list[int], n_prompt: int, header: str, stop_ids,
                  name: str = "example") -> dict:
    """Verify one SFT example's mask by decoding (DESIGN.md §9): labels are exactly -100 over the prompt and equal the
    input ids over the completion, which ends with a stop token; the masked prefix decodes to text that ends with
    the assistant header. Raises ValueError naming the example; returns the decoded tail and supervised text."""
    ignore = -100
    if labels != [ignore] * n_prompt + input_ids[n_prompt:]:
        raise ValueError(f"{name}: labels are not -100 over the {n_prompt} prompt tokens and the input ids after them")
    if n_prompt >= len(input_ids) or input_ids[-1] not in stop_ids:
        raise ValueError(f"{name}: the completion is empty or does not end with a stop id {sorted(stop_ids)}; RAFT "
                         "keeps only samples that stopped — re-run stage 1")
    prefix = tok.decode(input_ids[:n_prompt])
    if not prefix.endswith(header):
        raise ValueError(f"{name}: the masked prefix decodes to …{prefix[-40:]!r}, which does not end with the "
                         f"assistant header {header!r}: prompt and completion are misaligned")
    return {"prefix_tail": prefix[-64:], "supervised": tok.decode(input_ids[n_prompt:])}


def checkpoint_steps(total_steps: int, fractions=FRACTIONS) -> dict[str, int]:
    """{"025": step, "050": …, "100": total}: the optimizer step at each fraction of training (at least 1)."""
    return {f"{round(100 * f):03d}": max(1, round(f * total_steps)) for f in fractions}


def link_tree(src: Path, dst: Path) -> None:
    """dst = a copy of folder src made of hard links (no extra disk), or a plain copy where links are impossible."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, copy_function=os.link)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


# --- stage 3: the shift sanity and the EOS probe ---

def shift_probe(lp_pre_N, lp_raft_N, last_N) -> dict:
    """Per completion token N: Δ = log p_raft − log p_pre of the realized token. `last_N` marks each completion's
    final token, its stop token. Returns the shift magnitude (mean |Δ| per token, with its spread) and the EOS
    probe: mean log p(stop) at the true end of the completions under π_pre and RAFT."""
    pre, raft = np.asarray(lp_pre_N, float), np.asarray(lp_raft_N, float)
    last = np.asarray(last_N, bool)
    d = raft - pre
    a = np.abs(d)
    return {"shift": {"abs_mean": float(a.mean()), "mean": float(d.mean()), "abs_p50": float(np.median(a)),
                      "abs_p90": float(np.percentile(a, 90)), "abs_max": float(a.max()), "n_tokens": int(d.size),
                      "n_sequences": int(last.sum())},
            "eos_probe": {"pi_pre": float(pre[last].mean()), "raft": float(raft[last].mean()),
                          "delta": float(d[last].mean()), "n": int(last.sum())}}


def token_logprobs(path, seqs, pad_id: int, device, micro_batch: int = 8):
    """log p(realized completion token) under the model folder `path`, fp32, through lib.train.scoring (the loop's and
    the gates' scorer): every completion token of seqs = [(prompt ids, completion ids)], in order, shape (N,)."""
    import torch
    from transformers import AutoModelForCausalLM
    from lib.train.scoring import TokenScorer, pack, score_ids
    scorer = TokenScorer(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval())
    parts = []
    with torch.no_grad():
        for c in range(0, len(seqs), micro_batch):
            batch = pack([p for p, _ in seqs[c:c + micro_batch]], [r for _, r in seqs[c:c + micro_batch]], pad_id)
            parts.append(score_ids(scorer, batch.to(device), batch.targets_N[:, None].to(device))[:, 0].cpu())
    return torch.cat(parts)


def weight_change(pre_dir, raft_dir) -> dict:
    """How far the SFT moved the weights: global L2 norm of the difference, fraction of elements changed, max |Δ|.
    One tensor at a time (fp64 sums), so a 7B checkpoint needs no more than one tensor pair in memory."""
    from safetensors import safe_open

    def where(d):
        return {k: f for f in sorted(Path(d).glob("*.safetensors")) for k in safe_open(f, "pt").keys()}
    a, b = where(pre_dir), where(raft_dir)
    if a.keys() != b.keys():
        raise ValueError(f"{raft_dir} and {pre_dir} hold different tensors ({sorted(a.keys() ^ b.keys())[:5]}): the "
                         "RAFT checkpoint is not structurally π_pre's")
    sq = changed = n = 0
    mx = 0.0
    for k in sorted(a):
        d = safe_open(b[k], "pt").get_tensor(k).double() - safe_open(a[k], "pt").get_tensor(k).double()
        sq, changed, n = sq + float((d ** 2).sum()), changed + int((d != 0).sum()), n + d.numel()
        mx = max(mx, float(d.abs().max()))
    return {"l2": sq ** 0.5, "frac_changed": changed / n, "max_abs": mx, "n_params": n}
