"""lib/cpu_repro.py: the pinned CPU math gives the same training bytes whatever the environment says (a hostile one
simulates another CPU: baseline kernels, MKL's COMPATIBLE branch, two threads), while that environment unpinned does
change them; what a stage pins, and what a manifest records."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from lib import cpu_repro
from lib.artifacts import REPO, write_manifest

HOSTILE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}

# A tiny Qwen2 trained 12 SFT steps (lib/train/sft.py) in a fresh process; prints the sha256 of its weights, the kernel
# capability torch used and the thread count. argv[1]: "pin" calls cpu_repro.pin() before torch is imported.
TRAIN_TINY = textwrap.dedent("""
    import hashlib, random, sys
    sys.path.insert(0, sys.argv[2])
    if sys.argv[1] == "pin":
        from lib import cpu_repro
        cpu_repro.pin()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from lib.train.sft import train_sft
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                                         tie_word_embeddings=True)).float()
    rng = random.Random(0)
    examples = []
    for _ in range(96):
        prompt, completion = [rng.randrange(120) for _ in range(40)], [rng.randrange(120) for _ in range(24)]
        examples.append((prompt + completion, [-100] * 40 + completion))
    train_sft(model, examples, lr=1e-3, epochs=1, batch_size=8, seed=0, log=None)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(digest, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())
""")


def train_tiny(pin: bool, env: dict) -> tuple[str, str, int]:
    base = {k: v for k, v in os.environ.items() if k not in cpu_repro.PINNED_ENV}
    out = subprocess.run([sys.executable, "-c", TRAIN_TINY, "pin" if pin else "no", str(REPO)], env={**base, **env},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    digest, capability, threads = out.stdout.split()[-3:]
    return digest, capability, int(threads)


@pytest.mark.skipif(not set(cpu_repro.REQUIRED_FLAGS) <= set(cpu_repro.cpu_info()["isa_flags"]),
                    reason="the pinned kernels need AVX2 and FMA")
def test_pinned_training_ignores_a_hostile_environment():
    pinned = train_tiny(True, {})
    assert pinned[1:] == ("AVX2", 1)
    assert train_tiny(True, HOSTILE) == pinned                   # the pin overrides what the environment says
    by_hand = train_tiny(False, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1"})
    assert by_hand == pinned                                     # ... and is the documented settings, all of them
    hostile = train_tiny(False, HOSTILE)
    assert hostile[1:] == ("DEFAULT", 2) and hostile[0] != pinned[0]  # ... which on its own changes the bytes


def test_pin_sets_every_documented_flag_without_importing_the_compiler():
    script = textwrap.dedent("""
        import sys; sys.path.insert(0, sys.argv[1])
        from lib import cpu_repro
        cpu_repro.pin()
        import torch
        print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.mkldnn.enabled, torch.get_num_threads(), "torch._inductor" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # deterministic (warn-only), oneDNN off, one thread; and the 2.3 s compiler import at every stage start avoided
    assert out.stdout.split() == ["True", "True", "False", "1", "False"]


@pytest.mark.skipif(subprocess.run(["which", "lscpu"], capture_output=True).returncode != 0, reason="needs lscpu")
def test_cpu_info_names_the_generation_lscpu_reports():
    lscpu = dict(line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                                                 env={"LC_ALL": "C"}).stdout.splitlines() if ":" in line)
    info = cpu_repro.cpu_info()
    assert info["model"] == lscpu["Model name"].strip()
    if "CPU family" in lscpu:
        assert info["generation"] == (f"family {lscpu['CPU family'].strip()} model {lscpu['Model'].strip()} "
                                      f"stepping {lscpu['Stepping'].strip()}")


def test_pin_after_torch_under_other_settings_fails_clearly():
    script = "import os, sys; sys.path.insert(0, sys.argv[1]); import torch; from lib import cpu_repro; cpu_repro.pin()"
    env = {**{k: v for k, v in os.environ.items() if k not in cpu_repro.PINNED_ENV}, **HOSTILE}
    out = subprocess.run([sys.executable, "-c", script, str(REPO)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "before the first `import torch`" in out.stderr.strip().splitlines()[-1]


def test_pinned_env_forces_every_variable():
    env = cpu_repro.pinned_env({"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO", "PATH": "/bin"})
    assert env == {**cpu_repro.PINNED_ENV, "PATH": "/bin"}


def test_names_toy():
    assert cpu_repro.names_toy(["03_opd_train.py", "--pair", "toy", "--reward", "opd"])
    assert cpu_repro.names_toy(["02_baselines.py", "--pair", "toy-raft"])
    assert cpu_repro.names_toy(["04_eval.py", "--model", "runs/toy/train/opd/step_15", "--benchmark", "toy"])
    assert cpu_repro.names_toy(["04_eval.py", "--benchmark=toy"])
    assert not cpu_repro.names_toy(["03_opd_train.py", "--pair", "openthinker", "--run-name", "toy"])
    assert not cpu_repro.names_toy(["04_eval.py", "--model", "runs/x/step_1", "--benchmark", "aime24"])


def test_a_toy_stage_hides_the_gpus_and_a_real_pair_keeps_them():
    """pin_if_toy on a toy command line: CUDA_VISIBLE_DEVICES is emptied before torch is imported (a GPU host ran the
    toy on its GPU before, in bf16); a real pair's command line leaves the variable and the process unpinned."""
    script = ("import os, sys; sys.path.insert(0, sys.argv[1]); from lib import cpu_repro; "
              "cpu_repro.pin_if_toy(sys.argv[2:]); import torch; "
              "print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), torch.get_num_threads())")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "2"}
    env = {k: v for k, v in env.items() if k not in cpu_repro.PINNED_ENV or k == "OMP_NUM_THREADS"}
    runs = {}
    for argv in (["--pair", "toy-collapse"], ["--pair", "openthinker"]):
        out = subprocess.run([sys.executable, "-c", script, str(REPO), *argv], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        runs[argv[1]] = out.stdout.split()
    assert runs["toy-collapse"] == ["''", "1"]                   # hidden, and pinned to one thread
    assert runs["openthinker"] == ["'0,1'", "2"]                 # untouched


def test_manifest_records_the_pin_and_the_cpu(tmp_path):
    (tmp_path / "out.txt").write_text("x")
    write_manifest(tmp_path, stage="t", script=__file__, args={}, inputs={}, outputs=["out.txt"], started="s",
                   wall_s=0.0)
    rec = json.loads((tmp_path / "manifest.json").read_text())["cpu_repro"]
    assert set(rec["env"]) == set(cpu_repro.PINNED_ENV) and isinstance(rec["pinned"], bool)
    assert rec["cpu"]["cores"] == os.cpu_count() and rec["torch"].startswith("2.")
    if os.path.exists("/proc/cpuinfo"):
        assert rec["cpu"]["model"] and "sse2" in rec["cpu"]["isa_flags"]
