"""04_eval.py end to end on the toy world: a unit's numbers recomputed from its own rows, --skip-if-exists, refusal of
a different config (and its own messages for a tampered or unsealed checkpoint and for two benchmark files with one
stem), detection of a corrupted generations file, resume from a partial file, and the context gate."""
import json
import re
import shutil
from collections import Counter

import numpy as np
import pytest

from helpers import run_script
from lib import benchmarks, models
from lib.artifacts import ArtifactError, read_json, read_jsonl, sha256_bytes, verify_dir, write_manifest
from lib.toy import builder
from lib.toy.task import extract_int

pytestmark = pytest.mark.e2e


def run(*args, check=True):
    return run_script("04_eval.py", *args, check=check, timeout=600)


@pytest.fixture(scope="module")
def world():
    return builder.build()


def unit(run_dir, alias, protocol="greedy"):
    return run_dir / "evals" / alias / "toy" / protocol


def test_a_sample_row_by_hand():
    """One row of samples.jsonl from its generation and its grade: the pass is the sample's seed, the gold answer and
    level come from the problem, and first_answer is the answer written first where `extracted` is the last."""
    from types import SimpleNamespace

    from lib.eval.grading import Grade
    from lib.eval.units import sample_rows
    plan = SimpleNamespace(rows=[{"id": "p1", "answer": "3", "level": 2}, {"id": "p2", "answer": "8", "level": 5}])
    gen = {"problem_id": "p1", "seed": 2, "completion": "Answer: 5\nNo, recount.\nAnswer: 3", "n_tokens": 9,
           "truncated": False}
    grade = Grade(True, "3", "answer_line", "math_verify", None, "answer_line")
    assert sample_rows(plan, [gen], [grade]) == [{
        "problem_id": "p1", "seed": 2, "pass": 2, "completion": gen["completion"], "n_tokens": 9, "truncated": False,
        "extractor": "answer_line", "extracted": "3", "correct": True, "verify_method": "math_verify",
        "grade_reason": None, "decided_by": "answer_line", "level": 2, "answer": "3", "first_answer": "5"}]


def test_unit_contents(world, tmp_path):
    run(f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=sample4", "--limit-problems=6")
    u = unit(tmp_path, "toy-pre_sub6", "sample4")
    verify_dir(u)
    scores, rows = read_json(u / "scores.json"), read_jsonl(u / "samples.jsonl")
    assert len(rows) == 24 and {r["seed"] for r in rows} == {0, 1, 2, 3}
    assert scores["n_problems"] == 6 and scores["seeds"] == [0, 1, 2, 3]
    assert scores["deviations"] and "limit-problems: 6" in scores["deviations"][0]
    check_numbers_against_rows(scores, rows)
    gold = {r["id"]: int(r["answer"]) for r in benchmarks.load_benchmark("toy")[0]}
    for r in rows:                       # every verdict agrees with the toy's own integer rule, graded independently
        assert r["correct"] == (extract_int(r["completion"]) == gold[r["problem_id"]]), r
    prov = scores["provenance"]
    assert prov["rendered_tail_example"].endswith("<|im_start|>assistant\n")
    assert len(prov["chat_template_sha256"]) == 64 and prov["generation"]["temperature"] == 0.7
    assert prov["model"]["resolved_revision"].startswith("toy:")
    for r in rows:                       # every row carries what DESIGN.md §5 lists
        assert set(r) >= {"problem_id", "seed", "pass", "completion", "n_tokens", "truncated", "extractor",
                          "extracted", "correct", "verify_method", "answer"}
        assert int(r["answer"]) == gold[r["problem_id"]]          # the gold answer it was graded against
        first = re.search(r"^Answer:[ \t]*(.+)$|\\boxed\{([^{}]*)\}", r["completion"], re.M)   # the toy's two forms
        assert r["first_answer"] == (None if first is None else (first.group(1) or first.group(2)).strip())
        assert not r["truncated"] or r["n_tokens"] == scores["max_new_tokens"]


def check_numbers_against_rows(scores, rows):
    """Every number of scores.json recomputed here from the unit's own per-sample verdicts, not by lib/eval/units.py."""
    order = list(dict.fromkeys(r["problem_id"] for r in rows))          # problems in the order the rows hold them
    acc_P = np.array([np.mean([r["correct"] for r in rows if r["problem_id"] == p]) for p in order])
    assert scores["n_problems"] == len(order) and scores["n_samples"] == len(rows)
    assert scores["accuracy"] == pytest.approx(100 * acc_P.mean())
    # the CI: 10,000 resamples of problems from default_rng(42) (DESIGN.md §6), percentiles 2.5 / 97.5
    idx_BP = np.random.default_rng(42).integers(0, len(order), size=(10_000, len(order)))
    lo, hi = np.percentile(100 * acc_P[idx_BP].mean(axis=1), [2.5, 97.5])
    assert scores["accuracy_ci95"] == pytest.approx([lo, hi])
    assert scores["truncation_rate"] == pytest.approx(np.mean([r["truncated"] for r in rows]))
    assert scores["mean_tokens"] == pytest.approx(np.mean([r["n_tokens"] for r in rows]))
    ext = Counter(r["extractor"] for r in rows)
    assert scores["extractor_split"] == pytest.approx({e: ext[e] / len(rows) for e in ("answer_line", "boxed", "none")})
    trunc = [r for r in rows if r["truncated"]]                      # what the cap cut: graded, and answered at all
    assert (scores["accuracy_truncated"], scores["extracted_truncated"]) == (pytest.approx(
        (100 * np.mean([r["correct"] for r in trunc]), np.mean([r["extractor"] != "none" for r in trunc]))) if trunc
        else (None, None))
    g = scores["grading"]
    assert g["decided_by"] == dict(Counter(r["decided_by"] for r in rows))
    timeouts = [(r["problem_id"], r["seed"]) for r in rows if r["grade_reason"] == "timeout"]
    assert g["n_timeouts"] == len(timeouts) == len(g["timeouts"])
    assert [(t["problem_id"], t["seed"]) for t in g["timeouts"]] == timeouts


def test_summarize_on_synthetic_rows():
    """The same recomputation on 40 problems of varied accuracy (the toy unit's 6 problems are too coarse for the CI
    percentiles to show; seeds per problem vary so the means are not on a coarse grid), with truncations, both
    extractors and answers none could find, fallback paths and two timeouts."""
    from lib.eval.grading import Grade
    from lib.eval.units import grading_summary, summarize
    rng = np.random.default_rng(0)
    rows, grades = [], []
    for p in range(40):
        for seed in range(1 + (p * 5) % 11):
            timeout = (p, seed) in {(3, 1), (17, 0)}
            extractor = "boxed" if p % 5 == 0 else "none" if p % 6 == 1 else "answer_line"
            g = Grade(bool(rng.random() < p / 40) and not timeout, "1", extractor,
                      "math_verify", "timeout" if timeout else None, "math_verify_line" if p % 7 == 0 else "answer_line",
                      5.0 if timeout else 0.01, 5.3 if timeout else 0.02)
            grades.append(g)
            rows.append({"problem_id": f"q{(p * 13) % 40:02d}", "seed": seed, "correct": g.correct,
                         "truncated": bool(rng.random() < 0.2) or not rows, "n_tokens": int(rng.integers(10, 500)),
                         "extractor": g.extractor, "decided_by": g.decided_by, "grade_reason": g.reason})
    scores = summarize(rows) | {"grading": grading_summary(rows, grades, 5.0)}
    check_numbers_against_rows(scores, rows)
    assert scores["grading"]["timeouts"][0] == {"problem_id": "q39", "seed": 1, "cpu_s": 5.0, "wall_s": 5.3}


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
    assert "(model differ;" in p.stderr and "Traceback" not in p.stderr

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
    planted["row_sha256"] = sha256_bytes(json.dumps(planted, sort_keys=True, ensure_ascii=False).encode())
    damaged = dict(planted, problem_id=rows[1]["problem_id"])        # its sha256 is the planted row's: redone
    other = tmp_path / "other"
    part = unit(other, "toy-pre_sub3") / "generations.partial.jsonl"
    part.parent.mkdir(parents=True)
    part.write_text(json.dumps(planted) + "\n" + json.dumps(damaged) + "\n" + '{"config_sha256": "torn')
    p = run(*args[1:], f"--run-dir={other}")
    assert "resuming, 1 samples already generated" in p.stdout and "2 row(s) torn, damaged" in p.stdout
    got = read_jsonl(unit(other, "toy-pre_sub3") / "samples.jsonl")
    assert got[0]["completion"] == "planted\nAnswer: 12345" and got[0]["extracted"] == "12345"
    assert [r["completion"] for r in got[1:]] == [r["completion"] for r in rows[1:]]   # the rest regenerated identically
    assert not part.exists()


def test_context_gate_refuses_with_numbers(world, tmp_path):
    p = run(f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=greedy", "--limit-problems=2",
            "--max-new-tokens=100000", check=False)
    assert p.returncode != 0
    assert "context gate" in p.stderr and "max_position_embeddings 512" in p.stderr and "100000" in p.stderr


# --- the evaluated model and the benchmark file: their own refusals ---

def fake_checkpoint(run_dir, seal=True):
    """train/fake/step_000001: toy π_pre's files as a training run writes them, sealed by the run's manifest."""
    run = run_dir / "train" / "fake"
    step = run / "step_000001"
    shutil.copytree(models.resolve_model("toy-pre").path, step)
    (step / "checkpoint.json").write_text(json.dumps({"run": "fake", "step": 1, "student_init": "toy-pre"}))
    if seal:
        write_manifest(run, stage="03_opd_train", script=__file__, args={}, inputs={}, outputs=["step_000001"],
                       started="", wall_s=0.0)
    return step


def test_checkpoint_is_verified_against_its_run_manifest(world, tmp_path):
    step = fake_checkpoint(tmp_path)
    args = [f"--run-dir={tmp_path}", f"--model={step}", "--benchmark=toy", "--protocol=greedy", "--limit-problems=2"]
    run(*args)
    u = unit(tmp_path, "fake-step1_sub2")
    assert read_json(u / "scores.json")["provenance"]["model"]["sealed_by"] == str(tmp_path / "train/fake/manifest.json")
    weights = next(step.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1                                                       # one flipped bit in the weights
    weights.write_bytes(bytes(data))
    p = run(*args, "--skip-if-exists", check=False)
    err = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(err) == 1, p.stderr                # one line ...
    assert f"{weights.name} has sha256" in err[0] and "checkpoint changed after 03_opd_train" in err[0]   # ... naming it
    assert "different configuration" not in p.stderr


def test_unsealed_checkpoint_and_added_file_are_refused(world, tmp_path):
    step = fake_checkpoint(tmp_path / "a", seal=False)
    p = run(f"--run-dir={tmp_path / 'a'}", f"--model={step}", "--benchmark=toy", "--protocol=greedy",
            "--limit-problems=2", check=False)
    assert p.returncode != 0 and "is not sealed" in p.stderr and "--resume" in p.stderr, p.stderr
    step = fake_checkpoint(tmp_path / "b")
    (step / "extra.json").write_text("{}")
    p = run(f"--run-dir={tmp_path / 'b'}", f"--model={step}", "--benchmark=toy", "--protocol=greedy",
            "--limit-problems=2", check=False)
    assert p.returncode != 0 and "extra.json is not listed in" in p.stderr, p.stderr


def test_two_benchmark_files_with_one_stem(world, tmp_path):
    rows = benchmarks.load_benchmark("toy")[0]
    for sub, part in (("a", rows[:2]), ("b", rows[2:4])):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    common = [f"--run-dir={tmp_path / 'run'}", "--model=toy-pre", "--protocol=greedy"]
    run(*common, f"--benchmark={tmp_path / 'a' / 'bench.jsonl'}")
    p = run(*common, f"--benchmark={tmp_path / 'b' / 'bench.jsonl'}", "--skip-if-exists", check=False)
    assert p.returncode != 0 and "another benchmark file with the stem 'bench'" in p.stderr, p.stderr
    assert "different configuration" not in p.stderr


# --- issue 34: the grader bound is validated and part of the unit's identity ---

@pytest.mark.parametrize("bound, said", [("0", "expected a finite number > 0, got '0'"),
                                         ("-1", "expected a finite number > 0, got '-1'"),
                                         ("nan", "expected a finite number, got 'nan'")])
def test_grade_timeout_is_validated_before_anything(tmp_path, bound, said):
    p = run(f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=greedy", "--limit-problems=4",
            f"--grade-timeout={bound}", check=False)
    assert p.returncode == 2 and "argument --grade-timeout: " + said in p.stderr and "Traceback" not in p.stderr
    assert not any(tmp_path.iterdir())


def test_the_grader_bound_is_part_of_the_identity_and_the_default_keeps_it(world, tmp_path):
    from lib.eval.units import GRADE_TIMEOUT_S, config_sha256, plan_unit
    args = ("toy-pre", "toy", "greedy")
    default = plan_unit(tmp_path, *args, limit_problems=4)
    assert "grade_timeout_s" not in default.config                      # identities sealed before the bound counted
    assert plan_unit(tmp_path, *args, limit_problems=4, grade_timeout=GRADE_TIMEOUT_S).config == default.config
    other = plan_unit(tmp_path, *args, limit_problems=4, grade_timeout=7.5)
    assert other.config == default.config | {"grade_timeout_s": 7.5}
    assert config_sha256(other.config) != config_sha256(default.config)
    common = [f"--run-dir={tmp_path}", "--model=toy-pre", "--benchmark=toy", "--protocol=greedy", "--limit-problems=4"]
    run(*common)
    p = run(*common, "--grade-timeout=7.5", "--skip-if-exists", check=False)     # not reused as the default's unit
    assert p.returncode != 0 and "different configuration (grade_timeout_s differ;" in p.stderr


def test_a_checkpoint_folder_is_checked_file_by_file_and_its_unit_named_by_what_it_deviates_in(world, tmp_path):
    from lib.eval.units import config_sha256, plan_unit, verify_model_folder
    a = fake_checkpoint(tmp_path / "a")
    b = fake_checkpoint(tmp_path / "b")
    # the same model at another path is the same unit: a path is no part of the identity
    plan_a = plan_unit(tmp_path / "a", str(a), "toy", "greedy", limit_problems=2, max_new_tokens=64)
    plan_b = plan_unit(tmp_path / "b", str(b), "toy", "greedy", limit_problems=2, max_new_tokens=64)
    assert config_sha256(plan_a.config) == config_sha256(plan_b.config)
    assert plan_a.alias == "fake-step1_sub2_cap64" and plan_a.deviations[-1].startswith("max-new-tokens: 64")
    # a sibling whose name extends this one's (step_000001 and step_0000010) lists its own files, not this one's
    sibling = a.parent / "step_0000010"
    shutil.copytree(a, sibling)
    write_manifest(a.parent, stage="03_opd_train", script=__file__, args={}, inputs={},
                   outputs=["step_000001", "step_0000010"], started="", wall_s=0.0)
    assert verify_model_folder(a) == str(a.parent / "manifest.json")
    gone = next(a.glob("*.safetensors"))
    gone.unlink()                                                      # a listed file deleted after the seal
    with pytest.raises(ArtifactError, match=f"{gone.name} has sha256 missing"):
        verify_model_folder(a)
