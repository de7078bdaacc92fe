"""01_gates — every check the campaign runs before spending GPU time (DESIGN.md §8), one PASS/FAIL line per gate.

Gates, in order (each writes gates/<gate>.json + a short gates/<gate>.md):
    tokenizer      student, π_pre, π_post: every ordinary id means the same bytes; differing special ids listed with
                   both strings; embedding padding warned; 500 strings round-trip identically      (lib/gates/checks.py)
    prompt_length  the training prompts under the student's chat template vs the prompt cap: max, histogram, every
                   id over the cap                                                                 (lib/gates/checks.py)
    context        for each model × (benchmark, protocol) it is evaluated on, and for training: longest rendered
                   prompt + cap ≤ max_position_embeddings                                          (lib/gates/checks.py)
    template       rendered tail ends with the assistant header; injected system prompt; eos/pad/stop ids
                                                                                            (lib/gates/chat_template.py)
    anatomy        sample the student on an evenly spaced prompt subset (training rollout settings), score the sampled
                   tokens under π_pre, π_post and the student with lib/train/scoring.py (the training loop's code) and
                   report the shift anatomy; FAIL on an anti-EOS pair or a vanishing shift        (lib/gates/anatomy.py)
    anatomy_cross  (only when named in --gates) the source's §17 table: every pair of --cross-pairs scored on ONE
                   frozen set of the student's rollouts (gates/anatomy_cross_samples.jsonl, its sha256 recorded; a
                   rerun that adds a pair reads it back instead of sampling again); a pair whose models are not there
                   yet (the RAFT teacher before 07_raft) is listed as skipped                    (lib/gates/anatomy.py)

Reads: the registry's models (resolved to folders) and benchmark files. Writes runs/<name>/gates/: <gate>.json,
<gate>.md, anatomy_samples.jsonl, anatomy_cross_samples.jsonl and anatomy_cross_logprobs.jsonl (anatomy_cross),
manifest.json (with the --allow'ed gates). Exit status 1 if a gate that was not
--allow'ed fails.

    CPU:   python 01_gates.py --run-dir runs/toy --pair toy --anatomy-prompts 16
    GPU:   python 01_gates.py --run-dir runs/openthinker --pair openthinker --backend vllm
(one process: the anatomy's sampling and scoring fit one device; nothing here needs torchrun.)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
from lib import benchmarks, models, pairs, registry
from lib.artifacts import (ArtifactError, atomic_write_json, atomic_write_text, read_json, read_manifest, verify_dir,
                           wall_clock, write_manifest)
from lib.errors import UserError
from lib.cli import (ArgumentParser, HelpFormatter, finite_float, fraction, nonnegative_float, nonnegative_int,
                     positive_float, positive_int)
from lib.data import assistant_header, dapo_prompt, prompt_ids, refuse_special_text, render_chat
from lib.gates import anatomy, chat_template, checks

GATES = ("tokenizer", "prompt_length", "context", "template", "anatomy", "anatomy_cross")
DEFAULT_GATES = GATES[:-1]          # the cross-pair anatomy scores several pairs: run it when asked (--gates)


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    a, D = p.add_argument, anatomy.Settings          # D: the anatomy's defaults, declared in lib/gates/anatomy.py
    pairs.add_arguments(a)
    a("--student", default=None, help=f"student (default: the pair's): one of {sorted(registry.STUDENTS)}, "
                                      "a model alias, a hub id[@revision] or a folder")
    a("--run-dir", default=None, help="campaign directory (default runs/<pair>); reports go to <run-dir>/gates/")
    a("--gates", nargs="+", default=list(DEFAULT_GATES), choices=GATES,
      help="which gates to run (default: all but anatomy_cross)")
    a("--cross-pairs", nargs="+", default=None, metavar="PAIR",
      help="pairs the anatomy_cross gate scores on one frozen set of student rollouts, drawn at this pair's caps "
           "(default: this pair, then every registered pair whose student is the same model); one not registered or "
           "whose models are absent is listed as skipped")
    a("--allow", nargs="+", default=[], choices=GATES, metavar="GATE",
      help="proceed even if these gates fail (recorded in the manifest); one of " + ", ".join(GATES))
    a("--train-data", default=None, help="training prompts: a registry benchmark or a jsonl/parquet path with id, "
      "problem (default: the pair's)")
    a("--max-prompt-len", type=positive_int, default=None, help="prompt cap (default: the student's, DESIGN.md §4)")
    a("--max-response-len", type=positive_int, default=None, help="response cap (default: the student's, DESIGN.md §4)")
    a("--roundtrip-strings", type=positive_int, default=500, help="strings for the tokenizer round trip")
    a("--anatomy-prompts", type=positive_int, default=D.prompts,
      help="evenly spaced training prompts the anatomy samples")
    a("--anatomy-samples", type=positive_int, default=D.samples, help="samples per anatomy prompt")
    a("--temperature", type=positive_float, default=D.temperature,
      help="anatomy sampling temperature (the training rollouts')")
    a("--top-p", type=fraction, default=D.top_p, help="anatomy sampling top-p (the training rollouts')")
    a("--topk", type=positive_int, default=D.topk, help="K of the student-weighted (delta-topk) mean")
    a("--min-stop-delta", type=finite_float, default=D.min_stop_delta,
      help="FAIL if mean Δ at the terminal stop token is below this (nats). Source report: OpenThinker3 pair −90 "
           "(collapsed at step 10-13), RL pair −6.3 (stable), RAFT −0.006")
    a("--min-abs-delta", type=nonnegative_float, default=D.min_abs_delta,
      help="FAIL if the shift magnitude mean |Δ| per token is below this (source: corpus pairs 2.7, RAFT 0.099 — "
           "too small to transfer at 7B in 100 steps)")
    a("--min-pos-frac", type=fraction, default=D.min_pos_frac,
      help="FAIL if fewer of the student's tokens have Δ > 0, counted where |Δ| ≥ --tie-tol (source: corpus-SFT "
           "pairs 23-34 %% collapsed; RL 58 %%, RAFT 84.7 %% did not)")
    a("--tie-tol", type=nonnegative_float, default=D.tie_tol,
      help="|Δ| (nats) below which a token is a tie for --min-pos-frac")
    a("--auroc-bins", type=positive_int, default=D.auroc_bins,
      help="length-quantile bins of the length-controlled AUROC")
    a("--bootstrap", type=positive_int, default=D.bootstrap, help="bootstrap resamples of the AUROC CI (rng seed 42)")
    a("--backend", default=D.backend, choices=["hf", "vllm"], help="anatomy sampling engine (lib/sample/engine.py)")
    a("--scoring", default=D.scoring, choices=["fused-linear", "logits"], help="TokenScorer projection path")
    a("--micro-batch", type=positive_int, default=D.micro_batch, help="sequences per scoring forward")
    a("--seed", type=nonnegative_int, default=D.seed,
      help="anatomy sampling seeds: stable_seed(seed, 'anatomy', id, j)")
    return p.parse_args(argv)


# --- models: alias → folder, tokenizer, config, template kwargs (anatomy.load_roles) ---

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
    d = benchmarks.data_dir()
    for name in ("aime24", "aime25", "math500", "math_train"):
        if d is not None and (d / registry.BENCHMARKS[name].file).exists():
            problems += [r["problem"] for r in benchmarks.load_benchmark(name, require_answer=False)[0]]
    if not problems:      # no data directory: the pair's own training prompts still exercise real text
        problems = [r["problem"] for r in train_rows]
    strings = checks.roundtrip_strings(problems, args.roundtrip_strings)
    from lib.sample.engine import stop_ids
    stop = stop_ids(roles["student"]["tok"], roles["student"]["resolved"].path)
    rep = checks.compare_tokenizers({k: m["tok"] for k, m in roles.items()},
                                   {k: m["config"].get("vocab_size") for k, m in roles.items()}, strings)
    for dif in rep["special_diffs"]:
        if dif["id"] in stop:
            rep["warnings"].append(f"the student's stop id {dif['id']} means {dif['strings']} across the trio: the "
                                   "teachers score the student's stop token as a different token (see anatomy)")
    rep["summary"] = (f"{rep['ordinary']['n_checked']:,} ordinary ids, {rep['ordinary']['n_mismatch']} differ; "
                      f"{len(rep['special_diff_ids'])} special ids differ"
                      + (f" ({checks.id_ranges(rep['special_diff_ids'])})" if rep["special_diff_ids"] else "")
                      + f"; round trip {rep['roundtrip']['n_strings'] - rep['roundtrip']['n_lossy']}"
                      f"/{rep['roundtrip']['n_strings']} exact, {rep['roundtrip']['n_ids_differ']} id differences")
    return rep


# --- gate 2: prompt length ---

def gate_prompt_length(roles, train_rows, train_src, args) -> dict:
    rep = checks.length_audit(prompt_lengths(roles["student"], train_rows), args.max_prompt_len)
    rep.update(source=train_src, student=roles["student"]["alias"])
    rep["summary"] = (f"{rep['n_prompts']} prompts, max {rep['max']} ({rep['longest_id']}) vs cap "
                      f"{args.max_prompt_len}; {len(rep['over_cap'])} over")
    return rep


# --- gate 3: context ---

def gate_context(roles, pair, args) -> dict:
    rows_out, lengths = [], {}
    for role, m in roles.items():
        mpe, cap = max_positions(m), m["spec"].eval_max_new_tokens
        for bench, proto in pair.evals:
            if (role, bench) not in lengths:
                lengths[role, bench] = prompt_lengths(m, benchmarks.load_benchmark(bench)[0])
            ls = lengths[role, bench]
            longest = max(ls, key=ls.get)
            rows_out.append(dict(model=m["alias"], role=role, benchmark=bench, protocol=proto,
                                 longest_prompt=ls[longest], longest_id=longest, max_new_tokens=cap,
                                 max_position_embeddings=mpe))
        # training: teachers score the student's prompt + response ids verbatim, so every model needs the caps' sum
        rows_out.append(dict(model=m["alias"], role=role, benchmark="train", protocol="prompt cap + response cap",
                             longest_prompt=args.max_prompt_len, longest_id="prompt cap",
                             max_new_tokens=args.max_response_len, max_position_embeddings=mpe))
    rep = checks.context_check(rows_out)
    worst = min(rows_out, key=lambda r: r["max_position_embeddings"] - r["needed"])
    rep["summary"] = (f"{sum(r['ok'] for r in rows_out)}/{len(rows_out)} (model, benchmark, cap) fit; tightest "
                      f"{worst['model']} × {worst['benchmark']}: {worst['needed']} of "
                      f"{worst['max_position_embeddings']}")
    return rep


# --- gate 4: template ---

def gate_template(roles, train_rows) -> dict:
    from lib.sample.engine import stop_ids
    per, reasons, warnings = {}, [], []
    example = train_rows[0]["problem"]
    for role, m in roles.items():
        tok, path = m["tok"], m["resolved"].path
        gen = path / "generation_config.json"
        eos = json.loads(gen.read_text()).get("eos_token_id") if gen.exists() else None
        gen_eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        r = chat_template.template_report(tok, render_chat(tok, dapo_prompt(example), **m["kw"]),
                                  header=assistant_header(tok, **m["kw"]), stop=stop_ids(tok, path), gen_eos=gen_eos,
                                  template_note=m["spec"].template_note, kw=m["kw"])
        per[role] = {"model": m["alias"], **r}
        reasons += [f"{role} ({m['alias']}): {x}" for x in r["reasons"]]
        warnings += [f"{role} ({m['alias']}): {x}" for x in r["warnings"]]
    rep = checks.verdict(reasons, warnings, models=per)
    rep["summary"] = "; ".join(f"{k}: ends {v['assistant_header']!r} {'✓' if v['ends_with_header'] else '✗'}, "
                               f"system {v['injected_system']!r:.32}, stop {[s['token'] for s in v['stop_ids']]}"
                               for k, v in per.items())
    return rep


# --- gate 5: shift anatomy ---

def gate_anatomy(roles, train_rows, args, out_dir, pair_name: str) -> dict:
    """lib/gates/anatomy.py's driver with this script's flags (each defaults to anatomy.Settings, declared there
    once)."""
    cfg = anatomy.Settings(max_prompt_len=args.max_prompt_len, max_response_len=args.max_response_len,
                           prompts=args.anatomy_prompts, samples=args.anatomy_samples, temperature=args.temperature,
                           top_p=args.top_p, topk=args.topk, min_stop_delta=args.min_stop_delta,
                           min_abs_delta=args.min_abs_delta, min_pos_frac=args.min_pos_frac, tie_tol=args.tie_tol,
                           auroc_bins=args.auroc_bins,
                           bootstrap=args.bootstrap, backend=args.backend, scoring=args.scoring,
                           micro_batch=args.micro_batch, seed=args.seed)
    return anatomy.run(roles, train_rows, cfg, out_dir, pair_name)


# --- gate 6: the cross-pair anatomy (source §17) ---

def cross_pair_models(args, lp, run_dir) -> tuple[dict, dict]:
    """({pair: {"pi_pre": (alias, folder), "pi_post": (alias, folder)}} of the pairs to score, {pair: why skipped})."""
    def student_model(p):    # pairs whose student is the same model (its caps may differ: the collapse arm's do)
        return registry.STUDENTS[p.student].model if p.student in registry.STUDENTS else p.student

    names = args.cross_pairs or [lp.name] + sorted(n for n, p in registry.PAIRS.items()
                                                   if student_model(p) == lp.student.model and n != lp.name)
    found, skipped = {}, {}
    for name in dict.fromkeys(names):
        try:
            p = lp.pair if name == lp.name else pairs.load(name).pair
            res = models.resolve_roles({"pi_pre": p.pi_pre, "pi_post": p.pi_post}, run_dir, f"pair {name}")
        except (UserError, RuntimeError, FileNotFoundError, KeyError) as e:
            skipped[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
            continue
        found[name] = {role: (models.model_spec(getattr(p, role), run_dir).alias, res[role].path)
                       for role in ("pi_pre", "pi_post")}
    return found, skipped


def gate_anatomy_cross(roles, train_rows, args, out_dir, lp, run_dir) -> dict:
    cfg = anatomy.Settings(max_prompt_len=args.max_prompt_len, max_response_len=args.max_response_len,
                           prompts=args.anatomy_prompts, samples=args.anatomy_samples, temperature=args.temperature,
                           top_p=args.top_p, tie_tol=args.tie_tol, auroc_bins=args.auroc_bins,
                           bootstrap=args.bootstrap, backend=args.backend, scoring=args.scoring,
                           micro_batch=args.micro_batch, seed=args.seed)
    found, skipped = cross_pair_models(args, lp, run_dir)
    prev_path = out_dir / "anatomy_cross.json"
    previous = read_json(prev_path) if prev_path.exists() else None
    return anatomy.cross_pair(roles["student"], found, skipped, train_rows, cfg, out_dir, previous)


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


def carry_over(out_dir: Path, args, status: dict, outputs: list, pair_sha256: str) -> list[str]:
    """Gates not re-run keep their reports from this directory's previous run of the same pair, student and data,
    if their files still hash to what that manifest recorded; anything else is left out of the new manifest."""
    try:
        prev = read_manifest(out_dir)
    except ArtifactError:
        return []
    same = all(prev["args"].get(k) == getattr(args, k) for k in ("pair", "pi_pre", "pi_post", "student", "train_data"))
    same = same and prev.get("pair_sha256") == pair_sha256
    carried = []
    for name, st in (prev.get("gates", {}) if same else {}).items():
        files = [f for f in prev["outputs"] if f.split(".")[0] in (name, f"{name}_samples", f"{name}_logprobs")]
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
    lp = pairs.from_args(args)                       # a pair file's models and benchmarks are declared here
    pair = lp.pair
    student_name = args.student or lp.student.model
    sspec = models.student_spec(args.student) if args.student else lp.student
    args.max_prompt_len = args.max_prompt_len or sspec.max_prompt_len
    args.max_response_len = args.max_response_len or sspec.max_response_len
    run_dir = Path(args.run_dir or f"runs/{lp.name}")
    out_dir = run_dir / "gates"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        roles = anatomy.load_roles(pair, student_name, run_dir)
    except (RuntimeError, FileNotFoundError, KeyError) as e:       # offline hub, missing RAFT folder, bad alias
        sys.exit(f"[01] cannot load the models of pair {lp.name}: {e}")
    train_rows, train_src = benchmarks.load_benchmark(args.train_data or pair.train_data, require_answer=False)
    refuse_special_text(roles["student"]["tok"], train_rows, train_src)     # before the anatomy loads a model
    print(f"[01] gates for pair {lp.name}: student {roles['student']['alias']}, π_pre {roles['pi_pre']['alias']}, "
          f"π_post {roles['pi_post']['alias']} → {out_dir}", flush=True)

    run = {"tokenizer": lambda: gate_tokenizer(roles, train_rows, args),
           "prompt_length": lambda: gate_prompt_length(roles, train_rows, train_src, args),
           "context": lambda: gate_context(roles, pair, args), "template": lambda: gate_template(roles, train_rows),
           "anatomy": lambda: gate_anatomy(roles, train_rows, args, out_dir, lp.name),
           "anatomy_cross": lambda: gate_anatomy_cross(roles, train_rows, args, out_dir, lp, run_dir)}
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
    if "anatomy_cross" in status:
        outputs += [anatomy.CROSS_ROLLOUTS, anatomy.CROSS_LOGPROBS]
    carried, allowed = carry_over(out_dir, args, status, outputs, lp.sha256), [g for g in args.allow if g in status]
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
                          "passed": not every_failed} | lp.record())
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
