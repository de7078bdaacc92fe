"""The chat-template gate of DESIGN.md §8.4 as pure functions over a tokenizer; 01_gates.py runs it per model.

Template (§3): the rendered DAPO prompt ends with the assistant header (else the model is never asked to answer);
the system prompt a template injects into a user-only chat (found by rendering marker strings with and without an
explicit system message, so no template's wording is hard-coded); eos/pad ids; and the token that ends an assistant
turn must be a stop id of sampling (else rollouts run past the answer).
"""
from __future__ import annotations

import hashlib

from lib.gates.checks import special_ids, verdict

MARK, SYS, AMARK = "USER_TEXT_7f3a", "SYSTEM_TEXT_7f3a", "ASSISTANT_TEXT_7f3a"


def _render(tok, msgs, gen: bool, kw: dict) -> str:
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)


def injected_system(tok, kw: dict | None = None) -> str | None:
    """The system text a template adds to a user-only chat ('' if none; None if undetectable).

    With an explicit system message the template writes a … SYS … b … MARK; a user-only render that starts with a
    and has b before MARK carries an injected system prompt between them."""
    kw = kw or {}
    user_only = _render(tok, [{"role": "user", "content": MARK}], True, kw)
    before = user_only[:user_only.index(MARK)]
    try:
        explicit = _render(tok, [{"role": "system", "content": SYS}, {"role": "user", "content": MARK}], True, kw)
    except Exception:             # a template that refuses system messages cannot inject one through them
        return None
    if SYS not in explicit:
        return None
    a = explicit[:explicit.index(SYS)]
    b = explicit[explicit.index(SYS) + len(SYS):explicit.index(MARK)]
    if not before.startswith(a):
        return ""
    end = before.rfind(b) if b else len(before)
    return before[len(a):end] if end >= len(a) else None


def end_of_turn_id(tok, kw: dict | None = None) -> int | None:
    """The token a template writes right after an assistant message (e.g. <|im_end|>), if it is one token."""
    msgs = [{"role": "user", "content": MARK}, {"role": "assistant", "content": AMARK}]
    text = _render(tok, msgs, False, kw or {})
    if AMARK not in text:
        return None
    after = tok(text[text.index(AMARK) + len(AMARK):], add_special_tokens=False)["input_ids"]
    return after[0] if after and after[0] in special_ids(tok) else None


def template_report(tok, sample_prompt: str, *, header: str, stop: list[int], gen_eos: list[int],
                    template_note: str = "", kw: dict | None = None) -> dict:
    """Template checks for one model. `sample_prompt` is a rendered DAPO prompt, `header` the assistant header
    (lib.data.assistant_header), `stop` the ids sampling stops on, `gen_eos` generation_config's eos ids."""
    reasons, warnings = [], []
    tail = sample_prompt[-64:]
    if not sample_prompt.endswith(header):
        reasons.append(f"the rendered prompt ends {tail!r}, not with the assistant header {header!r}: the model would "
                       "not be prompted to answer; fix the chat template")
    injected = injected_system(tok, kw)
    if injected is None:
        warnings.append("could not tell whether the template injects a system prompt (it ignores system messages)")
    expects = "inject" in template_note and "no injected" not in template_note
    if injected and not expects:
        warnings.append(f"the template injects a system prompt the registry does not note: {injected!r}")
    if injected == "" and expects:
        warnings.append(f"the registry notes an injected system prompt ({template_note}) but none was rendered")
    eot = end_of_turn_id(tok, kw)

    def name(i):
        return None if i is None else tok.convert_ids_to_tokens(int(i))

    if eot is None:
        warnings.append("the template's end-of-turn is not a single special token; stop ids not cross-checked")
    elif eot not in stop:
        reasons.append(f"the template ends an assistant turn with {name(eot)!r} (id {eot}), which is not a stop id "
                       f"{[(i, name(i)) for i in stop]}: sampling would run past the end of the answer — add it to "
                       "generation_config.json's eos_token_id")
    elif eot not in gen_eos:
        warnings.append(f"end-of-turn {name(eot)!r} (id {eot}) is a stop id only via the tokenizer's eos, not via "
                        "generation_config.json's eos_token_id")
    if tok.pad_token_id is None:
        warnings.append("no pad token: batches are padded with the first stop id (masked, so harmless)")
    return verdict(reasons, warnings, rendered_tail=tail, assistant_header=header,
                   ends_with_header=sample_prompt.endswith(header), injected_system=injected,
                   template_note=template_note, end_of_turn={"id": eot, "token": name(eot)},
                   eos={"id": tok.eos_token_id, "token": tok.eos_token},
                   pad={"id": tok.pad_token_id, "token": tok.pad_token},
                   stop_ids=[{"id": i, "token": name(i)} for i in stop], generation_config_eos=gen_eos,
                   chat_template_sha256=hashlib.sha256(str(tok.chat_template).encode()).hexdigest())
