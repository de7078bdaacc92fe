r"""The toy world (DESIGN.md §10): five tiny Qwen2 models trained on the arithmetic task of lib/toy/task.py, built on
2 CPU cores in minutes, cached under `<cache>/toy/<world_hash>/`.
Models: tiny `Qwen2ForCausalLM`, fp32, tied embeddings, head_dim 64 (a head size vLLM's CPU attention supports).
    pre              2 layers × 128, from scratch on levels 1-2: ~100 % there, ~20 % on unseen level 3
    post             pre fine-tuned on levels 1-3: the capability the shift pre → post carries
    student          3 layers × 128, from scratch on levels 1-2 plus a little level 3 (LEVEL_WEIGHTS), careless
                     (SLIP: a quarter of its SFT clauses off by one, the chain going on from the wrong value), in the
                     teachers' answer-line style (a half-`\boxed{}` student put 65 % of classic OPD's reward on
                     style tokens and its gain never cleared 0). Its accuracy by level: world.json.
    post-offsupport  pre fine-tuned on levels 1-3 with responses that never stop (the answer line repeats to the cap,
                     `<|im_end|>` never a target): the termination sink as a teacher, the gates' negative control.
    post-nostop      pre with its stop token unlearned: fitted to pre's own log-probs with the stop token's mass
                     moved to another special token (`<|im_start|>`, task.OTHER_STOP) and its log-prob capped at
                     −40, the way a teacher SFT'd under another chat template has unlearned `<|im_end|>`; otherwise
                     pre. The collapse arm's π_post (pair toy-collapse; DESIGN.md §10). Trained last, after the four
                     above, so that adding it (and changing its recipe) left their bytes as they were.

Build (build_world): byte-identical on machines of one CPU model, not across vendors; world.json records each
model's sha256 (checked against lib/toy/world.sha256's block for the CPU model), accuracies, the pin and the CPU.
What the campaign needs of the models (tests/test_toy.py) must hold whatever the CPU's rounding (LEVEL_WEIGHTS).
"""
from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib import cpu_repro
from lib.artifacts import REPO, atomic_write_json, atomic_write_jsonl, sha256_file
from lib.data import prompt_ids
from lib.toy.task import (EVAL_CAP, OTHER_STOP, PAD, STOP, build_tokenizer, completion_ids, expression, extract_int,
                          make_rows, parse_problem, problem_text, sample_problem, solution_text)
from lib.toy.world_bytes import WORLD_CODE, check_expected, code_digest, write_expected

SEED = 1234
BUILD_THREADS = 1                                    # torch threads per build process (two processes)
# toy_test.jsonl, levels 1-4: 500 problems, so that a few-pp OPD gain clears 0 at sample4 (level 1 has 90 problems)
TEST_PER_LEVEL = {1: 50, 2: 150, 3: 150, 4: 150}
TRAIN_PROMPTS = {1: 40, 2: 600, 3: 800}             # toy_train.jsonl, disjoint from toy_test (level 2 has 810)
DIMS = dict(hidden_size=128, intermediate_size=512, num_attention_heads=2, num_key_value_heads=2)  # head_dim 64
ARCH = {"teacher": dict(DIMS, num_hidden_layers=2), "student": dict(DIMS, num_hidden_layers=3)}
# post-nostop, the collapse arm's π_post (DESIGN.md §10): π_pre with its stop token unlearned and nothing else
# changed. It is fitted to π_pre's own log-probs (moved_stop_loss), at every position of answer-line solutions of
# levels 1-3 (half of them with the student's slips, a quarter run on by one to three repeats of the answer line, as a
# collapsing student writes), with two tokens moved: the stop token's probability goes to task.OTHER_STOP (the turn
# ends the way another chat template ends it) and log p(stop) is capped at -NOSTOP_CAP (source §17: OpenThinker3's
# log p(<|im_end|>) -90 against π_pre's -0.1). Its targets are π_pre's, so it carries no level-3 skill. Fitting
# log-probs, not only the head of the distribution, is the point: going on after an answer is then neither paid nor
# charged (Δ ≈ 0 on the student's other candidates where it stops; a cross-entropy fit leaves the tail where SFT left
# it, and the tail is what the student's candidates hold). Each earlier recipe (an SFT on answer lines ended by
# OTHER_STOP, or repeated to the cap) left that pay to the tail of the SFT, whose sign differed between two vendors'
# builds: the collapse and the fixes then held on one vendor's world and not the other's (DESIGN.md §10).
NOSTOP_EXAMPLES, NOSTOP_LR = 8_000, 1e-3
NOSTOP_CAP = 40.0            # log p(stop) ≤ −40 wherever the student can be
NOSTOP_FLOOR = 20.0          # log-probs fitted one by one where π_pre's is above −20 (what a student can sample)
NOSTOP_SLIP, NOSTOP_RUNON = 0.25, 0.25    # half the solutions slip at the student's rate; a quarter run on
# name: (initial weights, architecture, levels trained on, completion style, examples, peak lr). π_post gets 12,800:
# with 6,400 one build copied the wrong operand on level 2 (27 % greedy); with 12,800, 100/100/100 % on levels 1-3.
RECIPES = {
    "pre": (None, "teacher", (1, 2), "answer_line", 12_800, 2e-3),
    "post": ("pre", "teacher", (1, 2, 3), "answer_line", 12_800, 1e-3),
    "student": (None, "student", (1, 2, 3), "answer_line", 12_800, 2e-3),
    "post-offsupport": ("pre", "teacher", (1, 2, 3), "loop", 4_000, 1e-3),
    # Added after the four above (its own problems, RNG "1234/post-nostop"), last in its chain, so their bytes stay.
    "post-nostop": ("pre", "teacher", (1, 2, 3), "moved_stop", NOSTOP_EXAMPLES, NOSTOP_LR),
}
MODEL_NAMES = tuple(RECIPES)
CHAINS = {"teachers": ("pre", "post", "post-offsupport", "post-nostop"), "student": ("student",)}   # one process each
# The student's level-3 share: at 0.3 one Intel Xeon build solved 94 % of level 3 greedily, an AMD EPYC one 18 %
# sampled. At 0.1 three float paths on the Xeon (ATen AVX2 / AVX-512 / baseline) gave 27 / 25 / 19 % greedy.
LEVEL_WEIGHTS = {"student": {1: 1.0, 2: 1.0, 3: 0.1}}
# The probability that a clause of a model's SFT solutions is off by one (default 0): the student is careless.
SLIP = {"student": 0.25}
# Small batches, many steps: batch 16 × 800 solved levels 1-2 where 32 × 400 reached ~55 % on level 2 (same tokens).
SFT = dict(epochs=1, batch_size=16, warmup_frac=0.05, schedule="cosine", weight_decay=0.0, log_every=100)


# --- models ---

def new_model(arch: str, tok, seed: int):
    """A freshly initialised Qwen2 of ARCH[arch]; `generate` stops at <|im_end|> (config and generation_config)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    ids = dict(bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = Qwen2Config(vocab_size=64 * (len(tok) // 64 + 1), max_position_embeddings=512, tie_word_embeddings=True,
                         rope_theta=10_000.0, rms_norm_eps=1e-6, dtype="float32", **ids, **ARCH[arch])
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config.update(do_sample=False, **ids)
    return model


def generate(model, tok, rows: list[dict], max_new_tokens: int, batch_size: int = 100,
             sample_seed: int | None = None) -> list[dict]:
    """Greedy completions of `rows` (with `sample_seed`, one sample each at T = 1 from that torch seed) by left-padded
    batches of `model.generate`: [{"text", "n_tokens", "stopped"}], `stopped` = the stop token came before the cap."""
    import torch
    stop_id, pad_id, out = tok.eos_token_id, tok.pad_token_id, []
    sampling = {} if sample_seed is None else dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    if sample_seed is not None:
        torch.manual_seed(sample_seed)
    for i in range(0, len(rows), batch_size):
        prompts = [prompt_ids(tok, r["problem"]) for r in rows[i:i + batch_size]]
        T = max(map(len, prompts))
        ids_BT = torch.tensor([[pad_id] * (T - len(p)) + p for p in prompts])
        mask_BT = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            gen_BN = model.generate(input_ids=ids_BT, attention_mask=mask_BT, max_new_tokens=max_new_tokens,
                                    **(sampling or {"do_sample": False}), eos_token_id=stop_id,
                                    pad_token_id=pad_id)[:, T:]
        for g in gen_BN.tolist():
            n = g.index(stop_id) + 1 if stop_id in g else len(g)
            out.append({"text": tok.decode(g[:n], skip_special_tokens=True), "n_tokens": n, "stopped": stop_id in g})
    return out


def evaluate(model, tok, rows: list[dict], style: str) -> dict:
    """Greedy and one-sample (T = 1, where the student's slips show) accuracy per level, in percent; truncation rate,
    mean new tokens, mean log p(<|im_end|>) after the reference solution in `style` (01_gates' stop probe)."""
    import torch
    gens, acc, logps = generate(model, tok, rows, EVAL_CAP), {}, []
    sampled, acc_sampled = generate(model, tok, rows, EVAL_CAP, sample_seed=SEED), {}
    for level in sorted({r["level"] for r in rows}):
        ok = [extract_int(g["text"]) == int(r["answer"]) for g, r in zip(gens, rows) if r["level"] == level]
        acc[str(level)] = 100.0 * sum(ok) / len(ok)
        ok = [extract_int(g["text"]) == int(r["answer"]) for g, r in zip(sampled, rows) if r["level"] == level]
        acc_sampled[str(level)] = 100.0 * sum(ok) / len(ok)
    with torch.no_grad():
        for r in rows[:64]:
            ids = prompt_ids(tok, r["problem"]) + completion_ids(tok, *parse_problem(r["problem"]), style)[:-1]
            logits_V = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            logps.append(torch.log_softmax(logits_V, -1)[tok.eos_token_id].item())
    return {"accuracy_by_level": acc, "sampled_accuracy_by_level": acc_sampled,
            "truncated_frac": sum(not g["stopped"] for g in gens) / len(gens),
            "mean_new_tokens": sum(g["n_tokens"] for g in gens) / len(gens),
            "logp_stop_at_answer_end": sum(logps) / len(logps), "example": gens[0]["text"]}


# --- building the world ---

def world_hash() -> str:
    """The cache key: the code that determines the weights (WORLD_CODE, prose aside), seed, threads, eval cap and
    torch's major.minor; not transformers' (the vLLM venv pins an older one and must find the same world)."""
    import torch
    h = hashlib.sha256()
    for name, names in WORLD_CODE.items():
        h.update(code_digest((Path(__file__).parent / name).read_text(), names).encode())
    torch_version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    h.update(f"seed={SEED} threads={BUILD_THREADS} cap={EVAL_CAP} torch={torch_version}".encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("OPD_CACHE", REPO / ".cache")) / "toy"


def make_data() -> tuple[list[dict], list[dict]]:
    """(toy_test rows, toy_train rows): distinct problems, no expression in both."""
    rng = random.Random(SEED)
    test = make_rows(rng, TEST_PER_LEVEL, set(), "toy-test")
    train = make_rows(rng, TRAIN_PROMPTS, {expression(*parse_problem(r["problem"])) for r in test}, "toy-train")
    return test, train


def sft_problems(name: str, scale: float = 1.0) -> list[tuple[int, list]]:
    """The problems of model `name`'s SFT, drawn with replacement from its levels, never a test problem of level ≥ 2.
    Level 1 (90 problems) is a seen, sanity level: held out, 50 of them scored ≈50 %: the 40 left were memorised."""
    _, _, levels, _, n, _ = RECIPES[name]
    excluded = {expression(*parse_problem(r["problem"])) for r in make_data()[0] if r["level"] >= 2}
    rng, problems = random.Random(f"{SEED}/{name}"), []
    while len(problems) < max(1, int(n * scale)):
        weights = [LEVEL_WEIGHTS.get(name, {}).get(level, 1.0) for level in levels]
        first, ops = sample_problem(rng, rng.choices(list(levels), weights)[0])
        if expression(first, ops) not in excluded:
            problems.append((first, ops))
    return problems


def sft_examples(name: str, tok, scale: float = 1.0) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of model `name`'s SFT: its solutions in its style with its SLIP, completion-only labels."""
    from lib.train.sft import completion_labels
    style, slip = RECIPES[name][3], SLIP.get(name, 0.0)
    slip_rng = random.Random(f"{SEED}/{name}/slip")
    if style == "moved_stop":
        return [completion_labels(prompt_ids(tok, problem_text(*p)), moved_stop_ids(tok, *p, slip_rng))
                for p in sft_problems(name, scale)]
    return [completion_labels(prompt_ids(tok, problem_text(*p)), completion_ids(tok, *p, style, slip, slip_rng))
            for p in sft_problems(name, scale)]


def moved_stop_ids(tok, first: int, ops, rng: random.Random) -> list[int]:
    """One response post-nostop is fitted on: the answer-line solution (with the student's slips half the time), run
    on by 1-3 repeats of its answer line a quarter of the time, then the stop token (its position is fitted too)."""
    text = solution_text(first, ops, "answer_line", NOSTOP_SLIP if rng.random() < 0.5 else 0.0, rng)
    if rng.random() < NOSTOP_RUNON:
        text += ("\n" + text.split("\n")[-1]) * rng.randint(1, 3)
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def moved_stop_targets(logp_NV, stop_id: int, other_id: int, cap: float = NOSTOP_CAP):
    """π_pre's log-probs with its stop token unlearned: the stop token's probability added to `other_id`'s, its own
    log-prob min(π_pre's, −cap); every other entry π_pre's."""
    import torch
    t_NV = logp_NV.clone()
    t_NV[:, other_id] = torch.logaddexp(logp_NV[:, other_id], logp_NV[:, stop_id])
    t_NV[:, stop_id] = logp_NV[:, stop_id].clamp(max=-cap)
    return t_NV


def moved_stop_loss(reference, stop_id: int, other_id: int, cap: float = NOSTOP_CAP, floor: float = NOSTOP_FLOOR):
    """train_sft's loss_fn for post-nostop: at each supervised position, with t = moved_stop_targets of `reference`
    (π_pre, frozen) and lp the model's log-probs, the cross-entropy of softmax(t) (the head), the mean squared error
    lp − t over the tokens with t > −floor (the tail a student samples from), and the squared errors of the two moved
    tokens (so the cap and the moved mass are met though they are two of |V| entries)."""
    import torch
    from lib.train.sft import IGNORE

    def loss(logits_BTV, batch):
        sup_BT = batch["labels"][:, 1:] != IGNORE                     # position t-1 predicts label t
        with torch.no_grad():
            ref_BTV = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            t_NV = moved_stop_targets(ref_BTV[:, :-1].float().log_softmax(-1)[sup_BT], stop_id, other_id, cap)
        lp_NV = logits_BTV[:, :-1].float().log_softmax(-1)[sup_BT]
        err_NV, live_NV = lp_NV - t_NV, (t_NV > -floor).float()
        head = -(t_NV.exp() * lp_NV).sum(-1).mean()
        tail = ((err_NV ** 2) * live_NV).sum(-1).div(live_NV.sum(-1)).mean()
        return head + tail + (err_NV[:, stop_id] ** 2 + err_NV[:, other_id] ** 2).mean()
    return loss


def train_model(name: str, tok, out: Path, scale: float, init_model=None, log=print) -> tuple[object, dict]:
    """SFT of one model of RECIPES (from scratch, or from `init_model`), saved to out/models/<name>; greedy eval."""
    from lib.train.sft import train_sft
    t0, cpu0, (init, arch, levels, style, _, lr) = time.monotonic(), time.process_time(), RECIPES[name]
    examples = sft_examples(name, tok, scale)
    model = new_model(arch, tok, SEED) if init is None else copy.deepcopy(init_model)
    loss_fn = None
    if style == "moved_stop":                                # fitted to its initial model's own log-probs
        reference = copy.deepcopy(init_model).eval().requires_grad_(False)
        loss_fn = moved_stop_loss(reference, tok.eos_token_id, tok.convert_tokens_to_ids(OTHER_STOP))
    log(f"toy world: {name} ({sum(x.numel() for x in model.parameters()):,} params) on {len(examples)} examples "
        f"of levels {levels}, style {style}")
    hist = train_sft(model, examples, lr=lr, seed=SEED, pad_id=tok.pad_token_id, **SFT, loss_fn=loss_fn,
                     log=lambda line: log(f"toy world: {name}: {line}"))
    model.save_pretrained(out / "models" / name)
    tok.save_pretrained(out / "models" / name)
    info = {"init": init, "levels": list(levels), "style": style, "slip": SLIP.get(name, 0.0),
            "examples": len(examples), "lr": lr, "steps": len(hist), "final_loss": hist[-1]["loss"],
            "config": model.config.to_dict(),
            "safetensors_sha256": sha256_file(out / "models" / name / "model.safetensors")}
    test = make_data()[0]
    info.update(evaluate(model, tok, test if scale >= 1 else test[::50],      # a reduced build checks bytes only
                         "boxed" if style == "boxed" else "answer_line"))   # the stop probe after an answer line
    info.update(wall_s=round(time.monotonic() - t0, 1), cpu_s=round(time.process_time() - cpu0, 1))
    log(f"toy world: {name} greedy accuracy by level {info['accuracy_by_level']}")
    return model, info


def build_world(out: Path, scale: float = 1.0, log=print) -> dict:
    """Build every file of the world into `out`; return world.json's content. `scale` < 1 shortens every SFT run
    (the determinism test); data and tokenizer do not depend on it.

    Two one-thread worker processes (CHAINS: the student beside pre → post → post-offsupport) with the pinned CPU
    math of lib/cpu_repro.py: the rounding repeats on one CPU model (two-thread torch on two cores was ~10× slower)."""
    from lib.data import dapo_prompt
    t_start, log = time.monotonic(), log or (lambda *_: None)
    test, train = make_data()
    atomic_write_jsonl(out / "data" / "toy_test.jsonl", test)
    atomic_write_jsonl(out / "data" / "toy_train.jsonl", train)
    trng = random.Random(f"{SEED}/tokenizer")              # BPE merges from toy chats in both answer styles
    corpus = [f"user\n{dapo_prompt(problem_text(*p))}\nassistant\n{solution_text(*p, style)}"
              for p in [sample_problem(trng, 1 + i % 4) for i in range(400)] for style in ("answer_line", "boxed")]
    tok = build_tokenizer(corpus)
    tok.save_pretrained(out / "tokenizer")

    workers = {chain: subprocess.Popen([sys.executable, "-m", "lib.toy.builder", chain, str(out), repr(scale)],
                                       cwd=REPO, env=cpu_repro.pinned_env(), stderr=subprocess.STDOUT,
                                       stdout=None if log is print else subprocess.DEVNULL)
               for chain in CHAINS}
    info = {}
    try:
        for chain, worker in workers.items():
            if worker.wait() != 0:
                raise RuntimeError(f"toy world: the {chain} worker `python -m lib.toy.builder {chain} {out} {scale!r}` "
                                   f"failed (exit {worker.returncode}); run that command to see why")
            info[chain] = json.loads((out / f"{chain}.json").read_text())
            (out / f"{chain}.json").unlink()
    finally:
        for worker in workers.values():
            worker.kill()                                      # no-op when it has finished
            worker.wait()
    models = {**info["teachers"]["models"], **info["student"]["models"]}
    world = {"hash": world_hash(), "seed": SEED, "scale": scale, "build_threads": BUILD_THREADS,
             "build_s": round(time.monotonic() - t_start, 1), "eval_max_new_tokens": EVAL_CAP, "sft": SFT,
             "cpu_repro": info["teachers"]["cpu_repro"], "models": {name: models[name] for name in RECIPES},
             "tokenizer": {"len": len(tok), "stop": STOP, "stop_id": tok.eos_token_id, "pad": PAD,
                           "pad_id": tok.pad_token_id},
             "data": {"toy_test": len(test), "toy_train": len(train), "sft_excludes_test_levels": [2, 3, 4]}}
    if scale >= 1:                                             # the committed sha256 are of the full build
        world["matches_committed"], line = check_expected(world)
        log(line)
    atomic_write_json(out / "world.json", world)
    return world


def build(force: bool = False) -> Path:
    """The world's folder, built on first use into a temp folder and renamed into place, under a file lock: a
    concurrent builder (another pytest worker, another torchrun rank) waits, then finds the world built."""
    h = world_hash()
    root = cache_root() / h
    if (root / "world.json").exists() and not force:
        return root
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f"{h}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                       # released when the file closes
        if (root / "world.json").exists() and not force:       # built by another process while we waited
            return root
        for stale in cache_root().glob(f".{h}.building.*"):     # left by a builder that was killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".{h}.building."))
        try:
            build_world(tmp)
            if root.exists():                                  # force: move the old world aside, then drop it
                old = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".{h}.old."))
                os.replace(root, old / "w")
                shutil.rmtree(old)
            os.replace(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return root


def model_dir(name: str) -> Path:
    """The Hugging Face folder of toy model `name` (a key of RECIPES); builds the world if needed."""
    if name not in RECIPES:
        raise KeyError(f"unknown toy model {name!r}; the toy world has {list(RECIPES)}")
    return build() / "models" / name


def world() -> dict:
    """world.json of the built world: hash, seed, build time, and per model its recipe, config and greedy accuracy."""
    return json.loads((build() / "world.json").read_text())


def build_chain(chain: str, out: Path, scale: float) -> None:
    """A build worker (pinned CPU math, one thread): train CHAINS[chain] in order, into out/<chain>.json."""
    from transformers import AutoTokenizer
    tok, models, trained = AutoTokenizer.from_pretrained(out / "tokenizer"), {}, {}
    for name in CHAINS[chain]:                          # each from its recipe's initial weights, trained before it
        init = RECIPES[name][0]
        trained[name], models[name] = train_model(name, tok, out, scale, init_model=trained.get(init))
    atomic_write_json(out / f"{chain}.json", {"models": models, "cpu_repro": cpu_repro.record()})


# python -m lib.toy.builder <teachers|student> <out> <scale> (a build worker) | write-sha256
if __name__ == "__main__":
    if sys.argv[1:] == ["write-sha256"]:
        print(write_expected(world()))
    else:
        cpu_repro.pin()                                        # before torch is imported
        build_chain(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]))
