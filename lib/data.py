"""Problems, the DAPO prompt and chat rendering (SPEC §2–3).

A problem row is `{"id", "problem", "answer", ...}` (extra fields such as `level` are kept). Rows come from a
jsonl or parquet file at a path, or from the Hugging Face hub (`hf://owner/dataset[:split]`) for users who have it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# --- the DAPO prompt: used for training and evaluation alike ---

DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def dapo_prompt(problem: str) -> str:
    return DAPO_PREFIX + problem + DAPO_SUFFIX


def render_chat(tokenizer, user_text: str, **template_kwargs) -> str:
    """The prompt as a string under `tokenizer`'s own chat template, generation prompt added.

    `template_kwargs` go to the template (Qwen3's `enable_thinking=True`; see registry.Model.thinking)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')} has no chat_template; "
                         "every model of the campaign is a chat model — point at a folder that ships one")
    return tokenizer.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                         add_generation_prompt=True, **template_kwargs)


def assistant_header(tokenizer, **template_kwargs) -> str:
    """What the generation prompt appends: the rendered prompt must end with it (SPEC §3)."""
    msgs = [{"role": "user", "content": "x"}]
    with_gen = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **template_kwargs)
    without = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **template_kwargs)
    if not with_gen.startswith(without):
        return with_gen[len(os.path.commonprefix([with_gen, without])):]
    return with_gen[len(without):]


def prompt_ids(tokenizer, problem: str, **template_kwargs) -> list[int]:
    """Token ids of the rendered DAPO prompt. The template already holds any BOS, so none is added again."""
    text = render_chat(tokenizer, dapo_prompt(problem), **template_kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stable_seed(*parts) -> int:
    """A 63-bit seed from any parts (problem id, sample seed, step …): the same on every machine and run."""
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# --- loading problem rows ---

REQUIRED = ("id", "problem", "answer")


def load_rows(source: str | Path, id_field: str = "id", require_answer: bool = True) -> list[dict]:
    """Rows from a .jsonl/.json/.parquet path or `hf://owner/name[:split]`; checked for ids, fields, duplicates.

    `id_field` names the id column of a hub copy (MATH-500's is `unique_id`). Training prompts need no answer
    (`require_answer=False`: on-policy distillation never grades them); a row without one keeps `answer: None`."""
    s = str(source)
    if s.startswith("hf://"):
        rows = [{**r, "id": r[id_field]} for r in _load_hub(s[len("hf://"):])]
    else:
        p = Path(s)
        if not p.exists():
            raise FileNotFoundError(f"problem file {p} does not exist; pass --data-dir or a full path")
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq  # optional: only parquet inputs need it
            rows = pq.read_table(p).to_pylist()
        elif p.suffix == ".json":
            rows = json.loads(p.read_text())
        else:
            rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return check_rows(rows, s, REQUIRED if require_answer else REQUIRED[:2])


def _load_hub(spec: str) -> list[dict]:
    from datasets import load_dataset  # only users with hub access need `datasets`
    name, _, split = spec.partition(":")
    return [dict(r) for r in load_dataset(name, split=split or "test")]


def check_rows(rows: list[dict], where: str = "rows", required=REQUIRED) -> list[dict]:
    seen = set()
    for i, r in enumerate(rows):
        missing = [k for k in required if k not in r or r[k] is None]
        if missing:
            raise ValueError(f"{where} row {i} (id={r.get('id')!r}) lacks {missing}; every row needs "
                             f"{', '.join(required)} — fix the row or remove it from the file")
        r["id"] = str(r["id"])
        r["answer"] = None if r.get("answer") is None else str(r["answer"])
        if r["id"] in seen:
            raise ValueError(f"{where} has duplicate id {r['id']!r}; ids must be unique")
        seen.add(r["id"])
    return rows


def evenly_spaced(rows: list, n: int | None) -> list:
    """The n-item evenly spaced subset (index floor(i·len/n)) used by probes and the 100-problem MATH-500 subset."""
    if n is None or n >= len(rows):
        return list(rows)
    if n <= 0:
        raise ValueError(f"--limit-problems must be positive, got {n}")
    return [rows[(i * len(rows)) // n] for i in range(n)]
