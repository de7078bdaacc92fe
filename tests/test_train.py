"""03_opd_train.py end to end on the toy world: 2-process gloo FSDP2 = 1 process; killed + resumed = uninterrupted;
checkpoints are loadable HF folders whose side files equal the initial student's; overlong prompts are named."""
import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from helpers import REPO, run_script
from lib.artifacts import read_json, read_jsonl, sha256_file, verify_dir
from lib.toy import builder

pytestmark = pytest.mark.e2e
SMALL = ["--pair=toy", "--batch-prompts=8", "--rollouts=2", "--lr=1e-4", "--micro-batch=4", "--topk=4"]
NUMERIC_SKIP = ("timing_s/", "perf/", "memory/")


def train(*args, check=True, launcher=()):
    return run_script("03_opd_train.py", *args, check=check, launcher=launcher)


@pytest.fixture(scope="module")
def world():
    return builder.build()


def metrics(run):
    return read_jsonl(run / "metrics.jsonl")


def assert_same_metrics(a, b, rel=1e-5, count_abs=1e-7):
    """count_abs: the tolerance of fractions that count a sign (…pos_frac): regrouped micro-batches pad differently,
    which moves a logit's last bits, and a log-ratio within ~1e-6 of 0 may flip (1 pair of 1,472 on the toy)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        for k, v in x.items():
            if k.startswith(NUMERIC_SKIP) or v is None or isinstance(v, bool):
                continue
            tol = count_abs if k.endswith(("pos_frac", "pos_frac_sampled")) else 1e-7
            assert y[k] == pytest.approx(v, rel=rel, abs=tol), f"step {x['step']} {k}: {v} vs {y[k]}"


def assert_same_weights(a_dir, b_dir, atol):
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"weights differ by {worst}"


def test_two_gloo_processes_match_one(world, tmp_path):
    """…and the two processes pack micro-batches by a token budget (uneven sizes, ranks equalised in count) and lay
    each one's sequences end to end with no padding (--packing on, lib/kernels/varlen.py), while the one process pads, groups 4
    sequences in sampling order for the update and scores in micro-batches of its own (a token budget: longest
    first), regrouped into the update's: neither grouping nor packing changes the global token-mean."""
    common = [*SMALL, "--reward=delta-topk", "--steps=3", "--save-every=3"]
    train(*common, f"--run-dir={tmp_path / 'one'}", "--score-tokens-per-micro=300")
    train(*common, f"--run-dir={tmp_path / 'two'}", "--nproc=2", "--max-tokens-per-micro=180",
          "--packing=on")                                                                               # via torchrun
    one, two = tmp_path / "one/train/delta-topk", tmp_path / "two/train/delta-topk"
    assert read_json(two / "manifest.json")["world_size"] == 2
    sizes = [r["perf/micro_batch_sizes"] for r in metrics(two)]
    assert any(len(set(s)) > 1 for s in sizes) and sizes != [r["perf/micro_batch_sizes"] for r in metrics(one)]
    assert all(r["perf/score_micro_batch_sizes"] == r["perf/micro_batch_sizes"] for r in metrics(two))   # CPU default
    assert all(r["perf/score_micro_batch_sizes"] != r["perf/micro_batch_sizes"] for r in metrics(one))
    assert_same_metrics(metrics(one), metrics(two), count_abs=2e-3)
    assert metrics(one)[-1]["actor/grad_norm"] > 0                      # the weights really moved
    # 1e-5 = a tenth of one AdamW step at lr 1e-4: packed attention sums in another order than the padded mask does,
    # and AdamW's m/√v turns a last-bit change of a near-zero gradient into up to a whole step (measured 3.6e-6)
    assert_same_weights(one / "step_000003", two / "step_000003", atol=1e-5)


def test_resume_after_kill_equals_uninterrupted(world, tmp_path):
    common = [*SMALL, "--reward=delta-sampled", "--save-every=2", "--kl-mode=adaptive"]
    train(*common, "--steps=4", f"--run-dir={tmp_path / 'full'}")
    cut = tmp_path / "cut"
    train(*common, "--steps=2", f"--run-dir={cut}")
    run = cut / "train/delta-sampled"
    (run / "manifest.json").unlink()                # killed before sealing, after logging step 3:
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(metrics(run)[-1] | {"step": 3, "actor/kl_coef": -1.0}) + "\n")
    p = train(*common, "--steps=4", f"--run-dir={cut}", "--resume")
    assert "resumed" in p.stdout
    full = tmp_path / "full/train/delta-sampled"
    assert_same_metrics(metrics(full), metrics(run), rel=0)               # bit-identical on CPU
    assert_same_weights(full / "step_000004", run / "step_000004", atol=0)
    loop, last = read_json(run / "resume" / "loop_state.json"), metrics(full)[-1]
    # the method's order: step t's coefficient already moved on step t's reward, so the saved one is the logged one
    assert loop["step"] == 4
    assert loop["kl_coef"] == last["actor/kl_coef"]


def test_checkpoint_is_a_loadable_hf_folder(world, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    train(*SMALL, "--reward=opd", "--steps=2", "--save-every=1", f"--run-dir={tmp_path}")
    run = tmp_path / "train/opd"
    verify_dir(run)
    init = builder.model_dir("student")
    for step in (1, 2):
        ck = run / f"step_{step:06d}"
        meta = read_json(ck / "checkpoint.json")
        assert meta == meta | {"run": "opd", "step": step, "pair": "toy", "reward": "opd", "student_init": "toy-student"}
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if (init / f).exists():
                assert sha256_file(ck / f) == sha256_file(init / f), f
        assert "lm_head.weight" not in load_file(ck / "model.safetensors")   # tied embeddings stay tied
    model = AutoModelForCausalLM.from_pretrained(run / "step_000002")
    tok = AutoTokenizer.from_pretrained(run / "step_000002")
    start = AutoModelForCausalLM.from_pretrained(init)
    moved = sum((a - b).abs().sum().item() for a, b in zip(model.parameters(), start.parameters()))
    assert moved > 0 and tok.eos_token == "<|im_end|>"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    summary = read_json(run / "summary.json")
    assert summary["reward"] == "opd" and "collapse_onset_step" in summary


def test_overlong_prompt_is_named(world, tmp_path):
    from transformers import AutoTokenizer
    from lib.data import prompt_ids
    tok = AutoTokenizer.from_pretrained(builder.model_dir("student"))
    rows = [{"id": "short-a", "problem": "Compute 1+2."}, {"id": "long-b", "problem": "Compute 1+2+3."},
            {"id": "short-c", "problem": "Compute 4-2."}]
    lengths = {r["id"]: len(prompt_ids(tok, r["problem"])) for r in rows}
    cap = lengths["long-b"] - 1                                        # exactly one token too long
    assert lengths["short-a"] <= cap and lengths["short-c"] <= cap
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [*SMALL, "--reward=opd", "--steps=1", "--batch-prompts=2", f"--max-prompt-len={cap}", f"--train-data={data}"]
    p = train(*args, f"--run-dir={tmp_path / 'refused'}", check=False)
    assert p.returncode != 0
    assert f"1 training prompts exceed the prompt cap {cap}" in p.stderr
    assert f"prompt long-b is {cap + 1} tokens" in p.stderr and "--drop-overlong" in p.stderr
    train(*args, f"--run-dir={tmp_path / 'dropped'}", "--drop-overlong")            # explicit: dropped and recorded
    summary = read_json(tmp_path / "dropped/train/opd/summary.json")
    assert summary["dropped_prompts"] == ["long-b"]


@pytest.mark.parametrize("reward", ["delta-sampled", "delta-topk"])
def test_on_policy_invariants_and_the_methods_kl_order(world, tmp_path, reward):
    """One update per step is on-policy: ρ = 1, nothing clipped, PPO's loss is −(the token's reward). The adaptive KL
    coefficient logged at step t has already moved on step t's delta_opd/weighted_reward_mean (the method's order:
    from 1.0 the first step logs 0.99 or 1.01, never 1.0)."""
    train(*SMALL, f"--reward={reward}", "--steps=3", "--save-every=3", "--kl-coef=1.0", f"--run-dir={tmp_path}")
    rows = metrics(tmp_path / f"train/{reward}")
    coef = 1.0
    for r in rows:
        assert r["actor/ppo_kl"] == 0 and r["actor/pg_clipfrac"] == 0
        assert r["actor/pg_loss"] == pytest.approx(-r["delta_opd/weighted_reward_token_mean"], rel=1e-6, abs=1e-9)
        if reward == "delta-sampled":     # one candidate: the reward IS the log-ratio, pair mean = token mean
            assert r["delta_opd/weighted_reward_mean"] == pytest.approx(r["delta_opd/log_ratio_mean"], rel=1e-6)
            assert r["actor/pg_loss"] == pytest.approx(-r["delta_opd/weighted_reward_mean"], rel=1e-6)
            assert r["delta_opd/log_ratio_mean"] == pytest.approx(r["delta_opd/log_ratio_mean_sampled"], rel=1e-6)
        else:                             # the method's mean is over (token, candidate) pairs: 1/K of the token's sum
            assert r["delta_opd/weighted_reward_mean"] * 4 == pytest.approx(r["delta_opd/weighted_reward_token_mean"])
        wrm = r["delta_opd/weighted_reward_mean"]
        coef = min(2.5, max(0.5, coef * (0.99 if wrm < 0 else 1.01 if wrm > 0 else 1.0)))
        assert r["actor/kl_coef"] == pytest.approx(coef, rel=1e-12), r["step"]
        assert r["teacher/entropy_minus_ref"] is not None
    assert rows[0]["actor/kl_coef"] != 1.0


def test_the_loop_freezes_the_heap_after_its_first_step(world, tmp_path):
    """03 gc.freeze()s what survived its first step (lib/step_phases.freeze_heap), so later collections do not rescan
    the models and their graphs. Nothing frozen when 03 only parses its arguments (--help); frozen after a run."""
    probe = ("import gc, runpy, sys\n"
             "sys.argv = ['03_opd_train.py', *sys.argv[1:]]\n"
             "try:\n    runpy.run_path('03_opd_train.py', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('frozen', gc.get_freeze_count())\n")
    counts = []
    for args in (["--help"], [*SMALL, "--reward=delta-topk", "--steps=2", f"--run-dir={tmp_path}"]):
        p = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, capture_output=True, text=True,
                           timeout=600, env=os.environ | {"OMP_NUM_THREADS": "1"})
        assert p.returncode == 0, p.stderr[-3000:]
        counts.append(int(p.stdout.rsplit("frozen", 1)[1]))
    assert counts[0] == 0 < counts[1]


def test_the_fixes_reach_the_update(world, tmp_path):
    """The loop applies --eos-policy and --truncated-policy to the advantage its update uses, after the metrics (which
    stay the raw shift's): one step from one seed, so the rollouts and the raw reward are the same in every run. On
    policy PPO's loss is −(the token-mean advantage), so a fix that changes nothing fails here. With a 6-token cap every
    response is cut, and --truncated-policy mask leaves no reward at all."""
    def step1(name, *flags):
        train(*SMALL, "--reward=delta-topk", "--steps=1", "--save-every=1", "--seed=5", f"--run-name={name}",
              f"--run-dir={tmp_path}", *flags)
        return metrics(tmp_path / "train" / name)[0]

    raw = step1("raw")
    fixed = {p: step1(p, f"--eos-policy={p}") for p in ("neutral-all", "conditional")}
    for p, r in fixed.items():
        assert r["delta_opd/weighted_reward_token_mean"] == raw["delta_opd/weighted_reward_token_mean"], p
        # (the main pair is near-neutral at its stop token, so the fixes move the loss by ~1e-4 here; the run is
        # deterministic, so any difference is the fix's)
        assert abs(r["actor/pg_loss"] - raw["actor/pg_loss"]) > 1e-6, p
    assert raw["actor/pg_loss"] == pytest.approx(-raw["delta_opd/weighted_reward_token_mean"], rel=1e-6)
    cut = step1("cut", "--max-response-len=6")
    masked = step1("masked", "--max-response-len=6", "--truncated-policy=mask")
    assert cut["response_length/clip_ratio"] == 1.0 and cut["actor/pg_loss"] != 0
    assert masked["delta_opd/weighted_reward_token_mean"] == cut["delta_opd/weighted_reward_token_mean"]
    assert masked["actor/pg_loss"] == 0
    r = train(*SMALL, "--reward=opd", "--eos-policy=conditional", f"--run-dir={tmp_path}", check=False)
    assert r.returncode != 0 and "conditional" in r.stderr and "delta-topk" in r.stderr


def test_micro_batch_auto_is_the_old_default_on_cpu(world, tmp_path):
    """`--micro-batch auto` off CUDA plans as the flag's default (8 sequences): the same micro-batches, metrics and
    weights as a run without the flag (on CUDA it is a token budget from memory: tests/test_train_step.py)."""
    small = [a for a in SMALL if not a.startswith("--micro-batch")]
    train(*small, "--reward=opd", "--steps=1", f"--run-dir={tmp_path / 'default'}")
    train(*small, "--reward=opd", "--steps=1", "--micro-batch=auto", f"--run-dir={tmp_path / 'auto'}")
    a, b = (metrics(tmp_path / r / "train/opd") for r in ("default", "auto"))
    assert a[0]["perf/micro_batch_sizes"] == b[0]["perf/micro_batch_sizes"] == [8, 8]
    assert_same_metrics(a, b, rel=0, count_abs=0)
    assert_same_weights(tmp_path / "default/train/opd/step_000001", tmp_path / "auto/train/opd/step_000001", 0.0)


def test_sampler_scores_train_as_the_recomputed_scores(world, tmp_path):
    """`--student-scores sampler` (the student's pre-update scores from the sampler's logits, PPO's old log-probs from
    the update's own forward) trains as the default recompute does on CPU, where both compute in fp32: the same
    metrics and weights after 3 steps. Its candidate log-probs differ from the update's by float rounding only; the
    vLLM backend is refused by name."""
    common = [*SMALL, "--reward=delta-topk", "--steps=3", "--save-every=3"]
    train(*common, f"--run-dir={tmp_path / 'recompute'}")
    train(*common, f"--run-dir={tmp_path / 'sampler'}", "--student-scores=sampler")
    a, b = (metrics(tmp_path / r / "train/delta-topk") for r in ("recompute", "sampler"))
    assert all(r["rollout/candidate_logprob_gap"] < 1e-5 for r in b)
    assert all(r["actor/ppo_kl"] == 0 and r["actor/pg_clipfrac"] == 0 for r in b)        # ratio exactly 1
    assert "rollout/candidate_logprob_gap" not in a[0]
    assert_same_metrics([{k: v for k, v in r.items() if k != "rollout/logprob_gap"} for r in a], b, rel=1e-4,
                        count_abs=2e-3)
    assert all(r["rollout/logprob_gap"] < 1e-5 for r in a + b)
    assert_same_weights(tmp_path / "recompute/train/delta-topk/step_000003",
                        tmp_path / "sampler/train/delta-topk/step_000003", 1e-5)
    r = train(*SMALL, "--student-scores=sampler", "--backend=vllm", f"--run-dir={tmp_path}", check=False)
    assert r.returncode != 0 and "--student-scores sampler" in r.stderr and "--backend hf" in r.stderr


def test_shared_prompts_train_as_unshared_packing(world, tmp_path):
    """`--share-prompts` (each prompt forwarded once for its rollouts, lib/train/scoring.pack_shared) trains as plain
    packing does: after 3 steps the same metrics and weights, to float rounding (CPU, fp32). Without packing it is
    refused by name. The plain run turns sharing off by a later `--no-share-prompts` (as campaign.sh's TRAIN_EXTRA
    undoes the toy's default), so its check below is also the check that the off switch works."""
    common = [*SMALL, "--reward=delta-topk", "--steps=3", "--save-every=3", "--packing=on"]
    train(*common, f"--run-dir={tmp_path / 'plain'}", "--share-prompts", "--no-share-prompts")
    train(*common, f"--run-dir={tmp_path / 'sharing'}", "--share-prompts")
    a, b = (metrics(tmp_path / r / "train/delta-topk") for r in ("plain", "sharing"))
    assert all(r["actor/ppo_kl"] == 0 for r in b)                          # scoring and update: the same layout
    # the prompts really were shared: the forwards ran fewer tokens than the step holds (a prompt of 2 rollouts once)
    assert all(r["perf/forwarded_tokens"] == r["perf/score_forwarded_tokens"] == r["perf/tokens"] for r in a)
    assert all(r["perf/forwarded_tokens"] < r["perf/tokens"] and r["perf/score_forwarded_tokens"] < r["perf/tokens"]
               for r in b)
    assert_same_metrics(a, b, rel=1e-4, count_abs=2e-3)                   # perf/ is not compared
    assert_same_weights(tmp_path / "plain/train/delta-topk/step_000003",
                        tmp_path / "sharing/train/delta-topk/step_000003", 1e-5)
    r = train(*SMALL, "--share-prompts", "--packing=off", f"--run-dir={tmp_path / 'off'}", check=False)
    assert r.returncode != 0 and "--share-prompts" in r.stderr and "--packing on" in r.stderr
