"""The registry (DESIGN.md §2): consistent pure tables, every hub model and dataset pinned to a commit."""
import ast
import re

from lib import registry
from lib.artifacts import REPO

COMMIT = re.compile(r"[0-9a-f]{40}")


def test_registry_is_consistent():
    for name, pair in registry.PAIRS.items():
        for m in (pair.pi_pre, pair.pi_post):
            assert m in registry.MODELS, f"pair {name}: {m}"
        assert pair.student in registry.STUDENTS and pair.train_data in registry.BENCHMARKS
        assert registry.STUDENTS[pair.student].model in registry.MODELS
        for bench, proto in pair.evals:
            assert bench in registry.BENCHMARKS and proto in registry.PROTOCOLS
    assert registry.MODELS["qwen2.5-math-1.5b"].eval_max_new_tokens == 3_200
    assert registry.PROTOCOLS["sample32"] == registry.Protocol(32, 0.7, 0.95)


def test_every_hub_model_and_dataset_is_pinned_to_a_commit():
    hub = [m for m in registry.MODELS.values() if m.hub_id]
    assert len(hub) == 9
    for m in hub:
        assert m.revision and COMMIT.fullmatch(m.revision), f"model {m.alias} ({m.hub_id}) has no 40-hex pin"
        assert not (m.toy or m.run_path or m.shape), m.alias
    for b in registry.BENCHMARKS.values():
        assert (b.hub is None) == (b.revision is None), b.name
        assert b.revision is None or COMMIT.fullmatch(b.revision), f"benchmark {b.name} has no 40-hex pin"
    assert sum(b.hub is not None for b in registry.BENCHMARKS.values()) == 3
    # the pins the source campaign's report gives for the openthinker pair (its §3 table)
    assert registry.MODELS["qwen2.5-1.5b-instruct"].revision == "989aa7980e4cf806f80c7fef2b1adb7bc71aa306"
    assert registry.MODELS["openthinker3-1.5b"].revision == "0ee90a38b29bfac8b8b005da9ae32c59e2943785"


def test_registry_is_pure_tables():
    """lib/registry.py imports nothing from lib/: model and benchmark resolution live above it (lib/models.py,
    lib/benchmarks.py), so lib/toy/task.py can read the tables without an import cycle."""
    tree = ast.parse((REPO / "lib" / "registry.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.split(".")[0] == "lib"} == set(), imported
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
