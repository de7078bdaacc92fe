"""Model names the ecosystem's way (DESIGN.md §2): a registry alias, a hub id (+ revision) or a local folder, and an
offline refusal that lists each missing model as id@revision with the command that fetches it."""
import json
import subprocess
import sys

import pytest

from lib import models, registry
from lib.artifacts import REPO
from lib.errors import UserError

PRE = registry.MODELS["qwen2.5-1.5b-instruct"]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache laid out as huggingface_hub writes it (models--owner--name/snapshots/<commit>)."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as C
    monkeypatch.setattr(C, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(cache))

    def put(hub_id, revision):
        snap = cache / f"models--{hub_id.replace('/', '--')}" / "snapshots" / revision
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        return snap
    return put


def test_alias_and_its_hub_id_resolve_to_the_pinned_snapshot(hub_cache):
    snap = hub_cache(PRE.hub_id, PRE.revision)
    for name in ("qwen2.5-1.5b-instruct", "Qwen/Qwen2.5-1.5B-Instruct"):
        r = models.resolve_model(name)
        assert (r.alias, r.path, r.hub_id, r.resolved_revision) == (PRE.alias, snap, PRE.hub_id, PRE.revision)
    assert models.model_spec("Qwen/Qwen3-4B").thinking and models.model_spec("qwen3-4b").thinking
    assert models.model_spec("Qwen/Qwen2.5-Math-1.5B").eval_max_new_tokens == 3_200


def test_unregistered_hub_id_with_a_revision(hub_cache):
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = hub_cache("someone/My-Model", rev)
    for name, kw in (("someone/My-Model@" + rev, {}), ("someone/My-Model", {"revision": rev})):
        r = models.resolve_model(name, **kw)
        assert (r.alias, r.path, r.hub_id, r.revision) == ("someone--My-Model", snap, "someone/My-Model", rev)
    assert models.with_revision("someone/My-Model", rev) == f"someone/My-Model@{rev}"
    assert models.model_spec(f"someone/My-Model@{rev}").hub_id == "someone/My-Model"
    with pytest.raises(UserError, match="names revision .* but --revision says"):
        models.resolve_model(f"someone/My-Model@{rev}", revision="main")
    other = hub_cache(PRE.hub_id, rev)                       # another revision of a registered model
    assert models.resolve_model(PRE.hub_id, revision=rev).path == other


def test_local_folder_is_accepted_and_a_folder_without_config_is_named(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(UserError, match=r"model folder .*m has no config\.json"):
        models.resolve_model(str(tmp_path / "m"))
    (tmp_path / "m" / "config.json").write_text("{}")
    r = models.resolve_model(str(tmp_path / "m"))
    assert r.path == tmp_path / "m" and r.resolved_revision.startswith("local:")
    assert models.student_spec(str(tmp_path / "m")).model == str(tmp_path / "m")
    assert models.student_spec("toy") is registry.STUDENTS["toy"]
    with pytest.raises(UserError, match="unknown student 'nope'"):
        models.student_spec("nope")
    with pytest.raises(UserError, match=r"^unknown model 'no-such-model': not a registry alias .*not a hub id"):
        models.resolve_model("no-such-model")


def test_offline_lists_each_missing_model_with_its_fetch_command(hub_cache):
    hub_cache(PRE.hub_id, PRE.revision)                      # π_pre is cached, π_post and the student are not
    pair = registry.PAIRS["openthinker"]
    roles = {"student": registry.STUDENTS[pair.student].model, "pi_pre": pair.pi_pre, "pi_post": pair.pi_post}
    with pytest.raises(UserError) as e:
        models.resolve_roles(roles, what="pair openthinker")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("2 model(s) of pair openthinker are not in the local Hugging Face cache")
    for role in ("student", "pi_post"):
        m = registry.MODELS[roles[role]]
        assert f"{role} {m.hub_id}@{m.revision} (`hf download {m.hub_id} --revision {m.revision}`)" in msg
    assert PRE.hub_id not in msg


def test_campaign_model_needs_its_run_dir(tmp_path):
    with pytest.raises(UserError, match=r"lives in a campaign directory \(raft/model\); pass --run-dir"):
        models.resolve_model("raft")
    with pytest.raises(UserError, match=r"model raft not found at .*raft/model: run 07_raft\.py"):
        models.resolve_model("raft", tmp_path)


def test_04_refuses_an_unknown_model_in_one_line():
    r = subprocess.run([sys.executable, "04_eval.py", "--model", "no-such-model", "--benchmark", "toy",
                        "--protocol", "greedy", "--run-dir", "/nonexistent"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("unknown model 'no-such-model'")


def test_a_changed_byte_in_a_cached_toy_model_is_refused(tmp_path, monkeypatch):
    """The cache holds the world its hash names only while its bytes are the ones the build recorded."""
    import shutil
    from lib.errors import UserError
    from lib.toy import builder
    src = builder.build()
    copy = tmp_path / "toy" / src.name
    shutil.copytree(src, copy)
    monkeypatch.setenv("OPD_CACHE", str(tmp_path))
    assert models.resolve_model("toy-pre").path == copy / "models" / "pre"      # the copy is read, and verifies
    weights = copy / "models" / "pre" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match="toy model pre: .* sha256 .* world.json"):
        models.resolve_model("toy-pre")


@pytest.mark.parametrize("edit", ["rope_theta", "deleted_key", "tokenizer", "generation", "extra_file"])
def test_every_file_of_a_cached_toy_model_is_checked(tmp_path, monkeypatch, edit):
    """config.json, the tokenizer files and generation_config.json are held to what world.json records, and a file
    the build did not write is refused: an edited rope_theta once gave 12.5 % instead of 50.0 % under one identity."""
    import json
    import shutil
    from lib.errors import UserError
    from lib.toy import builder
    src = builder.build()
    copy = tmp_path / "toy" / src.name
    shutil.copytree(src, copy)
    monkeypatch.setenv("OPD_CACHE", str(tmp_path))
    folder = copy / "models" / "pre"
    assert models.resolve_model("toy-pre").path == folder
    config = json.loads((folder / "config.json").read_text())
    if edit == "rope_theta":
        config["rope_parameters"]["rope_theta"] = 1e6
        (folder / "config.json").write_text(json.dumps(config))
    elif edit == "deleted_key":
        del config["num_hidden_layers"]
        (folder / "config.json").write_text(json.dumps(config))
    elif edit == "tokenizer":
        text = (folder / "tokenizer.json").read_text()
        (folder / "tokenizer.json").write_text(text.replace('"merges": [', '"merges": [["x", "y"], ', 1))
    elif edit == "generation":
        gen = json.loads((folder / "generation_config.json").read_text())
        (folder / "generation_config.json").write_text(json.dumps(gen | {"eos_token_id": 0}))
    else:
        (folder / "modeling_evil.py").write_text("print('hi')\n")
    with pytest.raises(UserError, match="toy model pre: .* world.json; delete"):
        models.resolve_model("toy-pre")
