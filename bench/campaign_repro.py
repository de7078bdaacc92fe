"""Two campaigns of the same code on the same world: are their findings identical? (issue 11)

    python bench/campaign_repro.py runs/toy runs/toy-again

Compares, file by file, what the two campaign directories measured, leaving out what a rerun may change by design
(wall-clock times, start and end stamps, hosts, process ids, throughput and memory readings):

    stats/*.json                  every gain, CI, p-value, verdict (ledger.json, the time ledger, and manifests skipped;
                                  training curves without their timing_s/, perf/ and memory/ series)
    evals/*/*/*/samples.jsonl     every sampled completion and its grade, byte for byte
    train/*/metrics.jsonl         every logged training metric except timing_s/, perf/ and memory/
    train/*/step_*/model.safetensors   the checkpoints' weights, byte for byte

Prints one line per compared file that differs and a summary; exit status 1 if anything differs or either side
lacks a file the other has.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

VOLATILE = re.compile(r"(^|_)(wall|started|ended|host|pid|time|timestamp|elapsed|seconds)($|_)|_s$|^gpu_s$")
VOLATILE_METRIC = ("timing_s/", "perf/", "memory/")


def scrub(x):
    """x without the keys a rerun changes by design (recursively)."""
    if isinstance(x, dict):
        return {k: scrub(v) for k, v in x.items() if not (VOLATILE.search(k) or k.startswith(VOLATILE_METRIC))}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    return x


def stats_view(path: Path):
    return scrub(json.loads(path.read_text()))


def metrics_view(path: Path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE_METRIC)}
            for line in path.read_text().splitlines() if line.strip()]


def bytes_view(path: Path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


KINDS = [("stats/*.json", stats_view), ("evals/*/*/*/samples.jsonl", bytes_view),
         ("train/*/metrics.jsonl", metrics_view), ("train/*/step_*/model.safetensors", bytes_view)]
SKIP = {"stats/ledger.json", "stats/manifest.json"}


def compare(a: Path, b: Path) -> tuple[int, int, list[str]]:
    """(files compared, files that differ, one line per difference)."""
    n, lines = 0, []
    for pattern, view in KINDS:
        rel_a = {str(p.relative_to(a)) for p in a.glob(pattern)} - SKIP
        rel_b = {str(p.relative_to(b)) for p in b.glob(pattern)} - SKIP
        for rel in sorted(rel_a ^ rel_b):
            lines.append(f"only in {a if rel in rel_a else b}: {rel}")
        for rel in sorted(rel_a & rel_b):
            n += 1
            if view(a / rel) != view(b / rel):
                lines.append(f"differs: {rel}")
    return n, len(lines), lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    n, bad, lines = compare(args.a, args.b)
    for line in lines:
        print(line)
    print(f"{n} files compared: {'all identical' if not bad else f'{bad} differ or are missing'}")
    return 1 if bad or not n else 0


if __name__ == "__main__":
    sys.exit(main())
