"""A campaign's pair: a registry name, a TOML file, or either with π_pre / π_post replaced by flags (DESIGN.md §2).

Every stage takes `--pair VALUE` and, where it loads the pair's teachers, `--pi-pre NAME` / `--pi-post NAME`:
  - a registered pair's name (`openthinker`, `toy`, …): lib/registry.py's entry;
  - the path of a TOML file, so that a new pair needs no edit under lib/. Its keys (all but `pi_pre`, `pi_post` and
    `student` optional):

        name = "smol"                           # default: the file's stem; names the run folder runs/<name>
        pi_pre = "smollm2"                      # any model name: alias, hub id[@revision], folder, or a [models] key
        pi_post = "raft"                        # `raft`: the RAFT teacher 07_raft.py makes in the campaign folder
        student = "smollm2"                     # a registered student or any model name
        teacher = "raft"                        # classic OPD's default teacher (default: none, pass --teacher)
        max_prompt_len = 256                    # the student's training caps (default: 768 / 3,328, DESIGN.md §7)
        max_response_len = 256
        train_data = "math_train"               # a benchmark name (registered or declared below) or a .jsonl path
        evals = [["math500-16", "greedy"]]      # [benchmark, protocol] units of 02_baselines and the gains
        gate_benchmark = "math500-16"           # the teacher-gain gate's benchmark (default: the first eval's)
        note = "…"

        [models.smollm2]                        # a model of this pair, by alias: a folder or a hub id
        folder = "../.cache/models/smollm2-135m-instruct"   # relative paths are read from the file's folder
        eval_max_new_tokens = 384               # its evaluation cap (default 31,744), not a deviation
        thinking = false                        # chat template rendered with enable_thinking=True

        [benchmarks.math500-16]                 # a benchmark of this pair: the N evenly spaced rows of a source
        source = "math500"                      # a registered benchmark or a .jsonl path
        limit_problems = 16

    Unknown keys are refused by name. A declared model or benchmark is known, under its alias, to every module of
    the process that loaded the file (lib/models.py, lib/benchmarks.py read `declared_model` / `declared_benchmark`),
    so 04_eval.py needs the same `--pair FILE` to evaluate one of them.
  - `--pi-pre` / `--pi-post` replace the pair's teachers. The result is another pair: it is named
    `<pair>-custom-<8 hex>` after the hash of what it holds, so that its runs never mix with the named pair's.

A pair's identity is `sha256`: of the file's bytes for a file, of its canonical JSON otherwise. Each stage records
it (`record()`) in its manifest; 03 refuses to resume under another, and 05 refuses artifacts recorded under another.
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lib.errors import UserError
from lib.registry import BENCHMARKS, MODELS, PAIRS, PROTOCOLS, STUDENTS, Model, Pair, Student

PAIR_KEYS = {"name", "pi_pre", "pi_post", "student", "teacher", "max_prompt_len", "max_response_len", "train_data",
             "evals", "gate_benchmark", "note", "models", "benchmarks"}
MODEL_KEYS = {"folder", "hub_id", "revision", "eval_max_new_tokens", "thinking", "template_note"}
BENCHMARK_KEYS = {"source", "limit_problems"}


@dataclass(frozen=True)
class Slice:
    """A benchmark declared by a pair file: the `limit_problems` evenly spaced rows of `source` (all when None)."""
    name: str
    source: str
    limit_problems: int | None = None


@dataclass(frozen=True)
class LoadedPair:
    name: str
    pair: Pair
    student: Student
    sha256: str
    file: str | None = None                  # the TOML file it was read from; None for a registered pair
    models: dict = field(default_factory=dict)
    benchmarks: dict = field(default_factory=dict)

    def record(self) -> dict:
        """What a stage writes into its manifest about the pair it ran for."""
        return {"pair": self.name, "pair_sha256": self.sha256, "pair_file": self.file}


# the models and benchmarks declared by the pair file this process loaded (one pair per process)
_DECLARED_MODELS: dict[str, Model] = {}
_DECLARED_BENCHMARKS: dict[str, Slice] = {}


def declared_model(name: str) -> Model | None:
    return _DECLARED_MODELS.get(name)


def declared_benchmark(name: str) -> Slice | None:
    return _DECLARED_BENCHMARKS.get(name)


def canonical_sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=list).encode()).hexdigest()


def is_pair_file(value: str) -> bool:
    return value.endswith(".toml") or "/" in value


def load(value: str, pi_pre: str | None = None, pi_post: str | None = None) -> LoadedPair:
    """The pair named by `--pair` (a registered name or a TOML file), with `--pi-pre` / `--pi-post` applied."""
    if is_pair_file(value):
        lp = _load_file(Path(value))
    elif value in PAIRS:
        p = PAIRS[value]
        student = STUDENTS.get(p.student) or Student(p.student)
        lp = LoadedPair(value, p, student, canonical_sha256({"pair": asdict(p), "student": asdict(student)}))
    else:
        raise UserError(f"--pair {value!r}: not a registered pair ({', '.join(sorted(PAIRS))}) and not a .toml file; "
                        f"pass one of those names or the path of a pair file (lib/pairs.py documents its keys)")
    _DECLARED_MODELS.clear()
    _DECLARED_MODELS.update(lp.models)
    _DECLARED_BENCHMARKS.clear()
    _DECLARED_BENCHMARKS.update(lp.benchmarks)
    if pi_pre is None and pi_post is None:
        return lp
    pair = replace(lp.pair, pi_pre=pi_pre or lp.pair.pi_pre, pi_post=pi_post or lp.pair.pi_post)
    sha = canonical_sha256({"base": lp.sha256, "pi_pre": pair.pi_pre, "pi_post": pair.pi_post})
    return replace(lp, name=f"{lp.name}-custom-{sha[:8]}", pair=pair, sha256=sha)


def _load_file(path: Path) -> LoadedPair:
    if not path.is_file():
        raise UserError(f"pair file {path} not found: pass the path of a .toml pair file or a registered pair's name")
    raw = path.read_bytes()
    try:
        d = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"pair file {path}: not valid TOML ({e}); fix the file") from None
    where = f"pair file {path}"
    _unknown(d, PAIR_KEYS, where)
    here = path.resolve().parent

    def rel(value: str) -> str:
        """A relative path that exists beside the file is read from there; anything else is a name."""
        beside = here / value
        return str(beside.resolve()) if not Path(value).is_absolute() and beside.exists() else value

    models = {alias: _model(alias, spec, f"{where} [models.{alias}]", rel)
              for alias, spec in _table(d, "models", where).items()}
    benches = {name: _slice(name, spec, f"{where} [benchmarks.{name}]", rel)
               for name, spec in _table(d, "benchmarks", where).items()}
    for key in ("pi_pre", "pi_post", "student"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise UserError(f"{where}: `{key}` must be a model name (an alias, hub id, folder or [models] key)")
    name = _str(d, "name", where, path.stem)
    from lib.cli import name_error
    if why := name_error(name):
        raise UserError(f"{where}: name {why}")
    evals = d.get("evals", [["math500", "sample4"], ["math500", "greedy"]])
    if not isinstance(evals, list) or not evals or not all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in evals):
        raise UserError(f"{where}: `evals` must be a non-empty list of [benchmark, protocol] pairs of strings")
    known = set(BENCHMARKS) | set(benches)
    for bench, proto in evals:
        if proto not in PROTOCOLS:
            raise UserError(f"{where}: evals protocol {proto!r} is not one of {sorted(PROTOCOLS)}")
        if bench not in known and not Path(rel(bench)).exists():
            raise UserError(f"{where}: evals benchmark {bench!r} is not registered ({', '.join(sorted(BENCHMARKS))}), "
                            f"not declared under [benchmarks] and not a file")
    evals = tuple((b if b in known else rel(b), p) for b, p in evals)
    gate = _str(d, "gate_benchmark", where, evals[0][0])
    if gate not in {b for b, _ in evals}:
        raise UserError(f"{where}: gate_benchmark {gate!r} is not one of the evals' benchmarks")
    train = _str(d, "train_data", where, "math_train")
    train = train if train in known else rel(train)
    pre, post, student_name = (d[k] if d[k] in models else rel(d[k]) for k in ("pi_pre", "pi_post", "student"))
    base = STUDENTS.get(student_name)
    student = Student(base.model if base else student_name,
                      _int(d, "max_prompt_len", where, base.max_prompt_len if base else None),
                      _int(d, "max_response_len", where, base.max_response_len if base else None),
                      _str(d, "teacher", where, base.teacher if base else None))
    student = replace(student, **{k: v for k, v in asdict(Student("")).items() if getattr(student, k) is None})
    pair = Pair(pre, post, student_name, train, evals, gate, _str(d, "note", where, ""))
    return LoadedPair(name, pair, student, hashlib.sha256(raw).hexdigest(), str(path), models, benches)


def _unknown(d: dict, allowed: set, where: str) -> None:
    if bad := sorted(set(d) - allowed):
        raise UserError(f"{where}: unknown key {bad[0]!r}; the keys are {', '.join(sorted(allowed))}")


def _table(d: dict, key: str, where: str) -> dict:
    t = d.get(key, {})
    if not isinstance(t, dict) or not all(isinstance(v, dict) for v in t.values()):
        raise UserError(f"{where}: [{key}] must hold tables, one per name ([{key}.NAME])")
    return t


def _str(d: dict, key: str, where: str, default):
    v = d.get(key, default)
    if v is not None and not isinstance(v, str):
        raise UserError(f"{where}: `{key}` must be a string, not {v!r}")
    return v


def _int(d: dict, key: str, where: str, default):
    v = d.get(key, default)
    if v is not None and (type(v) is not int or v < 1):
        raise UserError(f"{where}: `{key}` must be a positive integer, not {v!r}")
    return v


def _model(alias: str, spec: dict, where: str, rel) -> Model:
    _unknown(spec, MODEL_KEYS, where)
    if alias in MODELS:
        raise UserError(f"{where}: {alias!r} is a registered model's alias; give the pair's model another name")
    if ("folder" in spec) == ("hub_id" in spec):
        raise UserError(f"{where}: give exactly one of `folder` (a model folder) or `hub_id` (owner/name)")
    if "hub_id" in spec and not isinstance(spec.get("revision"), str):
        raise UserError(f"{where}: a hub model needs `revision`, the 40-hex commit it is pinned to")
    cap = _int(spec, "eval_max_new_tokens", where, Model("").eval_max_new_tokens)
    thinking = spec.get("thinking", False)
    if not isinstance(thinking, bool):
        raise UserError(f"{where}: `thinking` must be true or false")
    folder = rel(_str(spec, "folder", where, None)) if "folder" in spec else None
    return Model(alias, spec.get("hub_id"), spec.get("revision"), eval_max_new_tokens=cap, thinking=thinking,
                 template_note=_str(spec, "template_note", where, ""), folder=folder)


def _slice(name: str, spec: dict, where: str, rel) -> Slice:
    _unknown(spec, BENCHMARK_KEYS, where)
    if name in BENCHMARKS:
        raise UserError(f"{where}: {name!r} is a registered benchmark's name; give the slice another name")
    source = _str(spec, "source", where, None)
    if source is None:
        raise UserError(f"{where}: `source` must name a registered benchmark or a .jsonl path")
    return Slice(name, source if source in BENCHMARKS else rel(source), _int(spec, "limit_problems", where, None))


# --- the flags every stage shares ---

def add_arguments(add, teachers: bool = True, default: str | None = "toy") -> None:
    """`--pair` (and, where the stage loads the teachers, `--pi-pre` / `--pi-post`) on a parser's `add_argument`."""
    add("--pair", default=default, metavar="NAME|FILE",
        help=f"teacher pair: a registered name ({', '.join(sorted(PAIRS))}) or a .toml pair file (lib/pairs.py; "
             f"DESIGN.md §2)")
    if teachers:
        add("--pi-pre", default=None, metavar="MODEL", help="replace the pair's π_pre (any model name); the pair is "
                                                            "then named <pair>-custom-<hash>")
        add("--pi-post", default=None, metavar="MODEL", help="replace the pair's π_post (any model name); the pair "
                                                             "is then named <pair>-custom-<hash>")


def from_args(args) -> LoadedPair:
    return load(args.pair, getattr(args, "pi_pre", None), getattr(args, "pi_post", None))
