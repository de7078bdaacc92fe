"""Problems, the DAPO prompt and chat rendering (DESIGN.md §2–3).

A problem row is `{"id", "problem", "answer", ...}` (extra fields such as `level` are kept). Rows come from a
jsonl or parquet file at a path, or from the Hugging Face hub (`hf://owner/dataset[:split]`) for users who have it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

from lib.errors import UserError

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
        raise UserError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')} has no chat_template; "
                         "every model of the campaign is a chat model — point at a folder that ships one")
    return tokenizer.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                         add_generation_prompt=True, **template_kwargs)


def assistant_header(tokenizer, **template_kwargs) -> str:
    """What the generation prompt appends: the rendered prompt must end with it (DESIGN.md §3)."""
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


# --- loading problem rows: every malformed input is refused with its file, line and fix, before any model loads ---

REQUIRED = ("id", "problem", "answer")
BOM = b"\xef\xbb\xbf"
# the text of a chat-template special token (ChatML `<|im_end|>`, Llama `<|eot_id|>`, DeepSeek `<｜User｜>`): inside a
# problem the tokenizer would turn it into the real special id and forge a turn of the prompt (DESIGN.md §3)
SPECIAL_TEXT = re.compile(r"<\|[A-Za-z][A-Za-z0-9_]{2,39}\|>|<｜[^｜<>]{1,40}｜>")     # not `<|x|>`, a mean


def load_rows(source: str | Path, id_field: str = "id", require_answer: bool = True) -> list[dict]:
    """Rows from a .jsonl/.json/.parquet path or `hf://owner/name[@revision][:split]`; checked for shape, types,
    ids and duplicates.

    `id_field` names the id column of a hub copy (MATH-500's is `unique_id`). Training prompts need no answer
    (`require_answer=False`: on-policy distillation never grades them); a row without one keeps `answer: None`."""
    s = str(source)
    required = REQUIRED if require_answer else REQUIRED[:2]
    if s.startswith("hf://"):
        rows = [{**r, "id": r[id_field]} for r in _load_hub(s[len("hf://"):])]
        return check_rows(rows, s, required)
    p = Path(s)
    if not p.is_file():
        raise UserError(f"file not found: {p}; pass the path of an existing .jsonl/.parquet file")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # only parquet inputs need it (requirements/common.txt)
        except ImportError:
            raise UserError(f"{p}: reading parquet needs pyarrow; pip install -r requirements/common.txt") from None
        rows, lines = pq.read_table(p).to_pylist(), None
    else:
        rows, lines = _read_json_rows(p)
    if not rows:
        raise UserError(f"{p} holds no rows: every problem file needs at least one {{{', '.join(required)}}} row")
    return check_rows(rows, str(p), required, lines)


def _read_json_rows(p: Path) -> tuple[list, list[int]]:
    """(rows, 1-based line of each row) of a JSON Lines file, or of a .json file holding one list of rows."""
    raw = p.read_bytes()
    if raw.startswith(BOM):
        raise UserError(f"{p} line 1 starts with a UTF-8 byte-order mark: save the file as UTF-8 without BOM")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise UserError(f"{p} line {line}: byte 0x{raw[e.start]:02x} is not UTF-8; re-save the file as UTF-8") from None
    if p.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":
                raise UserError(f"{p} holds one JSON value per line (JSON Lines) but is named .json: rename it to "
                                f"{p.with_suffix('.jsonl').name}") from None
            raise UserError(f"{p} line {e.lineno} is not valid JSON ({e.msg}): fix the file") from None
        if not isinstance(rows, list):
            raise UserError(f"{p} holds a JSON {type(rows).__name__}, not a list of rows: write a list of "
                            f"{{\"id\", \"problem\", \"answer\"}} objects, or one object per line in a .jsonl file")
        return rows, None
    rows, lines = [], []
    all_lines = text.split("\n")
    for n, line in enumerate(all_lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(all_lines) and not text.endswith("\n"):
                raise UserError(f"{p} line {n} (the last) is cut off ({e.msg}): the file was truncated; copy it "
                                f"again or delete that line") from None
            raise UserError(f"{p} line {n} is not JSON ({e.msg}): fix or delete that line") from None
        lines.append(n)
    return rows, lines


def _load_hub(spec: str) -> list[dict]:
    """Rows of `owner/name[@revision][:split]` through `datasets` (only users with hub access need it)."""
    name, _, split = spec.partition(":")
    name, _, revision = name.partition("@")
    try:
        from datasets import load_dataset
    except ImportError:
        raise UserError(f"hf://{spec} needs the datasets package: pip install -r requirements/common.txt") from None
    try:
        return [dict(r) for r in load_dataset(name, split=split or "test", revision=revision or None)]
    except Exception as e:  # offline, gated, wrong pin or split
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        raise UserError(f"dataset {name}@{revision or 'main'} could not be loaded ({why}): fetch it where the hub is "
                        f"reachable with `hf download {name} --repo-type dataset --revision {revision or 'main'}`, "
                        f"or set OPD_DATA_DIR to a folder holding the benchmark's .jsonl file") from None


def check_rows(rows: list, where: str = "rows", required=REQUIRED, lines: list[int] | None = None) -> list[dict]:
    """Each row an object with `required` fields, text `problem`, scalar id and answer, ids unique."""
    seen = set()
    for i, r in enumerate(rows):
        at = f"{where} line {lines[i]}" if lines else f"{where} row {i + 1}"
        if not isinstance(r, dict):
            raise UserError(f"{at} is a JSON {type(r).__name__}, not an object: write each row as "
                            f"{{\"id\": …, \"problem\": …, \"answer\": …}}")
        missing = [k for k in required if k not in r or r[k] is None]
        if missing:
            raise UserError(f"{at} (id={r.get('id')!r}) lacks {missing}; every row needs "
                            f"{', '.join(required)} — fix the row or remove it from the file")
        if not isinstance(r["problem"], str) or not r["problem"].strip():
            raise UserError(f"{at} (id={r['id']!r}): problem must be non-empty text, got {type(r['problem']).__name__} "
                            f"{str(r['problem'])[:40]!r}; write it as a JSON string")
        for k in ("id", "answer"):
            if r.get(k) is not None and not isinstance(r[k], (str, int, float)):
                raise UserError(f"{at}: {k} must be a string or a number, got {type(r[k]).__name__}; fix the row")
        if m := SPECIAL_TEXT.search(r["problem"]):
            raise UserError(f"{at} (id={r['id']!r}): problem holds the text {m.group(0)!r}, a chat template's special "
                            f"token, which would become a real special id in the prompt (a forged turn); remove or "
                            f"rewrite it in the row")
        if "answer" in required and (why := bad_gold(r["answer"])):
            raise UserError(f"{at} (id={r['id']!r}): answer {r['answer']!r} {why}, not a math answer; write the "
                            f"gold answer as a JSON string (\"answer\": \"5\"), or remove the row")
        r["id"] = str(r["id"])
        r["answer"] = None if r.get("answer") is None else str(r["answer"])
        if r["id"] in seen:
            raise UserError(f"{at}: duplicate id {r['id']!r}; ids must be unique — rename or remove one of the rows")
        seen.add(r["id"])
    return rows


def bad_gold(answer) -> str | None:
    """Why a gold answer cannot be graded (a boolean, a non-finite number, empty or blank text), else None."""
    if isinstance(answer, bool):
        return "is a JSON boolean"
    if isinstance(answer, float) and not math.isfinite(answer):
        return "is not a finite number"
    if isinstance(answer, str) and not answer.strip():
        return "is empty" if not answer else "is blank"
    return None


def special_text(tokenizer, text: str) -> str | None:
    """The first of `tokenizer`'s added tokens (specials: `<|im_end|>`, `<tool_call>`, `<think>` …) written as text
    in `text`, else None: the tokenizer would encode it as that token's id, not as the characters."""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    found = [(text.find(t), t) for t in added if t and t in text]
    return min(found)[1] if found else None


def refuse_special_text(tokenizer, rows: list[dict], where: str) -> None:
    """Refuse, in one line naming the row and the token, a problem that holds the text of one of `tokenizer`'s added
    tokens (`special_text`): it would forge a turn of the prompt (DESIGN.md §3)."""
    for r in rows:
        if (found := special_text(tokenizer, r["problem"])) is not None:
            raise UserError(f"{where} (id={r['id']!r}): problem holds the text {found!r}, which the tokenizer reads as "
                            "a special token (a forged turn in the prompt); remove or rewrite it in the row")


def require_rows(rows: list, need: int, where: str, flag: str) -> None:
    """Refuse, before any model is loaded, a data set smaller than one batch (`need` rows, set by `flag`)."""
    if len(rows) < need:
        raise UserError(f"{where} has {len(rows)} rows, fewer than one batch of {need} ({flag}): add rows or lower "
                        f"{flag}")


def evenly_spaced(rows: list, n: int | None) -> list:
    """The n-item evenly spaced subset (index floor(i·len/n)) used by probes and the 100-problem MATH-500 subset."""
    if n is None or n >= len(rows):
        return list(rows)
    if n <= 0:
        raise UserError(f"asked for {n} evenly spaced items: the count must be positive")
    return [rows[(i * len(rows)) // n] for i in range(n)]
