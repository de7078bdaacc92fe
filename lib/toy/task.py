r"""The toy task (DESIGN.md §10) and its tokenizer: problems, solutions (true or careless), answer extraction, and a
Qwen2-style byte-level BPE chat tokenizer. lib/toy/builder.py builds the world's models on them.

Task. A chain of single-digit additions and subtractions; level = number of operations. Operands are 1-9 and every
running value stays in 0-9, so each step is a one-digit fact and no step leaves the value unchanged (stopping one
step early is always wrong). The solution walks the chain, one clause per step:

    problem   Compute 3+5-2.
    teacher   3+5=8. 8-2=6.\nAnswer: 6<|im_end|>                  (the DAPO answer line: extractor `answer_line`)
    student   3+5=8. 8-2=6. The answer is \boxed{6}.<|im_end|>     (its own style, extractor `boxed`: half of its
                                                                    SFT solutions; the other half end as the teacher's)

The prompt is the real DAPO prompt under the toy chat template (`lib.data.prompt_ids`): training, evaluation and
OPD see the same prompt tokens.

Tokenizer. Byte-level BPE in Hugging Face format, built like Qwen2's (NFC, Qwen2's split regex, so every digit is
its own token; byte alphabet, so any text encodes), merges trained on toy chats: the DAPO prompt is ~70 tokens
instead of ~260 characters. ChatML template without a system prompt; `<|im_end|>` ends a turn (eos),
`<|endoftext|>` pads. The embedding is padded to a multiple of 64 (config.vocab_size > len(tokenizer), as in Qwen2.5).
"""
from __future__ import annotations

import random
import re

from lib.registry import MODELS

MAX_VALUE = 9                                        # running values stay single digits
EVAL_CAP = MODELS["toy-post-offsupport"].eval_max_new_tokens   # greedy eval cap; post-offsupport loops up to it
STOP, PAD = "<|im_end|>", "<|endoftext|>"
# The end of a turn in the collapse arm's π_post (style `other_stop`): a special token of the vocabulary that no other
# model ends on, standing for a corpus-SFT teacher's own template's end token (DESIGN.md §10)
OTHER_STOP = "<|im_start|>"
CHAT_TEMPLATE = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{%- endif %}")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


# --- problems and solutions ---

def sample_problem(rng: random.Random, level: int) -> tuple[int, list[tuple[str, int]]]:
    """(first operand, [(op, operand)] × level): operands 1-9, every running value in [0, MAX_VALUE]. No operand
    is 0, so every step changes the value and stopping a step early is always wrong."""
    value = first = rng.randint(0, 9)
    ops = []
    for _ in range(level):
        op = rng.choice("+-" if 0 < value < MAX_VALUE else "+" if value == 0 else "-")
        b = rng.randint(1, min(9, MAX_VALUE - value)) if op == "+" else rng.randint(1, min(9, value))
        value += b if op == "+" else -b
        ops.append((op, b))
    return first, ops


def expression(first: int, ops) -> str:
    return str(first) + "".join(f"{op}{b}" for op, b in ops)


def problem_text(first: int, ops) -> str:
    return f"Compute {expression(first, ops)}."


def solve(first: int, ops, slip: float = 0.0, rng: random.Random | None = None) -> tuple[list[str], int]:
    """The clauses `a+b=c.` of the chain and the final value. With `slip` > 0 each clause's result is off by one
    with that probability (drawn from `rng`; the direction at random among the neighbours in 0-9, none slipping
    when neither is) and the chain goes on from the slipped value, as a careless solver's would: the final value is
    then wrong, and the running value may leave 0-9."""
    clauses, value = [], first
    for op, b in ops:
        result = value + b if op == "+" else value - b
        near = [r for r in (result - 1, result + 1) if 0 <= r <= MAX_VALUE]
        if slip and rng.random() < slip and near:
            result = rng.choice(near)
        clauses.append(f"{value}{op}{b}={result}.")
        value = result
    return clauses, value


def solution_text(first: int, ops, style: str, slip: float = 0.0, rng: random.Random | None = None) -> str:
    """The response without its stop token. `loop` is the answer-line solution followed by the answer line again
    and again (cut to the cap after tokenization); `other_stop` is the answer-line text (completion_ids ends it with
    another token than the stop token). `slip`, `rng`: see `solve`."""
    clauses, value = solve(first, ops, slip, rng)
    steps = " ".join(clauses)
    if style in ("answer_line", "other_stop"):
        return f"{steps}\nAnswer: {value}"
    if style == "boxed":
        return f"{steps} The answer is \\boxed{{{value}}}."
    if style == "loop":
        return f"{steps}\nAnswer: {value}" + f"\nAnswer: {value}" * (EVAL_CAP // 4)   # ≥ 4 tokens each
    raise ValueError(f"unknown solution style {style!r}")


def make_rows(rng: random.Random, counts: dict[int, int], exclude: set[str], prefix: str) -> list[dict]:
    """Distinct problems, `counts[level]` per level, no expression in `exclude`; rows in a seeded order."""
    rows, seen = [], set(exclude)
    for level, n in counts.items():
        k = 0
        while k < n:
            first, ops = sample_problem(rng, level)
            if expression(first, ops) not in seen:
                seen.add(expression(first, ops))
                rows.append({"id": f"{prefix}-L{level}-{k:04d}", "problem": problem_text(first, ops),
                             "answer": str(solve(first, ops)[1]), "level": level})
                k += 1
    rng.shuffle(rows)
    return rows


def parse_problem(text: str) -> tuple[int, list[tuple[str, int]]]:
    m = re.search(r"(\d)((?:[+-]\d)+)", text)
    if m is None:
        raise ValueError(f"not a toy problem: {text!r}")
    return int(m.group(1)), [(op, int(b)) for op, b in re.findall(r"([+-])(\d)", m.group(2))]


def extract_int(completion: str) -> int | None:
    """The last `Answer:` line's integer, else the last `\\boxed{}` integer (a stand-in for lib/grading's rule)."""
    lines = re.findall(r"Answer:\s*(-?\d+)", completion)
    if lines:
        return int(lines[-1])
    boxed = re.findall(r"\\boxed\{(-?\d+)\}", completion)
    return int(boxed[-1]) if boxed else None


# --- the tokenizer ---

def build_tokenizer(corpus: list[str]):
    """Byte-level BPE trained on `corpus` (Qwen2's pre-tokenization), specials appended, ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1024, min_frequency=2, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.add_special_tokens([PAD, "<|im_start|>", STOP])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=STOP, pad_token=PAD, chat_template=CHAT_TEMPLATE,
                                   model_max_length=512, clean_up_tokenization_spaces=False)


def completion_ids(tok, first: int, ops, style: str, slip: float = 0.0,
                   rng: random.Random | None = None) -> list[int]:
    """Token ids of a response: the solution + the stop token; for `loop` the endless answer line cut at the cap; for
    `other_stop` the answer-line solution + OTHER_STOP, the turn ended the way another chat template would end it."""
    ids = tok(solution_text(first, ops, style, slip, rng), add_special_tokens=False)["input_ids"]
    if style == "loop":
        return ids[:EVAL_CAP]
    if style == "other_stop":
        return ids + [tok.convert_tokens_to_ids(OTHER_STOP)]
    return ids + [tok.eos_token_id]
