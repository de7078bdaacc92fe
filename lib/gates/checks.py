"""The pre-GPU gates of DESIGN.md §8.1–8.4 as pure functions over tokenizers and numbers; 01_gates.py runs them.

Tokenizer compatibility. Teachers score the student's token ids verbatim (no re-tokenisation, DESIGN.md §3), so an id
must mean the same bytes to the student, π_pre and π_post. Over the union of lengths:
    ordinary id  = an id that is neither special nor added in ANY of the tokenizers; compared exhaustively by the
                   bytes it stands for. A byte-level BPE's vocab string maps 1:1 to bytes (GPT-2's byte↔unicode
                   table), so all 151k ids take one `convert_ids_to_tokens` call (< 1 s); other decoders fall back to
                   decoding each id alone.
    special id   = special/added in at least one tokenizer; listed with every tokenizer's string when they differ
                   (DeepSeek-R1-Distill's 151643–151649 mean other strings than Qwen's). Reported, not failed: the
                   source campaign passed this trio; the anatomy gate measures what it costs at the stop token.
    round trip   = each of ~500 strings (NFC) must decode(encode(s)) == s in every tokenizer, with identical ids.
    embedding    = config.vocab_size > len(tokenizer) is padding (warn); < len(tokenizer) is an error (ids without
                   an embedding row).
FAIL on any ordinary-id mismatch, round-trip difference or an embedding smaller than the tokenizer.

Prompt length (§4): every training prompt's length under the student's template vs the cap; every id over it is
listed (the training loop refuses them too). Context (§4): longest rendered prompt + cap ≤ max_position_embeddings
for every (model, benchmark, protocol) and the training caps. The template checks (§3) are lib/gates/chat_template.py.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
import unicodedata

from lib.data import evenly_spaced


def verdict(reasons: list[str], warnings: list[str] | None = None, **details) -> dict:
    """The common shape of a gate report: status PASS iff no reasons to fail."""
    return {"status": "FAIL" if reasons else "PASS", "reasons": reasons, "warnings": warnings or [], **details}


# --- tokenizer compatibility ---

def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes→printable-unicode table used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def pipeline_sha256(tok) -> dict:
    """sha256 (16 hex) of each stage of the fast tokenizer: normalizer, pre-tokenizer, BPE model, decoder.

    The serialised model (vocab + merges) is the last top-level key; its raw text is hashed as is, because parsing
    and re-dumping 151k merges costs seconds."""
    text = tok.backend_tokenizer.to_str()
    cut = text.find('"model":{"type"')
    if cut < 0:
        pipe = json.loads(text)
        model = json.dumps(pipe.get("model"), sort_keys=True)
    else:
        pipe, model = json.loads(text[:cut].rstrip(", ") + "}"), text[cut:]
    parts = {k: json.dumps(pipe.get(k), sort_keys=True) for k in ("normalizer", "pre_tokenizer", "decoder")}
    return {k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in {**parts, "model": model}.items()}


def special_ids(tok) -> set[int]:
    """Ids that are special or added tokens (the tokenizer's own markers, not BPE pieces)."""
    return set(tok.added_tokens_decoder) | set(tok.all_special_ids)


def id_bytes(tok, ids: list[int]) -> list[bytes | None]:
    """The bytes each id stands for; None for an id outside the tokenizer."""
    n = len(tok)
    inside = [i for i in ids if 0 <= i < n]
    if type(tok.backend_tokenizer.decoder).__name__ == "ByteLevel":
        table = _byte_decoder()
        toks = tok.convert_ids_to_tokens(inside)
        got = [bytes(table[c] for c in t) if all(c in table for c in t) else t.encode() for t in toks]
    else:    # SentencePiece-style decoders: decode each id alone (loses only the decoder's own space handling)
        got = [s.encode() for s in tok.batch_decode([[i] for i in inside], skip_special_tokens=False,
                                                      clean_up_tokenization_spaces=False)]
    by_id = dict(zip(inside, got))
    return [by_id.get(i) for i in ids]


def roundtrip_strings(problems: list[str], n: int = 500, seed: int = 0) -> list[str]:
    """n NFC strings: evenly spaced benchmark problems (≤ 60 %) + unicode / digit / whitespace mixtures."""
    pieces = ["naïve café", "日本語のテキストです", "数学题：求 x 的值。", "Привет, мир", "Γειά σου κόσμε", "emoji 🧮🚀✨",
              "∑_{i=1}^n i² = n(n+1)(2n+1)/6", "√2 ≈ 1.41421356", "α+β=γ", "x ≤ y ≥ z ≠ w", "€100 and £5 and ¥7",
              "12345678901234567890", "3.14159", "1,000,000", "-42", "2^{10}=1024", "0.000001", "007",
              "a  b", "\t\tindented", "line1\n\nline2", "   leading", "trailing   ", "\r\n", " \n \n", "x\u00a0y",
              "Answer: 42", "\\boxed{\\frac{1}{2}}", "$$\\int_0^1 x\\,dx$$", "don't they'll we've", "MiXeD CaSe"]
    out = evenly_spaced(list(problems), n * 3 // 5) if problems else []
    rng = random.Random(seed)
    while len(out) < n:
        out.append("".join(rng.choice(pieces) + rng.choice(["", " ", "\n", "  "]) for _ in range(rng.randint(1, 4))))
    return [unicodedata.normalize("NFC", s) for s in out[:n]]


def compare_tokenizers(toks: dict, vocab_sizes: dict | None = None, strings: list[str] | None = None,
                       show: int = 50) -> dict:
    """The tokenizer gate over named tokenizers {name: tokenizer}; vocab_sizes {name: config.vocab_size or None}."""
    t0 = time.monotonic()
    names = list(toks)
    lens = {k: len(t) for k, t in toks.items()}
    specials = {k: special_ids(t) for k, t in toks.items()}
    union_special = set().union(*specials.values())
    n_all = max(lens.values())
    reasons, warnings = [], []

    # ordinary ids: bytes per id, every tokenizer against the first
    ordinary = [i for i in range(n_all) if i not in union_special]
    b = {k: id_bytes(t, ordinary) for k, t in toks.items()}
    ref = names[0]
    mismatch = [i for j, i in enumerate(ordinary) if any(b[k][j] != b[ref][j] for k in names[1:])]
    if mismatch:
        ex = "; ".join(f"id {i}: " + ", ".join(f"{k}={b[k][ordinary.index(i)]!r}" for k in names) for i in mismatch[:3])
        reasons.append(f"{len(mismatch)} ordinary ids decode to different bytes ({ex}): the teachers would score "
                       "different text than the student sampled — pick teachers with the student's vocabulary")

    # special ids: each tokenizer's string (None = absent) and whether it is special there
    special_diffs = []
    for i in sorted(union_special):
        strs = {k: (toks[k].convert_ids_to_tokens(i) if i < lens[k] else None) for k in names}
        flags = {k: i in specials[k] for k in names}
        if len(set(strs.values())) > 1 or len(set(flags.values())) > 1:
            special_diffs.append({"id": i, "strings": strs, "special": flags})
    if special_diffs:
        warnings.append(f"{len(special_diffs)} special ids differ: {id_ranges([d['id'] for d in special_diffs])} — "
                        "each tokenizer's strings are listed; see the anatomy gate for what the stop token costs")

    # embedding padding: config.vocab_size vs len(tokenizer)
    embedding = {}
    for k in names:
        vs = (vocab_sizes or {}).get(k)
        embedding[k] = {"config_vocab_size": vs,
                        "len_tokenizer": lens[k],
                        "padding": None if vs is None else vs - lens[k]}
        if vs is not None and vs > lens[k]:
            warnings.append(f"{k}: config.vocab_size {vs} > len(tokenizer) {lens[k]} (embedding padding: "
                            f"{vs - lens[k]} rows no token can reach; harmless)")
        elif vs is not None and vs < lens[k]:
            reasons.append(f"{k}: config.vocab_size {vs} < len(tokenizer) {lens[k]}: ids ≥ {vs} have no embedding "
                           "row — the model and tokenizer folders do not belong together")

    rt = roundtrip(toks, strings or [], show=show)
    reasons += rt.pop("reasons")
    pipe = {k: pipeline_sha256(t) for k, t in toks.items()}
    if len({json.dumps(v, sort_keys=True) for v in pipe.values()}) > 1:
        warnings.append("tokenizer pipelines (normalizer / pre-tokenizer / BPE model / decoder) differ in hash: "
                        "see `pipeline_sha256`")
    return verdict(reasons, warnings, tokenizers=names, lengths=lens,
                   ordinary={"n_checked": len(ordinary), "n_mismatch": len(mismatch), "mismatch_ids": mismatch[:show]},
                   special_diffs=special_diffs, special_diff_ids=[d["id"] for d in special_diffs],
                   embedding=embedding, roundtrip=rt, pipeline_sha256=pipe, seconds=round(time.monotonic() - t0, 3))


def roundtrip(toks: dict, strings: list[str], show: int = 50) -> dict:
    """decode(encode(s)) == s in every tokenizer, and the same ids from all of them."""
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()          # long benchmark problems exceed a toy model_max_length: not an error here
    try:
        ids = {k: t(strings, add_special_tokens=False)["input_ids"] if strings else [] for k, t in toks.items()}
    finally:
        hf_logging.set_verbosity(level)
    back = {k: toks[k].batch_decode(ids[k], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for k in toks}
    names = list(toks)
    lossy = [{"index": j, "tokenizer": k, "string": s[:120], "decoded": back[k][j][:120]}
             for j, s in enumerate(strings) for k in names if back[k][j] != s]
    differ = [{"index": j, "string": s[:120], "ids": {k: ids[k][j][:40] for k in names}}
              for j, s in enumerate(strings) if any(ids[k][j] != ids[names[0]][j] for k in names[1:])]
    reasons = []
    if lossy:
        reasons.append(f"{len(lossy)} round trips lose text (first: {lossy[0]['tokenizer']} on {lossy[0]['string']!r} "
                       f"→ {lossy[0]['decoded']!r})")
    if differ:
        reasons.append(f"{len(differ)} of {len(strings)} strings tokenise to different ids across tokenizers (first: "
                       f"{differ[0]['string']!r}): the teachers would not see the student's tokenisation")
    return {"n_strings": len(strings), "n_lossy": len(lossy), "n_ids_differ": len(differ), "lossy": lossy[:show],
            "ids_differ": differ[:show], "reasons": reasons}


def id_ranges(ids: list[int]) -> str:
    """[151643, 151644, 151645, 151700] → '151643–151645, 151700'."""
    out, start = [], None
    for j, i in enumerate(ids):
        if start is None:
            start = i
        if j + 1 == len(ids) or ids[j + 1] != i + 1:
            out.append(f"{start}" if start == i else f"{start}–{i}")
            start = None
    return ", ".join(out)


# --- prompt length ---

def length_audit(lengths: dict[str, int], cap: int, n_bins: int = 10) -> dict:
    """Training-prompt lengths {id: tokens} against the prompt cap: max, histogram, every id over the cap."""
    if not lengths:
        return verdict(["no training prompts to audit"], n_prompts=0, cap=cap)
    vals = list(lengths.values())
    top = max(max(vals), cap)
    width = -(-(top + 1) // n_bins)                              # ceil: bins [0, w), [w, 2w), … cover 0..top
    counts = [0] * n_bins
    for v in vals:
        counts[min(v // width, n_bins - 1)] += 1
    hist = [{"lo": i * width, "hi": (i + 1) * width - 1, "count": c} for i, c in enumerate(counts)]
    over = sorted(((k, v) for k, v in lengths.items() if v > cap), key=lambda kv: -kv[1])
    longest = max(lengths, key=lengths.get)
    reasons = []
    if over:
        listed = "; ".join(f"prompt {k} is {v} tokens" for k, v in over[:10])
        reasons.append(f"{len(over)} of {len(vals)} training prompts exceed the prompt cap {cap} under the student's "
                       f"template: {listed}{' …' if len(over) > 10 else ''}. Raise --max-prompt-len or drop them "
                       "explicitly with 03_opd_train.py --drop-overlong (never silently)")
    return verdict(reasons, n_prompts=len(vals), cap=cap, max=max(vals), longest_id=longest,
                   mean=round(sum(vals) / len(vals), 2), headroom=cap - max(vals), histogram=hist,
                   over_cap=[{"id": k, "tokens": v} for k, v in over])


# --- context ---

def context_check(rows: list[dict]) -> dict:
    """rows: {model, benchmark, protocol, longest_prompt, longest_id, max_new_tokens, max_position_embeddings}.
    Each row passes iff longest_prompt + max_new_tokens ≤ max_position_embeddings."""
    reasons = []
    for r in rows:
        need = r["longest_prompt"] + r["max_new_tokens"]
        r["needed"], r["ok"] = need, need <= r["max_position_embeddings"]
        if not r["ok"]:
            reasons.append(f"{r['model']} × {r['benchmark']}/{r['protocol']}: longest prompt {r['longest_prompt']} "
                           f"({r['longest_id']}) + cap {r['max_new_tokens']} = {need} > max_position_embeddings "
                           f"{r['max_position_embeddings']}; lower that model's cap to "
                           f"{r['max_position_embeddings'] - r['longest_prompt']} (registry eval_max_new_tokens) and "
                           "record the deviation")
    return verdict(reasons, rows=rows)
