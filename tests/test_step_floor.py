"""bench/step_floor.py: the floor arithmetic against a hand computation, the table it prints, and the script end to
end on a real toy 03_opd_train metrics.jsonl (the names it reads are the names 03 writes), measuring tiny rates."""
import importlib.util
import json

import pytest

from helpers import REPO, run_script
from lib.toy import builder


def load():
    spec = importlib.util.spec_from_file_location("step_floor", REPO / "bench/step_floor.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


INFO = {"params": 1000, "layers": 2, "kv_heads": 1, "head_dim": 4}     # kv = 2·2·1·4·2 = 32 bytes per token
RATES = {"matmul_flops": 1e6, "copy_bytes_per_s": 100.0}
COUNTS = {"T": 50, "Tr": 30, "S": 3, "L": 12}                           # L̄ = 10, p̄ = 20/3


def test_floors_match_a_hand_computation():
    f = load().floors
    got = {k: v for k, (v, _) in f(COUNTS, INFO, RATES, world=1, scored_models=4, ac=False).items()}
    # sync 2·1000 / 100; gen (12·2000 + 32·3·(20/3·10 + 10·9/2)) / 200 = (24000 + 10720) / 200;
    # score 2·1000·50·4 / 1e6; update 6·1000·50 / 1e6; optimizer 40·1000 / 200
    want = {"sync": 20.0, "gen": 173.6, "score": 0.4, "update": 0.3, "optimizer": 200.0}
    want["step"] = sum(want.values())
    assert got == pytest.approx(want, rel=1e-12)
    two = {k: v for k, (v, _) in f(COUNTS, INFO, RATES, world=2, scored_models=3, ac=True).items()}
    # per rank: the sync is whole, gen holds S/W = 1.5 sequences, score 3 models, update c = 8, optimizer P/W
    assert two == pytest.approx({"sync": 20.0, "gen": (24000 + 32 * 1.5 * (200 / 3 + 45)) / 200, "score": 0.15,
                                 "update": 0.2, "optimizer": 100.0, "step": 20 + 146.8 + 0.15 + 0.2 + 100}, rel=1e-12)


def test_forwarded_tokens_set_the_score_and_update_floors():
    """03's --share-prompts forwards fewer tokens than the step holds: the scoring and update floors count the tokens
    forwarded (Ts, Tu), the other phases the step's; a row without them counts T."""
    m = load()
    shared = m.floors(COUNTS | {"Ts": 40, "Tu": 45}, INFO, RATES, world=1, scored_models=4, ac=False)
    plain = m.floors(COUNTS, INFO, RATES, world=1, scored_models=4, ac=False)
    assert shared["score"][0] == pytest.approx(2 * 1000 * 40 * 4 / 1e6) and shared["update"][0] == pytest.approx(
        6 * 1000 * 45 / 1e6)
    assert all(shared[k][0] == plain[k][0] for k in ("sync", "gen", "optimizer"))
    row = {"step": 3, "perf/tokens": 50, "perf/response_tokens": 30, "perf/sequences": 3, "response_length/max": 12}
    assert m.step_counts(row)["Ts"] == m.step_counts(row)["Tu"] == 50
    assert m.step_counts(row | {"perf/forwarded_tokens": 45, "perf/score_forwarded_tokens": 40})["Tu"] == 45


def test_table_takes_medians_of_steps_from_three():
    m = load()
    base = {"perf/tokens": 50, "perf/response_tokens": 30, "perf/sequences": 3, "response_length/max": 12}
    gen = {1: 1347.2, 2: 1347.2, 3: 340.0, 4: 347.2, 5: 350.0}        # all five: median 350; steps ≥ 3: 347.2
    rows = [base | {"step": s, "timing_s/sync": 40.0, "timing_s/gen": gen[s],
                    "timing_s/score": 0.8, "timing_s/update": 0.6, "timing_s/optimizer": 400.0, "timing_s/step": 800.0}
            for s in (1, 2, 3, 4, 5)]
    rows[3]["timing_s/score"] = 0.4                                    # median of 0.8, 0.4, 0.8 = 0.8
    text, numbers = m.table(rows, INFO, RATES, world=1, scored_models=4, ac=False)
    assert numbers["gen"] == pytest.approx({"measured_s": 347.2, "floor_s": 173.6, "pct_of_floor": 50.0})
    assert numbers["score"]["pct_of_floor"] == pytest.approx(50.0)
    assert numbers["step"]["floor_s"] == pytest.approx(394.3)
    lines = text.splitlines()
    assert lines[0].startswith("| phase | measured s (median of steps ≥ 3) | floor s |")
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| sync", "| gen", "| score", "| update", "| optimizer",
                                                             "| step"]
    assert "| 2·P·Ts·4 / (W·R) | 50.0 % |" in lines[4]


@pytest.mark.e2e
def test_script_on_a_real_toy_run(tmp_path):
    """03 on the toy for 3 steps, then the script (rates measured at tiny sizes, then given): every phase is read
    from the metrics, the counts are 03's (S = B·n, Tr = mean length × S), the floors are floors() of them."""
    builder.build()
    run_script("03_opd_train.py", "--pair=toy", "--batch-prompts=8", "--rollouts=2", "--micro-batch=4", "--topk=4",
               "--reward=delta-topk", "--steps=3", "--save-every=3", f"--run-dir={tmp_path}")
    metrics = tmp_path / "train/delta-topk/metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    for r in rows:
        assert r["perf/sequences"] == 16 and r["perf/response_tokens"] == r["response_length/mean"] * 16
        assert r["perf/tokens"] > r["perf/response_tokens"]
        assert sum(r[f"timing_s/{k}"] for k in ("sync", "gen", "score", "update", "optimizer")) <= r["timing_s/step"]
    smoke = run_script("bench/step_floor.py", metrics, "--shape", builder.model_dir("student"), "--mm-n", "128",
                       "--copy-gib", "0.001", "--reps", "2")
    assert "TFLOP/s (bf16 mm)" in smoke.stdout and "| optimizer |" in smoke.stdout
    out = tmp_path / "floor.json"
    run_script("bench/step_floor.py", metrics, "--shape", builder.model_dir("student"), "--matmul-tflops", "0.001",
               "--copy-gbps", "0.5", "--json", out)
    got, m = json.loads(out.read_text()), load()
    assert got["world"] == 1 and got["scored_models"] == 4 and got["activation_checkpointing"] is False
    info = m.model_info(str(builder.model_dir("student")))
    from transformers import AutoModelForCausalLM
    lm = AutoModelForCausalLM.from_pretrained(builder.model_dir("student"))
    assert info == got["model"] == {"params": sum(p.numel() for p in lm.parameters()), "layers": 3, "kv_heads": 2,
                                    "head_dim": 64}                     # 03's n_params: numel, tied embedding once
    assert len(rows) == 3                                               # the median of steps ≥ 3 is step 3's
    want = m.floors(m.step_counts(rows[2]), info, {"matmul_flops": 1e9, "copy_bytes_per_s": 0.5e9}, 1, 4, False)
    for phase in ("sync", "gen", "score", "update", "optimizer", "step"):
        assert got[phase]["measured_s"] == rows[2][f"timing_s/{phase}"]
        assert got[phase]["floor_s"] == pytest.approx(want[phase][0], rel=1e-12)


@pytest.mark.parametrize("args,scored", [({"reward": "delta-topk"}, 4), ({"reward": "opd"}, 3),
                                         ({"reward": "delta-topk", "student_scores": "sampler"}, 3),
                                         ({"reward": "opd", "kl_ref": "none", "student_scores": "sampler"}, 1),
                                         ({"reward": "delta-topk", "student_scores": "recompute"}, 4)])
def test_scored_models_follow_the_runs_settings(tmp_path, args, scored):
    """M, the models step 2 forwards: the student (none under --student-scores sampler, whose scores come from the
    sampler), one or two teachers, and the reference unless --kl-ref none; read from the run's manifest."""
    (tmp_path / "manifest.json").write_text(json.dumps({"args": args, "world_size": 2}))
    got = load().run_settings(tmp_path / "metrics.jsonl")
    assert got["scored_models"] == scored and got["world"] == 2


def test_metrics_without_a_manifest_count_three_models_under_sampler_scores(tmp_path):
    """bench/device.sh hands step_floor a copy of the metrics with no manifest beside it: M = 4, or 3 when the rows
    carry rollout/candidate_logprob_gap (logged only under --student-scores sampler)."""
    row = {"step": 3, "perf/tokens": 1000, "perf/sequences": 8, "perf/response_tokens": 400,
           "response_length/max": 50, **{f"timing_s/{k}": 1.0 for k in ("sync", "gen", "score", "update",
                                                                        "optimizer", "step")}}
    for extra, want in (({}, 4), ({"rollout/candidate_logprob_gap": 0.01}, 3)):
        (tmp_path / "metrics.jsonl").write_text(json.dumps(row | extra) + "\n")
        out = tmp_path / f"floor{want}.json"
        run_script("bench/step_floor.py", tmp_path / "metrics.jsonl", "--shape", builder.model_dir("student"),
                   "--matmul-tflops", "1", "--copy-gbps", "1", "--json", out)
        assert json.loads(out.read_text())["scored_models"] == want
