"""Model resolution: any model name → a local folder and the revision actually used (DESIGN.md §2).

A model can be named three ways, wherever one is asked for (04's `--model`, 03's `--student` / `--teacher`, a pair's
π_pre / π_post / student):
  - a registry alias (`qwen2.5-1.5b-instruct`, `toy-pre`, `raft`, …): lib/registry.py's entry, pinned revision;
  - a hub id, optionally `@revision` (`Qwen/Qwen2.5-1.5B-Instruct@989aa79…`); a registered hub id gets its
    registry entry (pin, token cap, thinking mode) unless another revision is asked for;
  - a local folder holding config.json (a checkpoint, a model copied from elsewhere).
Offline, a hub model that is not in the local Hugging Face cache is refused with the command that fetches it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from lib.artifacts import read_json, sha256_tree
from lib.errors import UserError
from lib.pairs import declared_model
from lib.registry import MODELS, STUDENTS, Model, Student

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"]
BASE_FILE = "raft.json"   # 07_raft.py writes it into the RAFT teacher's folder: {"base": π_pre's alias, ...}


# --- names: alias | hub id[@revision] | folder ---

def split_revision(name: str, revision: str | None = None) -> tuple[str, str | None]:
    """'owner/name@rev' → ('owner/name', 'rev'); an explicit `revision` wins over none, and must agree with one."""
    base, at, rev = name.partition("@")
    if at and not Path(name).exists():
        if revision and revision != rev:
            raise UserError(f"model {name} names revision {rev} but --revision says {revision}: give it once")
        return base, rev
    return name, revision


def with_revision(name: str, revision: str | None) -> str:
    """`name@revision` when a revision is given (04's --revision), else `name`."""
    return f"{name}@{revision}" if revision else name


def registered(name: str) -> Model | None:
    """The registry entry of an alias or of a registered hub id, or a model the loaded pair file declares."""
    return (MODELS.get(name) or declared_model(name)
            or next((m for m in MODELS.values() if m.hub_id and m.hub_id == name), None))


def is_hub_id(name: str) -> bool:
    return bool(HUB_ID.fullmatch(name)) and not Path(name).exists()


def fetch_command(hub_id: str, revision: str | None, repo_type: str = "model") -> str:
    kind = "" if repo_type == "model" else f" --repo-type {repo_type}"
    return f"hf download {hub_id}{kind} --revision {revision or 'main'}"


def model_spec(name: str, run_dir: str | Path | None = None) -> Model:
    """The registry entry of a name (alias or registered hub id), or a bare entry for any other hub id or folder.
    A model made by the campaign (`run_path`) whose folder names its base in raft.json is evaluated under the base's
    settings (token cap, thinking mode): the toy RAFT teacher gets toy π_pre's 96-token cap, the real one
    Qwen2.5-1.5B-Instruct's."""
    base_name, _ = split_revision(name)
    m = registered(base_name)
    if m is None:
        hub = base_name if is_hub_id(base_name) else None
        return Model(base_name.replace("/", "--") if hub else Path(base_name).name, hub_id=hub)
    if m.run_path and run_dir is not None and (f := Path(run_dir) / m.run_path / BASE_FILE).exists():
        base = registered(read_json(f).get("base") or "")
        if base is not None:
            return replace(m, eval_max_new_tokens=base.eval_max_new_tokens, thinking=base.thinking)
    return m


def student_spec(name: str) -> Student:
    """A registered student, or any other model name trained under the default caps (no default teacher)."""
    if name in STUDENTS:
        return STUDENTS[name]
    base_name = split_revision(name)[0]
    if registered(base_name) or is_hub_id(base_name) or (Path(name) / "config.json").exists():
        return Student(name)
    raise UserError(f"unknown student {name!r}: use one of {sorted(STUDENTS)}, a model alias, a hub id or a folder "
                    f"with config.json")


# --- resolution: a local folder + provenance ---

@dataclass
class Resolved:
    alias: str
    path: Path
    hub_id: str | None = None
    revision: str | None = None       # what was asked for
    resolved_revision: str | None = None
    extra: dict = field(default_factory=dict)

    def provenance(self) -> dict:
        return {"alias": self.alias, "path": str(self.path), "hub_id": self.hub_id, "revision": self.revision,
                "resolved_revision": self.resolved_revision}


class NotFetched(UserError):
    """A hub model that could not be fetched (offline, gated, wrong pin)."""

    def __init__(self, alias: str, hub_id: str, revision: str | None, why: str):
        self.alias, self.hub_id, self.revision = alias, hub_id, revision
        super().__init__(f"model {alias} ({hub_id}@{revision or 'main'}) could not be fetched ({why}): fetch it where "
                         f"the hub is reachable with `{fetch_command(hub_id, revision)}` (it lands in the Hugging Face "
                         f"cache; copy that cache here or pass the model's folder instead)")


TOY_MODEL_FILES = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json", "chat_template.jinja"}


def verified_toy_model(name: str) -> Path:
    """The cached toy model's folder, each of its files checked against what the build recorded in world.json (a
    changed byte would pass for the world its hash names, so it is refused, not silently evaluated):
      model.safetensors        its sha256;
      config.json              every key equal to the recorded config (and every recorded key present);
      tokenizer.json           its vocabulary size and the stop and pad tokens' ids as recorded; byte-identical to
      chat_template.jinja      the world's tokenizer/ folder (one tokenizer, saved by the build to both);
      tokenizer_config.json    the recorded stop and pad tokens;
      generation_config.json   the recorded stop and pad ids;
    and no other file (a file the build did not write, custom code among them)."""
    from lib.artifacts import follow_umask, sha256_file
    from lib.toy import builder
    path, world = builder.model_dir(name), builder.world()
    follow_umask(path.parent.parent)                 # the build leaves its folder 0700 and the weights 0600
    rec, tok = world["models"][name], world["tokenizer"]
    fix = f"delete {path.parent.parent} and rerun to rebuild the toy world"

    def refuse(f: str, why: str):
        raise UserError(f"toy model {name}: {path / f} {why}, not what the build recorded in world.json; {fix}")

    if extra := sorted(p.name for p in path.iterdir() if p.name not in TOY_MODEL_FILES):
        refuse(extra[0], "is a file the build did not write")
    if (got := sha256_file(path / "model.safetensors")) != (want := rec["safetensors_sha256"]):
        raise UserError(f"toy model {name}: {path / 'model.safetensors'} has sha256 {got[:12]}… but the build recorded "
                        f"{want[:12]}… in world.json; {fix}")
    try:
        config, gen = read_json(path / "config.json"), read_json(path / "generation_config.json")
        tok_json, tok_cfg = read_json(path / "tokenizer.json"), read_json(path / "tokenizer_config.json")
    except (OSError, ValueError) as e:
        raise UserError(f"toy model {name}: {str(e).splitlines()[0]}; {fix}") from None
    keys = (config.keys() | _config_keys_written(rec["config"])) - {"_name_or_path", "transformers_version"}
    if bad := sorted(k for k in keys if config.get(k, "(absent)") != rec["config"].get(k, "(absent)")):
        refuse("config.json", f"has {bad[0]} = {config.get(bad[0], '(absent)')!r} (recorded "
                              f"{rec['config'].get(bad[0], '(absent)')!r})")
    ids = {t["content"]: t["id"] for t in tok_json.get("added_tokens", [])}
    vocab = tok_json.get("model", {}).get("vocab", {})
    size = len(set(vocab.values()) | set(ids.values()))
    if (size, ids.get(tok["stop"]), ids.get(tok["pad"])) != (tok["len"], tok["stop_id"], tok["pad_id"]):
        refuse("tokenizer.json", f"holds {size} tokens, stop id {ids.get(tok['stop'])}, pad id {ids.get(tok['pad'])}")
    for f in ("tokenizer.json", "chat_template.jinja"):
        if sha256_file(path / f) != sha256_file(path.parent.parent / "tokenizer" / f):
            refuse(f, "differs from the world's tokenizer/")
    if (tok_cfg.get("eos_token"), tok_cfg.get("pad_token")) != (tok["stop"], tok["pad"]):
        refuse("tokenizer_config.json", f"names eos {tok_cfg.get('eos_token')!r}, pad {tok_cfg.get('pad_token')!r}")
    if (gen.get("eos_token_id"), gen.get("pad_token_id")) != (tok["stop_id"], tok["pad_id"]):
        refuse("generation_config.json", f"has eos {gen.get('eos_token_id')}, pad {gen.get('pad_token_id')}")
    return path


def _config_keys_written(recorded: dict) -> set[str]:
    """The recorded config's keys that save_pretrained writes (it leaves out values equal to the class defaults):
    the architecture's shape and ids, which a config.json must hold."""
    return {k for k in ("architectures", "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                        "num_key_value_heads", "vocab_size", "max_position_embeddings", "rope_parameters",
                        "tie_word_embeddings", "model_type", "eos_token_id", "pad_token_id", "rms_norm_eps")
            if k in recorded}


def resolve_model(name: str, run_dir: str | Path | None = None, revision: str | None = None) -> Resolved:
    """Turn an alias, a hub id (`@revision` or `revision=`) or a folder into a local folder and the revision used."""
    base_name, revision = split_revision(name, revision)
    m = registered(base_name)
    if m is not None and m.toy:
        from lib.toy import builder
        return Resolved(m.alias, verified_toy_model(m.toy), resolved_revision="toy:" + builder.world_hash())
    if m is not None and m.shape:
        from lib import shapes
        return Resolved(m.alias, shapes.model_dir(*m.shape), resolved_revision=f"random:{m.shape[0]}:seed{m.shape[1]}")
    if m is not None and m.folder:
        p = Path(m.folder)
        if not (p / "config.json").exists():
            raise UserError(f"model {m.alias}: its folder {p} (declared by the pair file) has no config.json; fix the "
                            f"pair file's [models.{m.alias}] folder")
        return Resolved(m.alias, p, resolved_revision="local:" + sha256_tree(p)[:16])
    if m is not None and m.run_path:
        if run_dir is None:
            raise UserError(f"model {m.alias} lives in a campaign directory ({m.run_path}); pass --run-dir")
        p = Path(run_dir) / m.run_path
        if not (p / "config.json").exists():
            raise UserError(f"model {m.alias} not found at {p}: run 07_raft.py for this campaign first")
        return Resolved(m.alias, p, resolved_revision="local:" + sha256_tree(p)[:16])
    if m is not None:
        return _resolve_hub(m.alias, m.hub_id, revision or m.revision)
    p = Path(base_name)
    if (p / "config.json").exists():
        return Resolved(p.name, p, resolved_revision="local:" + sha256_tree(p)[:16])
    if p.exists():
        raise UserError(f"model folder {p} has no config.json: point at the folder that holds the model's config.json")
    if is_hub_id(base_name):
        return _resolve_hub(base_name.replace("/", "--"), base_name, revision)
    raise UserError(f"unknown model {name!r}: not a registry alias ({', '.join(sorted(MODELS))}), not a hub id "
                    f"(owner/name[@revision]) and not a folder with config.json")


def _resolve_hub(alias: str, hub_id: str, revision: str | None) -> Resolved:
    from huggingface_hub import snapshot_download
    try:
        path = Path(snapshot_download(hub_id, revision=revision or "main", allow_patterns=HUB_FILES))
    except Exception as e:  # offline, gated, or a wrong pin: say which and how to fix it
        raise NotFetched(alias, hub_id, revision, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                         .rstrip(": ")) from None
    return Resolved(alias, path, hub_id, revision, resolved_revision=path.name)


def resolve_roles(names: dict[str, str], run_dir: str | Path | None = None,
                  what: str = "the run") -> dict[str, Resolved]:
    """{role: Resolved} for every model of a run; hub models that cannot be fetched are listed together, each as
    `id@revision` with the command that fetches it, in one line."""
    out, missing = {}, []
    for role, name in names.items():
        try:
            out[role] = resolve_model(name, run_dir)
        except NotFetched as e:
            missing.append(f"{role} {e.hub_id}@{e.revision or 'main'} (`{fetch_command(e.hub_id, e.revision)}`)")
    if missing:
        raise UserError(f"{len(missing)} model(s) of {what} are not in the local Hugging Face cache and the hub cannot "
                        f"be reached: {'; '.join(missing)}. Fetch them where the hub is reachable and copy the cache "
                        f"here (HF_HOME), or name local folders instead")
    return out
