"""The toy world's bytes: what determines them (the code that the cache key hashes) and the committed sha256 of the
five models (lib/toy/world.sha256) that every build is checked against (lib/toy/builder.py builds; DESIGN.md §10).

The cache key hashes each module's syntax tree without docstrings or comments, and of lib/data.py only what the
build calls: an edit of prose, or of data.py's row validation, keeps the world (and its cache) as it is, while any
change of code the weights depend on builds a new one. This file determines nothing of the weights.

Where a module lives is not code the weights depend on either: the world's identity was fixed while lib/ was one flat
folder, so the digest reads each moved module's dotted name (in an import, or in the `python -m` line that starts a
build worker) as the name it had then (PRE_MOVE_NAMES). Moving lib/ into sub-packages kept the world, its hash and
its cache; a later move adds its names here and keeps them too.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from lib import cpu_repro
from lib.artifacts import atomic_write_text

LIB = Path(__file__).resolve().parent.parent
EXPECTED = Path(__file__).parent / "world.sha256"          # the committed build's model sha256
# What determines the weights, by module file: None = the whole module; else the top-level names the build uses
# (of data.py not the row checks, of cpu_repro.py the pin but not its records). The order is the hash's.
WORLD_CODE = {
    LIB / "toy" / "builder.py": None,
    LIB / "toy" / "task.py": None,
    LIB / "train" / "sft.py": None,
    LIB / "cpu_repro.py": {"PINNED_ENV", "pinned_env", "pin"},
    LIB / "data.py": {"DAPO_PREFIX", "DAPO_SUFFIX", "dapo_prompt", "render_chat", "prompt_ids"},
}
# Each moved module of the world's code, by its dotted name now → its name when the world's identity was fixed.
# Longest first, so that lib.toy.builder is not read as lib.toy + ".builder".
PRE_MOVE_NAMES = {
    "lib.toy.world_bytes": "lib.toy_bytes",
    "lib.toy.builder": "lib.toy",
    "lib.toy.task": "lib.toy_task",
    "lib.train.sft": "lib.sft",
}


def code_digest(source: str, names: set[str] | None = None) -> str:
    """The syntax tree of `source` (its top-level statements defining `names`, or all) without docstrings or
    comments: editing prose, or code the build does not use, leaves the digest, and so the world, unchanged."""
    def defines(node) -> set[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return {node.name}
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        return {t.id for t in targets if isinstance(t, ast.Name)}
    def pre_move(text: str) -> str:
        for now, then in PRE_MOVE_NAMES.items():
            text = re.sub(rf"\b{re.escape(now)}\b", then, text)
        return text

    module = ast.parse(source)
    module.body = [n for n in module.body if names is None or defines(n) & names]
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.ImportFrom) and node.module:
            node.module = pre_move(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = pre_move(node.value)
    return ast.dump(module)


def read_expected(path: Path = EXPECTED) -> tuple[str | None, dict]:
    """(world hash, {CPU model: {model: sha256}}) of the committed file: `# world <hash>`, then per CPU a
    `# built on <CPU model> (<ISA flags>), …` line and its `<sha256>  <model>` lines."""
    if not path.exists():
        return None, {}
    world, builds, cpu = None, {}, None
    for line in path.read_text().splitlines():
        if m := re.match(r"^# world ([0-9a-f]{16})", line):
            world = m[1]
        elif m := re.match(r"^# built on (.+?) \(", line):
            cpu = m[1]
            builds[cpu] = {}
        elif (m := re.match(r"^([0-9a-f]{64})  (\S+)$", line)) and cpu is not None:
            builds[cpu][m[2]] = m[1]
    return world, builds


def check_expected(world: dict, path: Path = EXPECTED) -> tuple[bool | None, str]:
    """(True: this build's models are the bytes committed for this CPU model; False: they differ; None: nothing is
    committed for this CPU model, True/False then saying whether another CPU's build matches; one line saying so
    and what it means)."""
    committed_world, builds = read_expected(path)
    got = {name: m["safetensors_sha256"] for name, m in world["models"].items()}
    cpu = world.get("cpu_repro", {}).get("cpu", {}).get("model", "an unknown CPU")
    if committed_world != world["hash"]:
        return False, (f"toy world {world['hash']}: {path.name} is for world {committed_world}: the code changed "
                       "since its bytes were committed; `python -m lib.toy.builder write-sha256` commits this build's")
    same = [c for c, expected in builds.items() if expected == got]
    if cpu not in builds:
        return None, (f"toy world {world['hash']}: nothing committed for this CPU ({cpu}) in {path.name}; "
                      + (f"the same bytes as the build on {same[0]}" if same else
                         f"the bytes differ from the builds on {', '.join(builds) or 'no CPU'}")
                      + ". The pinned math gives the same bytes run after run and on machines of one CPU model, not "
                        "across vendors; `python -m lib.toy.builder write-sha256` adds this CPU's")
    expected = builds[cpu]
    differ = [n for n in got if expected.get(n) != got[n]] + sorted(set(expected) - set(got))
    if not differ:
        return True, f"toy world {world['hash']}: all {len(got)} models match {path.name}'s build on {cpu}"
    if all(n not in expected for n in differ):      # a model added since this CPU's block was committed: unchecked
        return None, (f"toy world {world['hash']}: the {len(got) - len(differ)} models committed for this CPU ({cpu}) "
                      f"match {path.name}; {', '.join(differ)} has no sha256 committed for it yet; `python -m "
                      "lib.toy.builder write-sha256` adds them")

    def short(sha):
        return (sha or "none")[:8] + "…"

    pairs = ", ".join(f"{n} {short(got.get(n))} here vs {short(expected.get(n))} committed" for n in differ)
    isa_flags = world.get("cpu_repro", {}).get("cpu", {}).get("isa_flags", [])
    missing = [f for f in cpu_repro.REQUIRED_FLAGS if f not in isa_flags]
    why = (f"this CPU lacks {'/'.join(missing)}, which the pinned math paths need (lib/cpu_repro.py)" if missing else
           "so a library version (torch, MKL, libm) rounds differently")
    return False, (f"toy world: this build DIFFERS from {path.name}'s on the same CPU model ({pairs}); same code, "
                   f"{why}: its campaign numbers will differ from the README's by that float noise. The world is "
                   "still used; `python -m lib.toy.builder write-sha256` commits this build's bytes instead")


def write_expected(world: dict, path: Path = EXPECTED) -> Path:
    """This build's bytes as its CPU model's block of `path`, the other CPUs' blocks kept if they are of this world."""
    rec = world["cpu_repro"]
    committed_world, builds = read_expected(path)
    old = path.read_text().split("\n# built on ")[1:] if committed_world == world["hash"] else []
    keep = ["# built on " + b.strip("\n") for b in old if not b.startswith(rec["cpu"]["model"] + " (")]
    lines = ["# sha256 of the toy world's model.safetensors, built by lib/toy/builder.py with the CPU math pinned "
             "(lib/cpu_repro.py), per CPU model", f"# world {world['hash']}", *keep,
             (f"# built on {rec['cpu']['model']} ({' '.join(rec['cpu']['isa_flags'])}), torch {rec.get('torch')}, "
              f"MKL {rec.get('mkl')}, ATen {rec.get('cpu_capability')}")]
    lines += [f"{m['safetensors_sha256']}  {n}" for n, m in world['models'].items()]
    return atomic_write_text(path, "\n".join(lines) + "\n")
