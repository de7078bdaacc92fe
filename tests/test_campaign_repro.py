"""bench/campaign_repro.py: two campaign folders compared on what they measured, not on when or how fast."""
import importlib.util
import json

from lib.artifacts import REPO

spec = importlib.util.spec_from_file_location("campaign_repro", REPO / "bench" / "campaign_repro.py")
repro = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repro)


def make(root, p=0.0128, wall=1.0, loss=0.5, weights=b"w"):
    (root / "stats").mkdir(parents=True)
    (root / "stats" / "student_gains.json").write_text(json.dumps(
        {"rows": [{"gain": -2.15, "ci": [-3.85, -0.47], "p": p, "wall_s": wall, "started": f"t{wall}"}],
         "curves": {"actor/pg_loss": [[1, loss]], "timing_s/step": [[1, wall]]}}))
    (root / "stats" / "ledger.json").write_text(json.dumps({"total": wall}))
    (root / "train" / "opd" / "step_000045").mkdir(parents=True)
    (root / "train" / "opd" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "actor/pg_loss": loss, "timing_s/step": wall, "perf/mfu": wall}) + "\n")
    (root / "train" / "opd" / "step_000045" / "model.safetensors").write_bytes(weights)
    unit = root / "evals" / "opd-step45" / "toy" / "sample4"
    unit.mkdir(parents=True)
    (unit / "samples.jsonl").write_text('{"correct": true}\n')


def test_identical_findings_with_other_times_compare_equal(tmp_path):
    make(tmp_path / "a")
    make(tmp_path / "b", wall=99.0)                        # other wall-clock times, stamps, ledger, throughput
    assert repro.compare(tmp_path / "a", tmp_path / "b")[:2] == (4, 0)


def test_every_measured_difference_is_reported(tmp_path):
    make(tmp_path / "a")
    for i, kw in enumerate([dict(p=0.0129), dict(loss=0.51), dict(weights=b"x")]):
        make(tmp_path / f"b{i}", **kw)
        n, bad, lines = repro.compare(tmp_path / "a", tmp_path / f"b{i}")
        assert (n, bad) == (4, 1 + (i == 1)) and lines[0].startswith("differs: "), (kw, lines)
    make(tmp_path / "c")
    (tmp_path / "c" / "evals" / "opd-step45" / "toy" / "sample4" / "samples.jsonl").unlink()
    n, bad, lines = repro.compare(tmp_path / "a", tmp_path / "c")
    assert bad == 1 and lines[0].startswith("only in ")
