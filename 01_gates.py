"""01_gates — every check the campaign runs before spending GPU time (SPEC §8), one PASS/FAIL line per gate.

Gates, in order (each writes gates/<gate>.json + a short gates/<gate>.md):
    tokenizer      student, π_pre, π_post: every ordinary id means the same bytes; differing special ids listed with
                   both strings; embedding padding warned; 500 strings round-trip identically       (lib/gates.py)
    prompt_length  the training prompts under the student's chat template vs the prompt cap: max, histogram, every
                   id over the cap                                                                 (lib/gates.py)
    context        for each model × (benchmark, protocol) it is evaluated on, and for training: longest rendered
                   prompt + cap ≤ max_position_embeddings                                          (lib/gates.py)
    template       rendered tail ends with the assistant header; injected system prompt; eos/pad/stop ids
    anatomy        sample the student on an evenly spaced prompt subset (training rollout settings), score the sampled
                   tokens under π_pre, π_post and the student with lib/scoring.py (the training loop's code) and
                   report the shift anatomy; FAIL on an anti-EOS pair or a vanishing shift          (lib/anatomy.py)

Reads: the registry's models (resolved to folders) and benchmark files. Writes runs/<name>/gates/: <gate>.json,
<gate>.md, anatomy_samples.jsonl, manifest.json (with the --allow'ed gates). Exit status 1 if a gate that was not
--allow'ed fails.

    CPU:   python 01_gates.py --run-dir runs/toy --pair toy --anatomy-prompts 16
    GPU:   python 01_gates.py --run-dir runs/openthinker --pair openthinker --backend vllm
(one process: the anatomy's sampling and scoring fit one device; nothing here needs torchrun.)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
import torch

from lib import anatomy, gates, opd, registry
from lib.artifacts import (ArtifactError, atomic_write_json, atomic_write_jsonl, atomic_write_text, read_json,
                           read_manifest, verify_dir, wall_clock, write_manifest)
from lib.data import assistant_header, dapo_prompt, evenly_spaced, prompt_ids, render_chat, stable_seed

GATES = ("tokenizer", "prompt_length", "context", "template", "anatomy")
ROLES = ("student", "pi_pre", "pi_post")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--pair", default="toy", choices=sorted(registry.PAIRS), help="teacher pair (SPEC §2)")
    a("--student", default=None, help=f"student (default: the pair's); one of {sorted(registry.STUDENTS)}")
    a("--run-dir", default=None, help="campaign directory (default runs/<pair>); reports go to <run-dir>/gates/")
    a("--gates", nargs="+", default=list(GATES), choices=GATES, help="which gates to run (default: all)")
    a("--allow", nargs="+", default=[], choices=GATES, metavar="GATE",
      help="proceed even if these gates fail (recorded in the manifest); one of " + ", ".join(GATES))
    a("--train-data", default=None, help="training prompts: a registry benchmark or a jsonl/parquet path with id, "
      "problem (default: the pair's)")
    a("--max-prompt-len", type=int, default=None, help="prompt cap (default: the student's, SPEC §4)")
    a("--max-response-len", type=int, default=None, help="response cap (default: the student's, SPEC §4)")
    a("--roundtrip-strings", type=int, default=500, help="strings for the tokenizer round trip")
    a("--anatomy-prompts", type=int, default=64, help="evenly spaced training prompts the anatomy samples")
    a("--anatomy-samples", type=int, default=1, help="samples per anatomy prompt")
    a("--temperature", type=float, default=1.0, help="anatomy sampling temperature (the training rollouts')")
    a("--top-p", type=float, default=1.0, help="anatomy sampling top-p (the training rollouts')")
    a("--topk", type=int, default=16, help="K of the student-weighted (delta-topk) mean")
    a("--min-stop-delta", type=float, default=-10.0,
      help="FAIL if mean Δ at the terminal stop token is below this (nats). Source report: OpenThinker3 pair −90 "
           "(collapsed at step 10-13), RL pair −6.3 (stable), RAFT −0.006")
    a("--min-abs-delta", type=float, default=0.01,
      help="FAIL if the shift magnitude mean |Δ| per token is below this (source: corpus pairs 2.7, RAFT 0.099 — "
           "too small to transfer at 7B in 100 steps)")
    a("--min-pos-frac", type=float, default=0.40,
      help="FAIL if fewer of the student's tokens have Δ > 0 (source: corpus-SFT pairs 23-34 %% collapsed; RL 58 %%, "
           "RAFT 84.7 %% did not)")
    a("--auroc-bins", type=int, default=4, help="length-quantile bins of the length-controlled AUROC")
    a("--bootstrap", type=int, default=10_000, help="bootstrap resamples of the AUROC CI (rng seed 42)")
    a("--backend", default="hf", choices=["hf", "vllm"], help="anatomy sampling engine (lib/sampling.py)")
    a("--scoring", default="fused-linear", choices=["fused-linear", "logits"], help="TokenScorer projection path")
    a("--micro-batch", type=int, default=8, help="sequences per scoring forward")
    a("--seed", type=int, default=42, help="anatomy sampling seeds: stable_seed(seed, 'anatomy', id, j)")
    return p.parse_args(argv)


# --- models: alias → folder, tokenizer, config, template kwargs ---

def load_roles(pair, student_name, run_dir) -> dict:
    """{role: dict(alias, resolved, tok, config, kw)} for student, π_pre, π_post."""
    from transformers import AutoTokenizer
    aliases = {"student": registry.STUDENTS[student_name].model, "pi_pre": pair.pi_pre, "pi_post": pair.pi_post}
    roles = {}
    for role, alias in aliases.items():
        res = registry.resolve_model(alias, run_dir)
        cfg = json.loads((res.path / "config.json").read_text())
        spec = registry.model_spec(alias, run_dir)
        kw = {"enable_thinking": True} if spec.thinking else {}
        roles[role] = dict(alias=alias, resolved=res, tok=AutoTokenizer.from_pretrained(res.path), config=cfg, kw=kw,
                           spec=spec)
    return roles


def max_positions(m: dict) -> int:
    cfg = m["config"]
    mpe = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    if not mpe:
        raise SystemExit(f"{m['alias']}: config.json at {m['resolved'].path} has no max_position_embeddings; "
                         "the context gate needs it — add it to the config")
    return int(mpe)


def prompt_lengths(m: dict, rows: list[dict]) -> dict[str, int]:
    """{row id: tokens of its rendered DAPO prompt} under model m's own template (lib.data.prompt_ids)."""
    return {r["id"]: len(prompt_ids(m["tok"], r["problem"], **m["kw"])) for r in rows}


# --- gate 1: tokenizer ---

def gate_tokenizer(roles, train_rows, args) -> dict:
    problems = []
    d = registry.data_dir()
    for name in ("aime24", "aime25", "math500", "math_train"):
        if d is not None and (d / registry.BENCHMARKS[name].file).exists():
            problems += [r["problem"] for r in registry.load_benchmark(name, require_answer=False)[0]]
    if not problems:      # no data directory: the pair's own training prompts still exercise real text
        problems = [r["problem"] for r in train_rows]
    strings = gates.roundtrip_strings(problems, args.roundtrip_strings)
    from lib.sampling import stop_ids
    stop = stop_ids(roles["student"]["tok"], roles["student"]["resolved"].path)
    rep = gates.compare_tokenizers({k: m["tok"] for k, m in roles.items()},
                                   {k: m["config"].get("vocab_size") for k, m in roles.items()}, strings)
    for dif in rep["special_diffs"]:
        if dif["id"] in stop:
            rep["warnings"].append(f"the student's stop id {dif['id']} means {dif['strings']} across the trio: the "
                                   "teachers score the student's stop token as a different token (see anatomy)")
    rep["summary"] = (f"{rep['ordinary']['n_checked']:,} ordinary ids, {rep['ordinary']['n_mismatch']} differ; "
                      f"{len(rep['special_diff_ids'])} special ids differ"
                      + (f" ({gates.id_ranges(rep['special_diff_ids'])})" if rep["special_diff_ids"] else "")
                      + f"; round trip {rep['roundtrip']['n_strings'] - rep['roundtrip']['n_lossy']}"
                      f"/{rep['roundtrip']['n_strings']} exact, {rep['roundtrip']['n_ids_differ']} id differences")
    return rep


# --- gate 2: prompt length ---

def gate_prompt_length(roles, train_rows, train_src, args) -> dict:
    rep = gates.length_audit(prompt_lengths(roles["student"], train_rows), args.max_prompt_len)
    rep.update(source=train_src, student=roles["student"]["alias"])
    rep["summary"] = (f"{rep['n_prompts']} prompts, max {rep['max']} ({rep['longest_id']}) vs cap {args.max_prompt_len}; "
                      f"{len(rep['over_cap'])} over")
    return rep


# --- gate 3: context ---

def gate_context(roles, pair, args) -> dict:
    rows_out, lengths = [], {}
    for role, m in roles.items():
        mpe, cap = max_positions(m), m["spec"].eval_max_new_tokens
        for bench, proto in pair.evals:
            if (role, bench) not in lengths:
                lengths[role, bench] = prompt_lengths(m, registry.load_benchmark(bench)[0])
            ls = lengths[role, bench]
            longest = max(ls, key=ls.get)
            rows_out.append(dict(model=m["alias"], role=role, benchmark=bench, protocol=proto,
                                 longest_prompt=ls[longest], longest_id=longest, max_new_tokens=cap,
                                 max_position_embeddings=mpe))
        # training: teachers score the student's prompt + response ids verbatim, so every model needs the caps' sum
        rows_out.append(dict(model=m["alias"], role=role, benchmark="train", protocol="prompt cap + response cap",
                             longest_prompt=args.max_prompt_len, longest_id="prompt cap",
                             max_new_tokens=args.max_response_len, max_position_embeddings=mpe))
    rep = gates.context_check(rows_out)
    worst = min(rows_out, key=lambda r: r["max_position_embeddings"] - r["needed"])
    rep["summary"] = (f"{sum(r['ok'] for r in rows_out)}/{len(rows_out)} (model, benchmark, cap) fit; tightest "
                      f"{worst['model']} × {worst['benchmark']}: {worst['needed']} of {worst['max_position_embeddings']}")
    return rep


# --- gate 4: template ---

def gate_template(roles, train_rows) -> dict:
    from lib.sampling import stop_ids
    per, reasons, warnings = {}, [], []
    example = train_rows[0]["problem"]
    for role, m in roles.items():
        tok, path = m["tok"], m["resolved"].path
        gen = path / "generation_config.json"
        eos = json.loads(gen.read_text()).get("eos_token_id") if gen.exists() else None
        gen_eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        r = gates.template_report(tok, render_chat(tok, dapo_prompt(example), **m["kw"]),
                                  header=assistant_header(tok, **m["kw"]), stop=stop_ids(tok, path), gen_eos=gen_eos,
                                  template_note=m["spec"].template_note, kw=m["kw"])
        per[role] = {"model": m["alias"], **r}
        reasons += [f"{role} ({m['alias']}): {x}" for x in r["reasons"]]
        warnings += [f"{role} ({m['alias']}): {x}" for x in r["warnings"]]
    rep = gates.verdict(reasons, warnings, models=per)
    rep["summary"] = "; ".join(f"{k}: ends {v['assistant_header']!r} {'✓' if v['ends_with_header'] else '✗'}, "
                               f"system {v['injected_system']!r:.32}, stop {[s['token'] for s in v['stop_ids']]}"
                               for k, v in per.items())
    return rep


# --- gate 5: shift anatomy ---

def load_lm(path, device):
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def sample_student(m, prompts, seeds, args, device):
    """The student's completions at the training rollout settings, through lib/sampling (hf or vllm)."""
    from lib.sampling import load_engine, sample
    if args.backend == "vllm":
        engine = load_engine("vllm", str(m["resolved"].path), m["tok"],
                             max_model_len=args.max_prompt_len + args.max_response_len,
                             dtype="bfloat16" if device.type == "cuda" else "float32")
    else:
        engine = load_engine("hf", m["resolved"].path, m["tok"], batch_size=max(64, args.micro_batch), device=device,
                             dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    outs = sample(engine, prompts, seeds, temperature=args.temperature, top_p=args.top_p,
                  max_new_tokens=args.max_response_len, progress="anatomy: sampling the student")
    del engine
    return outs


@torch.no_grad()
def score_all(roles, prompts, outs, args, device) -> dict:
    """lib/scoring.py over every micro-batch, one model in memory at a time. Returns per-token tensors (N_total, ·):
    student lp (N,), top-K log-probs (N, K); each teacher's log-probs of [sampled id, top-K ids] (N, 1+K)."""
    from lib.scoring import TokenScorer, pack, score_ids
    tok = roles["student"]["tok"]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    mb = args.micro_batch
    batches = [(prompts[c:c + mb], [o.token_ids for o in outs[c:c + mb]]) for c in range(0, len(outs), mb)]
    got, ids_NK = {}, []
    for role in ROLES:                                    # the student first: its top-K ids are what teachers score
        scorer = TokenScorer(load_lm(roles[role]["resolved"].path, device), fused_linear=args.scoring == "fused-linear")
        parts = []
        for j, (p, r) in enumerate(batches):
            batch = pack(p, r, pad_id).to(device)
            if role == "student":
                lp_N, topk_ids_NK, topk_lp_NK, _ = scorer(batch, None, topk=args.topk)
                ids_NK.append(torch.cat([batch.targets_N[:, None], topk_ids_NK], 1))      # (N, 1+K)
                parts.append((lp_N.float().cpu(), topk_lp_NK.float().cpu()))
            else:
                parts.append(score_ids(scorer, batch, ids_NK[j]).float().cpu())         # (N, 1+K)
        got[role] = (torch.cat([x[0] for x in parts]), torch.cat([x[1] for x in parts])) if role == "student" \
            else torch.cat(parts)
        del scorer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return got


def gate_anatomy(roles, train_rows, args, out_dir) -> dict:
    """Sample the student on an evenly spaced prompt subset, grade, score under all three models, summarise."""
    from lib import grading
    m = roles["student"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    subset = evenly_spaced(train_rows, args.anatomy_prompts)
    ids_P = {r["id"]: prompt_ids(m["tok"], r["problem"], **m["kw"]) for r in subset}
    over = [r["id"] for r in subset if len(ids_P[r["id"]]) > args.max_prompt_len]
    subset = [r for r in subset if r["id"] not in over]   # the prompt_length gate names them; training refuses them
    reqs = [(r, j) for r in subset for j in range(args.anatomy_samples)]
    if not reqs:
        return gates.verdict([f"no anatomy prompts: {len(over)} of the subset are over the prompt cap and "
                              f"--anatomy-prompts is {args.anatomy_prompts}"], summary="nothing sampled")
    prompts = [ids_P[r["id"]] for r, _ in reqs]
    seeds = [stable_seed(args.seed, "anatomy", r["id"], j) for r, j in reqs]
    t0 = time.monotonic()
    outs = sample_student(m, prompts, seeds, args, device)
    t_sample = time.monotonic() - t0
    extractors = [grading.extract_answer(o.text)[1] for o in outs]
    golds = [r.get("answer") for r, _ in reqs]
    graded = [i for i, g in enumerate(golds) if g is not None]
    grades = dict(zip(graded, grading.grade_many([(outs[i].text, golds[i]) for i in graded],
                                                 progress="anatomy: grading")))
    t0 = time.monotonic()
    s = score_all(roles, prompts, outs, args, device)
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
    stats = anatomy.summarise(seqs, args.auroc_bins, args.bootstrap)
    stats["sampler_logprob_gap"] = float((sampler_N - lp_student_N).abs().mean())   # sampler vs scorer, same tokens
    reasons = anatomy.anatomy_gate(stats, args.min_stop_delta, args.min_abs_delta, args.min_pos_frac)
    warnings = [f"{len(over)} subset prompts over the prompt cap were left out: {over}"] if over else []
    if stats["sampler_logprob_gap"] > 0.05:
        warnings.append(f"sampler and scorer disagree by {stats['sampler_logprob_gap']:.3f} nats/token on the same "
                        "tokens: check dtype or the sampling engine")
    rep = gates.verdict(reasons, warnings, **stats, pair=args.pair, models={k: v["alias"] for k, v in roles.items()},
                        settings={"prompts": len(subset), "samples_per_prompt": args.anatomy_samples,
                                  "temperature": args.temperature, "top_p": args.top_p,
                                  "max_new_tokens": args.max_response_len, "topk": args.topk, "backend": args.backend,
                                  "scoring": args.scoring, "seed": args.seed, "device": device.type},
                        thresholds={"min_stop_delta": args.min_stop_delta, "min_abs_delta": args.min_abs_delta,
                                    "min_pos_frac": args.min_pos_frac},
                        timing_s={"sample": round(t_sample, 2), "score": round(t_score, 2)},
                        samples_file="anatomy_samples.jsonl")
    rep["table"] = anatomy_table(rep)
    rep["summary"] = (f"Δ̄ {stats['token_mean_delta']:+.3f}, |Δ| {stats['abs_mean_delta']:.3f}, "
                      f"{100 * stats['pos_frac']:.1f} % > 0, Δ@stop "
                      + ("n/a" if stats["stop"]["mean_delta"] is None else f"{stats['stop']['mean_delta']:+.2f}"))
    return rep


def _f(x, spec="+.3f"):
    return "n/a" if x is None else format(x, spec)


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
        f"| student-weighted mean Σ_k w_k Δ(x_k), K={rep['settings']['topk']} | {_f(rep['student_weighted_mean'])} |",
        f"| % tokens with Δ > 0 | {_f(100 * rep['pos_frac'] if rep['pos_frac'] is not None else None, '.1f')} |",
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


# --- reports ---

def write_gate(out_dir: Path, name: str, rep: dict, allowed: bool) -> list[str]:
    rep = {"gate": name, "allowed": allowed, **rep}
    atomic_write_json(out_dir / f"{name}.json", rep)
    md = [f"# gate `{name}`: {rep['status']}{' (allowed)' if allowed and rep['status'] == 'FAIL' else ''}", "",
          rep.get("summary", ""), ""]
    md += [f"- **FAIL**: {x}" for x in rep["reasons"]] + [f"- warning: {x}" for x in rep["warnings"]]
    if name == "tokenizer" and rep["special_diffs"]:
        md += ["", "| id | " + " | ".join(rep["tokenizers"]) + " |", "|---" * (1 + len(rep["tokenizers"])) + "|"]
        md += [f"| {d['id']} | " + " | ".join(f"`{d['strings'][k]}`" for k in rep["tokenizers"]) + " |"
               for d in rep["special_diffs"]]
    if name == "prompt_length":
        md += ["", "| tokens | prompts |", "|---|---|"] + [f"| {h['lo']}–{h['hi']} | {h['count']} |"
                                                          for h in rep["histogram"]]
        md += [f"- over cap: `{o['id']}` {o['tokens']} tokens" for o in rep.get("over_cap", [])]
    if name == "context":
        md += ["", "| model | benchmark | protocol | longest prompt | cap | needed | max positions | ok |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['model']} | {r['benchmark']} | {r['protocol']} | {r['longest_prompt']} ({r['longest_id']}) | "
               f"{r['max_new_tokens']} | {r['needed']} | {r['max_position_embeddings']} | {r['ok']} |"
               for r in rep["rows"]]
    if name == "template":
        for role, v in rep["models"].items():
            md += ["", f"## {role}: {v['model']}", f"- rendered tail: `{v['rendered_tail']!r}`",
                   f"- injected system prompt: `{v['injected_system']!r}` (registry note: {v['template_note'] or '—'})",
                   f"- eos {v['eos']}, pad {v['pad']}, end of turn {v['end_of_turn']}, stop ids {v['stop_ids']}"]
    if rep.get("table"):
        md += ["", rep["table"]]
    atomic_write_text(out_dir / f"{name}.md", "\n".join(md) + "\n")
    return [f"{name}.json", f"{name}.md"]


def carry_over(out_dir: Path, args, status: dict, outputs: list) -> list[str]:
    """Gates not re-run keep their reports from this directory's previous run of the same pair, student and data,
    if their files still hash to what that manifest recorded; anything else is left out of the new manifest."""
    try:
        prev = read_manifest(out_dir)
    except ArtifactError:
        return []
    same = all(prev["args"].get(k) == getattr(args, k) for k in ("pair", "student", "train_data"))
    carried = []
    for name, st in (prev.get("gates", {}) if same else {}).items():
        files = [f for f in prev["outputs"] if f.split(".")[0] in (name, f"{name}_samples")]
        if name in status or not files:
            continue
        try:
            verify_dir(out_dir, files)
        except ArtifactError:
            continue
        status[name] = st
        outputs += files
        carried.append(name)
    return carried


def main(argv=None):
    args = parse_args(argv)
    started, t_start = wall_clock()
    pair = registry.PAIRS[args.pair]
    student_name = args.student or pair.student
    sspec = registry.STUDENTS[student_name]
    args.max_prompt_len = args.max_prompt_len or sspec.max_prompt_len
    args.max_response_len = args.max_response_len or sspec.max_response_len
    run_dir = Path(args.run_dir or f"runs/{args.pair}")
    out_dir = run_dir / "gates"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        roles = load_roles(pair, student_name, run_dir)
    except (RuntimeError, FileNotFoundError, KeyError) as e:       # offline hub, missing RAFT folder, bad alias
        sys.exit(f"[01] cannot load the models of pair {args.pair}: {e}")
    train_rows, train_src = registry.load_benchmark(args.train_data or pair.train_data, require_answer=False)
    print(f"[01] gates for pair {args.pair}: student {roles['student']['alias']}, π_pre {roles['pi_pre']['alias']}, "
          f"π_post {roles['pi_post']['alias']} → {out_dir}", flush=True)

    run = {"tokenizer": lambda: gate_tokenizer(roles, train_rows, args),
           "prompt_length": lambda: gate_prompt_length(roles, train_rows, train_src, args),
           "context": lambda: gate_context(roles, pair, args), "template": lambda: gate_template(roles, train_rows),
           "anatomy": lambda: gate_anatomy(roles, train_rows, args, out_dir)}
    status, outputs, failed = {}, [], []
    for name in [g for g in GATES if g in args.gates]:
        t0 = time.monotonic()
        rep = run[name]()
        rep["seconds"] = round(time.monotonic() - t0, 2)
        allowed = name in args.allow
        outputs += write_gate(out_dir, name, rep, allowed)
        status[name] = rep["status"]
        tag = rep["status"] + (" (allowed)" if allowed and rep["status"] == "FAIL" else "")
        print(f"[01] {name:<14} {tag:<15} {rep.get('summary', '')}  ({rep['seconds']:.1f} s)", flush=True)
        for x in rep["reasons"]:
            print(f"       FAIL: {x}", flush=True)
        for x in rep["warnings"]:
            print(f"       warning: {x}", flush=True)
        if rep.get("table"):
            print(rep["table"], flush=True)
        if rep["status"] == "FAIL" and not allowed:
            failed.append(name)
    if "anatomy" in status:
        outputs.append("anatomy_samples.jsonl")
    carried, allowed = carry_over(out_dir, args, status, outputs), [g for g in args.allow if g in status]
    for name in carried:
        rep = read_json(out_dir / f"{name}.json")
        allowed += [name] if rep["allowed"] else []
        print(f"[01] {name:<14} {rep['status']:<15} (kept from the previous run of this directory)", flush=True)
    every_failed = [g for g, st in status.items() if st == "FAIL" and g not in allowed]
    inputs = {f"model:{k}": m["resolved"].provenance() for k, m in roles.items()}
    if Path(train_src).exists():
        inputs["train_data"] = train_src
    write_manifest(out_dir, stage="01_gates", script=__file__, args=vars(args), inputs=inputs, outputs=outputs,
                   started=started, wall_s=time.monotonic() - t_start,
                   extra={"gates": status, "allowed": sorted(allowed), "failed": every_failed, "carried": carried,
                          "passed": not every_failed})
    if failed:
        print(f"[01] FAILED: {', '.join(failed)} — fix them, or proceed on purpose with --allow {' '.join(failed)}",
              flush=True)
        return 1
    waived = [g for g, st in status.items() if st == "FAIL"]
    print(f"[01] all gates passed{f' except {waived}, allowed on purpose' if waived else ''} "
          f"({time.monotonic() - t_start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
