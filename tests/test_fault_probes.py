"""bench/fault_probes.py, the scorecard of issue 17: it lists exactly 42 probes, and one probe runs end to end.

The whole scorecard (7–12 min on 2 busy CPU cores) is run by hand: `python bench/fault_probes.py --out DIR`; its last
result is bench/results/fault_probes_2026-12-01.md."""
import importlib.util
import json
import subprocess
import sys

from helpers import REPO

SCRIPT = REPO / "bench" / "fault_probes.py"


def test_the_scorecard_lists_42_unique_probes_with_group_issue_and_check():
    spec = importlib.util.spec_from_file_location("fault_probes", SCRIPT)
    fp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fp)                              # importing it runs nothing
    n = 42 + sum(i.startswith("34") for _, i, _, _ in fp.PROBES.values())      # issue 34's sections add their own
    assert len(fp.PROBES) == n
    p = subprocess.run([sys.executable, str(SCRIPT), "--list"], check=False, cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert p.returncode == 0 and len(names) == len(set(names)) == n and names == list(fp.PROBES)
    assert all(g and i and w for g, i, w, _ in fp.PROBES.values())
    assert sum(k.startswith("bad-input-") for k in names) == 9                          # the nine malformed files


def test_one_probe_end_to_end(tmp_path):
    """The grading probe needs no toy world: a pathological item is timed out within its bound (a few seconds)."""
    p = subprocess.run([sys.executable, str(SCRIPT), "--only", "grading-pathological-item-bounded", "--out",
                        str(tmp_path / "out")], check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].startswith("PASS grading-pathological-item-bounded — 'timeout' after ")
    card = json.loads((tmp_path / "out" / "scorecard.json").read_text())
    assert (card["survived"], card["n"], card["probes"][0]["result"]) == (1, 1, "PASS")
    assert "| `grading-pathological-item-bounded` |" in (tmp_path / "out" / "scorecard.md").read_text()
