"""02_baselines end to end on the toy world: each unit is 04_eval.py's, run as its own process, and a second run
leaves finished units untouched."""
import json

import pytest

from helpers import run_script
from lib import registry

pytestmark = pytest.mark.e2e


def test_baselines_are_04_units_and_a_rerun_skips_them(tmp_path):
    argv = ("--run-dir", tmp_path, "--pair", "toy", "--models", "pi_pre", "--limit-problems", "4")
    p = run_script("02_baselines.py", *argv, env={"OMP_NUM_THREADS": "1"})
    units = {}
    for bench, proto in registry.PAIRS["toy"].evals:
        d = tmp_path / "evals" / "toy-pre_sub4" / bench / proto           # the probe alias of a reduced unit
        m = json.loads((d / "manifest.json").read_text())
        assert m["stage"] == "04_eval" and m["args"]["model"] == "toy-pre" and m["args"]["protocol"] == proto
        rows = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * registry.PROTOCOLS[proto].n
        assert json.loads((d / "scores.json").read_text())["deviations"]
        units[d] = (d / "samples.jsonl").stat().st_mtime_ns, (d / "manifest.json").read_bytes()
    assert len(units) == len(registry.PAIRS["toy"].evals) and "pi_pre = toy-pre" in p.stdout

    again = run_script("02_baselines.py", *argv, env={"OMP_NUM_THREADS": "1"})
    assert again.stdout.count("skipped (--skip-if-exists)") == len(units)
    for d, (mtime, manifest) in units.items():
        assert (d / "samples.jsonl").stat().st_mtime_ns == mtime and (d / "manifest.json").read_bytes() == manifest


def test_unknown_role_is_named(tmp_path):
    p = run_script("02_baselines.py", "--run-dir", tmp_path, "--pair", "toy", "--models", "pi_pre,teacher",
                   check=False)
    assert p.returncode != 0 and "unknown role(s) ['teacher']" in p.stderr
