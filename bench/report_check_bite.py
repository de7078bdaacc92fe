"""How many deliberately wrong numbers in the report does tests/test_report.py's checker catch?

Builds the test's synthetic campaign (05 twice with a RAFT rerun between, then 06) in a temporary folder, then N times
changes one number of a table row or TL;DR line in report/README.md (`digit`: one digit ±1; `swap`: another number of
the same report) and runs the checker. A swap that happens to print the same text is not counted.

    python bench/report_check_bite.py [N] [random seed]
"""
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
import test_report as t  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
tmp = tempfile.TemporaryDirectory()
run_dir = Path(tmp.name) / "toy"
t.make_campaign(run_dir)
for k, argv in enumerate([["05_stats.py", "--pair", "toy"], ["05_stats.py", "--pair", "toy"], ["06_report.py"]]):
    subprocess.run([sys.executable, argv[0], "--run-dir", run_dir, *argv[1:]], cwd=REPO, check=True, capture_output=True)
    if k == 0:
        t.rerun_raft(run_dir)
readme_path = run_dir / "report" / "README.md"
readme = readme_path.read_text()
lines = readme.splitlines()
tldr = range(lines.index("## 0. TL;DR"), next(i for i, ln in enumerate(lines) if ln.startswith("## 1.")))
sites = []
for i, ln in enumerate(lines):
    table_row = ln.startswith("| ") and lines[i - 1].startswith("|") and not ln.startswith("|---")
    if table_row or (i in tldr and ln[:1].isdigit()):
        start = 0 if table_row else ln.index(". ") + 2
        sites += [(i, start + m.start(), start + m.end()) for m in t.NUM.finditer(ln[start:])]
rng = random.Random(seed)
for kind in ("digit", "swap"):
    caught = tried = 0
    while tried < n:
        i, a, b = rng.choice(sites)
        tok = lines[i][a:b]
        if kind == "digit":
            d = max(k for k, c in enumerate(tok) if c.isdigit())
            new = tok[:d] + str((int(tok[d]) + rng.choice([1, 9])) % 10) + tok[d + 1:]
        else:
            j, c, e = rng.choice(sites)
            new = lines[j][c:e]
        if new == tok:
            continue
        tried += 1
        readme_path.write_text("\n".join(lines[:i] + [lines[i][:a] + new + lines[i][b:]] + lines[i + 1:]))
        try:
            t.check_report(run_dir)
        except AssertionError:
            caught += 1
        else:
            print(f"  missed: {lines[i][max(0, a - 30):b + 10]!r}: {tok} → {new}")
    print(f"{kind}: caught {caught}/{tried} ({100 * caught / tried:.1f} %) of {len(sites)} numbers in tables and TL;DR")
readme_path.write_text(readme)
t.check_report(run_dir)
print("the unmodified report passes")
