"""The toy world's bytes: what determines them (the code that the cache key hashes) and the committed sha256 of the
four models (lib/toy_world.sha256) that every build is checked against (lib/toy.py builds; DESIGN.md §10).

The cache key hashes each module's syntax tree without docstrings or comments, and of lib/data.py only what the
build calls: an edit of prose, or of data.py's row validation, keeps the world (and its cache) as it is, while any
change of code the weights depend on builds a new one. This file determines nothing of the weights.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from lib import cpu_repro
from lib.artifacts import atomic_write_text

EXPECTED = Path(__file__).parent / "toy_world.sha256"          # the committed build's model sha256
# What determines the weights, by module: None = the whole module; else the top-level names the build uses
# (of data.py not the row checks, of cpu_repro.py the pin but not its records).
WORLD_CODE = {"toy.py": None, "toy_task.py": None, "sft.py": None, "cpu_repro.py": {"PINNED_ENV", "pinned_env", "pin"},
              "data.py": {"DAPO_PREFIX", "DAPO_SUFFIX", "dapo_prompt", "render_chat", "prompt_ids"}}


def code_digest(source: str, names: set[str] | None = None) -> str:
    """The syntax tree of `source` (its top-level statements defining `names`, or all) without docstrings or
    comments: editing prose, or code the build does not use, leaves the digest, and so the world, unchanged."""
    def defines(node) -> set[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return {node.name}
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        return {t.id for t in targets if isinstance(t, ast.Name)}
    module = ast.parse(source)
    module.body = [n for n in module.body if names is None or defines(n) & names]
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(module)


def read_expected(path: Path = EXPECTED) -> tuple[str | None, dict]:
    """(world hash, {model: sha256}) of the committed file: `# world <hash>` and `<sha256>  <model>` lines."""
    if not path.exists():
        return None, {}
    text = path.read_text()
    world = next(iter(re.findall(r"^# world ([0-9a-f]{16})", text, re.M)), None)
    return world, {name: sha for sha, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.M)}


def check_expected(world: dict, path: Path = EXPECTED) -> tuple[bool, str]:
    """(whether this build's four models are the committed bytes, one line saying so and what it means)."""
    committed_world, expected = read_expected(path)
    got = {name: m["safetensors_sha256"] for name, m in world["models"].items()}
    differ = [n for n in got if expected.get(n) != got[n]] + sorted(set(expected) - set(got))
    if not differ:
        return True, f"toy world {world['hash']}: all {len(got)} models match {path.name} (the committed bytes)"
    short = lambda sha: (sha or "none")[:8] + "…"
    pairs = ", ".join(f"{n} {short(got.get(n))} here vs {short(expected.get(n))} committed" for n in differ)
    missing = [f for f in cpu_repro.REQUIRED_FLAGS if f not in world.get("cpu_repro", {}).get("cpu", {}).get("isa_flags", [])]
    why = (f"this code builds world {world['hash']}, the file is for {committed_world}: the code changed"
           if committed_world != world["hash"] else
           f"same code, but this CPU lacks {'/'.join(missing)}, which the pinned math paths need (lib/cpu_repro.py)"
           if missing else "same code, so a library version (torch, MKL, libm) rounds differently")
    return False, (f"toy world: this build DIFFERS from {path.name} ({pairs}); {why}: its campaign numbers will "
                   f"differ from the README's by that float noise. The world is still used; `python -m lib.toy "
                   f"write-sha256` commits this build's bytes instead")


def write_expected(world: dict, path: Path = EXPECTED) -> Path:
    rec = world["cpu_repro"]
    lines = ["# sha256 of the toy world's model.safetensors, built by lib/toy.py with the CPU math pinned "
             "(lib/cpu_repro.py)", f"# world {world['hash']}",
             (f"# built on {rec['cpu']['model']} ({' '.join(rec['cpu']['isa_flags'])}), torch {rec.get('torch')}, "
              f"MKL {rec.get('mkl')}, ATen {rec.get('cpu_capability')}")]
    lines += [f"{m['safetensors_sha256']}  {n}" for n, m in world['models'].items()]
    return atomic_write_text(path, "\n".join(lines) + "\n")
