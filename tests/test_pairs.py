"""Pairs from a file or flags (lib/pairs.py): the parser's refusals, declared models and benchmarks, and a pair
defined in a TOML file run through 01 → 06 with no edit under lib/."""
import hashlib
import json

import pytest

from helpers import run_script
from lib import benchmarks, models, pairs, registry
from lib.errors import UserError


def pair_file(tmp_path, body: str, name: str = "pair.toml"):
    p = tmp_path / name
    p.write_text(body)
    return p


@pytest.fixture
def toy_pre():
    from lib.toy import builder
    builder.build()
    return builder.model_dir("pre")


def file_pair_body(folder) -> str:
    return f'''name = "filepair"
pi_pre = "mypre"
pi_post = "toy-post"
student = "toy-student"
max_prompt_len = 96
max_response_len = 48
train_data = "toy_train"
evals = [["toy-24", "greedy"]]
note = "the toy pair, declared in a file"

[models.mypre]
folder = "{folder}"
eval_max_new_tokens = 96

[benchmarks.toy-24]
source = "toy"
limit_problems = 24
'''


def test_a_registered_pair_loads_as_itself():
    lp = pairs.load("toy")
    assert lp.pair == registry.PAIRS["toy"] and lp.student == registry.STUDENTS["toy"] and lp.file is None
    assert lp.sha256 == pairs.load("toy").sha256 != pairs.load("toy-raft").sha256


def test_flags_make_another_pair_with_its_own_name():
    lp = pairs.load("toy", pi_post="toy-post-offsupport")
    assert lp.pair.pi_post == "toy-post-offsupport" and lp.pair.pi_pre == "toy-pre"
    assert lp.name.startswith("toy-custom-") and lp.name != pairs.load("toy", pi_pre="toy-student").name
    assert lp.sha256 != pairs.load("toy").sha256


def test_a_file_declares_models_and_benchmarks(tmp_path, toy_pre):
    f = pair_file(tmp_path, file_pair_body(toy_pre))
    lp = pairs.load(str(f))
    assert (lp.name, lp.pair.pi_pre, lp.pair.gate_benchmark) == ("filepair", "mypre", "toy-24")
    assert lp.sha256 == hashlib.sha256(f.read_bytes()).hexdigest() and lp.record()["pair_file"] == str(f)
    assert (lp.student.max_prompt_len, lp.student.max_response_len, lp.student.teacher) == (96, 48, None)
    # the declared model resolves to its folder, with its own cap (not a deviation)
    r = models.resolve_model("mypre")
    assert r.path == toy_pre and r.resolved_revision.startswith("local:")
    assert models.model_spec("mypre").eval_max_new_tokens == 96
    # the declared benchmark is its source's 24 evenly spaced rows, read from the source's file
    rows, src = benchmarks.load_benchmark("toy-24")
    full, full_src = benchmarks.load_benchmark("toy")
    assert src == full_src and [r["id"] for r in rows] == [full[i * len(full) // 24]["id"] for i in range(24)]


def test_a_relative_folder_is_read_from_the_files_folder(tmp_path, toy_pre):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "pre").symlink_to(toy_pre)
    lp = pairs.load(str(pair_file(tmp_path, file_pair_body("models/pre"))))
    assert pairs.declared_model("mypre").folder == str((tmp_path / "models" / "pre").resolve()) == str(toy_pre)
    assert lp.name == "filepair" and models.resolve_model("mypre").path == toy_pre


@pytest.mark.parametrize("edit,message", [
    (lambda b: 'seed = 3\n' + b, "unknown key 'seed'"),
    (lambda b: b + 'seed = 3\n', "[benchmarks.toy-24]: unknown key 'seed'"),
    (lambda b: b.replace('pi_pre = "mypre"\n', ""), "`pi_pre` must be a model name"),
    (lambda b: b.replace('["toy-24", "greedy"]', '["toy-24", "sample5"]'), "protocol 'sample5'"),
    (lambda b: b.replace('["toy-24", "greedy"]', '["nowhere", "greedy"]'), "evals benchmark 'nowhere'"),
    (lambda b: b.replace("max_prompt_len = 96", "max_prompt_len = 0"), "`max_prompt_len` must be a positive"),
    (lambda b: b.replace('name = "filepair"', 'name = "../x"'), "not a single folder name"),
    (lambda b: b.replace("eval_max_new_tokens = 96", "eval_max_new_tokens = 96\nhub_id = \"a/b\""),
     "exactly one of `folder`"),
    (lambda b: b.replace("[models.mypre]", "[models.toy-pre]"), "registered model's alias"),
    (lambda b: b.replace('source = "toy"\n', ""), "`source` must name"),
    (lambda b: 'gate_benchmark = "toy"\n' + b, "gate_benchmark 'toy' is not one of the evals"),
    (lambda b: b.replace("[models.mypre]", "[models.mypre"), "not valid TOML"),
])
def test_a_bad_file_is_refused_in_one_line(tmp_path, toy_pre, edit, message):
    f = pair_file(tmp_path, edit(file_pair_body(toy_pre)))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        pairs.load(str(f))
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_an_unknown_pair_names_both_forms():
    with pytest.raises(UserError, match=r"not a registered pair \(.*toy.*\) and not a \.toml file"):
        pairs.load("toyy")
    with pytest.raises(UserError, match="pair file nowhere/p.toml not found"):
        pairs.load("nowhere/p.toml")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_pair_defined_in_a_file_runs_01_to_06(tmp_path, toy_pre):
    f = pair_file(tmp_path, file_pair_body(toy_pre))
    run = tmp_path / "run"
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    run_script("01_gates.py", "--pair", f, "--run-dir", run, "--anatomy-prompts", 8, "--roundtrip-strings", 50)
    gates = json.loads((run / "gates" / "manifest.json").read_text())
    assert (gates["pair"], gates["pair_sha256"], gates["passed"]) == ("filepair", sha, True)
    run_script("02_baselines.py", "--pair", f, "--run-dir", run)
    assert sorted(p.name for p in (run / "evals").iterdir()) == ["mypre", "toy-post", "toy-student"]
    unit = json.loads((run / "evals" / "mypre" / "toy-24" / "greedy" / "scores.json").read_text())
    assert unit["n_problems"] == 24 and not unit.get("deviations"), unit.get("deviations")
    run_script("03_opd_train.py", "--pair", f, "--run-dir", run, "--steps", 2, "--batch-prompts", 8, "--save-every", 2,
               "--micro-batch", 8, "--reward", "delta-sampled")
    summary = json.loads((run / "train" / "delta-sampled" / "summary.json").read_text())
    assert (summary["pair"], summary["pair_sha256"]) == ("filepair", sha)
    run_script("04_eval.py", "--pair", f, "--run-dir", run, "--model", run / "train" / "delta-sampled" / "step_000002",
               "--benchmark", "toy-24", "--protocol", "greedy")
    run_script("05_stats.py", "--run-dir", run, "--pair", f)
    t = json.loads((run / "stats" / "teacher_gains.json").read_text())
    assert (t["pair"], t["pair_sha256"], t["pi_pre"], t["evals"]) == ("filepair", sha, "mypre", [["toy-24", "greedy"]])
    (gain,) = t["gains"]
    assert (gain["alias_a"], gain["alias_b"], gain["benchmark"]) == ("mypre", "toy-post", "toy-24")
    s = json.loads((run / "stats" / "student_gains.json").read_text())
    assert [(g["alias_b"], g["benchmark"]) for g in s["gains"]] == [("delta-sampled-step2", "toy-24")]
    run_script("06_report.py", "--run-dir", run)
    assert "filepair" in (run / "report" / "README.md").read_text()

    # the pair's run folder refuses another file under the same name: 05 names both hashes
    f.write_text(f.read_text().replace("the toy pair, declared in a file", "edited"))
    p = run_script("05_stats.py", "--run-dir", run, "--pair", f, check=False)
    assert p.returncode == 1 and "the pair file changed since" in p.stderr, p.stderr[-2000:]
    # and 05 cannot guess an unregistered pair's file
    p = run_script("05_stats.py", "--run-dir", run, check=False)
    assert p.returncode == 1 and "not registered: pass --pair with its .toml file" in p.stderr, p.stderr[-2000:]


def test_a_run_started_before_pair_hashes_continues_and_a_changed_pair_is_refused():
    from lib.runs import settings_diff
    old, now = {"pair": "toy", "lr": 1e-4}, {"pair": "toy", "lr": 1e-4, "pair_name": "toy", "pair_sha256": "a" * 64}
    assert settings_diff(old, now) == []
    assert settings_diff(now | {"pair_sha256": "b" * 64}, now) == [f"  --pair-sha256: was {'b' * 64!r}, now "
                                                                   f"{'a' * 64!r}"]
