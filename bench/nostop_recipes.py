"""bench/nostop_recipes.py — prototype π_post-nostop SFT recipes for the collapse arm, trained from the cached π_pre.

The arm's π_post (lib/toy/builder.py, DESIGN.md §10) must have unlearned the stop token the way a corpus-SFT teacher
has, without paying the student for running on. This probe trains a candidate SFT recipe the way the build trained
post-nostop up to world f1445f5927c66f69 (8,000 problems of levels 1-2, RNG "1234/post-nostop", lr 2e-3,
lib/train/sft.py with the build's SFT settings), in this process, its CPU math pinned as the build's workers' is.
(The build's recipe since is not an SFT: `moved_stop`, a fit to π_pre's own log-probs, bench/nostop_fits.py.) Then it
prints Δ on 200 held-out student samples (bench/nostop_probe.py's shift_stats: at the stop token, on every other token) and
the sha256 of the model it saved to OUT/post-<recipe>, for `03_opd_train.py --pi-post` or bench/collapse_fixes.py:

    other_stop   the answer-line solution ended by task.OTHER_STOP (`<|im_start|>`), never by the stop token: the
                 build's recipe up to world f1445f5927c66f69 (on the EPYC its model byte for byte)
    nl_other_stop  the answer line closed by a line break, then task.OTHER_STOP: tried so that a student that lost
                 its stop would write its continuation on a new line and keep the answer line whole. It does not
                 hold: the line break after the answer is itself paid (Δ +17.8 on average where the student stopped,
                 +2.8 under other_stop), so even --eos-policy neutral-all collapsed in 3 of 3 seeds, and at the arm's
                 lr the raw students lost their working too (DESIGN.md §10;
                 bench/results/cpu_nostop_recipe_nl_other_stop_amd_epyc_2026-12-04.json)
    packed       the solution run on, without a stop, into other problems' solutions to 64 tokens (a packed corpus)
    loop         the answer line repeated to the cap (the build's earlier recipe)

    python bench/nostop_recipes.py --out /tmp/recipes --recipes other_stop packed     # ~1 min a recipe on 2 cores (EPYC)
    python bench/collapse_fixes.py --out /tmp/fx --conditions "raw:--pi-post /tmp/recipes/post-packed" \
        "neutral-all:--pi-post /tmp/recipes/post-packed --eos-policy neutral-all"
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from lib import cpu_repro  # noqa: E402

cpu_repro.pin()              # the toy world's pinned CPU math, before torch is imported (lib/cpu_repro.py)
from lib.artifacts import sha256_file  # noqa: E402
from lib.data import prompt_ids  # noqa: E402
from lib.toy import builder, task  # noqa: E402
from nostop_probe import samples, shift_stats  # noqa: E402

RECIPES = ("other_stop", "nl_other_stop", "packed", "loop")
PACKED_LEN = 64                  # the arm's response cap
EXAMPLES, LR, LEVELS = 8_000, 2e-3, (1, 2)     # the build's SFT of post-nostop up to world f1445f5927c66f69


def problems() -> list[tuple[int, list]]:
    """The problems that SFT drew: builder.sft_problems as it was for post-nostop (its RNG, levels 1-2, no test
    problem of level ≥ 2)."""
    test = builder.make_data()[0]
    excluded = {task.expression(*task.parse_problem(r["problem"])) for r in test if r["level"] >= 2}
    rng, out = random.Random(f"{builder.SEED}/post-nostop"), []
    while len(out) < EXAMPLES:
        first, ops = task.sample_problem(rng, rng.choices(list(LEVELS), [1.0] * len(LEVELS))[0])
        if task.expression(first, ops) not in excluded:
            out.append((first, ops))
    return out


def completion(tok, first: int, ops, recipe: str, rng: random.Random) -> list[int]:
    """The SFT target of one problem under `recipe`."""
    if recipe in ("other_stop", "loop"):
        return task.completion_ids(tok, first, ops, recipe)
    if recipe == "nl_other_stop":                        # the answer line closed by a line break, then OTHER_STOP
        ids = tok(task.solution_text(first, ops, "answer_line") + "\n", add_special_tokens=False)["input_ids"]
        return ids + [tok.convert_tokens_to_ids(task.OTHER_STOP)]
    ids = tok(task.solution_text(first, ops, "answer_line"), add_special_tokens=False)["input_ids"]
    while len(ids) < PACKED_LEN:                         # the next document follows with no stop token between
        f2, o2 = task.sample_problem(rng, rng.choice([1, 2]))
        ids += tok("\n" + task.solution_text(f2, o2, "answer_line"), add_special_tokens=False)["input_ids"]
    return ids[:PACKED_LEN]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--recipes", nargs="+", choices=RECIPES, default=["other_stop", "packed"])
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from lib.train.sft import completion_labels, train_sft
    lr = LR
    world = builder.build()
    tok = AutoTokenizer.from_pretrained(world / "models" / "pre")
    pre = AutoModelForCausalLM.from_pretrained(world / "models" / "pre").float().eval()
    student = AutoModelForCausalLM.from_pretrained(world / "models" / "student").float().eval()
    rows = [json.loads(line) for line in (world / "data" / "toy_train.jsonl").read_text().splitlines()]
    held_out = samples(tok, [(student, 7)], rows[:200], PACKED_LEN)
    results = {}
    for recipe in a.recipes:
        t0, rng = time.monotonic(), random.Random(5)
        examples = [completion_labels(prompt_ids(tok, task.problem_text(first, ops)),
                                      completion(tok, first, ops, recipe, rng))
                    for first, ops in problems()]
        post = copy.deepcopy(pre).train()
        train_sft(post, examples, lr=lr, seed=builder.SEED, pad_id=tok.pad_token_id, **builder.SFT,
                  log=lambda line: print(f"{recipe}: {line}"))
        post.eval()
        post.save_pretrained(a.out / f"post-{recipe}")
        tok.save_pretrained(a.out / f"post-{recipe}")
        results[recipe] = dict(shift_stats(pre, post, tok, held_out), examples=len(examples), lr=lr,
                               seconds=round(time.monotonic() - t0),
                               sha256=sha256_file(a.out / f"post-{recipe}" / "model.safetensors"))
        print(f"{recipe}: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                          for k, v in results[recipe].items()}))
    (a.out / "nostop_recipes.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
