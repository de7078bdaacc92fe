"""bench/neutral_leak.py — why `--eos-policy neutral` lets the collapse arm collapse where `neutral-all` holds it.

The two policies differ in one thing (lib/train/opd.eos_policy): where the student did NOT stop but the stop token
is one of its top-K candidates, neutral keeps that candidate's delta-topk advantage (w_stop · Δ(stop), Δ(stop) ≈ −40
under the arm's π_post) and neutral-all zeroes it. This probe measures that leak on fresh samples of a student at
each checkpoint of a run (and of the initial student): the step's weighted reward under raw, neutral and
neutral-all, the leak itself, and the push it gives the stop token's logit (bench/stop_delta.neutral_leak has the
definitions). Run it on a run saved every step, for instance

    python 03_opd_train.py --run-dir /tmp/leak --run-name collapse-neutral --seed 42 --eos-policy neutral \\
        --save-every 1 --steps 8 <the flags campaign.sh gives the collapse arm>
    python bench/neutral_leak.py --run /tmp/leak/train/collapse-neutral --out /tmp/leak/neutral.json

Samples: `--prompts` evenly spaced training prompts × `--samples` each, drawn at the training settings (T = 1, the
pair's caps) by 01_gates' sampler (lib/gates/anatomy.draw_rollouts), seeded as the anatomy seeds them, so every
checkpoint is sampled with the same seeds; π_pre and π_post are the toy-collapse pair's, from the toy world cache.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from lib.cpu_repro import pin  # noqa: E402

pin()                       # the toy world's pinned CPU math, set before torch is imported (lib/cpu_repro.py)
import torch  # noqa: E402
from stop_delta import neutral_leak  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a 03 run folder (its step_* checkpoints are probed)")
    p.add_argument("--pair", default="toy-collapse")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--topk", type=int, default=16)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from transformers import AutoTokenizer

    from lib import benchmarks
    from lib.gates import anatomy
    from lib.registry import PAIRS, STUDENTS
    pair = PAIRS[args.pair]
    caps = STUDENTS[pair.student]
    cfg = anatomy.Settings(max_prompt_len=caps.max_prompt_len, max_response_len=caps.max_response_len,
                           prompts=args.prompts, samples=args.samples)
    roles = anatomy.load_roles(pair, pair.student, None)
    cpu = torch.device("cpu")
    pre, post = (anatomy.load_lm(roles[r]["resolved"].path, cpu) for r in ("pi_pre", "pi_post"))
    train_rows = benchmarks.load_benchmark(pair.train_data, require_answer=False)[0]
    ckpts = sorted(args.run.glob("step_*/"), key=lambda d: int(d.name.split("_")[1]))
    if not ckpts:
        raise SystemExit(f"{args.run}: no step_* checkpoint in it; give a 03 run folder (--save-every 1 saves each step)")
    out = []
    for step, path in [(0, roles["student"]["resolved"].path)] + [(int(c.name.split("_")[1]), c) for c in ckpts]:
        tok = AutoTokenizer.from_pretrained(path)
        m = dict(roles["student"], resolved=SimpleNamespace(path=path), tok=tok)
        rows = anatomy.draw_rollouts(m, train_rows, cfg, cpu)
        r = neutral_leak(anatomy.load_lm(path, cpu), pre, post, rows, tok.eos_token_id, args.topk)
        lp = r["leak_positions"]
        print(f"step {step:>3} | stopped {r['stopped']:>3}/{r['samples']} | {r['tokens']} tokens | reward raw "
              f"{r['reward_raw']:+.4f} neutral {r['reward_neutral']:+.4f} neutral-all {r['reward_neutral_all']:+.4f}"
              f" | push on the stop logit: raw {r['push_raw']:+.4f} (where it stopped {r['push_terminal']:+.4f}, "
              f"elsewhere {r['push_leak']:+.4f}) neutral {r['push_neutral']:+.4f} neutral-all "
              f"{r['push_neutral_all']:+.4f} | {lp['n']} positions with the stop a candidate, p(stop) "
              f"{lp['p_stop']:.3f}", flush=True)
        out.append({"step": step, "checkpoint": str(path), **r})
    if args.out:
        args.out.write_text(json.dumps({"run": str(args.run), "pair": args.pair, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
