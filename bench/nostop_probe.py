"""bench/nostop_probe.py — the collapse arm with another π_post: π_pre whose stop token alone was unlearned.

The arm's π_post-nostop (lib/toy/builder.py) is an SFT of π_pre on solutions whose turns end in another token than the
stop token (an earlier recipe: the answer line repeated to the cap). That SFT moves more than the stop token, so this
probe measures the idealised alternative a reader would ask about (DESIGN.md §10): π_post-stoprow, equal to π_pre in
every logit but the stop token's. It is π_pre with its output layer untied from the embedding and only the stop
token's output row trained (AdamW, --row-steps steps of --row-batch sequences, lr --row-lr), toward π_pre conditioned
on not stopping: at each completion position the target is π_pre's next-token distribution with the stop token
removed and renormalised. Every other logit is π_pre's, so for any token x other than the stop token

    Δ(x) = log π_post(x) − log π_pre(x) = −log(1 − p_pre(stop) + p_pre(stop) · exp(s_post − s_pre)) ≥ 0

(s: the stop token's logit): ≈ 0 wherever π_pre does not want to stop, and −log(1 − p_pre(stop)) > 0 where it does.
The training sequences are the student's own samples (T = 1, seeds 1 and 2) and π_pre's (seed 3) on toy_train, cap 64.

Then, for every --seeds seed, the arm's raw and `--eos-policy neutral` conditions with campaign.sh's own
COLLAPSE_FLAGS (read from campaign.sh, so the two cannot drift; since b1a9577 they include the shared-prompt layout,
where the rows committed before ran padded) and `--pi-post` set to π_post-stoprow, two at a time,
and each raw run's last checkpoint evaluated at toy sample4 (04_eval.py). One row per seed: the step-1 weighted reward,
the onset and peak clip ratio of both conditions, the token-mean reward over the raw run's last five steps (the sink),
the accuracy, the truncation rate, and how often the FIRST answer line of a sample is right (did the student reach
its answer before it looped?) against the last one, which the grader reads.

    python bench/nostop_probe.py --out /tmp/nostop                  # CPU, the cached toy world; ~3 min a seed
    python bench/nostop_probe.py --answer-lines runs/toy             # first / last answer line right, every collapse
                                                                     # eval unit of a campaign (the arm's own π_post)
    python bench/nostop_probe.py --loop-stop --seeds 7               # does π_pre's wish to stop fade as a loop repeats?
    python bench/nostop_probe.py --sink-where CKPT                   # where a collapsed student's reward is paid

`--loop-stop` takes the student's own samples that stopped right after their answer line, writes that line k more
times (the loop a collapsed student writes) and reads, at the end of the k-th repeat, p(stop) under π_pre, the
student and the arm's π_post-nostop, and what π_post-stoprow would pay there for going on, −log(1 − p_pre(stop)):
does the stop-row sink pay at every line of a loop, or once, where π_pre would have stopped? (DESIGN.md §10 has the
answer measured on the EPYC's world: once; π_pre's p(stop) falls from ≈ 0.98 to ≈ 0.03 after one repeat.)

`--sink-where CKPT` asks why a collapsed student's reward is positive where the source's read ≈ 0: it scores CKPT's
own samples (400: two seeds over 200 training prompts, the arm's cap 64) with delta-topk's per-token reward and splits
it into the working, the token after the first answer, and the run-on, the run-on also by token (sink_where).
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lib import cpu_repro  # noqa: E402,F401  (not pinned here: tests import this module; its 03 runs pin)
from lib.data import prompt_ids  # noqa: E402
from lib.toy import builder  # noqa: E402
from lib.toy.task import STOP  # noqa: E402

ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def campaign_array(name: str) -> list[str]:
    """The first `NAME=( … )` array of campaign.sh (for TRAIN_FLAGS: the toy's), as the campaign passes it to 03."""
    text = (ROOT / "campaign.sh").read_text()
    m = re.search(rf"\b{name}=\((.*?)\)", text, re.S)
    if m is None:
        raise SystemExit(f"campaign.sh has no {name}=( … ) array; update bench/nostop_probe.campaign_array's callers")
    return m.group(1).split()


def collapse_flags() -> list[str]:
    """campaign.sh's COLLAPSE_FLAGS array, as the campaign passes it to 03."""
    return campaign_array("COLLAPSE_FLAGS")


def samples(tok, models_seeds: list, rows: list[dict], cap: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids with its stop token if it stopped) of one T = 1 sample per row per (model, seed)."""
    out = []
    for model, seed in models_seeds:
        for r, g in zip(rows, builder.generate(model, tok, rows, cap, sample_seed=seed)):
            completion = tok(g["text"], add_special_tokens=False)["input_ids"]
            out.append((prompt_ids(tok, r["problem"]), completion + ([tok.eos_token_id] if g["stopped"] else [])))
    return out


def batch(tok, seqs):
    """Right-padded input ids, attention mask, and the mask of positions that predict a completion token."""
    import torch
    B, T = len(seqs), max(len(p) + len(c) for p, c in seqs)
    ids = torch.full((B, T), tok.pad_token_id)
    mask = torch.zeros(B, T, dtype=torch.long)
    pred = torch.zeros(B, T, dtype=torch.bool)
    for b, (p, c) in enumerate(seqs):
        n = len(p) + len(c)
        ids[b, :n], mask[b, :n] = torch.tensor(p + c), 1
        pred[b, len(p) - 1:n - 1] = True
    return ids, mask, pred


def build_stoprow(pre, tok, seqs, steps: int, batch_size: int, lr: float, log=print):
    """π_pre with an untied output layer whose stop-token row alone is trained toward π_pre without its stop token."""
    import torch
    stop = tok.eos_token_id
    post = copy.deepcopy(pre)
    post.config.tie_word_embeddings = False
    post.lm_head.weight = torch.nn.Parameter(pre.model.embed_tokens.weight.detach().clone())
    for p in post.parameters():
        p.requires_grad_(False)
    post.lm_head.weight.requires_grad_(True)
    only_stop = torch.zeros_like(post.lm_head.weight)
    only_stop[stop] = 1.0
    opt = torch.optim.AdamW([post.lm_head.weight], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(0)
    for step in range(steps):
        ids, mask, pred = batch(tok, rng.sample(seqs, batch_size))
        with torch.no_grad():
            target = pre(input_ids=ids, attention_mask=mask).logits.float()
            target[..., stop] = float("-inf")
            target = torch.softmax(target, -1)                       # π_pre conditioned on not stopping
        logp = torch.log_softmax(post(input_ids=ids, attention_mask=mask).logits.float(), -1)
        loss = -(target * logp).sum(-1)[pred].mean()
        opt.zero_grad()
        loss.backward()
        post.lm_head.weight.grad.mul_(only_stop)                    # every other row stays π_pre's
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log(f"  stop row step {step}: loss {loss.item():.4f}")
    return post.eval()


def shift_stats(pre, post, tok, seqs) -> dict:
    """Δ on held-out student samples: on the stop token, and on every other sampled token; and, where the student
    stopped, Δ of the line break instead (what a student that went on to a new line there would be paid)."""
    import torch
    stop, on_stop, off_stop, logp_stop, newline = tok.eos_token_id, [], [], [], []
    (nl,) = tok("\n", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        for i in range(0, len(seqs), 50):
            ids, mask, pred = batch(tok, seqs[i:i + 50])
            a = torch.log_softmax(pre(input_ids=ids, attention_mask=mask).logits.float(), -1)[:, :-1]
            b = torch.log_softmax(post(input_ids=ids, attention_mask=mask).logits.float(), -1)[:, :-1]
            tgt, keep = ids[:, 1:], pred[:, :-1]
            d = (b - a).gather(-1, tgt[..., None])[..., 0][keep]
            is_stop = tgt[keep] == stop
            on_stop += d[is_stop].tolist()
            off_stop += d[~is_stop].tolist()
            logp_stop += b[keep][is_stop][:, stop].tolist()
            newline += (b - a)[keep][is_stop][:, nl].tolist()
    mean = lambda xs: sum(xs) / len(xs) if xs else None           # noqa: E731
    return {"tokens": len(on_stop) + len(off_stop), "delta_at_stop_mean": mean(on_stop),
            "delta_off_stop_mean": mean(off_stop), "delta_off_stop_abs_max": max(map(abs, off_stop)),
            "logp_post_stop_at_stop_mean": mean(logp_stop), "delta_newline_at_stop_mean": mean(newline)}


def run(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)


def first_and_last_right(samples_file: Path, gold: dict) -> tuple[float, float]:
    """% of samples whose first / last `Answer: <int>` line holds the gold answer."""
    first = last = n = 0
    for line in samples_file.read_text().splitlines():
        s = json.loads(line)
        found = ANSWER.findall(s["completion"])
        n += 1
        first += bool(found) and int(found[0]) == gold[s["problem_id"]]
        last += bool(found) and int(found[-1]) == gold[s["problem_id"]]
    return 100.0 * first / n, 100.0 * last / n


def first_digit_right(samples_file: Path, gold: dict) -> float:
    """% of samples whose first `Answer: <int>` line starts with the gold answer's digit (the toy's answers are one
    digit): a student that reached its answer and then ran on with more digits (`Answer: 60000…`) counts."""
    right = n = 0
    for line in samples_file.read_text().splitlines():
        s = json.loads(line)
        found = ANSWER.findall(s["completion"])
        n += 1
        right += bool(found) and found[0].lstrip("-")[:1] == str(gold[s["problem_id"]])
    return 100.0 * right / n


def answer_lines(campaign: Path) -> None:
    """First / last answer line right, and the first line's leading digit, for the initial student and every
    collapse-* eval unit of a campaign."""
    gold = {json.loads(line)["id"]: int(json.loads(line)["answer"])
            for line in (builder.build() / "data" / "toy_test.jsonl").read_text().splitlines()}
    units = sorted(campaign.glob("evals/collapse-*/toy/sample4")) + sorted(
        campaign.glob("evals/toy-student/toy/sample4"))
    if not units:
        raise SystemExit(f"nostop_probe: no collapse-* or toy-student toy/sample4 eval unit under {campaign}/evals")
    from lib.report.rollouts import reached_counts
    for unit in units:
        first, last = first_and_last_right(unit / "samples.jsonl", gold)
        digit = first_digit_right(unit / "samples.jsonl", gold)
        # the report's own count (§5.3 "reached %"), where 04 wrote each sample's first answer (units from c7f02ca on)
        rows = [json.loads(line) for line in (unit / "samples.jsonl").read_text().splitlines()]
        n = reached_counts(rows, "toy")["n_reached"]
        report = "" if n is None else f"; reached (the report's count) {100 * n / len(rows):.2f} %"
        print(f"{unit.relative_to(campaign)}: first answer line right {first:.2f} %, last {last:.2f} %; the first "
              f"line's leading digit right {digit:.2f} %{report}")


def loop_stop(seed: int = 7, repeats: int = 8, n_rows: int = 200) -> None:
    """p(stop) at the end of each repeat of the answer line, per model, over the student's stopped samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    world = builder.build()
    tok = AutoTokenizer.from_pretrained(world / "models" / "pre")
    models = {name: AutoModelForCausalLM.from_pretrained(world / "models" / name).float().eval()
              for name in ("pre", "student", "post-nostop")}
    rows = [json.loads(line) for line in (world / "data" / "toy_train.jsonl").read_text().splitlines()][:n_rows]
    stop = tok.eos_token_id
    bases = []                                    # (prompt ids, completion ids without its stop, answer line ids)
    for r, g in zip(rows, builder.generate(models["student"], tok, rows, 64, sample_seed=seed)):
        line = g["text"].rsplit("\n", 1)[-1]
        if g["stopped"] and ANSWER.fullmatch(line.strip()) and "\n" in g["text"]:
            bases.append((prompt_ids(tok, r["problem"]), tok(g["text"], add_special_tokens=False)["input_ids"],
                          tok("\n" + line, add_special_tokens=False)["input_ids"]))
    print(f"loop_stop: {len(bases)} of {len(rows)} student samples (seed {seed}) stopped right after an answer line")
    print("| repeats of the answer line | " + " | ".join(f"p(stop), {m}" for m in models) +
          " | stop-row pay for going on, −log(1 − p_pre(stop)): mean, median |")
    print("|---|" + "---|" * (len(models) + 1))
    with torch.no_grad():
        for k in range(repeats + 1):
            seqs = [(p, c + line * k) for p, c, line in bases]
            ids, mask, _ = batch(tok, seqs)
            at = torch.tensor([len(p) + len(c) - 1 for p, c in seqs])          # the last position: predicts stop
            p_stop = {}
            for name, m in models.items():
                z = m(input_ids=ids, attention_mask=mask).logits.double()[torch.arange(len(seqs)), at]   # (N, V)
                p_stop[name] = torch.softmax(z, -1)[:, stop]
                if name == "pre":              # log(1 − p(stop)) from the other logits: exact where p(stop) ≈ 1
                    pay = torch.logsumexp(z, -1) - torch.logsumexp(torch.cat([z[:, :stop], z[:, stop + 1:]], -1), -1)
            print(f"| {k} | " + " | ".join(f"{v.mean().item():.4f}" for v in p_stop.values()) +
                  f" | {pay.mean().item():+.3f}, {pay.median().item():+.4f} |")


FIRST_ANSWER_DIGIT = re.compile(r"Answer:\s*-?\d")


def sink_where(ckpt: Path, seeds=(7, 8), n_rows: int = 200, topk: int = 16) -> dict:
    """Where a collapsed student's reward is paid: its own samples (T = 1, cap 64, the arm's training caps) on
    toy_train prompts, scored with delta-topk's per-token reward Σ_k w_k · Δ(x_k) over its top-`topk` candidates
    (lib/train/opd.py, before any fix), split by where each token sits relative to the first answer's digit (the toy's
    answers are one digit): the working up to and including that digit; the one token after it, where the initial
    student stops; and the run-on after that. The stop token is counted in whichever part it falls in."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lib.train.opd import delta_topk_advantage
    world = builder.build()
    tok = AutoTokenizer.from_pretrained(world / "models" / "pre")
    pre, post = (AutoModelForCausalLM.from_pretrained(world / "models" / m).float().eval()
                 for m in ("pre", "post-nostop"))
    student = AutoModelForCausalLM.from_pretrained(ckpt).float().eval()
    rows = [json.loads(line) for line in (world / "data" / "toy_train.jsonl").read_text().splitlines()][:n_rows]
    seqs = samples(tok, [(student, s) for s in seeds], rows, 64)
    parts = {"working": [], "after the answer": [], "run-on": []}
    stop_in, run_on = {k: 0 for k in parts}, {}          # run_on: the run-on's rewards by what the token is
    with torch.no_grad():
        for i in range(0, len(seqs), 50):
            chunk = seqs[i:i + 50]
            ids, mask, pred = batch(tok, chunk)
            lp = {name: torch.log_softmax(m(input_ids=ids, attention_mask=mask).logits.float(), -1)[:, :-1]
                  for name, m in (("student", student), ("pre", pre), ("post", post))}
            top_lp, top_ids = lp["student"].topk(topk, -1)
            r = delta_topk_advantage(top_lp, lp["post"].gather(-1, top_ids), lp["pre"].gather(-1, top_ids)).sum(-1)
            for b, (p, c) in enumerate(chunk):
                cut = first_answer_cut(tok, c)
                for j in range(len(c)):
                    part = "working" if j < cut else "after the answer" if j == cut else "run-on"
                    parts[part].append(r[b, len(p) - 1 + j].item())
                    stop_in[part] += c[j] == tok.eos_token_id
                    if part == "run-on":
                        t = "<stop>" if c[j] == tok.eos_token_id else tok.decode([c[j]])
                        run_on.setdefault("a digit" if t.strip().isdigit() else repr(t), []).append(parts[part][-1])
    total = sum(sum(v) for v in parts.values())
    n = sum(map(len, parts.values()))
    out = {"samples": len(seqs), "tokens": n, "token_mean": total / n}
    for k, v in parts.items():
        out[k] = {"tokens": len(v), "stop_tokens": stop_in[k], "mean": sum(v) / len(v) if v else None,
                  "share_of_token_mean": sum(v) / n}
    out["run-on by token"] = {k: {"tokens": len(v), "mean": sum(v) / len(v), "share_of_token_mean": sum(v) / n}
                              for k, v in sorted(run_on.items(), key=lambda kv: -abs(sum(kv[1])))
                              if abs(sum(v)) / n >= 0.001}
    return out


def first_answer_cut(tok, completion_ids: list[int]) -> int:
    """How many of a completion's tokens reach through its first answer's first digit (all of them if it has none):
    the token at that index is the one after the answer, where a student that stops writes its stop token."""
    text = tok.decode(completion_ids, skip_special_tokens=True)
    m = FIRST_ANSWER_DIGIT.search(text)
    if m is None:
        return len(completion_ids)
    # the shortest prefix of tokens whose text holds the digit (read from the tokens, not by re-tokenizing the text)
    return next(j for j in range(1, len(completion_ids) + 1)
                if len(tok.decode(completion_ids[:j], skip_special_tokens=True)) >= m.end())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--answer-lines", type=Path, metavar="CAMPAIGN",
                   help="only print the first / last answer line right of CAMPAIGN's collapse-* eval units")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    p.add_argument("--row-steps", type=int, default=300)
    p.add_argument("--row-batch", type=int, default=32)
    p.add_argument("--row-lr", type=float, default=1e-2)
    p.add_argument("--sink-where", type=Path, metavar="CKPT",
                   help="only print where CKPT's delta-topk reward is paid on its own samples: the working, the token "
                   "after the first answer, the run-on (see sink_where)")
    p.add_argument("--loop-stop", action="store_true",
                   help="only print p(stop) at the end of each repeat of the answer line (see above), the student's samples "
                   "drawn with the first of --seeds (give one, e.g. --seeds 7)")
    a = p.parse_args()
    if a.sink_where:
        return print(json.dumps(sink_where(a.sink_where), indent=1))
    if a.loop_stop:
        return loop_stop(a.seeds[0])
    if a.answer_lines:
        return answer_lines(a.answer_lines)
    if a.out is None:
        p.error("--out is required (or --answer-lines CAMPAIGN)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    world = builder.build()
    tok = AutoTokenizer.from_pretrained(world / "models" / "pre")
    assert tok.eos_token == STOP, f"the toy tokenizer's stop token is {tok.eos_token!r}, not {STOP!r}"
    pre = AutoModelForCausalLM.from_pretrained(world / "models" / "pre").float().eval()
    student = AutoModelForCausalLM.from_pretrained(world / "models" / "student").float().eval()
    rows = [json.loads(line) for line in (world / "data" / "toy_train.jsonl").read_text().splitlines()]
    seqs = samples(tok, [(student, 1), (student, 2), (pre, 3)], rows, 64)
    print(f"nostop_probe: {len(seqs)} training sequences ({time.monotonic() - t0:.0f} s)")
    post = build_stoprow(pre, tok, seqs, a.row_steps, a.row_batch, a.row_lr)
    post_dir = a.out / "post-stoprow"
    post.save_pretrained(post_dir)
    tok.save_pretrained(post_dir)
    stats = shift_stats(pre, post, tok, samples(tok, [(student, 7)], rows[:200], 64))
    print("nostop_probe: Δ on 200 held-out student samples: " + json.dumps({k: round(v, 4) for k, v in stats.items()}))

    flags = collapse_flags() + ["--pi-post", str(post_dir), "--run-dir", str(a.out / "run")]
    gold = {json.loads(line)["id"]: int(json.loads(line)["answer"])
            for line in (world / "data" / "toy_test.jsonl").read_text().splitlines()}
    ev = subprocess.run([sys.executable, "04_eval.py", "--run-dir", str(a.out / "run"), "--model", "toy-student",
                         "--benchmark", "toy", "--protocol", "sample4", "--pair", "toy-collapse"],
                        cwd=ROOT, capture_output=True, text=True)
    if ev.returncode:
        raise SystemExit(f"nostop_probe: 04 on the initial student failed: {ev.stderr.strip().splitlines()[-1]}")
    unit = a.out / "run" / "evals" / "toy-student" / "toy" / "sample4"
    first, last = first_and_last_right(unit / "samples.jsonl", gold)
    initial = {"accuracy": json.loads((unit / "scores.json").read_text())["accuracy"],
               "first_answer_right_pct": first, "last_answer_right_pct": last}
    print(f"nostop_probe: the initial student: {json.dumps(initial)}")
    results = []
    for seed in a.seeds:
        procs = {cond: run([sys.executable, "03_opd_train.py", *flags, "--seed", str(seed), "--run-name",
                            f"{cond}-seed{seed}", *(["--eos-policy", "neutral"] if cond == "neutral" else [])],
                           a.out / f"{cond}-seed{seed}.log") for cond in ("raw", "neutral")}
        for cond, proc in procs.items():
            if proc.wait():
                raise SystemExit(f"nostop_probe: 03 {cond} seed {seed} failed; see {a.out}/{cond}-seed{seed}.log")
        row = {"seed": seed}
        for cond in ("raw", "neutral"):
            run_dir = a.out / "run" / "train" / f"{cond}-seed{seed}"
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            summary = json.loads((run_dir / "summary.json").read_text())
            row[cond] = {"step1_weighted_reward": metrics[0]["delta_opd/weighted_reward_mean"],
                         "onset": summary["collapse_onset_step"],
                         "peak_clip": max(m["response_length/clip_ratio"] for m in metrics),
                         "last5_token_reward": sum(m["delta_opd/weighted_reward_token_mean"]
                                                   for m in metrics[-5:]) / 5}
        ckpt = sorted((a.out / "run" / "train" / f"raw-seed{seed}").glob("step_*"))[-1]
        ev = subprocess.run([sys.executable, "04_eval.py", "--run-dir", str(a.out / "run"), "--model", str(ckpt),
                             "--benchmark", "toy", "--protocol", "sample4", "--pair", "toy-collapse"],
                            cwd=ROOT, capture_output=True, text=True)
        if ev.returncode:
            raise SystemExit(f"nostop_probe: 04 on {ckpt} failed: {ev.stderr.strip().splitlines()[-1]}")
        unit = next((a.out / "run" / "evals").glob(f"raw-seed{seed}-step*/toy/sample4"))
        scores = json.loads((unit / "scores.json").read_text())
        first, last = first_and_last_right(unit / "samples.jsonl", gold)
        row["raw_eval"] = {"accuracy": scores["accuracy"], "truncation_rate": scores["truncation_rate"],
                           "first_answer_right_pct": first, "last_answer_right_pct": last,
                           "example": json.loads((unit / "samples.jsonl").read_text().splitlines()[0])["completion"]}
        results.append(row)
        print(f"nostop_probe: seed {seed}: " + json.dumps(row, default=str))
    out = {"shift": stats, "flags": flags, "initial_student": initial, "seeds": results,
           "seconds": time.monotonic() - t0}
    (a.out / "summary.json").write_text(json.dumps(out, indent=1))
    print("| seed | step-1 weighted reward | raw onset / peak clip | sink token reward (last 5) | neutral onset / "
          "peak clip | raw accuracy | truncated | first / last answer line right |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        raw, neu, ev = r["raw"], r["neutral"], r["raw_eval"]
        print(f"| {r['seed']} | {raw['step1_weighted_reward']:+.4f} | {raw['onset'] or '—'} / {raw['peak_clip']:.2f} | "
              f"{raw['last5_token_reward']:+.3f} | {neu['onset'] or '—'} / {neu['peak_clip']:.2f} | "
              f"{ev['accuracy']:.2f} % | {100 * ev['truncation_rate']:.1f} % | "
              f"{ev['first_answer_right_pct']:.2f} / {ev['last_answer_right_pct']:.2f} % |")


if __name__ == "__main__":
    main()
