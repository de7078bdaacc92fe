"""Atomic writes, manifests and refusal on a hash mismatch (SPEC §11); data loading and the DAPO prompt (SPEC §3)."""
import hashlib
import json
import os

import pytest

from lib import artifacts as A
from lib import data, registry


def test_atomic_write_leaves_no_temp_and_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "x.json"
    A.atomic_write_json(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}

    class Boom:
        pass
    with pytest.raises(TypeError):
        A.atomic_write_json(p, {"a": Boom()})      # serialisation fails before anything is replaced
    assert json.loads(p.read_text()) == {"a": 1}
    assert [q.name for q in tmp_path.iterdir()] == ["x.json"]


def test_manifest_hashes_and_detects_corruption(tmp_path):
    out = tmp_path / "stage"
    A.atomic_write_jsonl(out / "rows.jsonl", [{"i": i} for i in range(3)])
    (out / "sub").mkdir()
    (out / "sub" / "w.bin").write_bytes(b"\x00\x01")
    inp = tmp_path / "input.jsonl"
    inp.write_text("{}\n")
    started, t0 = A.wall_clock()
    A.write_manifest(out, stage="test", script=__file__, args={"k": 1, "p": tmp_path}, inputs={"data": inp},
                     outputs=["rows.jsonl", "sub"], started=started, wall_s=1.5, gpu_s=3.0)
    m = A.verify_dir(out)
    assert m["outputs"]["rows.jsonl"] == hashlib.sha256((out / "rows.jsonl").read_bytes()).hexdigest()
    assert m["outputs"]["sub/w.bin"] == hashlib.sha256(b"\x00\x01").hexdigest()
    assert m["inputs"]["data"]["sha256"] == hashlib.sha256(b"{}\n").hexdigest()
    assert m["code"]["script_sha256"] == A.sha256_file(__file__) and len(m["code"]["lib_sha256"]) == 64
    assert m["wall_s"] == 1.5 and m["gpu_s"] == 3.0 and m["args"]["p"] == str(tmp_path)

    with open(out / "rows.jsonl", "a") as f:     # one changed byte anywhere is refused, naming the file
        f.write(" ")
    with pytest.raises(A.ArtifactError, match=r"rows\.jsonl has sha256 .* changed after test wrote it"):
        A.verify_dir(out)
    os.remove(out / "sub" / "w.bin")
    with pytest.raises(A.ArtifactError, match="missing"):
        A.verify_dir(out, ["sub/w.bin"])
    with pytest.raises(A.ArtifactError, match="no manifest.json"):
        A.verify_dir(tmp_path)


def test_read_jsonl_names_the_corrupt_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(A.ArtifactError, match=r"a\.jsonl:2"):
        A.read_jsonl(p)


def test_dapo_prompt_is_verbatim():
    s = data.dapo_prompt("What is 1+1?")
    assert s.startswith("Solve the following math problem step by step. The last line of your response should be of "
                        "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
    assert s.endswith('What is 1+1?\n\nRemember to put your answer on its own line after "Answer:".')


def test_rows_are_checked(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"id": 1, "problem": "x", "answer": 2}\n{"id": "1", "problem": "y", "answer": "3"}\n')
    with pytest.raises(ValueError, match="duplicate id '1'"):
        data.load_rows(p)
    p.write_text('{"id": "a", "problem": "x"}\n')
    with pytest.raises(ValueError, match=r"row 0 \(id='a'\) lacks \['answer'\]"):
        data.load_rows(p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.load_rows(tmp_path / "nope.jsonl")


def test_evenly_spaced_and_stable_seed():
    assert data.evenly_spaced(list(range(10)), 3) == [0, 3, 6]
    assert data.evenly_spaced(list(range(500)), 100)[:3] == [0, 5, 10]
    assert data.evenly_spaced([1, 2], None) == [1, 2]
    assert data.stable_seed("a", 1) == data.stable_seed("a", 1) != data.stable_seed("a", 2)
    assert 0 <= data.stable_seed("x") < 2**63


def test_registry_is_consistent():
    for name, pair in registry.PAIRS.items():
        for m in (pair.pi_pre, pair.pi_post):
            assert m in registry.MODELS, f"pair {name}: {m}"
        assert pair.student in registry.STUDENTS and pair.train_data in registry.BENCHMARKS
        for bench, proto in pair.evals:
            assert bench in registry.BENCHMARKS and proto in registry.PROTOCOLS
    pins = {m.alias: m.revision for m in registry.MODELS.values() if m.revision}
    assert pins == {"qwen2.5-1.5b-instruct": "989aa7980e4cf806f80c7fef2b1adb7bc71aa306",
                    "openthinker3-1.5b": "0ee90a38b29bfac8b8b005da9ae32c59e2943785"}
    assert registry.MODELS["qwen2.5-math-1.5b"].eval_max_new_tokens == 3_200
    assert registry.PROTOCOLS["sample32"] == registry.Protocol(32, 0.7, 0.95)


def test_real_benchmarks_load_when_present():
    if registry.data_dir() is None:
        pytest.skip("no ../shared/data beside the checkout and OPD_DATA_DIR unset")
    sizes = {b: len(registry.load_benchmark(b)[0]) for b in ("aime24", "aime25", "math500")}
    assert sizes == {"aime24": 30, "aime25": 30, "math500": 500}
    with pytest.raises(ValueError, match=r"math-train-00886.*lacks \['answer'\]"):   # 2 real rows have no answer
        registry.load_benchmark("math_train")
    train, _ = registry.load_benchmark("math_train", require_answer=False)      # prompts need none
    assert len(train) == 7474 and sum(r["answer"] is None for r in train) == 2


def test_hub_models_fail_offline_with_a_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="pass the local folder"):
        registry.resolve_model("qwen2.5-1.5b-instruct")
    with pytest.raises(KeyError, match="neither a registered alias"):
        registry.resolve_model("no-such-model")
