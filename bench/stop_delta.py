"""bench/stop_delta.py — at the student's own answer ends, what Direct-OPD pays for stopping and for going on.

The collapse arm (DESIGN.md §10) needs two things at the position where the student stops: stopping must cost
(Δ(stop) = log π_post(stop) − log π_pre(stop) ≪ 0), and going on must pay, or at least not cost. The cross-pair
anatomy (01_gates.py) prints the first; this prints both, for one pair of toy models scored on a frozen set of the
student's stopped samples. At the last position of each sample that ended in its stop token, with x_1..x_K the
student's top-K candidates there and w = softmax_k log π_student(x_k) (delta-topk's weights, DESIGN.md §7.2):

    stop        Δ(y) at the sampled stop token y
    go_on       Σ_{x_k ≠ y} w_k Δ(x_k) / Σ_{x_k ≠ y} w_k     the student-weighted Δ of its other candidates
    pre_go_on   Σ_{x_k ≠ y} π_pre(x_k)                        how much of π_pre's mass those candidates hold

bench/nostop_probe.py's shift_stats prints, at the same positions, Δ of one token (the line break) for a π_post it
builds itself; this weighs every candidate the student itself would write there, for any world's own pair.

The samples are a run's `gates/anatomy_cross_samples.jsonl` (prompt and response ids, finish reason). Each --world
is a toy world folder (its models/ subfolder): give two to compare the worlds two CPU vendors built (the models of a
world built on another machine can be copied into a folder of their own).

    python bench/stop_delta.py --samples runs/toy/gates/anatomy_cross_samples.jsonl \\
        --world ~/.cache/opd/toy/<hash> [--world DIR2 …] [--post post-nostop] [--out stop_delta.json]

Samples that carry a `level` (the toy's) are also summarised by level. With the arm's previous π_post (an SFT whose
turns end in another token, worlds up to f1445f5927c66f69) it measured (bench/RESULTS.md §15) go_on +3.50 on the AMD
EPYC's world and −0.03 on the Intel Xeon's, with Δ(stop) −14.85 and −13.81: on the Xeon's world going on earned
nothing, because its π_pre keeps 11 % of its mass on the student's other candidates where the EPYC's π_pre keeps
none; by level, the Xeon world's go_on was +2.4 to +2.6 after level-1 and -2 answers and −3.0 after level-3 ones,
where its π_pre (trained on levels 1–2) stops less surely. The arm's π_post now (world 4208b47b5c8c6571, fitted to
π_pre's log-probs with the stop token's mass moved: DESIGN.md §10) gives Δ(stop) −40.03 and go_on −0.21 on the
EPYC's world and −39.11 and −0.61 on the model-207 Xeon's, on a campaign's 64 stopped samples (bench/nostop_fits.py
compares the fits).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lib.artifacts import read_jsonl  # noqa: E402


def all_logprobs(lm, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """(T, V) log-softmax of the logits that predicted each of the response's T tokens."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        return lm(ids).logits[0, len(prompt_ids) - 1:-1].float().log_softmax(-1)


def last_logprobs(lm, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """log-softmax of the logits that predicted the response's last token (the stop token of a stopped sample)."""
    return all_logprobs(lm, prompt_ids, token_ids)[-1]


def stop_and_go_on(student, pre, post, samples: list[dict], k: int = 16) -> dict:
    """The three quantities of the module docstring, averaged over the samples that stopped; `rows` per sample."""
    rows = []
    for s in samples:
        if s["finish_reason"] != "stop":
            continue
        lp_s, lp_pre, lp_post = (last_logprobs(m, s["prompt_ids"], s["token_ids"]) for m in (student, pre, post))
        y = s["token_ids"][-1]
        top = torch.topk(lp_s, k)
        w = torch.softmax(top.values, 0)
        delta = lp_post[top.indices] - lp_pre[top.indices]
        other = top.indices != y
        rows.append({"level": s.get("level"), "stop": float(lp_post[y] - lp_pre[y]),
                     "go_on": float((w[other] * delta[other]).sum() / w[other].sum()),
                     "pre_go_on": float(lp_pre[top.indices[other]].exp().sum()),
                     "logp_stop": {"student": float(lp_s[y]), "pi_pre": float(lp_pre[y]), "pi_post": float(lp_post[y])}})
    if not rows:
        raise SystemExit("no sample ended in its stop token: give a samples file of a run whose student stops")
    keys = ("stop", "go_on", "pre_go_on")
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in keys}
    levels = sorted({r["level"] for r in rows if r["level"] is not None})
    by_level = {lv: {"n": len(sel), **{key: sum(r[key] for r in sel) / len(sel) for key in keys}}
                for lv in levels for sel in [[r for r in rows if r["level"] == lv]]}
    return {"n": len(rows), **mean, "by_level": by_level, "rows": rows}


def neutral_leak(student, pre, post, samples: list[dict], stop_id: int, k: int = 16) -> dict:
    """What `--eos-policy neutral` leaves of the stop token's price, on the student's own samples (every one, stopped
    or not), with delta-topk's advantage A_{t,k} (lib/train/opd.py's, the training loop's arithmetic):

        reward_{raw,neutral,neutral_all}   the mean A over (token, candidate) pairs after each policy (03's
                                           delta_opd/weighted_reward_mean at step 1, were these the step's rollouts)
        leak                               the stop candidate's A where the student did not stop, summed over the same
                                           pairs: what neutral keeps and neutral-all zeroes (their difference)
        push_{raw,neutral,neutral_all}     the gradient of Σ_k A_k ρ_k on the stop token's logit, A_stop − p_stop Σ_k A_k
                                           at ρ = 1 (p_stop the student's full-vocabulary probability), after each
                                           policy, summed over every position, per response token: negative pushes
                                           the student off stopping
        push_{terminal,leak}               the raw push summed over the positions where the student stopped (what
                                           neutral zeroes), and over the others where the stop token is a candidate

    `leak_positions` counts those other positions, with the student's mean p(stop) and the mean Δ(stop) there."""
    from lib.train import opd
    A, cand, stop, p_stop, d_stop = [], [], [], [], []
    for s in samples:
        lp_s, lp_pre, lp_post = (all_logprobs(m, s["prompt_ids"], s["token_ids"]) for m in (student, pre, post))
        top = torch.topk(lp_s, k, dim=-1)
        A.append(opd.delta_topk_advantage(top.values, lp_post.gather(1, top.indices), lp_pre.gather(1, top.indices)))
        cand.append(top.indices == stop_id)
        is_stop = torch.zeros(len(s["token_ids"]), dtype=torch.bool)
        is_stop[-1] = s["finish_reason"] == "stop"
        stop.append(is_stop)
        p_stop.append(lp_s[:, stop_id].exp())
        d_stop.append(lp_post[:, stop_id] - lp_pre[:, stop_id])
    A_NK, cand_NK, stop_N, p_N, d_N = (torch.cat(x) for x in (A, cand, stop, p_stop, d_stop))
    leak_NK = cand_NK & ~stop_N[:, None]

    def push(adv_NK):                # A_stop − p_stop Σ_k A_k at each position (A_stop = 0 off the top-K)
        return (adv_NK * cand_NK).sum(1) - p_N * adv_NK.sum(1)

    after = {policy: opd.eos_policy(A_NK, stop_N, policy, is_stop_cand_NK=cand_NK)
             for policy in ("raw", "neutral", "neutral-all")}
    push_N, leak_N, n_tok = push(A_NK), leak_NK.any(1), len(A_NK)
    return {"tokens": n_tok, "samples": len(samples), "stopped": int(stop_N.sum()),
            **{f"reward_{k.replace('-', '_')}": v.mean().item() for k, v in after.items()},
            **{f"push_{k.replace('-', '_')}": push(v).sum().item() / n_tok for k, v in after.items()},
            "leak": (A_NK * leak_NK).sum().item() / A_NK.numel(),
            "push_terminal": push_N[stop_N].sum().item() / n_tok, "push_leak": push_N[leak_N].sum().item() / n_tok,
            "leak_positions": {"n": int(leak_N.sum()),            # means over no position are NaN
                               "p_stop": p_N[leak_N].mean().item() if leak_N.any() else math.nan,
                               "delta_stop": d_N[leak_N].mean().item() if leak_N.any() else math.nan}}


def main() -> None:
    from transformers import AutoModelForCausalLM
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=Path, required=True, help="a run's gates/anatomy_cross_samples.jsonl")
    p.add_argument("--world", type=Path, action="append", required=True, help="a toy world folder (repeatable)")
    p.add_argument("--student", default="student")
    p.add_argument("--pre", default="pre")
    p.add_argument("--post", default="post-nostop", help="the π_post model of the world (default: the collapse arm's)")
    p.add_argument("--topk", type=int, default=16)
    p.add_argument("--leak", action="store_true", help="also neutral_leak: what --eos-policy neutral leaves of the "
                   "stop token's price, on every sample (stopped or not)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    samples = read_jsonl(args.samples)
    out = []
    for world in args.world:
        missing = [n for n in (args.student, args.pre, args.post) if not (world / "models" / n).is_dir()]
        if missing:
            raise SystemExit(f"{world}: no models/{missing[0]} in it; give a toy world folder (its models/ has "
                             f"{args.student}, {args.pre} and {args.post})")
        student, pre, post = (AutoModelForCausalLM.from_pretrained(world / "models" / n, dtype=torch.float32).eval()
                              for n in (args.student, args.pre, args.post))
        r = stop_and_go_on(student, pre, post, samples, args.topk)
        print(f"{world}: {r['n']} stopped samples | Δ(stop) {r['stop']:+.2f} | go_on {r['go_on']:+.2f} | "
              f"π_pre's mass on the other candidates {r['pre_go_on']:.3f}")
        for lv, b in r["by_level"].items():
            print(f"    level {lv}: {b['n']} | Δ(stop) {b['stop']:+.2f} | go_on {b['go_on']:+.2f} | π_pre's mass "
                  f"{b['pre_go_on']:.3f}")
        out.append({"world": str(world), **{k: v for k, v in r.items() if k != "rows"}, "rows": r["rows"]})
        if args.leak:
            from transformers import AutoTokenizer
            stop_id = AutoTokenizer.from_pretrained(world / "models" / args.student).eos_token_id
            leak = neutral_leak(student, pre, post, samples, stop_id, args.topk)
            lp = leak["leak_positions"]
            print(f"    step-1 weighted reward: raw {leak['reward_raw']:+.4f} | neutral {leak['reward_neutral']:+.4f} "
                  f"| neutral-all {leak['reward_neutral_all']:+.4f} | neutral's leak {leak['leak']:+.4f}")
            print(f"    push on the stop logit per token: where it stopped {leak['push_terminal']:+.4f} | elsewhere "
                  f"{leak['push_leak']:+.4f} ({lp['n']} of {leak['tokens']} positions; there p(stop) "
                  f"{lp['p_stop']:.3f}, Δ(stop) {lp['delta_stop']:+.2f})")
            out[-1]["neutral_leak"] = leak
    if args.out:
        args.out.write_text(json.dumps({"samples": str(args.samples), "post": args.post, "worlds": out}, indent=1))


if __name__ == "__main__":
    main()
