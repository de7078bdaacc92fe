"""Atomic writes, manifests and refusal on a hash mismatch (DESIGN.md §11); the real benchmark files and the DAPO prompt
(DESIGN.md §3). Malformed problem files: tests/test_data.py."""
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

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


def test_manifest_lists_nested_outputs_and_names_what_it_refuses(tmp_path):
    out = tmp_path / "stage"
    (out / "model" / "shards").mkdir(parents=True)
    (out / "model" / "config.json").write_text("{}")
    (out / "model" / "shards" / "w.bin").write_bytes(b"\x02")                  # two folders deep
    started, _ = A.wall_clock()
    A.write_manifest(out, stage="test", script=__file__, args={}, inputs={"folder": out / "model"},
                     outputs=["model"], started=started, wall_s=0.0)
    m = A.verify_dir(out)
    assert sorted(m["outputs"]) == ["model/config.json", "model/shards/w.bin"]
    assert m["inputs"]["folder"]["sha256"] == A.sha256_tree(out / "model")       # a folder input: its tree hash
    # the lib hash covers the package's sources, not an empty match
    assert m["code"]["lib_sha256"] == A.sha256_tree(A.REPO / "lib", "*.py") != hashlib.sha256().hexdigest()
    with pytest.raises(A.ArtifactError, match=r"stage/notes\.txt is not listed in .*manifest\.json"):
        A.verify_dir(out, ["notes.txt"])
    A.atomic_write_json(out / "manifest.json", {"written_by": "something else"})
    with pytest.raises(A.ArtifactError, match=r"is not a manifest \(no stage name or outputs table\)"):
        A.verify_dir(out)


def test_tree_hash_covers_names_and_skips_bytecode(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    h = A.sha256_tree(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00")     # bytecode is no part of the code
    assert A.sha256_tree(tmp_path) == h
    (tmp_path / "b.py").rename(tmp_path / "c.py")                             # same bytes, another name
    assert A.sha256_tree(tmp_path) != h


def test_json_spelling_is_sorted_and_failed_writes_leave_nothing(tmp_path, monkeypatch):
    assert A.dumps_json({"b": 1, "a": {"d": 2, "c": 3}}) == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'
    p = tmp_path / "x.json"
    A.atomic_write_json(p, {"a": 1})

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(A.os, "replace", full_disk)        # the bytes are written, the rename fails
    with pytest.raises(OSError):
        A.atomic_write_json(p, {"a": 2})
    assert [q.name for q in tmp_path.iterdir()] == ["x.json"] and json.loads(p.read_text()) == {"a": 1}


def test_git_commit_marks_a_changed_checkout_dirty(tmp_path, monkeypatch):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.txt").write_text("a")
    subprocess.run(git + ["add", "f.txt"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], check=True)
    monkeypatch.setattr(A, "REPO", tmp_path)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert A.git_commit() == head
    (tmp_path / "f.txt").write_text("b")
    assert A.git_commit() == head + "-dirty"


def test_private_files_get_the_modes_of_ordinary_ones(tmp_path):
    old = os.umask(0o022)
    try:
        folder = Path(tempfile.mkdtemp(dir=tmp_path))                     # 0700, as mkdtemp makes it
        (folder / "w.safetensors").write_bytes(b"\x00")
        os.chmod(folder / "w.safetensors", 0o600)                         # as safetensors writes it
        A.follow_umask(folder)
        assert (os.stat(folder).st_mode & 0o777, os.stat(folder / "w.safetensors").st_mode & 0o777) == (0o755, 0o644)
        os.chmod(folder / "w.safetensors", 0)                             # no bit at all is widened too
        A.follow_umask(folder)
        assert os.stat(folder / "w.safetensors").st_mode & 0o777 == 0o644
        os.chmod(folder / "w.safetensors", 0o600)
        A.umask_mode(folder / "w.safetensors")
        assert os.stat(folder / "w.safetensors").st_mode & 0o777 == 0o644
    finally:
        os.umask(old)

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
    # the rule every sample and rollout seed depends on, on every machine: sha256 of the parts joined by NUL, its
    # first 8 bytes little-endian, the top bit cleared; so ("a1") and ("a", 1) are different seeds
    digest = hashlib.sha256(b"problem-7\x003\x00pass").digest()
    assert data.stable_seed("problem-7", 3, "pass") == int.from_bytes(digest[:8], "little") & (2**63 - 1)
    assert data.stable_seed("a1") != data.stable_seed("a", 1)


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
