"""bench/kernel_resources.py compiles lib/sample/decode_triton.py's split kernel for sm_90 on a CPU machine (Triton's
bundled ptxas): every argument of the kernel must get its type or constexpr, in the plain and the shared-reads
variant, so that a new kernel argument the tool does not know fails here rather than on the day it is needed."""
import os
import subprocess
import sys

from helpers import REPO


def test_compiles_the_split_kernel_for_hopper_in_both_read_variants():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}     # it compiles; it runs nothing
    rows = {}
    for flags in ([], ["--shared"]):
        out = subprocess.run([sys.executable, "bench/kernel_resources.py", "c128b64w4s2", *flags], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        line = out.stdout.strip().splitlines()[-1].split()
        rows[bool(flags)] = int(line[line.index("registers") + 1]), float(line[line.index("shared") + 1])
    for regs, smem in rows.values():
        assert 0 < regs <= 255 and smem > 0
