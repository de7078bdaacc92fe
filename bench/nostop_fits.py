"""bench/nostop_fits.py — which fit of π_pre's log-probs makes the collapse arm's π_post price going on at 0.

The arm's π_post-nostop (lib/toy/builder.py, DESIGN.md §10) is π_pre with its stop token's mass moved to another end
token and its log-prob capped at −40 (builder.moved_stop_targets). How it is fitted to those targets decides what
the student earns for going on where it stops: its other candidates there hold 1e-5 of π_pre's mass or less, so
their log-probs are the tail of the distribution, which a fit of the distribution alone leaves where the optimiser
happens to leave it. This probe fits each variant the way the build fits post-nostop (builder.sft_examples'
responses, the build's SFT settings, lr NOSTOP_LR; RNG and data the build's), from the cached world's π_pre, in this
process (the CPU math pinned by lib.cpu_repro, one thread), and prints for each bench/stop_delta.py's Δ(stop) and
go_on, overall and by level, on a run's frozen student samples:

    recipe      the build's loss (builder.moved_stop_loss): cross-entropy of the targets + squared log-prob error
                where the target is above −20 + squared errors of the two moved entries. Its sha256 is printed
                beside the world's post-nostop: the same bytes where this CPU built the world
    ce          the cross-entropy of the targets alone (a fit of the distribution: the tail left to the optimiser)
    mse-all     the squared log-prob error over the whole vocabulary, with the two moved entries (it spends itself on
                log-probs near −30 and leaves the head off: the student's own tokens charged ≈ −2)

    python bench/nostop_fits.py --samples runs/toy/gates/anatomy_cross_samples.jsonl --out /tmp/fits
    OPD_CACHE=<a cache holding another vendor's world, copied> python bench/nostop_fits.py --samples … --out …

About 80 s a variant on one core of the Zen 4 EPYC. Writes OUT/nostop_fits.json and OUT/post-<variant>/.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from lib import cpu_repro  # noqa: E402

cpu_repro.pin()              # the CPU math of the build's workers, before torch is imported

VARIANTS = ("recipe", "ce", "mse-all")


def variant_loss(name: str, reference, stop_id: int, other_id: int):
    """train_sft's loss_fn for one variant (the recipe: the build's own)."""
    import torch
    from lib.toy import builder
    from lib.train.sft import IGNORE
    if name == "recipe":
        return builder.moved_stop_loss(reference, stop_id, other_id)

    def loss(logits_BTV, batch):
        sup_BT = batch["labels"][:, 1:] != IGNORE
        with torch.no_grad():
            ref_BTV = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            t_NV = builder.moved_stop_targets(ref_BTV[:, :-1].float().log_softmax(-1)[sup_BT], stop_id, other_id)
        lp_NV = logits_BTV[:, :-1].float().log_softmax(-1)[sup_BT]
        if name == "ce":
            return -(t_NV.exp() * lp_NV).sum(-1).mean()
        err_NV = lp_NV - t_NV
        return (err_NV ** 2).mean() + (err_NV[:, stop_id] ** 2 + err_NV[:, other_id] ** 2).mean()
    return loss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=Path, required=True, help="a run's gates/anatomy_cross_samples.jsonl")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    a = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from lib.artifacts import read_jsonl, sha256_file
    from lib.toy import builder, task
    from lib.train.sft import train_sft
    from stop_delta import stop_and_go_on
    torch.set_num_threads(1)
    world = builder.build()
    tok = AutoTokenizer.from_pretrained(world / "models" / "pre")
    load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()   # noqa: E731
    pre, student = load(world / "models" / "pre"), load(world / "models" / "student")
    samples = read_jsonl(a.samples)
    stop_id, other_id = tok.eos_token_id, tok.convert_tokens_to_ids(task.OTHER_STOP)
    lr = builder.RECIPES["post-nostop"][5]
    results = {"world": str(world), "samples": str(a.samples),
               "world_post_nostop_sha256": sha256_file(world / "models" / "post-nostop" / "model.safetensors")}
    for name in a.variants:
        examples = builder.sft_examples("post-nostop", tok)
        post, reference = copy.deepcopy(pre).train(), copy.deepcopy(pre).eval().requires_grad_(False)
        train_sft(post, examples, lr=lr, seed=builder.SEED, pad_id=tok.pad_token_id, **builder.SFT,
                  loss_fn=variant_loss(name, reference, stop_id, other_id), log=lambda line: print(f"{name}: {line}"))
        post.eval()
        post.save_pretrained(a.out / f"post-{name}")
        r = stop_and_go_on(student, pre, post, samples)
        results[name] = {"stop": r["stop"], "go_on": r["go_on"], "n": r["n"],
                         "by_level": r["by_level"], "sha256": sha256_file(a.out / f"post-{name}" / "model.safetensors")}
        print(f"{name}: {r['n']} stopped samples | Δ(stop) {r['stop']:+.2f} | go_on {r['go_on']:+.2f} | by level "
              + " ".join(f"{lv}: {b['go_on']:+.2f}" for lv, b in r["by_level"].items())
              + f" | sha256 {results[name]['sha256'][:8]}… (the world's post-nostop "
              f"{results['world_post_nostop_sha256'][:8]}…)")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "nostop_fits.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
