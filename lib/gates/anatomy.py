"""Shift anatomy (DESIGN.md §8.5): what a teacher pair's reward looks like on the student's OWN samples, before
training.

The student samples one completion per prompt at the rollout settings; π_pre, π_post and the student score the
sampled ids (lib.train.scoring, the training loop's code). Per response token t of sequence s, with y_t the sampled id
and x_1..x_K the student's top-K candidates (K = 16, the delta-topk reward of DESIGN.md §7.2):

    Δ_t      = log π_post(y_t) − log π_pre(y_t)                             (delta-sampled reward)
    W_t      = Σ_k w_k (log π_post(x_k) − log π_pre(x_k)),  w = softmax_k log π_student(x_k)
                                                                             (delta-topk's weighted_reward_mean)
Reported, pooled over all tokens: token-mean Δ, student-weighted mean W, % tokens with Δ > 0, mean |Δ| (the shift
magnitude); mean Δ at the terminal stop token of samples that stopped; each model's mean log p(stop) at genuine
answer ends (the stop token of samples that stopped after an extractable answer: where the student chose to end);
and the length-controlled AUROC of the sequence-mean Δ̄_s = mean_t Δ_t for correctness.

The AUROC's length control (strata, Mann–Whitney pooled over within-bin pairs, bootstrap CI) is lib/gates/auroc.py.

Source-report orientation (per token, on 2,960 frozen student rollouts): OpenThinker3 pair 34 % of tokens > 0 and
terminal EOS Δ −90; RAFT pair 84.7 % and −0.006; RL pair 58 % and −6.3; |Δ| ≈ 2.7 (corpus pairs) vs 0.099 (RAFT).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from lib import models
from lib.artifacts import atomic_write_jsonl, read_jsonl, sha256_file
from lib.data import evenly_spaced, prompt_ids, stable_seed
from lib.gates import checks
from lib.gates.auroc import auroc_report
from lib.train import opd

MODELS = ("student", "pi_pre", "pi_post")


@dataclass
class Settings:
    """Every knob of the anatomy, declared once: 01_gates' flags take their defaults from here, 07_raft overrides a
    few."""
    max_prompt_len: int                # caps: the student's (DESIGN.md §4)
    max_response_len: int
    prompts: int = 64                  # evenly spaced training prompts the student samples
    samples: int = 1                   # samples per prompt
    temperature: float = 1.0           # the training rollouts' sampling settings
    top_p: float = 1.0
    topk: int = 16                     # K of the student-weighted (delta-topk) mean
    min_stop_delta: float = -10.0      # FAIL thresholds of anatomy_gate
    min_abs_delta: float = 0.01
    min_pos_frac: float = 0.40         # ... of the tokens where |Δ| ≥ tie_tol (a smaller |Δ| is a tie: no opinion)
    auroc_bins: int = 4                # length-quantile bins of the length-controlled AUROC
    bootstrap: int = 10_000            # resamples of its CI (rng seed 42)
    backend: str = "hf"                # sampling engine: hf | vllm (lib/sample/engine.py)
    scoring: str = "fused-linear"      # TokenScorer projection: fused-linear | logits
    micro_batch: int = 8               # sequences per scoring forward
    tie_tol: float = 1e-3
    seed: int = 42                     # sampling seeds: stable_seed(seed, "anatomy", id, j)


# --- the summary ---

def _mean(xs) -> float | None:
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()) if xs.size else None


def summarise(seqs: list[dict], n_bins: int = 4, n_resamples: int = 10_000, tie_tol: float = 1e-3) -> dict:
    """seqs: one dict per sampled sequence with
        delta      (T,) Δ_t on the sampled ids          weighted   (T,) W_t
        stopped    bool: the last token is the stop     answer_end bool: stopped right after an extractable answer
        lp_stop    {model: log p(stop)} at the last token when stopped, else None
        correct    bool | None (None: no gold answer)   n_tokens   int (stop token included)"""
    delta = np.concatenate([np.asarray(s["delta"], float) for s in seqs]) if seqs else np.zeros(0)
    weighted = np.concatenate([np.asarray(s["weighted"], float) for s in seqs]) if seqs else np.zeros(0)
    stop_delta = [s["delta"][-1] for s in seqs if s["stopped"]]
    interior = np.concatenate([np.asarray(s["delta"][:-1] if s["stopped"] else s["delta"], float) for s in seqs]) \
        if seqs else np.zeros(0)
    ends = [s for s in seqs if s["stopped"] and s["answer_end"]]
    out = {
        "n_sequences": len(seqs), "n_tokens": int(delta.size),
        "token_mean_delta": _mean(delta), "student_weighted_mean": _mean(weighted),
        "pos_frac": _mean(delta > 0), "abs_mean_delta": _mean(np.abs(delta)), "tie_tol": tie_tol,
        "tie_frac": _mean(np.abs(delta) < tie_tol), "pos_frac_decided": _mean(delta[np.abs(delta) >= tie_tol] > 0),
        "interior_mean_delta": _mean(interior), "non_finite_tokens": int((~np.isfinite(delta)).sum()),
        "stop": {"n": len(stop_delta), "mean_delta": _mean(stop_delta), "pos_frac": _mean(np.asarray(stop_delta) > 0)},
        "logp_stop_at_answer_end": {"n": len(ends), **{m: _mean([s["lp_stop"][m] for s in ends]) for m in MODELS}},
        "stop_rate": _mean([s["stopped"] for s in seqs]), "mean_tokens": _mean([s["n_tokens"] for s in seqs]),
    }
    graded = [s for s in seqs if s["correct"] is not None]
    return {**out,
            "accuracy": _mean([s["correct"] for s in graded]),
            "auroc": auroc_report(graded, n_bins, n_resamples)}


# --- the gate ---

def anatomy_gate(stats: dict, min_stop_delta: float, min_abs_delta: float, min_pos_frac: float) -> list[str]:
    """Reasons to fail (empty = PASS): an anti-EOS shift, a shift too small to carry anything, a shift that
    penalises most of the student's own tokens, or non-finite rewards."""
    reasons = []
    lp = stats["logp_stop_at_answer_end"]

    def fmt(x):
        return "n/a" if x is None else f"{x:+.3f}"

    if stats["non_finite_tokens"]:
        reasons.append(f"{stats['non_finite_tokens']} tokens have a non-finite Δ: a teacher assigns −inf to the "
                       "student's tokens (a vocabulary or masking problem) — the reward is unusable")
    if stats["stop"]["n"] == 0:
        reasons.append(f"none of the {stats['n_sequences']} samples stopped within the response cap, so Δ at the stop "
                       "token cannot be measured: check the student's stop ids or raise the response cap (01_gates.py "
                       "--max-response-len)")
    elif stats["stop"]["mean_delta"] < min_stop_delta:
        reasons.append(f"mean Δ at the terminal stop token is {stats['stop']['mean_delta']:+.3f} nats over "
                       f"{stats['stop']['n']} stops (< {min_stop_delta}): at genuine answer ends π_post puts "
                       f"log p(stop) {fmt(lp['pi_post'])} vs π_pre {fmt(lp['pi_pre'])} (student "
                       f"{fmt(lp['student'])}) — π_post is off support at the stop token, so Direct-OPD would teach "
                       "the student not to stop (termination collapse, DESIGN.md §1). Use another pair, --eos-policy "
                       "neutral|clamp, or --allow anatomy")
    if stats["abs_mean_delta"] is not None and stats["abs_mean_delta"] < min_abs_delta:
        reasons.append(f"shift magnitude mean |Δ| = {stats['abs_mean_delta']:.4f} nats/token (< {min_abs_delta}): "
                       "π_pre and π_post barely differ on the student's samples; there is nothing to transfer")
    if (pos := stats.get("pos_frac_decided", stats["pos_frac"])) is not None and pos < min_pos_frac:
        reasons.append(f"only {100 * pos:.1f} % of the student's tokens where the pair has an opinion (|Δ| ≥ "
                       f"{stats.get('tie_tol', 0)}) have Δ > 0 (< {100 * min_pos_frac:.0f} %): the pair mostly says "
                       "'stop being yourself' (the source report's corpus-SFT pairs: 23–34 %, vs RL 58 %, RAFT 84.7 %)")
    if not all(math.isfinite(v) for v in (stats["token_mean_delta"] or 0.0, stats["abs_mean_delta"] or 0.0)):
        reasons.append("token-mean Δ is not finite")
    return reasons


# --- the driver: models, sampling, scoring, the report ---

def load_roles(pair, student_name, run_dir) -> dict:
    """{role: dict(alias, resolved, tok, config, kw)} for student, π_pre, π_post."""
    from transformers import AutoTokenizer
    aliases = {"student": models.student_spec(student_name).model, "pi_pre": pair.pi_pre, "pi_post": pair.pi_post}
    roles, resolved = {}, models.resolve_roles(aliases, run_dir, "the pair")
    for role, alias in aliases.items():
        res = resolved[role]
        cfg = json.loads((res.path / "config.json").read_text())
        spec = models.model_spec(alias, run_dir)
        kw = {"enable_thinking": True} if spec.thinking else {}
        roles[role] = dict(alias=alias, resolved=res, tok=AutoTokenizer.from_pretrained(res.path), config=cfg, kw=kw,
                           spec=spec)
    return roles


def load_lm(path, device):
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def sample_student(m, prompts, seeds, cfg, device):
    """The student's completions at the training rollout settings, through lib/sampling (hf or vllm)."""
    from lib.sample.engine import load_engine, sample
    if cfg.backend == "vllm":
        engine = load_engine("vllm", str(m["resolved"].path), m["tok"],
                             max_model_len=cfg.max_prompt_len + cfg.max_response_len,
                             dtype="bfloat16" if device.type == "cuda" else "float32")
    else:
        engine = load_engine("hf", m["resolved"].path, m["tok"], batch_size=max(64, cfg.micro_batch), device=device,
                             dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    outs = sample(engine, prompts, seeds, temperature=cfg.temperature, top_p=cfg.top_p,
                  max_new_tokens=cfg.max_response_len, progress="anatomy: sampling the student")
    del engine
    return outs


@torch.no_grad()
def score_all(roles, prompts, outs, cfg, device) -> dict:
    """lib/train/scoring.py over every micro-batch, one model in memory at a time. Returns per-token tensors
    (N_total, ·): student lp (N,), top-K log-probs (N, K); each teacher's log-probs of [sampled id, top-K ids]
    (N, 1+K); "ids", those ids (N, 1+K)."""
    from lib.train.scoring import TokenScorer, pack, score_ids
    tok = roles["student"]["tok"]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    mb = cfg.micro_batch
    batches = [(prompts[c:c + mb], [o.token_ids for o in outs[c:c + mb]]) for c in range(0, len(outs), mb)]
    got, ids_NK = {}, []
    for role in MODELS:                                   # the student first: its top-K ids are what teachers score
        scorer = TokenScorer(load_lm(roles[role]["resolved"].path, device), fused_linear=cfg.scoring == "fused-linear")
        parts = []
        for j, (p, r) in enumerate(batches):
            batch = pack(p, r, pad_id).to(device)
            if role == "student":
                lp_N, topk_ids_NK, topk_lp_NK, _ = scorer(batch, None, topk=cfg.topk)
                ids_NK.append(torch.cat([batch.targets_N[:, None], topk_ids_NK], 1))      # (N, 1+K)
                parts.append((lp_N.float().cpu(), topk_lp_NK.float().cpu()))
            else:
                parts.append(score_ids(scorer, batch, ids_NK[j]).float().cpu())         # (N, 1+K)
        got[role] = (torch.cat([x[0] for x in parts]), torch.cat([x[1] for x in parts])) if role == "student" \
            else torch.cat(parts)
        del scorer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    got["ids"] = torch.cat(ids_NK).cpu()
    return got


def run(roles, train_rows, cfg: Settings, out_dir, pair_name: str) -> dict:
    """Sample the student on an evenly spaced prompt subset, grade, score under all three models, summarise.
    roles: load_roles(); writes out_dir/anatomy_samples.jsonl; returns the gate report (a lib.gates.checks.verdict) with
    its markdown table under "table"."""
    from lib.eval import grading
    m = roles["student"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    subset = evenly_spaced(train_rows, cfg.prompts)
    ids_P = {r["id"]: prompt_ids(m["tok"], r["problem"], **m["kw"]) for r in subset}
    over = [r["id"] for r in subset if len(ids_P[r["id"]]) > cfg.max_prompt_len]
    subset = [r for r in subset if r["id"] not in over]   # the prompt_length gate names them; training refuses them
    reqs = [(r, j) for r in subset for j in range(cfg.samples)]
    if not reqs:
        return checks.verdict([f"no anatomy prompts: {len(over)} of the subset are over the prompt cap and "
                              f"--anatomy-prompts is {cfg.prompts}"], summary="nothing sampled")
    prompts = [ids_P[r["id"]] for r, _ in reqs]
    seeds = [stable_seed(cfg.seed, "anatomy", r["id"], j) for r, j in reqs]
    t0 = time.monotonic()
    outs = sample_student(m, prompts, seeds, cfg, device)
    t_sample = time.monotonic() - t0
    extractors = [grading.extract_answer(o.text)[1] for o in outs]
    golds = [r.get("answer") for r, _ in reqs]
    graded = [i for i, g in enumerate(golds) if g is not None]
    grades = dict(zip(graded, grading.grade_many([(outs[i].text, golds[i]) for i in graded],
                                                 progress="anatomy: grading")))
    t0 = time.monotonic()
    s = score_all(roles, prompts, outs, cfg, device)
    t_score = time.monotonic() - t0

    lp_student_N, topk_lp_NK = s["student"]
    post_NK, pre_NK = s["pi_post"], s["pi_pre"]
    delta_N = opd.delta_sampled_reward(post_NK[:, 0], pre_NK[:, 0])                               # (N,)
    weighted_N = opd.delta_topk_advantage(topk_lp_NK, post_NK[:, 1:], pre_NK[:, 1:]).sum(-1)      # (N,)
    sampler_N = torch.tensor([x for o in outs for x in o.logprobs])
    seqs, rows_out, start = [], [], 0
    for i, ((r, j), o) in enumerate(zip(reqs, outs)):
        sl = slice(start, start + len(o.token_ids))
        start = sl.stop
        stopped = o.finish_reason == "stop"
        last = sl.stop - 1
        lp_stop = {"student": float(lp_student_N[last]), "pi_pre": float(pre_NK[last, 0]),
                   "pi_post": float(post_NK[last, 0])} if stopped else None
        correct = bool(grades[i].correct) if i in grades else None
        seqs.append(dict(delta=delta_N[sl].numpy(), weighted=weighted_N[sl].numpy(), stopped=stopped,
                         answer_end=stopped and extractors[i] != "none", lp_stop=lp_stop, correct=correct,
                         n_tokens=len(o.token_ids)))
        rows_out.append({"problem_id": r["id"], "seed": seeds[i], "sample": j, "n_tokens": len(o.token_ids),
                         "finish_reason": o.finish_reason, "extractor": extractors[i], "correct": correct,
                         "level": r.get("level"), "seq_mean_delta": float(delta_N[sl].mean()),
                         "seq_mean_weighted": float(weighted_N[sl].mean()),
                         "delta_at_stop": float(delta_N[last]) if stopped else None, "lp_stop": lp_stop,
                         "completion": o.text})
    atomic_write_jsonl(out_dir / "anatomy_samples.jsonl", rows_out)
    stats = summarise(seqs, cfg.auroc_bins, cfg.bootstrap, cfg.tie_tol)
    stats["sampler_logprob_gap"] = float((sampler_N - lp_student_N).abs().mean())   # sampler vs scorer, same tokens
    reasons = anatomy_gate(stats, cfg.min_stop_delta, cfg.min_abs_delta, cfg.min_pos_frac)
    warnings = [f"{len(over)} subset prompts over the prompt cap were left out: {over}"] if over else []
    if stats["sampler_logprob_gap"] > 0.05:
        warnings.append(f"sampler and scorer disagree by {stats['sampler_logprob_gap']:.3f} nats/token on the same "
                        "tokens: check dtype or the sampling engine")
    rep = checks.verdict(reasons, warnings, **stats, pair=pair_name, models={k: v["alias"] for k, v in roles.items()},
                        settings={"prompts": len(subset), "samples_per_prompt": cfg.samples,
                                  "temperature": cfg.temperature, "top_p": cfg.top_p,
                                  "max_new_tokens": cfg.max_response_len, "topk": cfg.topk, "backend": cfg.backend,
                                  "scoring": cfg.scoring, "seed": cfg.seed, "device": device.type},
                        thresholds={"min_stop_delta": cfg.min_stop_delta, "min_abs_delta": cfg.min_abs_delta,
                                    "min_pos_frac": cfg.min_pos_frac, "tie_tol": cfg.tie_tol},
                        timing_s={"sample": round(t_sample, 2), "score": round(t_score, 2)},
                        samples_file="anatomy_samples.jsonl")
    rep["table"] = anatomy_table(rep)
    rep["summary"] = (f"Δ̄ {stats['token_mean_delta']:+.3f}, |Δ| {stats['abs_mean_delta']:.3f}, "
                      f"{_f(stats['pos_frac_decided'], '.1f', 100)} % > 0 (|Δ| ≥ {cfg.tie_tol}), Δ@stop "
                      + ("n/a" if stats["stop"]["mean_delta"] is None else f"{stats['stop']['mean_delta']:+.2f}"))
    return rep


def _f(x, spec="+.3f", scale=1):
    return "n/a" if x is None else format(scale * x, spec)


def anatomy_table(rep: dict) -> str:
    """The anatomy as a markdown table (printed and written to anatomy.md)."""
    a, lp, st = rep["auroc"], rep["logp_stop_at_answer_end"], rep["stop"]
    ci = a.get("ci95")
    auc = _f(a.get("length_controlled"), ".3f") + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") \
        + ("" if a.get("length_controlled") is not None else f" ({a.get('why')})")
    lines = [
        f"| shift anatomy: {rep['pair']} ({rep['models']['pi_post']} − {rep['models']['pi_pre']}) on "
        f"{rep['models']['student']} | value |", "|---|---|",
        f"| sequences / tokens | {rep['n_sequences']} / {rep['n_tokens']} |",
        f"| token-mean Δ (nats) | {_f(rep['token_mean_delta'])} |",
        f"| student-weighted mean Σ_k w_k Δ(x_k), K={rep['settings']['topk']} "
        f"| {_f(rep['student_weighted_mean'])} |",
        f"| % tokens with Δ > 0: all / where \\|Δ\\| ≥ {rep.get('tie_tol')} "
        f"(ties {_f(rep.get('tie_frac'), '.1f', 100)} %) "
        f"| {_f(rep['pos_frac'], '.1f', 100)} / {_f(rep.get('pos_frac_decided'), '.1f', 100)} |",
        f"| mean abs Δ (shift magnitude) | {_f(rep['abs_mean_delta'], '.4f')} |",
        f"| interior-token mean Δ | {_f(rep['interior_mean_delta'])} |",
        f"| Δ at terminal stop (n = {st['n']}) | {_f(st['mean_delta'])} |",
        f"| log p(stop) at answer ends (n = {lp['n']}): student / π_pre / π_post | "
        f"{_f(lp['student'])} / {_f(lp['pi_pre'])} / {_f(lp['pi_post'])} |",
        f"| accuracy / stop rate / mean tokens | {_f(rep['accuracy'], '.3f')} / {_f(rep['stop_rate'], '.3f')} / "
        f"{_f(rep['mean_tokens'], '.1f')} |",
        f"| AUROC of sequence-mean Δ for correctness, length-controlled [95 % CI] | {auc} |",
        f"| AUROC raw (no length control) | {_f(a.get('raw'), '.3f')} |",
        f"| sampler vs scorer log-prob gap | {_f(rep['sampler_logprob_gap'], '.2e')} |",
    ]
    return "\n".join(lines)


# --- the cross-pair anatomy (source §17): every pair scored on ONE frozen set of the student's rollouts ---
#
# The source scored the same 2,960 frozen student rollouts under five pairs, changing nothing but which pair is
# subtracted; that is what makes its columns comparable. Here the student samples the anatomy's prompt subset once;
# the rollouts (prompt ids, sampled ids, text, grade) are written to CROSS_ROLLOUTS and its sha256 recorded. A later
# run (a pair added, the RAFT teacher built since) reads that file back instead of sampling again, as long as the
# student and the sampling settings are the ones it was drawn with. Every distinct model of the pairs then scores the
# sampled ids once, with the training loop's scorer (lib/train/scoring.py), on the sampled token only (no top-K: the
# table's measures are all of the sampled token); the per-token log-probs go to CROSS_LOGPROBS, so every number of
# the table can be recomputed from the two files. Per pair, Δ_t = log π_post(y_t) − log π_pre(y_t), summarised as
# the gate above summarises it (`summarise`), the stop-token log-probs taken of the pair's own π_pre and π_post.

CROSS_ROLLOUTS = "anatomy_cross_samples.jsonl"
CROSS_LOGPROBS = "anatomy_cross_logprobs.jsonl"
CROSS_MEASURES = ("n_sequences", "n_tokens", "token_mean_delta", "pos_frac", "pos_frac_decided", "tie_tol",
                  "abs_mean_delta", "interior_mean_delta", "stop", "logp_stop_at_answer_end", "accuracy", "stop_rate",
                  "mean_tokens", "auroc")


def rollout_settings(cfg: Settings, student_alias: str) -> dict:
    """What decides the frozen rollouts: a stored file is reused only under exactly these."""
    return {"student": student_alias, "prompts": cfg.prompts, "samples": cfg.samples, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "max_prompt_len": cfg.max_prompt_len, "max_new_tokens": cfg.max_response_len,
            "seed": cfg.seed}


def draw_rollouts(m: dict, train_rows: list[dict], cfg: Settings, device) -> list[dict]:
    """The student's rollouts on the evenly spaced prompt subset (prompts over the cap left out), graded."""
    from lib.eval import grading
    subset = evenly_spaced(train_rows, cfg.prompts)
    ids_P = {r["id"]: prompt_ids(m["tok"], r["problem"], **m["kw"]) for r in subset}
    reqs = [(r, j) for r in subset if len(ids_P[r["id"]]) <= cfg.max_prompt_len for j in range(cfg.samples)]
    seeds = [stable_seed(cfg.seed, "anatomy", r["id"], j) for r, j in reqs]
    outs = sample_student(m, [ids_P[r["id"]] for r, _ in reqs], seeds, cfg, device)
    graded = [i for i, (r, _) in enumerate(reqs) if r.get("answer") is not None]
    grades = dict(zip(graded, grading.grade_many([(outs[i].text, reqs[i][0]["answer"]) for i in graded],
                                                 progress="anatomy (cross-pair): grading")))
    rows = []
    for i, ((r, j), o) in enumerate(zip(reqs, outs)):
        extractor = grading.extract_answer(o.text)[1]
        rows.append({"index": i, "problem_id": r["id"], "sample": j, "seed": seeds[i], "level": r.get("level"),
                     "prompt_ids": ids_P[r["id"]], "token_ids": list(o.token_ids), "finish_reason": o.finish_reason,
                     "extractor": extractor, "correct": bool(grades[i].correct) if i in grades else None,
                     "completion": o.text})
    return rows


@torch.no_grad()
def score_sampled(path, rollouts: list[dict], pad_id: int, cfg: Settings, device) -> list[list[float]]:
    """log π(y_t) of every sampled token of every rollout under the model at `path`, one list per rollout."""
    from lib.train.scoring import TokenScorer, pack, score_ids
    scorer = TokenScorer(load_lm(path, device), fused_linear=cfg.scoring == "fused-linear")
    out = []
    for c in range(0, len(rollouts), cfg.micro_batch):
        chunk = rollouts[c:c + cfg.micro_batch]
        batch = pack([r["prompt_ids"] for r in chunk], [r["token_ids"] for r in chunk], pad_id).to(device)
        lp_N = score_ids(scorer, batch, batch.targets_N[:, None])[:, 0].float().cpu()
        start = 0
        for r in chunk:
            out.append(lp_N[start:start + len(r["token_ids"])].tolist())
            start += len(r["token_ids"])
    del scorer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def pair_sequences(rollouts: list[dict], lp: dict, pre: str, post: str, student: str) -> list[dict]:
    """`summarise`'s per-sequence input for one pair, from the per-model log-probs of the frozen rollouts."""
    seqs = []
    for r in rollouts:
        i = r["index"]
        delta = np.asarray(lp[post][i]) - np.asarray(lp[pre][i])
        stopped = r["finish_reason"] == "stop"
        seqs.append(dict(delta=delta, weighted=delta, stopped=stopped, answer_end=stopped and r["extractor"] != "none",
                         lp_stop={"student": lp[student][i][-1], "pi_pre": lp[pre][i][-1],
                                  "pi_post": lp[post][i][-1]} if stopped else None,
                         correct=r["correct"], n_tokens=len(r["token_ids"])))
    return seqs


def cross_pair(student: dict, pair_models: dict, skipped: dict, train_rows: list[dict], cfg: Settings, out_dir,
               previous: dict | None) -> dict:
    """Score every pair of `pair_models` ({pair: {"pi_pre": (alias, path), "pi_post": (alias, path)}}) on one frozen
    set of the student's rollouts. `student`: load_roles()'s student role; `skipped`: {pair: why} (listed, not
    scored); `previous`: the last anatomy_cross.json of this directory (its rollouts are reused when they match)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    settings = rollout_settings(cfg, student["alias"])
    path = out_dir / CROSS_ROLLOUTS
    prev = (previous or {}).get("rollouts") or {}
    reused = (path.exists() and prev.get("settings") == settings and prev.get("sha256") == sha256_file(path))
    if reused:
        rollouts = read_jsonl(path)
    else:
        rollouts = draw_rollouts(student, train_rows, cfg, device)
        atomic_write_jsonl(path, rollouts)
    tok = student["tok"]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    models_to_score = {student["alias"]: student["resolved"].path}
    for roles in pair_models.values():
        models_to_score.update({alias: p for alias, p in roles.values()})
    lp = {alias: score_sampled(p, rollouts, pad_id, cfg, device) for alias, p in models_to_score.items()}
    atomic_write_jsonl(out_dir / CROSS_LOGPROBS, [{"index": r["index"], "logprobs": {a: lp[a][r["index"]] for a in lp}}
                                                  for r in rollouts])
    rows = []
    for name, roles in pair_models.items():
        pre, post = roles["pi_pre"][0], roles["pi_post"][0]
        s = summarise(pair_sequences(rollouts, lp, pre, post, student["alias"]), cfg.auroc_bins, cfg.bootstrap,
                      cfg.tie_tol)
        rows.append({"pair": name, "status": "scored", "pi_pre": pre, "pi_post": post,
                     **{k: s[k] for k in CROSS_MEASURES}})
    rows += [{"pair": name, "status": "skipped", "reason": why} for name, why in skipped.items()]
    warnings = [f"pair {name} not scored: {why}" for name, why in skipped.items()]
    reasons = [] if pair_models else ["no pair could be scored: " + "; ".join(warnings)]
    rep = checks.verdict(reasons, warnings, student=student["alias"], pairs=rows,
                         rollouts={"file": CROSS_ROLLOUTS, "sha256": sha256_file(path), "n_sequences": len(rollouts),
                                   "settings": settings, "reused": reused},
                         logprobs_file=CROSS_LOGPROBS)
    rep["summary"] = (f"{len(pair_models)} pair(s) on one frozen set of {len(rollouts)} student rollouts "
                      f"({'reused' if reused else 'drawn now'}, sha256 {rep['rollouts']['sha256'][:12]}…)"
                      + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
    rep["table"] = cross_table(rep)
    return rep


def cross_table(rep: dict) -> str:
    """The source §17 table: one row per pair."""
    lines = ["| pair | π_pre → π_post | mean Δ | % Δ > 0 | % Δ > 0 (\\|Δ\\| ≥ tie) | mean abs Δ | Δ at stop | "
             "log p(stop) π_pre | log p(stop) π_post | AUROC (length-controlled) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["pairs"]:
        if r["status"] != "scored":
            lines.append(f"| {r['pair']} | skipped: {r['reason']} |" + " — |" * 8)
            continue
        lp = r["logp_stop_at_answer_end"]
        lines.append(f"| {r['pair']} | {r['pi_pre']} → {r['pi_post']} | {_f(r['token_mean_delta'])} | "
                     f"{_f(r['pos_frac'], '.1f', 100)} | {_f(r['pos_frac_decided'], '.1f', 100)} | "
                     f"{_f(r['abs_mean_delta'], '.4f')} | {_f(r['stop']['mean_delta'])} | {_f(lp['pi_pre'])} | "
                     f"{_f(lp['pi_post'])} | {_f(r['auroc'].get('length_controlled'), '.3f')} |")
    return "\n".join(lines)
