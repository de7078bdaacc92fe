"""The collapse arm of the toy world (DESIGN.md §10): a π_post that has unlearned its stop token (toy π_post-nostop,
lib/toy/builder.py) and the pair toy-collapse, on the built world.

What the arm must carry, checked on the models themselves, not on a training run:
  - π_post-nostop prices the stop token after a correct answer line far below π_pre (the source's OpenThinker3
    measured −90 against −0.1; here below −35 against above −1: its recipe caps it at −40), and greedy it writes its
    (correct) answer line and then ends the turn with its own end token (task.OTHER_STOP), never with the stop token;
  - on the student's own samples (lib/gates/anatomy.py: the student samples, π_pre / π_post score, the reward is the
    training loop's own lib/train/opd.py), Δ at the stop token is ≪ 0 (below −35) and the delta-topk reward is
    clearly negative on average (below −0.02 a (token, candidate) pair) — the source's step-1 signature — while the
    main pair's is positive on the same samples;
  - the negative mean is the stop token's: with its reward set to 0 wherever it is a candidate (--eos-policy
    neutral-all, opd.eos_policy) what is left is near 0, because off the stop token this π_post is π_pre; and where
    the student stops, going on is neither paid nor charged (Δ of its other candidates, student-weighted, within 1 nat
    of 0, within 2 at every level), on which the collapse and the fixes holding on both CPU vendors rest
    (DESIGN.md §10).
About 10 s on 2 cores once the world is built (the world itself: 5–25 min the first time, then cached)."""
import json
import re

import pytest
import torch

from lib.data import prompt_ids
from lib.toy import builder, task

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def world_dir():
    return builder.build()


@pytest.fixture(scope="module")
def tok(world_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(world_dir / "tokenizer")


def logp_stop_after_answer(model_name, tok, rows) -> float:
    """Mean log p(<|im_end|>) right after each row's correct answer-line solution, teacher-forced."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(builder.model_dir(model_name)).eval()
    out = []
    with torch.no_grad():
        for r in rows:
            ids = prompt_ids(tok, r["problem"]) + task.completion_ids(tok, *task.parse_problem(r["problem"]),
                                                                       "answer_line")[:-1]
            logits_V = model(input_ids=torch.tensor([ids])).logits[0, -1]
            out.append(torch.log_softmax(logits_V, -1)[tok.eos_token_id].item())
    return sum(out) / len(out)


def test_nostop_teacher_has_unlearned_its_stop_token(world_dir, tok):
    from transformers import AutoModelForCausalLM
    rows = [json.loads(line) for line in (world_dir / "data" / "toy_test.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["level"] in (1, 2)][:12]     # the levels both were trained on
    pre, nostop = logp_stop_after_answer("pre", tok, rows[:6]), logp_stop_after_answer("post-nostop", tok, rows[:6])
    assert pre > -1.0 and nostop < -35.0, (pre, nostop)        # the measured values: DESIGN.md §10
    model = AutoModelForCausalLM.from_pretrained(builder.model_dir("post-nostop")).eval()
    other_stop = tok.convert_tokens_to_ids(task.OTHER_STOP)
    for r in rows[:3]:                  # greedy: the right answer line, then its own end token, never the stop token
        ids = torch.tensor([prompt_ids(tok, r["problem"])])
        with torch.no_grad():
            out = model.generate(input_ids=ids, max_new_tokens=task.EVAL_CAP, do_sample=False)[0, ids.shape[1]:]
        out = out.tolist()
        assert tok.eos_token_id not in out and other_stop in out, (r["problem"], tok.decode(out))
        before = tok.decode(out[:out.index(other_stop)])
        assert re.findall(r"Answer: (\d+)", before) == [r["answer"]] and before.endswith(r["answer"]), (r, before)


def test_moved_stop_targets_move_only_the_stop_tokens_mass():
    """post-nostop's targets (builder.moved_stop_targets) against a hand computation on random log-probs: every token
    but the two keeps π_pre's log-prob; the other end token gets p(other) + p(stop); the stop token min(its own, −cap);
    so the targets sum to 1 + min(p(stop), e^-cap): the stop token's mass is moved, not lost."""
    g = torch.Generator().manual_seed(0)
    logits_NV = torch.randn(7, 13, generator=g, dtype=torch.float64) * 4
    logits_NV[:3, 5] += 30                                   # rows where π_pre is all but sure to stop (token 5)
    logits_NV[3, 5] -= 60                                    # a row where it is already below the cap
    lp_NV = logits_NV.log_softmax(-1)
    t_NV = builder.moved_stop_targets(lp_NV, stop_id=5, other_id=9, cap=40.0)
    keep = [v for v in range(13) if v not in (5, 9)]
    assert torch.equal(t_NV[:, keep], lp_NV[:, keep])
    p_NV = lp_NV.exp()
    torch.testing.assert_close(t_NV[:, 9].exp(), p_NV[:, 9] + p_NV[:, 5])
    torch.testing.assert_close(t_NV[:, 5], torch.minimum(lp_NV[:, 5], torch.tensor(-40.0, dtype=torch.float64)))
    assert t_NV[3, 5] == lp_NV[3, 5] < -40.0
    total_N = t_NV.exp().sum(-1)
    torch.testing.assert_close(total_N, 1 + torch.minimum(p_NV[:, 5], torch.tensor(-40.0, dtype=torch.float64).exp()))


def test_moved_stop_loss_fits_the_tail_not_only_the_head():
    """builder.moved_stop_loss against its formula written out here, at random log-probs; and what it is for: raising
    one tail token (log-prob ≈ −15, a mass the head's cross-entropy barely feels) by 5 raises the loss by more than
    1, where the cross-entropy alone moves by less than 1e-4; a token below the floor is not fitted one by one; a
    position that predicts no label is not fitted at all."""
    from lib.train.sft import IGNORE
    V, stop, other, tail, dead = 11, 2, 3, 6, 7
    g = torch.Generator().manual_seed(1)
    ref_BTV = torch.randn(1, 4, V, generator=g).log_softmax(-1)
    ref_BTV[..., tail], ref_BTV[..., dead] = -15.0, -40.0
    ref_BTV = ref_BTV.log_softmax(-1)
    reference = lambda input_ids, attention_mask: type("Out", (), {"logits": ref_BTV})()   # noqa: E731
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 4, dtype=torch.long),
             "labels": torch.tensor([[IGNORE, IGNORE, 1, 1]])}            # positions 1-2 predict the two labels
    loss = builder.moved_stop_loss(reference, stop, other, cap=40.0, floor=20.0)
    t_NV = builder.moved_stop_targets(ref_BTV[0, 1:3], stop, other, 40.0)
    assert (t_NV[:, dead] < -20.0).all() and (t_NV[:, tail] > -20.0).all()

    def head(lp_NV):
        return -(t_NV.exp() * lp_NV).sum(-1).mean()

    def expected(lp_NV):
        err_NV = lp_NV - t_NV
        live = [v for v in range(V) if v not in (dead, stop)]     # the stop token's target is the cap, −40
        return head(lp_NV) + (err_NV[:, live] ** 2).mean() + (err_NV[:, stop] ** 2 + err_NV[:, other] ** 2).mean()

    model_BTV = torch.randn(1, 4, V, generator=g)
    lp_NV = model_BTV[0, 1:3].log_softmax(-1)
    torch.testing.assert_close(loss(model_BTV, batch), expected(lp_NV))
    model_BTV[0, 1:3] = t_NV                             # a model at the targets (they sum to 1 + e^-40)
    lp_NV = model_BTV[0, 1:3].log_softmax(-1)
    raised_BTV = model_BTV.clone()
    raised_BTV[..., tail] += 5.0
    raised_NV = raised_BTV[0, 1:3].log_softmax(-1)
    assert loss(raised_BTV, batch) - loss(model_BTV, batch) > 1.0
    assert abs(head(raised_NV) - head(lp_NV)) < 1e-4
    for pos in (0, 3):                  # 0 predicts the prompt's last token (−100), 3 is the last: neither is fitted
        changed = model_BTV.clone()
        changed[0, pos] += torch.randn(V, generator=g)
        torch.testing.assert_close(loss(changed, batch), loss(model_BTV, batch))


@pytest.fixture(scope="module")
def student_rollouts(world_dir):
    """The student's own samples, one per prompt on 48 evenly spaced training prompts, at the training rollout
    settings and the collapse pair's caps (lib/gates/anatomy.py's sampler: the training loop's engine), each token
    scored by both pairs' teachers (anatomy.score_all: lib/train/scoring.py, the training loop's scorer)."""
    from lib import benchmarks
    from lib.data import evenly_spaced, stable_seed
    from lib.gates import anatomy
    from lib.registry import PAIRS, STUDENTS
    pair, main = PAIRS["toy-collapse"], PAIRS["toy"]
    student = STUDENTS[pair.student]
    cfg = anatomy.Settings(max_prompt_len=student.max_prompt_len, max_response_len=student.max_response_len)
    roles = anatomy.load_roles(pair, pair.student, None)
    rows = evenly_spaced(benchmarks.load_benchmark(pair.train_data, require_answer=False)[0], 48)
    prompts = [prompt_ids(roles["student"]["tok"], r["problem"]) for r in rows]
    seeds = [stable_seed(42, "test_collapse", r["id"]) for r in rows]
    cpu = torch.device("cpu")
    outs = anatomy.sample_student(roles["student"], prompts, seeds, cfg, cpu)
    scored = anatomy.score_all(roles, prompts, outs, cfg, cpu)
    main_roles = dict(roles, pi_post=anatomy.load_roles(main, pair.student, None)["pi_post"])
    scored_main = anatomy.score_all(main_roles, prompts, outs, cfg, cpu)
    ends_N = torch.tensor([len(o.token_ids) for o in outs]).cumsum(0) - 1
    is_stop_N = torch.zeros(int(ends_N[-1]) + 1, dtype=torch.bool)
    is_stop_N[ends_N[torch.tensor([o.finish_reason == "stop" for o in outs])]] = True
    return {"outs": outs, "rows": rows, "toy-collapse": scored, "toy": scored_main, "is_stop_N": is_stop_N,
            "tok": roles["student"]["tok"]}


def step1_reward(scored, is_stop_N, stop_id: int, eos_policy: str = "raw") -> float:
    """03's delta_opd/weighted_reward_mean of these tokens: delta-topk's advantage A_{t,k} (opd.delta_topk_advantage)
    averaged over (token, candidate) pairs, after the stop-token policy (opd.eos_policy) when one is given."""
    from lib.train import opd
    (_, topk_lp_NK), post_NJ, pre_NJ = scored["student"], scored["pi_post"], scored["pi_pre"]
    adv_NK = opd.delta_topk_advantage(topk_lp_NK, post_NJ[:, 1:], pre_NJ[:, 1:])
    is_stop_cand_NK = scored["ids"][:, 1:] == stop_id
    return opd.eos_policy(adv_NK, is_stop_N, eos_policy, is_stop_cand_NK=is_stop_cand_NK).mean().item()


def test_collapse_pair_prices_the_students_stop_token_far_below_zero(student_rollouts):
    from lib.train import opd
    stop_N = student_rollouts["is_stop_N"]
    assert stop_N.sum() >= 0.9 * len(student_rollouts["outs"])            # the student ends (nearly) every sample
    scored = student_rollouts["toy-collapse"]
    delta_N = opd.delta_sampled_reward(scored["pi_post"][:, 0], scored["pi_pre"][:, 0])
    assert delta_N[stop_N].mean() < -35.0, delta_N[stop_N].mean()
    pre, post = scored["pi_pre"][stop_N, 0].mean().item(), scored["pi_post"][stop_N, 0].mean().item()
    assert pre > -2.0 > -35.0 > post, (pre, post)          # π_pre would stop there (level-3 samples: less sure)


def test_step1_reward_is_negative_on_the_collapse_pair_and_it_is_the_stop_tokens(student_rollouts):
    """The source's premise (every run's step-1 weighted reward < 0) on the student's own tokens, clearly; and where it
    comes from: with the stop token's reward set to 0 wherever it is a candidate (--eos-policy neutral-all) less than
    a fifth of it is left (measured on the AMD EPYC's world: −0.104 and +0.010), since off the stop token this π_post
    is π_pre; the main pair, on the same tokens, rewards them (> 0)."""
    stop_N, stop_id = student_rollouts["is_stop_N"], student_rollouts["tok"].eos_token_id
    raw = step1_reward(student_rollouts["toy-collapse"], stop_N, stop_id)
    rest = step1_reward(student_rollouts["toy-collapse"], stop_N, stop_id, "neutral-all")
    main = step1_reward(student_rollouts["toy"], stop_N, stop_id)
    print(f"step-1 weighted reward: toy-collapse {raw:+.5f}, without the stop token's share {rest:+.5f}; "
          f"toy {main:+.5f}")
    assert raw < -0.02 and abs(rest) < 0.2 * abs(raw) and main > 0, (raw, rest, main)


def test_going_on_is_neither_paid_nor_charged_where_the_student_stops(world_dir, student_rollouts):
    """bench/stop_delta.py on the student's own stopped samples: Δ(stop) ≈ −40 and the student-weighted Δ of its other
    top-K candidates within 1 nat of 0 overall and within 2 at every level with ten samples or more (the recipe fitted
    from the Intel Xeon world's π_pre gives −0.63 overall and −1.28 after level-3 answers, bench/nostop_fits.py). The
    arm's previous π_post (an SFT ending its turns in task.OTHER_STOP) paid going on +3.5 on the AMD EPYC's world and
    charged it −3.0 after level-3 answers on an Intel Xeon's: its collapse held on one vendor's world and not the
    other's."""
    import importlib.util
    from pathlib import Path
    from transformers import AutoModelForCausalLM
    path = Path(__file__).resolve().parent.parent / "bench" / "stop_delta.py"
    spec = importlib.util.spec_from_file_location("stop_delta", path)
    stop_delta = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stop_delta)
    from lib.data import prompt_ids as ids_of
    tok = student_rollouts["tok"]
    samples = [{"prompt_ids": ids_of(tok, r["problem"]), "token_ids": list(o.token_ids), "level": r.get("level"),
                "finish_reason": o.finish_reason} for r, o in zip(student_rollouts["rows"], student_rollouts["outs"])]
    student, pre, post = (AutoModelForCausalLM.from_pretrained(world_dir / "models" / n, dtype=torch.float32).eval()
                          for n in ("student", "pre", "post-nostop"))
    r = stop_delta.stop_and_go_on(student, pre, post, samples)
    print({k: r[k] for k in ("n", "stop", "go_on")}, {lv: round(b["go_on"], 2) for lv, b in r["by_level"].items()})
    assert r["n"] >= 40 and r["stop"] < -35.0 and abs(r["go_on"]) < 1.0, r["go_on"]
    for level, b in r["by_level"].items():
        if b["n"] >= 10:
            assert abs(b["go_on"]) < 2.0, (level, b)


def test_sink_probe_splits_a_completion_at_its_first_answer(tok):
    """bench/nostop_probe.py --sink-where counts a collapsed student's reward in three parts, cut after the FIRST
    answer's digit: the working, the token after the answer (where a student that stops writes its stop token), the
    run-on. Hand cases on the toy tokenizer: digits glued onto the answer, a clean stop, no answer line at all."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "bench" / "nostop_probe.py"
    spec = importlib.util.spec_from_file_location("nostop_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    glued = ids("1-1=0. 0+6=6.\nAnswer: 60000+1=1.\nAnswer: 1")
    cut = probe.first_answer_cut(tok, glued)
    assert tok.decode(glued[:cut]).endswith("Answer: 6") and tok.decode(glued[cut:]).startswith("0000+1"), cut
    clean = ids("3+5=8.\nAnswer: 8") + [tok.eos_token_id]
    assert probe.first_answer_cut(tok, clean) == len(clean) - 1          # the stop token is the token after
    twice = ids("2+2=4.\nAnswer: 4\nAnswer: 4")
    assert tok.decode(twice[:probe.first_answer_cut(tok, twice)]) == "2+2=4.\nAnswer: 4"   # the first, not the last
    none = ids("2+2=4. 4+1=5.")
    assert probe.first_answer_cut(tok, none) == len(none)


def test_sink_where_totals_equal_an_independent_sum(tok):
    """bench/nostop_probe.py --sink-where's totals against an independent computation on the same samples: each
    completion forwarded alone (no padded batch), delta-topk's per-token reward written out from DESIGN.md §7.2
    (w = the student's top-K probabilities renormalised, Σ_k w_k · (log π_post − log π_pre)), summed over every
    completion token. The parts' token counts add up to the whole, their shares to the token mean, and the stop tokens
    counted are the completions that stopped."""
    import importlib.util
    import json
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM
    path = Path(__file__).resolve().parent.parent / "bench" / "nostop_probe.py"
    spec = importlib.util.spec_from_file_location("nostop_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    world = builder.build()
    ckpt, K, n_rows = builder.model_dir("student"), 4, 6
    got = probe.sink_where(ckpt, seeds=(7,), n_rows=n_rows, topk=K)
    lms = {m: AutoModelForCausalLM.from_pretrained(d).float().eval()
           for m, d in (("student", ckpt), ("pre", world / "models" / "pre"), ("post", world / "models" / "post-nostop"))}
    rows = [json.loads(line) for line in (world / "data" / "toy_train.jsonl").read_text().splitlines()][:n_rows]
    seqs = probe.samples(tok, [(lms["student"], 7)], rows, 64)
    total, n, stops = 0.0, 0, 0
    with torch.no_grad():
        for p, c in seqs:
            x = torch.tensor([p + c])
            lp = {m: torch.log_softmax(lm(input_ids=x).logits[0, len(p) - 1:len(p) + len(c) - 1].double(), -1)
                  for m, lm in lms.items()}
            top, ids = lp["student"].topk(K, -1)
            w = torch.softmax(top, -1)
            total += (w * (lp["post"].gather(1, ids) - lp["pre"].gather(1, ids))).sum().item()
            n, stops = n + len(c), stops + (c[-1] == tok.eos_token_id)
    parts = [got[k] for k in ("working", "after the answer", "run-on")]
    assert got["samples"] == n_rows and got["tokens"] == n == sum(p["tokens"] for p in parts)
    assert got["token_mean"] == pytest.approx(total / n, abs=1e-5)
    assert sum(p["share_of_token_mean"] for p in parts) == pytest.approx(got["token_mean"], abs=1e-9)
    assert sum(p["stop_tokens"] for p in parts) == stops
