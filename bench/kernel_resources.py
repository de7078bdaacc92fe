"""bench/kernel_resources.py — registers and shared memory of lib/sample/decode_triton.py's split kernel for Hopper
(sm_90), compiled on any machine, no GPU needed (Triton's bundled ptxas and cuobjdump).

The launch a GPU would make is reproduced: the same constexprs, and 16-byte divisibility on exactly the pointer and
integer arguments that Triton's launcher would mark so (the 1.5B cache shape's strides by default), so the counts
match what `bench/decode_attn.py` reads off the device (`n_regs`, `shared`). Use it to weed out a tiling before a
device call: registers × threads and shared memory per program bound the programs per SM (65,536 registers, 228 KiB).

    python bench/kernel_resources.py c128b64w4s2 c256b32w4s4 c128b32w4x            # tilings: bench/decode_attn.py's
"""
from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.decode_attn import tiling  # noqa: E402
from lib.sample.decode_triton import _split_kernel  # noqa: E402

# the pointer arguments not of the cache's dtype
POINTERS = {"POS": "*i64", "LEAD": "*i32", "PRE": "*i32", "PO": "*fp32", "PM": "*fp32", "PL": "*fp32"}


def ints(H: int, Hkv: int, D: int, T: int, chunk: int) -> dict:
    """The integer arguments of one call: q|k|v as views of one (S, (H + 2·H_kv)·D) projection, caches
    (S, H_kv, T, D)."""
    row = (H + 2 * Hkv) * D
    return dict(sq_s=row, sq_h=D, sk_s=row, sk_h=D, sv_s=row, sv_h=D, sc_s=Hkv * T * D, sc_h=T * D, sc_t=D,
                so_s=H * D, so_h=D, T=T, n_split=-(-T // chunk))


def compile_split(name: str, H=12, Hkv=2, D=128, T=1088, dtype="bf16", shared=False):
    """shared: the variant that reads a shared prompt's rows from the leader's slot (pointer loads only)."""
    t = tiling(name)
    const = dict(G=H // Hkv, GP=max(16, triton.next_power_of_2(H // Hkv)), D=D, CHUNK=t["chunk"],
                 BLOCK=min(t["block"], t["chunk"]), TMA=t["tma"], UPCAST=False, DIRECT=t["chunk"] >= T,
                 SHARED=shared and not t["tma"])
    values = ints(H, Hkv, D, T, t["chunk"])
    sig, attrs = {}, {}
    for i, arg in enumerate(inspect.signature(_split_kernel.fn).parameters):
        if arg in const:
            sig[arg] = "constexpr"
        elif arg in ("KD", "VD") and t["tma"]:
            sig[arg] = f"tensordesc<{dtype}[{const['BLOCK']},{D}]>"
        elif arg == "scale":
            sig[arg] = "fp32"
        elif arg in values:
            sig[arg] = "i32"
            if values[arg] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[arg] = POINTERS.get(arg, f"*{dtype}")
            attrs[(i,)] = [["tt.divisibility", 16]]
    options = {"num_warps": t["warps"]} | ({"num_stages": t["stages"]} if t["stages"] else {})
    return triton.compile(ASTSource(_split_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def registers(kernel) -> int:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return int(out.split("REG:")[1].split()[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tilings", nargs="+", help="c<chunk>b<block>w<warps>[s<stages>][x]")
    p.add_argument("--heads", default="12:2:128", help="H:H_kv:D")
    p.add_argument("--T", type=int, default=1088, help="cache positions (sets the strides' divisibility)")
    p.add_argument("--shared", action="store_true", help="the shared-reads variant (03's default with shared prompts)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("kernel_resources: unset TRITON_INTERPRET (this compiles for the GPU, it runs nothing)")
    H, Hkv, D = (int(x) for x in args.heads.split(":"))
    for name in args.tilings:
        k = compile_split(name, H, Hkv, D, args.T, shared=args.shared)
        ptx = k.asm["ptx"]
        print(f"{name:>14}  registers {registers(k):3d}  shared {k.metadata.shared / 1024:6.1f} KiB  "
              f"copy engine {'cp.async.bulk.tensor' in ptx}  cp.async {'cp.async.cg' in ptx or 'cp.async.ca' in ptx}")


if __name__ == "__main__":
    main()
