"""The registry of DESIGN.md §2: models, pairs, students, benchmarks, protocols. Declared once, here; pure tables.

A model is a Hugging Face causal LM named by an alias. It lives on the hub (`hub_id` at a pinned 40-hex
`revision`), in the toy world (`toy`), or in a folder of the campaign (`run_path`, e.g. the RAFT teacher that
07_raft.py writes). lib/models.py turns any model name (alias, hub id, local folder) into a folder; lib/benchmarks.py
does the same for benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass

EVAL_MAX_NEW_TOKENS = 31_744          # DESIGN.md §4: evaluation cap unless a model's context forbids it
TRAIN_PROMPT_CAP, TRAIN_RESPONSE_CAP = 768, 3_328


@dataclass(frozen=True)
class Model:
    alias: str
    hub_id: str | None = None
    revision: str | None = None       # the pinned hub commit (40 hex); every hub model has one
    toy: str | None = None            # name inside the toy world (lib/toy/builder.py)
    run_path: str | None = None       # folder relative to the campaign directory
    folder: str | None = None         # a local model folder (a pair file's [models] table, lib/pairs.py)
    shape: tuple | None = None        # (real shape, seed): random weights for speed runs (lib/shapes.py)
    eval_max_new_tokens: int = EVAL_MAX_NEW_TOKENS
    thinking: bool = False            # Qwen3: chat template rendered with enable_thinking=True
    template_note: str = ""           # known quirk of its chat template (DESIGN.md §3), reported by 01_gates


MODELS = {m.alias: m for m in [
    Model("qwen2.5-math-1.5b", "Qwen/Qwen2.5-Math-1.5B", "4a83ca6e4526a4f2da3aa259ec36c259f66b2ab2",
          eval_max_new_tokens=3_200,
          template_note="injects the system prompt 'Please reason step by step, and put your final answer within "
                        "\\boxed{}.'"),
    Model("qwen2.5-1.5b-instruct", "Qwen/Qwen2.5-1.5B-Instruct", "989aa7980e4cf806f80c7fef2b1adb7bc71aa306",
          template_note="injects 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.'"),
    Model("openthinker3-1.5b", "open-thoughts/OpenThinker3-1.5B", "0ee90a38b29bfac8b8b005da9ae32c59e2943785"),
    Model("r1-distill-qwen-1.5b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
          "ad9f0ae0864d7fbcd1cd905e3c6c5b069cc8b562",
          template_note="force-opens <think> after the assistant header; special ids 151643-151649 differ from Qwen's"),
    Model("justrl-deepseek-1.5b", "hbx/JustRL-DeepSeek-1.5B", "0637e4096c789c67f9eecbe8355e0bdeddede1c2",
          template_note="DeepSeek template: force-opens <think>"),
    Model("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct", "a09a35458c702b33eeacc393d103063234e8bc28",
          template_note="injects 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.'"),
    Model("qwen3-4b", "Qwen/Qwen3-4B", "1cfa9a7208912126459214e8b04321603b3df60c", thinking=True,
          template_note="no injected system prompt; thinking mode on"),
    Model("qwen3-1.7b", "Qwen/Qwen3-1.7B", "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e", thinking=True,
          template_note="no injected system prompt; thinking mode on"),
    # the source campaign's published RAFT teacher (SFT of Qwen2.5-1.5B-Instruct on its own verified samples)
    Model("raft-deepmath-1.5b", "cmpatino/Qwen2.5-1.5B-Instruct-DeepMath-RAFT",
          "d46294c2a827c8558547c8ebac96a49b7a8410bb",
          template_note="π_pre's template, copied byte-identical"),
    Model("raft", run_path="raft/model", template_note="π_pre's template, copied byte-identical"),
    # the toy world (DESIGN.md §10): built locally by lib/toy/builder.py, cached by a hash of its code and seed
    Model("toy-pre", toy="pre", eval_max_new_tokens=96),
    Model("toy-post", toy="post", eval_max_new_tokens=96),
    Model("toy-post-offsupport", toy="post-offsupport", eval_max_new_tokens=96),
    Model("toy-student", toy="student", eval_max_new_tokens=96),
    Model("toy-post-nostop", toy="post-nostop", eval_max_new_tokens=96),      # the collapse arm's π_post
    # real shapes with random weights: the GPU speed runs (no checkpoint can reach the GPU machine)
    Model("shape-1.5b-pre", shape=("qwen2.5-1.5b", 1)),
    Model("shape-1.5b-post", shape=("qwen2.5-1.5b", 2)),
    Model("shape-1.5b-student", shape=("qwen2.5-1.5b", 3)),
    Model("shape-7b-student", shape=("qwen2.5-7b", 3)),
]}


@dataclass(frozen=True)
class Student:
    model: str
    max_prompt_len: int = TRAIN_PROMPT_CAP
    max_response_len: int = TRAIN_RESPONSE_CAP
    teacher: str | None = None        # classic OPD's default single teacher


STUDENTS = {
    "qwen2.5-7b-instruct": Student("qwen2.5-7b-instruct"),
    "qwen3-4b": Student("qwen3-4b", max_response_len=4_096),
    "qwen3-1.7b": Student("qwen3-1.7b", max_response_len=4_096),
    "r1-distill-1.5b": Student("r1-distill-qwen-1.5b", max_response_len=7_168, max_prompt_len=1_024,
                               teacher="justrl-deepseek-1.5b"),
    "shape-1.5b": Student("shape-1.5b-student", teacher="shape-1.5b-post"),
    "shape-7b": Student("shape-7b-student", teacher="shape-1.5b-post"),
    "toy": Student("toy-student", max_prompt_len=96, max_response_len=48, teacher="toy-post"),
    # the collapse arm's caps: room to run away (a step-1 mean of ~22 tokens doubles below the cap, so the runaway
    # marker can fire before the clip ratio does, and a loop reaches it within a few answer lines; DESIGN.md §10)
    "toy-long": Student("toy-student", max_prompt_len=96, max_response_len=64, teacher="toy-post"),
}


@dataclass(frozen=True)
class Benchmark:
    name: str
    file: str                          # file name inside the data directory
    hub: str | None = None             # owner/name of a hub dataset, for users with hub access
    split: str = "test"
    revision: str | None = None        # the pinned hub commit (40 hex); every hub dataset has one
    id_field: str = "id"               # the hub copy's id column


BENCHMARKS = {b.name: b for b in [
    Benchmark("aime24", "aime24.jsonl", "HuggingFaceH4/aime_2024", "train", "2fe88a2f1091d5048c0f36abc874fb997b3dd99a"),
    Benchmark("aime25", "aime25.jsonl", "math-ai/aime25", "test", "563bb8404243c5f09de6ec262f2db674fe5bce9b"),
    Benchmark("math500", "math500.jsonl", "HuggingFaceH4/MATH-500", "test", "ff5b20257d8185524591543f8ff5993951537bb8",
              id_field="unique_id"),
    Benchmark("math_train", "math_train.jsonl"),
    Benchmark("toy", "toy_test.jsonl"),                 # held-out toy problems, `level` 1-4
    Benchmark("toy_train", "toy_train.jsonl"),           # toy training prompts, disjoint from `toy`
]}


@dataclass(frozen=True)
class Protocol:
    n: int                            # samples per problem; seeds 0..n-1
    temperature: float
    top_p: float


PROTOCOLS = {
    "sample32": Protocol(32, 0.7, 0.95),   # AIME
    "sample4": Protocol(4, 0.7, 0.95),     # MATH-500 primary
    "curve8": Protocol(8, 0.7, 0.95),      # training-curve units
    "greedy": Protocol(1, 0.0, 1.0),       # MATH-500 secondary
}


@dataclass(frozen=True)
class Pair:
    pi_pre: str
    pi_post: str
    student: str
    train_data: str
    evals: tuple = (("aime24", "sample32"), ("aime25", "sample32"), ("math500", "sample4"), ("math500", "greedy"))
    gate_benchmark: str = "aime24"     # the teacher-gain gate of DESIGN.md §6
    note: str = ""


_TOY_EVALS = (("toy", "sample4"), ("toy", "greedy"))
PAIRS = {
    "r1distill": Pair("qwen2.5-math-1.5b", "r1-distill-qwen-1.5b", "qwen2.5-7b-instruct", "math_train",
                      note="π_pre context 4,096; π_post's special ids 151643-151649 differ from Qwen's"),
    "openthinker": Pair("qwen2.5-1.5b-instruct", "openthinker3-1.5b", "qwen2.5-7b-instruct", "math_train",
                        note="same lineage as the student; both 32,768 context"),
    "raft": Pair("qwen2.5-1.5b-instruct", "raft", "qwen2.5-7b-instruct", "math_train", note="on-support shift"),
    "justrl": Pair("r1-distill-qwen-1.5b", "justrl-deepseek-1.5b", "qwen2.5-7b-instruct", "math_train",
                   note="the RL pair"),
    "toy": Pair("toy-pre", "toy-post", "toy", "toy_train", _TOY_EVALS, "toy", note="CPU default"),
    # RAFT's base is the toy student, not toy π_pre: π_pre puts a median −56 nats on a right level-3 solution, so its
    # own samples hold no right answer it does not already write; the student's slips and level 3 are on its support
    # (DESIGN.md §9)
    "toy-raft": Pair("toy-student", "raft", "toy", "toy_train", _TOY_EVALS, "toy", note="RAFT of the toy student"),
    "toy-offsupport": Pair("toy-pre", "toy-post-offsupport", "toy", "toy_train", _TOY_EVALS, "toy",
                           note="negative control: π_post never emits the stop token"),
    "toy-collapse": Pair("toy-pre", "toy-post-nostop", "toy-long", "toy_train", _TOY_EVALS, "toy",
                         note="collapse arm: π_post is π_pre with its stop token unlearned "
                              "(moved to another end token)"),
    "shape-1.5b": Pair("shape-1.5b-pre", "shape-1.5b-post", "shape-1.5b", "math_train",
                       note="random weights, real Qwen2.5-1.5B shapes: GPU speed runs only"),
}


# --- hypotheses (DESIGN.md §6): what a campaign on a pair claims, as clauses 05_stats evaluates on its records ---

@dataclass(frozen=True)
class Clause:
    """One testable clause. `kind` is what it measures (lib/report/hypotheses.py evaluates each kind):

        teacher_gate      the pair's teacher-gain gate passes
        no_collapse       no run of the selected conditions has clip ratio > 0.5 through `through_step` (None: the
                          runs' planned last step, which every run must have reached)
        held              every run of the selected conditions kept its clip ratio below 0.1 through its planned
                          last step (what "a fix prevents the collapse" means here; no through_step)
        collapse          every run of the selected conditions has a collapse onset
        reward_negative   every run's weighted reward mean is negative at step 1 (the source's collapse premise)
        gain              a pooled gain whose CI excludes 0 (Holm-adjusted) on at least `min_benchmarks` benchmarks

    `where` selects conditions by their settings, as (setting, value) pairs (e.g. (("reward", "opd"),)); a `gain`
    clause must select exactly one condition."""
    kind: str
    where: tuple = ()
    through_step: int | None = None
    min_benchmarks: int = 1


@dataclass(frozen=True)
class Hypothesis:
    name: str
    pair: str
    claim: str
    clauses: tuple
    source: str = ""                  # the source campaign's hypothesis it restates, if any


_OPD, _SAMPLED, _TOPK = (("reward", "opd"),), (("reward", "delta-sampled"),), (("reward", "delta-topk"),)
HYPOTHESES = (
    Hypothesis("toy-premise", "toy", "the toy shift π_post − π_pre carries a held-out capability",
               (Clause("teacher_gate"),), "the teacher-gain gate"),
    Hypothesis("toy-opd", "toy", "classic OPD from π_post trains without collapse and transfers a gain",
               (Clause("no_collapse", _OPD), Clause("gain", _OPD))),
    Hypothesis("toy-topk", "toy", "Direct-OPD (weighted top-K shift reward) on the on-support toy shift trains without "
               "collapse and transfers a gain", (Clause("no_collapse", _TOPK), Clause("gain", _TOPK)), "H1"),
    Hypothesis("toy-sampled", "toy", "Direct-OPD (sampled-token shift reward) on the on-support toy shift trains "
               "without collapse and transfers a gain", (Clause("no_collapse", _SAMPLED), Clause("gain", _SAMPLED)),
               "H1"),
    Hypothesis("toy-sink", "toy", "the source's termination sink reproduces on the main toy pair: the step-1 shift "
               "reward is negative and the run collapses",
               (Clause("reward_negative", _TOPK), Clause("collapse", _TOPK)), "the collapse of H1-H5"),
)

# The collapse arm (pair toy-collapse, DESIGN.md §10): one condition per fix, each a setting of campaign.sh's collapse
# runs (delta-topk at TOY_COLLAPSE_LR; the low-lr condition at TOY_COLLAPSE_LOW_LR). Each selection names every
# setting that tells its condition from the others.
TOY_COLLAPSE_LR, TOY_COLLAPSE_LOW_LR = 7.5e-4, 1.5e-4
_TOPK_RAW_EOS = (("reward", "delta-topk"), ("stop_on_collapse", False))
_RAW = _TOPK_RAW_EOS + (("eos_policy", "raw"), ("reward_center", False), ("kl_mode", "adaptive"),
                        ("lr", TOY_COLLAPSE_LR))
_NEUTRAL = _TOPK_RAW_EOS + (("eos_policy", "neutral"), ("reward_center", False), ("kl_mode", "adaptive"),
                            ("lr", TOY_COLLAPSE_LR))
_NEUTRAL_ALL = _TOPK_RAW_EOS + (("eos_policy", "neutral-all"), ("reward_center", False), ("kl_mode", "adaptive"),
                                ("lr", TOY_COLLAPSE_LR))
_CLAMP = _TOPK_RAW_EOS + (("eos_policy", "clamp"), ("reward_center", False), ("kl_mode", "adaptive"),
                          ("lr", TOY_COLLAPSE_LR))
_CENTER = _TOPK_RAW_EOS + (("eos_policy", "raw"), ("reward_center", True), ("kl_mode", "adaptive"),
                           ("lr", TOY_COLLAPSE_LR))
_KL_MAX = _TOPK_RAW_EOS + (("eos_policy", "raw"), ("reward_center", False), ("kl_mode", "constant"),
                           ("kl_coef", 2.5), ("lr", TOY_COLLAPSE_LR))
_LOW_LR = _TOPK_RAW_EOS + (("eos_policy", "raw"), ("reward_center", False), ("kl_mode", "adaptive"),
                           ("lr", TOY_COLLAPSE_LOW_LR))
HYPOTHESES += (
    Hypothesis("toy-collapse-sink", "toy-collapse", "a π_post that has unlearned the stop token makes the step-1 "
               "shift reward negative on the student's own tokens, and Direct-OPD collapses into non-termination",
               (Clause("reward_negative", _RAW), Clause("collapse", _RAW)), "the termination sink (source §5, §17)"),
    Hypothesis("toy-collapse-neutral", "toy-collapse", "a zero reward at the terminal stop token "
               "(--eos-policy neutral) prevents the collapse", (Clause("held", _NEUTRAL),),
               "fix: a termination-aware reward (source §16)"),
    Hypothesis("toy-collapse-neutral-all", "toy-collapse", "a zero reward for the stop token wherever it is a "
               "top-K candidate (--eos-policy neutral-all, ours) prevents the collapse",
               (Clause("held", _NEUTRAL_ALL),), "fix: a termination-aware reward (source §16), for top-K"),
    Hypothesis("toy-collapse-clamp", "toy-collapse", "a stop-token reward floored at 0 (--eos-policy clamp) prevents "
               "the collapse", (Clause("held", _CLAMP),), "fix: a termination-aware reward (source §16)"),
    Hypothesis("toy-collapse-center", "toy-collapse", "a batch-mean reward shifted to ≥ 0 (--reward-center) prevents "
               "the collapse", (Clause("held", _CENTER),),
               "fix: a shift whose mean is positive on the student (source §16)"),
    Hypothesis("toy-collapse-kl-max", "toy-collapse", "the KL coefficient pinned at its maximum 2.5 prevents the "
               "collapse", (Clause("held", _KL_MAX),), "H3 (source: refuted by condition C)"),
    Hypothesis("toy-collapse-low-lr", "toy-collapse", "a 5× lower learning rate (run twice as long) prevents the "
               "collapse",
               (Clause("held", _LOW_LR),),
               "H5's no-collapse clause (source: refuted, B-lowlr collapsed at step 48)"),
)
