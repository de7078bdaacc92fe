"""Benchmark resolution: a benchmark name or a path → its rows and where they were read from (DESIGN.md §2).

A registered benchmark is read from its file in the data directory ($OPD_DATA_DIR, else ../shared/data beside the
checkout), else from its pinned hub copy; toy benchmarks live inside the toy world. A benchmark that the loaded pair
file declares (lib/pairs.py) is its source's N evenly spaced rows. Any other name must be a path.
"""
from __future__ import annotations

import os
from pathlib import Path

from lib.artifacts import REPO
from lib.data import evenly_spaced, load_rows
from lib.errors import UserError
from lib.pairs import declared_benchmark
from lib.registry import BENCHMARKS


def data_dir() -> Path | None:
    """Where benchmark files live: $OPD_DATA_DIR, else ../shared/data beside the checkout when present."""
    env = os.environ.get("OPD_DATA_DIR")
    if env:
        return Path(env)
    for cand in (REPO.parent / "shared" / "data", REPO / "shared" / "data"):
        if cand.exists():
            return cand
    return None


def looks_like_path(name: str) -> bool:
    return "/" in name or os.sep in name or Path(name).suffix in (".jsonl", ".json", ".parquet")


def benchmark_source(name: str) -> str:
    """The path (or hf://owner/name@revision:split) a benchmark is read from."""
    if (declared := declared_benchmark(name)) is not None:
        return benchmark_source(declared.source)
    if name not in BENCHMARKS:
        if Path(name).exists():
            return name
        if looks_like_path(name):
            raise UserError(f"file not found: {name}; pass the path of an existing .jsonl/.parquet file")
        raise UserError(f"unknown benchmark {name!r}: use one of {', '.join(sorted(BENCHMARKS))} or the path of a "
                        f".jsonl/.parquet file")
    b = BENCHMARKS[name]
    if name.startswith("toy"):
        from lib.artifacts import follow_umask
        from lib.toy import builder
        root = builder.build()
        follow_umask(root)                           # the build leaves its folder 0700 (mkdtemp)
        return str(verified_toy_data(root / "data" / b.file))
    d = data_dir()
    if d is not None and (d / b.file).exists():
        return str(d / b.file)
    if b.hub:
        return f"hf://{b.hub}@{b.revision}:{b.split}"
    where = f"{d} (OPD_DATA_DIR)" if d is not None else "no data directory (set OPD_DATA_DIR)"
    raise UserError(f"file not found: benchmark {name} needs {b.file}, which is not in {where}: set OPD_DATA_DIR to "
                    f"the folder holding it")


def verified_toy_data(path: Path) -> Path:
    """A toy world's benchmark file as its build wrote it: the build's rows are drawn again (builder.make_data:
    seeded, ~50 ms) and compared, so a row changed in the cache (a gold answer) is refused, not evaluated under the
    world's identity; world.json records the models' bytes, not the data's."""
    import json
    from lib.toy import builder
    test, train = builder.make_data()
    want = json.loads(json.dumps({"toy_test.jsonl": test, "toy_train.jsonl": train}.get(path.name)))
    if want is None:                                   # a file make_data does not write: nothing to compare with
        return path
    try:
        got = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    except (OSError, ValueError):
        got = None
    if got != want:
        raise UserError(f"toy benchmark {path} is not what the toy world's build wrote (a row changed, added or "
                        f"removed since): delete {path.parent.parent} and rerun to rebuild the toy world")
    return path


def load_benchmark(name: str, require_answer: bool = True) -> tuple[list[dict], str]:
    """(rows, source) for a registered benchmark name or a path; training prompts pass require_answer=False."""
    if (declared := declared_benchmark(name)) is not None:
        rows, src = load_benchmark(declared.source, require_answer)
        if declared.limit_problems is not None and declared.limit_problems < len(rows):
            rows = evenly_spaced(rows, declared.limit_problems)
        return rows, src
    src = benchmark_source(name)
    rows = load_rows(src, BENCHMARKS[name].id_field if name in BENCHMARKS else "id", require_answer)
    return rows, src


def is_known(name: str) -> bool:
    """A registered benchmark or one the loaded pair file declares (its units take the name, not a file's stem)."""
    return name in BENCHMARKS or declared_benchmark(name) is not None
