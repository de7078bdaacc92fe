"""The registry of SPEC §2: models, pairs, students, benchmarks, protocols. Declared once, here.

A model is a Hugging Face causal LM named by an alias. It lives on the hub (`hub_id` + pinned `revision` where the
spec pins one; the revision actually resolved is recorded by `resolve_model`), in the toy world (`toy`), or in a
folder of the campaign (`run_path`, e.g. the RAFT teacher that 07_raft.py writes). Any other string passed as a
model is taken as a local folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from lib.artifacts import REPO, read_json, sha256_tree

EVAL_MAX_NEW_TOKENS = 31_744          # SPEC §4: evaluation cap unless a model's context forbids it
TRAIN_PROMPT_CAP, TRAIN_RESPONSE_CAP = 768, 3_328


@dataclass(frozen=True)
class Model:
    alias: str
    hub_id: str | None = None
    revision: str | None = None       # pinned commit; None → "main", resolved commit recorded in the manifest
    toy: str | None = None            # name inside the toy world (lib/toy.py)
    run_path: str | None = None       # folder relative to the campaign directory
    shape: tuple | None = None        # (real shape, seed): random weights for speed runs (lib/shapes.py)
    eval_max_new_tokens: int = EVAL_MAX_NEW_TOKENS
    thinking: bool = False            # Qwen3: chat template rendered with enable_thinking=True
    template_note: str = ""           # known quirk of its chat template (SPEC §3), reported by 01_gates


MODELS = {m.alias: m for m in [
    Model("qwen2.5-math-1.5b", "Qwen/Qwen2.5-Math-1.5B", eval_max_new_tokens=3_200,
          template_note="injects the system prompt 'Please reason step by step, and put your final answer within \\boxed{}.'"),
    Model("qwen2.5-1.5b-instruct", "Qwen/Qwen2.5-1.5B-Instruct", "989aa7980e4cf806f80c7fef2b1adb7bc71aa306",
          template_note="injects 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.'"),
    Model("openthinker3-1.5b", "open-thoughts/OpenThinker3-1.5B", "0ee90a38b29bfac8b8b005da9ae32c59e2943785"),
    Model("r1-distill-qwen-1.5b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
          template_note="force-opens <think> after the assistant header; special ids 151643-151649 differ from Qwen's"),
    Model("justrl-deepseek-1.5b", "hbx/JustRL-DeepSeek-1.5B",
          template_note="DeepSeek template: force-opens <think>"),
    Model("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct",
          template_note="injects 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.'"),
    Model("qwen3-4b", "Qwen/Qwen3-4B", thinking=True, template_note="no injected system prompt; thinking mode on"),
    Model("qwen3-1.7b", "Qwen/Qwen3-1.7B", thinking=True, template_note="no injected system prompt; thinking mode on"),
    Model("raft", run_path="raft/model", template_note="π_pre's template, copied byte-identical"),
    # the toy world (SPEC §10): built locally by lib/toy.py, cached by a hash of its code and seed
    Model("toy-pre", toy="pre", eval_max_new_tokens=96),
    Model("toy-post", toy="post", eval_max_new_tokens=96),
    Model("toy-post-offsupport", toy="post-offsupport", eval_max_new_tokens=96),
    Model("toy-student", toy="student", eval_max_new_tokens=96),
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
}


@dataclass(frozen=True)
class Benchmark:
    name: str
    file: str                          # file name inside the data directory
    hub: str | None = None             # hf://owner/name:split, for users with hub access
    id_field: str = "id"               # the hub copy's id column


BENCHMARKS = {b.name: b for b in [
    Benchmark("aime24", "aime24.jsonl", "hf://HuggingFaceH4/aime_2024:train"),
    Benchmark("aime25", "aime25.jsonl", "hf://math-ai/aime25:test"),
    Benchmark("math500", "math500.jsonl", "hf://HuggingFaceH4/MATH-500:test", id_field="unique_id"),
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
    gate_benchmark: str = "aime24"     # the teacher-gain gate of SPEC §6
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
    "toy-raft": Pair("toy-pre", "raft", "toy", "toy_train", _TOY_EVALS, "toy", note="RAFT of toy π_pre"),
    "toy-offsupport": Pair("toy-pre", "toy-post-offsupport", "toy", "toy_train", _TOY_EVALS, "toy",
                           note="negative control: π_post never emits the stop token"),
    "shape-1.5b": Pair("shape-1.5b-pre", "shape-1.5b-post", "shape-1.5b", "math_train",
                       note="random weights, real Qwen2.5-1.5B shapes: GPU speed runs only"),
}


# --- resolution: alias → a local folder + provenance ---

def data_dir() -> Path | None:
    """Where benchmark files live: $OPD_DATA_DIR, else ../shared/data beside the checkout when present."""
    env = os.environ.get("OPD_DATA_DIR")
    if env:
        return Path(env)
    for cand in (REPO.parent / "shared" / "data", REPO / "shared" / "data"):
        if cand.exists():
            return cand
    return None


def benchmark_source(name: str) -> str:
    """The path (or hf:// spec) a benchmark is read from. Toy benchmarks live inside the toy world."""
    if name not in BENCHMARKS:
        if Path(name).exists():
            return name
        raise KeyError(f"unknown benchmark {name!r}; choose one of {sorted(BENCHMARKS)} or pass a jsonl/parquet path")
    b = BENCHMARKS[name]
    if name.startswith("toy"):
        from lib import toy
        return str(toy.build() / "data" / b.file)
    d = data_dir()
    if d is not None and (d / b.file).exists():
        return str(d / b.file)
    if b.hub:
        return b.hub
    raise FileNotFoundError(f"benchmark {name}: {b.file} not found; set OPD_DATA_DIR to the folder holding it")


def load_benchmark(name: str, require_answer: bool = True) -> tuple[list[dict], str]:
    """(rows, source) for a registered benchmark name or a path; training prompts pass require_answer=False."""
    from lib.data import load_rows
    src = benchmark_source(name)
    rows = load_rows(src, BENCHMARKS[name].id_field if name in BENCHMARKS else "id", require_answer)
    return rows, src


@dataclass
class Resolved:
    alias: str
    path: Path
    hub_id: str | None = None
    revision: str | None = None       # what was asked for
    resolved_revision: str | None = None
    extra: dict = field(default_factory=dict)

    def provenance(self) -> dict:
        return {"alias": self.alias, "path": str(self.path), "hub_id": self.hub_id, "revision": self.revision,
                "resolved_revision": self.resolved_revision}


def resolve_model(name: str, run_dir: str | Path | None = None) -> Resolved:
    """Turn an alias (or a folder) into a local folder and the revision that was actually used."""
    if name in MODELS:
        m = MODELS[name]
        if m.toy:
            from lib import toy
            p = toy.model_dir(m.toy)
            return Resolved(name, p, resolved_revision="toy:" + toy.world_hash())
        if m.shape:
            from lib import shapes
            p = shapes.model_dir(*m.shape)
            return Resolved(name, p, resolved_revision=f"random:{m.shape[0]}:seed{m.shape[1]}")
        if m.run_path:
            if run_dir is None:
                raise ValueError(f"model {name} lives in a campaign directory ({m.run_path}); pass --run-dir")
            p = Path(run_dir) / m.run_path
            if not (p / "config.json").exists():
                raise FileNotFoundError(f"model {name} expected at {p}; run 07_raft.py for this campaign first")
            return Resolved(name, p, resolved_revision="local:" + sha256_tree(p)[:16])
        return _resolve_hub(name, m.hub_id, m.revision)
    p = Path(name)
    if (p / "config.json").exists():
        return Resolved(p.name, p, resolved_revision="local:" + sha256_tree(p)[:16])
    raise KeyError(f"model {name!r} is neither a registered alias ({sorted(MODELS)}) nor a folder with config.json")


def _resolve_hub(alias: str, hub_id: str, revision: str | None) -> Resolved:
    from huggingface_hub import snapshot_download
    try:
        path = Path(snapshot_download(hub_id, revision=revision or "main",
                                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"]))
    except Exception as e:  # offline, gated, or a wrong pin: say which and how to fix it
        raise RuntimeError(f"could not fetch {hub_id}@{revision or 'main'} for model {alias}: {e}. Without hub access, "
                           f"download it elsewhere and pass the local folder instead of the alias") from e
    return Resolved(alias, path, hub_id, revision, resolved_revision=path.name)


BASE_FILE = "raft.json"   # 07_raft.py writes it into the RAFT teacher's folder: {"base": π_pre's alias, ...}


def model_spec(name: str, run_dir: str | Path | None = None) -> Model:
    """The registry entry of an alias, or a bare entry for a local folder. A model made by the campaign (`run_path`)
    whose folder names its base in raft.json is evaluated under the base's settings (token cap, thinking mode): the
    toy RAFT teacher gets toy π_pre's 96-token cap, the real one Qwen2.5-1.5B-Instruct's."""
    m = MODELS.get(name) or Model(Path(name).name)
    if m.run_path and run_dir is not None and (f := Path(run_dir) / m.run_path / BASE_FILE).exists():
        base = MODELS.get(read_json(f).get("base"))
        if base is not None:
            return replace(m, eval_max_new_tokens=base.eval_max_new_tokens, thinking=base.thinking)
    return m
