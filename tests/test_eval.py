"""04_eval.py end to end on the toy world: a unit's contents, --skip-if-exists, refusal of a different config,
detection of a corrupted generations file, resume from a partial file, and the context gate."""
import json

import pytest

from helpers import run_script
from lib import toy
from lib.artifacts import read_json, read_jsonl, verify_dir

pytestmark = pytest.mark.e2e


def run(*args, check=True):
    return run_script("04_eval.py", *args, check=check, timeout=600)


@pytest.fixture(scope="module")
def world():
    return toy.build()


def unit(run_dir, alias, protocol="greedy"):
    return run_dir / "evals" / alias / "toy" / protocol


def test_unit_contents(world, tmp_path):
    run(f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=sample4", "--limit-problems=6")
    u = unit(tmp_path, "toy-pre_sub6", "sample4")
    verify_dir(u)
    scores, rows = read_json(u / "scores.json"), read_jsonl(u / "samples.jsonl")
    assert len(rows) == 24 and {r["seed"] for r in rows} == {0, 1, 2, 3}
    assert scores["n_problems"] == 6 and scores["seeds"] == [0, 1, 2, 3]
    assert scores["deviations"] and "limit-problems: 6" in scores["deviations"][0]
    per_problem = {}
    for r in rows:
        per_problem.setdefault(r["problem_id"], []).append(r["correct"])
    acc = 100 * sum(sum(v) / len(v) for v in per_problem.values()) / len(per_problem)
    assert scores["accuracy"] == pytest.approx(acc)
    lo, hi = scores["accuracy_ci95"]
    assert lo <= scores["accuracy"] <= hi
    prov = scores["provenance"]
    assert prov["rendered_tail_example"].endswith("<|im_start|>assistant\n")
    assert len(prov["chat_template_sha256"]) == 64 and prov["generation"]["temperature"] == 0.7
    assert prov["model"]["resolved_revision"].startswith("toy:")
    for r in rows:                       # every row carries what SPEC §5 lists
        assert set(r) >= {"problem_id", "seed", "pass", "completion", "n_tokens", "truncated", "extractor",
                          "extracted", "correct", "verify_method"}
        assert not r["truncated"] or r["n_tokens"] == scores["max_new_tokens"]


def test_skip_refuse_and_corruption(world, tmp_path):
    args = [f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=greedy", "--limit-problems=4",
            "--alias=u"]
    run(*args)
    u = unit(tmp_path, "u_sub4")
    before = (u / "samples.jsonl").stat().st_mtime_ns, (u / "manifest.json").read_bytes()
    p = run(*args, "--skip-if-exists")
    assert "skipped" in p.stdout
    assert ((u / "samples.jsonl").stat().st_mtime_ns, (u / "manifest.json").read_bytes()) == before

    p = run(f"--run-dir={tmp_path}", "--model=toy-post", "--benchmark=toy", "--protocol=greedy",
            "--limit-problems=4", "--alias=u", "--skip-if-exists", check=False)
    assert p.returncode != 0 and "different configuration" in p.stderr and "refusing to overwrite" in p.stderr

    text = (u / "samples.jsonl").read_text()
    (u / "samples.jsonl").write_text(text + "\n")      # one extra byte: still valid JSONL, only the hash can tell
    p = run(*args, "--skip-if-exists", check=False)
    assert p.returncode != 0 and "samples.jsonl has sha256" in p.stderr and "changed after 04_eval wrote it" in p.stderr


def test_resume_uses_the_partial_file(world, tmp_path):
    args = [f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=greedy", "--limit-problems=3"]
    run(*args)
    u = unit(tmp_path, "toy-pre_sub3")
    scores, rows = read_json(u / "scores.json"), read_jsonl(u / "samples.jsonl")
    # a killed run leaves generations.partial.jsonl behind: plant one (with a marked completion) and a torn line
    planted = {"config_sha256": scores["config_sha256"], "problem_id": rows[0]["problem_id"], "seed": 0,
               "completion": "planted\nAnswer: 12345", "n_tokens": 5, "truncated": False}
    other = tmp_path / "other"
    part = unit(other, "toy-pre_sub3") / "generations.partial.jsonl"
    part.parent.mkdir(parents=True)
    part.write_text(json.dumps(planted) + "\n" + '{"config_sha256": "torn')
    p = run(*args[1:], f"--run-dir={other}")
    assert "resuming, 1 samples already generated" in p.stdout
    got = read_jsonl(unit(other, "toy-pre_sub3") / "samples.jsonl")
    assert got[0]["completion"] == "planted\nAnswer: 12345" and got[0]["extracted"] == "12345"
    assert [r["completion"] for r in got[1:]] == [r["completion"] for r in rows[1:]]   # the rest regenerated identically
    assert not part.exists()


def test_context_gate_refuses_with_numbers(world, tmp_path):
    p = run(f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=greedy", "--limit-problems=2",
            "--max-new-tokens=100000", check=False)
    assert p.returncode != 0
    assert "context gate" in p.stderr and "max_position_embeddings 512" in p.stderr and "100000" in p.stderr
