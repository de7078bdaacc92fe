"""Atomic writes, manifests and refusal on a hash mismatch (DESIGN.md §11); the real benchmark files and the DAPO prompt
(DESIGN.md §3). Malformed problem files: tests/test_data.py."""
import hashlib
import json
import os

import pytest

from lib import artifacts as A
from lib import benchmarks, data
from lib.errors import UserError


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


def test_evenly_spaced_and_stable_seed():
    assert data.evenly_spaced(list(range(10)), 3) == [0, 3, 6]
    assert data.evenly_spaced(list(range(500)), 100)[:3] == [0, 5, 10]
    assert data.evenly_spaced([1, 2], None) == [1, 2]
    assert data.stable_seed("a", 1) == data.stable_seed("a", 1) != data.stable_seed("a", 2)
    assert 0 <= data.stable_seed("x") < 2**63


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_writes_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        assert A.current_umask() == umask
        A.atomic_write_json(tmp_path / "a.json", {"a": 1})
        A.atomic_write_text(tmp_path / "a.json", "replaced")          # a replacement gets the mode too
        with open(tmp_path / "plain.txt", "w") as f:                   # the reference: what open() gives
            f.write("x")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "a.json").st_mode & 0o777 == mode == os.stat(tmp_path / "plain.txt").st_mode & 0o777


def test_real_benchmarks_load_when_present():
    if benchmarks.data_dir() is None:
        pytest.skip("no ../shared/data beside the checkout and OPD_DATA_DIR unset")
    sizes = {b: len(benchmarks.load_benchmark(b)[0]) for b in ("aime24", "aime25", "math500")}
    assert sizes == {"aime24": 30, "aime25": 30, "math500": 500}
    with pytest.raises(UserError, match=r"math_train\.jsonl line 887 \(id='math-train-00886'\) lacks \['answer'\]"):
        benchmarks.load_benchmark("math_train")                      # 2 real rows have no answer
    train, _ = benchmarks.load_benchmark("math_train", require_answer=False)      # prompts need none
    assert len(train) == 7474 and sum(r["answer"] is None for r in train) == 2
