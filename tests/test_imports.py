"""The shape of the code, read without running it (ast only): lib/ is a one-way stack of rooms and the stages import
only lib/.

Checked over lib/**/*.py and the stage scripts NN_*.py:
    cycles          no import cycle among lib modules, counting imports inside functions (a lazy import is still
                    an edge: it is how a cycle hides)
    rooms           each sub-package of lib/ imports only what its docstring allows (ROOMS below; the plumbing is
                    lib/*.py), and lib/toy/ is reached only by the resolvers of its names (lib/models.py,
                    lib/benchmarks.py): the real path never touches the fixture
    stage imports   no stage script imported by another stage or by lib/, neither by `import` nor through
                    importlib / __import__ / runpy with the stage's name; no dynamic import a reader cannot follow
                    (stages call each other as subprocesses: the stage contract, as campaign.sh does); no relative
                    import (every import names its module whole)
    re-exports      no module-level `__getattr__` in lib/: every name is defined where go-to-definition finds it
    documents       no reference in code or docs to a document outside the repository: the design is
                    docs/DESIGN.md (the ../shared/data fallback for benchmark files is data, and allowed)
    layout          lines of at most 120 characters and one statement per line, in the stages and lib/ (DESIGN.md
                    §13 says why there is no cap on a file's length)

PENDING lists what other branches remove today; each entry is a ceiling, never a licence to grow: a new offender
fails, and so does an entry that no longer holds (delete it then), so the list can only shrink.
The first test runs every checker on a small scratch repository with one planted fault of each kind.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = re.compile(r"^\d\d_\w+$")                 # 01_gates, 03_opd_train, ...
MAX_LINE = 120
# What each room of lib/ may import of the project besides itself: "plumbing" is lib/*.py but the resolvers, which
# reach the toy world; a dotted module name allows that one module.
PLUMBING, RESOLVERS = "plumbing", {"lib.models", "lib.benchmarks"}
ROOMS = {
    "lib.kernels": set(),
    "lib.sample": {"lib.kernels"},
    "lib.train": {PLUMBING, "lib.kernels"},
    "lib.report": {PLUMBING, "lib.train.collapse"},
    "lib.eval": {PLUMBING, *RESOLVERS, "lib.report"},
    "lib.gates": {PLUMBING, *RESOLVERS, "lib.kernels", "lib.sample", "lib.train", "lib.eval"},
    "lib.toy": {PLUMBING, "lib.train.sft"},
}
SKIP_DIRS = {".git", ".venv", ".venv-vllm", ".cache", "runs", "__pycache__", "shared", ".pytest_cache", ".gl"}
DOC_SUFFIXES = {".py", ".sh", ".md", ".txt", ".ini", ".toml", ".cfg", ".yaml", ".yml"}
# a document outside the repository: the old spec by name, its sections, or a path into ../shared other than data/
OUTSIDE_DOC = re.compile(r"\bSPEC\b|\bshared/(?!data\b)\w")

# Offenders on this branch that other developers' branches remove (owner in the comment). Remove an entry when the
# test says it no longer holds.
PENDING = {
    "cycles": set(),
    "rooms": set(),
    "getattr": set(),
    "documents": set(),
    "layout": set(),
}


# --- the walker ---

def modules(root: Path) -> dict[str, Path]:
    """{dotted name: file} for lib/**/*.py (lib.x, lib.room.x; a package's __init__ under the package's name) and the
    stage scripts at the root (01_gates, ...)."""
    mods = {}
    for p in sorted((root / "lib").rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    mods |= {p.stem: p for p in sorted(root.glob("*.py")) if STAGE.match(p.stem)}
    return mods


def room(module: str) -> str:
    """The room a lib module lives in: `lib.train` for lib.train.opd, PLUMBING for lib.data, the stage's own name
    for a stage."""
    parts = module.split(".")
    if parts[0] != "lib":
        return module
    return ".".join(parts[:2]) if len(parts) > 2 else PLUMBING


def _const(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dynamic_target(call: ast.Call) -> tuple[bool, str | None] | None:
    """For importlib.import_module / __import__ / runpy.run_path|run_module calls: (is such a call, its constant
    target or None if computed). None for any other call."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name not in {"import_module", "__import__", "run_path", "run_module"}:
        return None
    return True, (_const(call.args[0]) if call.args else None)


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], list[str]]:
    """(modules of `known` that `name` imports anywhere in its file, problems: dynamic imports that cannot be read)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out, problems = set(), []

    def add(target: str):
        target = target.removesuffix(".py").split("/")[-1] if target.endswith(".py") else target
        while target and target not in known and "." in target:
            target = target.rsplit(".", 1)[0]          # lib.x.y → lib.x
        if target in known:
            out.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                problems.append(f"{path.name}:{node.lineno}: a relative import; name the module whole (lib.…)")
                continue
            for a in node.names:
                add(f"{base}.{a.name}") if f"{base}.{a.name}" in known else add(base)
        elif isinstance(node, ast.Call) and (d := _dynamic_target(node)):
            if d[1] is None:
                problems.append(f"{path.name}:{node.lineno}: a computed import target; name the module statically")
            else:
                add(d[1])
    out.discard(name)
    return out, problems


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    known = modules(root)
    graph, problems = {}, []
    for name, path in known.items():
        graph[name], p = imports(name, path, known)
        problems += p
    return graph, problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module, as one concrete cycle through it (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_through(c, graph) for c in comps]


def _cycle_through(comp: set[str], graph) -> list[str]:
    """A shortest cycle from the component's first module back to itself, for the message."""
    start = min(comp)
    paths, seen = [[start]], {start}
    while paths:
        nxt = []
        for p in paths:
            for w in sorted(graph[p[-1]] & comp):
                if w == start:
                    return p + [start]
                if w not in seen:
                    seen.add(w)
                    nxt.append(p + [w])
        paths = nxt
    raise AssertionError(f"no cycle in component {comp}")


def stage_imports(graph) -> list[str]:
    return [f"{a} imports the stage {b}" for a, deps in sorted(graph.items()) for b in sorted(deps) if STAGE.match(b)]


def room_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Each import that crosses into a room its importer may not reach (ROOMS), and each import of lib/toy/ from
    outside it other than by the resolvers."""
    out = []
    for a, deps in sorted(graph.items()):
        ra = room(a)
        for b in sorted(deps):
            rb = room(b)
            if rb == ra or not b.startswith("lib"):
                continue
            if rb == "lib.toy" and a not in RESOLVERS:
                out.append(f"{a} imports {b}: only the resolvers ({', '.join(sorted(RESOLVERS))}) reach the toy world")
            elif ra == PLUMBING and rb != PLUMBING and not (a in RESOLVERS and rb == "lib.toy"):
                out.append(f"{a} imports {b}: the plumbing imports only the plumbing")
            elif ra in ROOMS and not ({rb, b} & ROOMS[ra] or (rb == PLUMBING and PLUMBING in ROOMS[ra]
                                                               and b not in RESOLVERS)):
                out.append(f"{a} imports {b}: {ra} may import {sorted(ROOMS[ra]) or 'nothing of the project'}")
    return out


def layout_breaks(root: Path) -> list[str]:
    """'file:line: what' for every line over MAX_LINE characters and every line that holds two statements (a `;`,
    or a body on its compound statement's line), in the stages and lib/."""
    out = []
    for path in modules(root).values():
        rel, text = path.relative_to(root).as_posix(), path.read_text()
        out += [f"{rel}:{i}: {len(line)} characters (at most {MAX_LINE})"
                for i, line in enumerate(text.splitlines(), 1) if len(line) > MAX_LINE]
        starts = {}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.stmt):
                starts[node.lineno] = starts.get(node.lineno, 0) + 1
        out += [f"{rel}:{line}: {n} statements on one line" for line, n in sorted(starts.items()) if n > 1]
    return out


def module_getattrs(root: Path) -> set[str]:
    return {name for name, path in modules(root).items() if name.startswith("lib.")
            and any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in ast.parse(path.read_text()).body)}


def outside_doc_refs(root: Path) -> dict[str, list[str]]:
    """{relative file: ['line: text', ...]} for every reference to a document outside the repository."""
    me = Path(__file__).resolve()
    hits = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.suffix not in DOC_SUFFIXES or not p.is_file() or SKIP_DIRS & set(rel.parts) or any(x.startswith(".") for x in rel.parts[:-1]) or p.resolve() == me:
            continue
        found = [f"{i}: {line.strip()}" for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
                 if OUTSIDE_DOC.search(line)]
        if found:
            hits[rel.as_posix()] = found
    return hits


def over_and_stale(found: set, pending: set, what: str) -> list[str]:
    msgs = [f"new {what}: {x}" for x in sorted(map(str, found - pending))]
    msgs += [f"{what} listed in PENDING no longer holds (remove the entry): {x}" for x in sorted(map(str, pending - found))]
    return msgs


# --- the walker on planted faults ---

def test_the_walker_catches_each_planted_fault(tmp_path):
    (tmp_path / "lib").mkdir()
    files = {
        "lib/__init__.py": "",
        "lib/a.py": "from lib import b\n",
        "lib/b.py": "def f():\n    from lib.c import g   # lazy: still an edge\n",
        "lib/c.py": "import lib.a\n",                                     # a → b → c → a
        "lib/d.py": "import importlib\nS = importlib.import_module('02_stage')\n",
        "lib/e.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
        "lib/f.py": "import importlib\nm = importlib.import_module('lib.' + 'a')\n",
        "lib/kernels/__init__.py": "",
        "lib/kernels/k.py": "from lib.kernels import j\nfrom lib import a\n",       # a kernel reaching the plumbing
        "lib/kernels/j.py": "from . import k\n",                                     # a relative import
        "lib/toy/__init__.py": "",
        "lib/toy/w.py": "from lib import a\n",
        "lib/models.py": "from lib.toy import w\n",                                  # the resolver: allowed
        "lib/train/__init__.py": "",
        "lib/train/t.py": "from lib.toy.w import x\nfrom lib.kernels import k\n",   # the fixture from the loop
        "lib/g.py": "from lib.train import t\n",                                    # plumbing reaching a room
        "01_one.py": "from importlib import import_module\nimport_module('02_stage')\nfrom lib import a\n",
        "02_stage.py": "# see " + "SP" + "EC §3\nimport lib.e\n" + "x = 1; y = 2\n" + "if x: y = 3\n" + "z = '" + "z" * 120 + "'\n",
        "docs/x.md": "read ../sha" + "red/source/doc.txt\n",
        "docs/y.md": "benchmark files fall back to ../shared/data/aime24.jsonl (data, not a document)\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph, problems = import_graph(tmp_path)
    assert graph["01_one"] == {"02_stage", "lib.a"} and graph["lib.b"] == {"lib.c"}
    assert graph["lib.train.t"] == {"lib.toy.w", "lib.kernels.k"} and graph["lib.models"] == {"lib.toy.w"}
    assert cycles(graph) == [["lib.a", "lib.b", "lib.c", "lib.a"]]
    assert stage_imports(graph) == ["01_one imports the stage 02_stage", "lib.d imports the stage 02_stage"]
    assert problems == ["f.py:2: a computed import target; name the module statically",
                        "j.py:1: a relative import; name the module whole (lib.…)"]
    assert module_getattrs(tmp_path) == {"lib.e"}
    assert [b.split(":")[0] for b in room_breaks(graph)] == ["lib.g imports lib.train.t", "lib.kernels.k imports lib.a",
                                                             "lib.train.t imports lib.toy.w"]
    refs = outside_doc_refs(tmp_path)
    assert set(refs) == {"02_stage.py", "docs/x.md"} and refs["02_stage.py"][0].startswith("1: ")
    assert layout_breaks(tmp_path) == ["02_stage.py:5: 126 characters (at most 120)",
                                       "02_stage.py:3: 2 statements on one line", "02_stage.py:4: 2 statements on one line"]
    (tmp_path / "lib/c.py").write_text("x = 1\n")                        # break the cycle: none is left
    assert cycles(import_graph(tmp_path)[0]) == []


# --- the repository ---

def test_lib_has_no_import_cycle():
    graph, _ = import_graph(REPO)
    found = {frozenset(c[:-1]): " → ".join(c) for c in cycles(graph)}
    msgs = [f"import cycle: {found[c]}" for c in sorted(set(found) - PENDING["cycles"], key=sorted)]
    msgs += [f"cycle listed in PENDING is gone (remove the entry): {sorted(c)}"
             for c in PENDING["cycles"] - set(found)]
    assert not msgs, "\n".join(msgs)


def test_no_stage_imports_another_stage_and_every_import_is_static():
    graph, problems = import_graph(REPO)
    assert graph["02_baselines"] and graph["07_raft"], "the walker must see the stages' lib imports"
    assert not stage_imports(graph) + problems, "\n".join(stage_imports(graph) + problems)


def test_lib_has_no_module_getattr_reexport():
    assert not (msgs := over_and_stale(module_getattrs(REPO), PENDING["getattr"], "module-level __getattr__")), \
        "\n".join(msgs)


def test_no_reference_to_a_document_outside_the_repository():
    refs = outside_doc_refs(REPO)
    assert (REPO / "docs" / "DESIGN.md").exists(), "docs/DESIGN.md is the design the code cites"
    msgs = [f"{f}:{line}" for f in sorted(set(refs) - PENDING["documents"]) for line in refs[f]]
    msgs += [f"{f} listed in PENDING['documents'] cites nothing outside any more (remove the entry)"
             for f in sorted(PENDING["documents"] - set(refs))]
    assert not msgs, "\n".join(msgs)


def test_each_room_imports_only_what_it_may():
    graph, _ = import_graph(REPO)
    assert {room(m) for m in graph if m.startswith("lib.")} >= set(ROOMS) | {PLUMBING}, "every room must be walked"
    for pkg in ROOMS:
        doc = ast.get_docstring(ast.parse((REPO / pkg.replace(".", "/") / "__init__.py").read_text()))
        assert doc and "May import:" in doc, f"{pkg}/__init__.py must say what the room owns and may import"
    breaks = set(room_breaks(graph))
    assert not (msgs := over_and_stale(breaks, PENDING["rooms"], "import across rooms")), "\n".join(msgs)


def test_one_statement_per_line_and_lines_within_120_characters():
    assert not (msgs := over_and_stale(set(layout_breaks(REPO)), PENDING["layout"], "layout break")), "\n".join(msgs)
