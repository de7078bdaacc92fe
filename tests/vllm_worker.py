"""Runs lib.sample.engine's `vllm` backend for tests/test_sampling_vllm.py, inside the vLLM venv (its own torch and
transformers), with ONE engine start (≈15–30 s on CPU), and writes every result as JSON.

    .venv-vllm/bin/python tests/vllm_worker.py job.json out.json

job: {"model", "dtype", "max_model_len", "prompts", "max_new_tokens",
      "sampled": {"seeds", "temperature", "top_p", "neighbours", "other_seeds"} | absent,
      "perturbed": safetensors file of perturbed weights | absent, "original": safetensors file | absent}
Exit code 3 (with {"import_error"} written) when vllm itself cannot be imported: the test skips on that.
"""
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(job_path: str, out_path: str) -> None:
    job, out, t0 = json.loads(Path(job_path).read_text()), {}, time.time()
    try:
        import vllm  # noqa: F401  (a broken install is a skip, not a failure of lib.sample.engine)
    except Exception as e:  # noqa: BLE001
        Path(out_path).write_text(json.dumps({"import_error": f"{type(e).__name__}: {e}"}))
        sys.exit(3)
    from safetensors.torch import load_file

    from lib.sample.engine import sample
    from lib.sample.vllm_engine import VLLMEngine

    engine = VLLMEngine(job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"], enable_sleep_mode=True)
    out["timings"] = {"engine_start_s": time.time() - t0}
    out["stop"], out["sleep_note"], out["vllm_version"] = engine.stop, engine.sleep_note, vllm.__version__
    prompts, cap = job["prompts"], job["max_new_tokens"]

    def run(name, prompts, seeds, temperature, top_p):
        t = time.time()
        res = sample(engine, prompts, seeds, temperature=temperature, top_p=top_p, max_new_tokens=cap, progress=False)
        out["timings"][name + "_s"] = time.time() - t
        out[name] = [asdict(c) for c in res]

    run("greedy", prompts, [0] * len(prompts), 0.0, 1.0)
    if s := job.get("sampled"):
        n = len(prompts)
        run("sampled", prompts, s["seeds"], s["temperature"], s["top_p"])
        # the same requests again, reversed and between other requests: must not change
        run("sampled_mixed", s["neighbours"] + prompts[::-1], list(range(len(s["neighbours"]))) + s["seeds"][::-1],
            s["temperature"], s["top_p"])
        out["sampled_mixed"] = out["sampled_mixed"][len(s["neighbours"]):][::-1]
        run("sampled_other", prompts, s["other_seeds"], s["temperature"], s["top_p"])
        assert len(out["sampled"]) == n
        # logprob_every=3: the same tokens, the log-probs of requests 0, 3, … only
        engine.logprob_every = 3
        run("sampled_every3", prompts, s["seeds"], s["temperature"], s["top_p"])
        engine.logprob_every = 0
        run("sampled_none", prompts, s["seeds"], s["temperature"], s["top_p"])
        engine.logprob_every = 1
    if job.get("perturbed"):
        t = time.time()
        engine.update_weights(load_file(job["perturbed"]).items())
        out["timings"]["update_weights_s"] = time.time() - t
        run("greedy_perturbed", prompts, [0] * len(prompts), 0.0, 1.0)
        engine.update_weights(load_file(job["original"]).items())
        run("greedy_restored", prompts, [0] * len(prompts), 0.0, 1.0)
        engine.sleep()      # on CPU a recorded no-op: the engine must still serve, asleep, with its weights
        run("greedy_while_asleep", prompts, [0] * len(prompts), 0.0, 1.0)
        engine.wake_up()
        run("greedy_after_sleep", prompts, [0] * len(prompts), 0.0, 1.0)
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":      # vLLM may spawn processes that re-import this file
    main(sys.argv[1], sys.argv[2])
