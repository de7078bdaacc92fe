"""bench/stop_delta.py: what Direct-OPD pays for stopping and for going on at the student's answer ends, checked on
tiny random Qwen2 models against a computation written another way (the prefix's own last logits, the weights as
renormalised probabilities)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("stop_delta", REPO / "bench" / "stop_delta.py")
stop_delta = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stop_delta)

V, K = 61, 5          # an odd vocabulary; fewer candidates than the bench's default


def tiny(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


def samples(student) -> list[dict]:
    """Random prompts and responses whose last token, the one a stopped sample ends in, is the student's most likely
    id there: so the stop token is one of its top-K candidates, and go_on must leave it out."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i, (p, r) in enumerate([(5, 4), (9, 1), (3, 11), (7, 6)]):
        ids = torch.randint(0, V, (p + r - 1,), generator=g).tolist()
        with torch.no_grad():
            last = int(student(torch.tensor([ids])).logits[0, -1].argmax())
        out.append({"prompt_ids": ids[:p], "token_ids": ids[p:] + [last], "level": 1 + i % 2,
                    "finish_reason": "length" if i == 2 else "stop"})   # one sample the cap cut: left out
    return out


def reference(student, pre, post, s):
    """The same three numbers from the prefix (prompt + response without its last token) forwarded alone."""
    ids = torch.tensor([s["prompt_ids"] + s["token_ids"][:-1]])
    with torch.no_grad():
        p_s, p_pre, p_post = (m(ids).logits[0, -1].double().softmax(-1) for m in (student, pre, post))
    y = s["token_ids"][-1]
    top = torch.topk(p_s, K).indices
    assert y in top.tolist()
    other = [int(x) for x in top if int(x) != y]
    w = {x: float(p_s[x]) for x in other}
    delta = {x: math.log(p_post[x]) - math.log(p_pre[x]) for x in other}
    return (math.log(p_post[y]) - math.log(p_pre[y]), sum(w[x] * delta[x] for x in other) / sum(w.values()),
            sum(float(p_pre[x]) for x in other))


def test_stop_and_go_on_match_a_reference_computation():
    student, pre, post = tiny(0), tiny(1), tiny(2)
    got = stop_delta.stop_and_go_on(student, pre, post, samples(student), k=K)
    stopped = [s for s in samples(student) if s["finish_reason"] == "stop"]
    assert got["n"] == len(stopped) == 3
    for row, s in zip(got["rows"], stopped):
        stop, go_on, pre_go_on = reference(student, pre, post, s)
        assert row["stop"] == pytest.approx(stop, abs=1e-4)
        assert row["go_on"] == pytest.approx(go_on, abs=1e-4)
        assert row["pre_go_on"] == pytest.approx(pre_go_on, abs=1e-5)
    assert got["go_on"] == pytest.approx(sum(r["go_on"] for r in got["rows"]) / 3)
    for lv in (1, 2):                                        # samples 0 and 3 are level 1, sample 1 level 2
        mine = [reference(student, pre, post, s)[1] for s in stopped if s["level"] == lv]
        assert got["by_level"][lv]["n"] == len(mine)
        assert got["by_level"][lv]["go_on"] == pytest.approx(sum(mine) / len(mine), abs=1e-4)


def test_a_pair_of_one_model_pays_nothing_and_swapping_it_flips_the_sign():
    student, pre, post = tiny(0), tiny(1), tiny(2)
    same = stop_delta.stop_and_go_on(student, pre, pre, samples(student), k=K)
    assert same["stop"] == 0.0 and same["go_on"] == 0.0
    fwd = stop_delta.stop_and_go_on(student, pre, post, samples(student), k=K)
    rev = stop_delta.stop_and_go_on(student, post, pre, samples(student), k=K)
    assert fwd["stop"] != 0.0 and rev["stop"] == pytest.approx(-fwd["stop"], abs=1e-5)
    assert rev["go_on"] == pytest.approx(-fwd["go_on"], abs=1e-5)


def test_no_stopped_sample_is_a_clear_error():
    cut = [dict(s, finish_reason="length") for s in samples(tiny(0))]
    with pytest.raises(SystemExit, match="no sample ended in its stop token"):
        stop_delta.stop_and_go_on(tiny(0), tiny(1), tiny(2), cut, k=K)


def leak_reference(student, pre, post, rows, stop_id):
    """neutral_leak's numbers position by position: each prefix forwarded alone, the weights as renormalised
    probabilities, each policy applied by hand."""
    A = {"raw": [], "neutral": [], "neutral-all": []}
    push = {p: 0.0 for p in A}
    push_terminal = push_leak = leak = 0.0
    n_tok = 0
    for s in rows:
        resp = s["token_ids"]
        for t in range(len(resp)):
            ids = torch.tensor([s["prompt_ids"] + resp[:t]])
            with torch.no_grad():
                p_s, p_pre, p_post = (m(ids).logits[0, -1].double().softmax(-1) for m in (student, pre, post))
            top = [int(x) for x in torch.topk(p_s, K).indices]
            z = sum(float(p_s[x]) for x in top)
            raw = [float(p_s[x]) / z * (math.log(p_post[x]) - math.log(p_pre[x])) for x in top]
            terminal = t == len(resp) - 1 and s["finish_reason"] == "stop"
            is_stop = [x == stop_id for x in top]
            after = {"raw": raw, "neutral": [0.0] * K if terminal else raw,
                     "neutral-all": [0.0 if terminal or st else a for a, st in zip(raw, is_stop)]}
            for p, a in after.items():
                A[p] += a
                push[p] += sum(x for x, st in zip(a, is_stop) if st) - float(p_s[stop_id]) * sum(a)
            raw_push = sum(x for x, st in zip(raw, is_stop) if st) - float(p_s[stop_id]) * sum(raw)
            if terminal:
                push_terminal += raw_push
            elif any(is_stop):
                push_leak += raw_push
                leak += sum(x for x, st in zip(raw, is_stop) if st)
            n_tok += 1
    return ({p: sum(a) / len(a) for p, a in A.items()}, {p: v / n_tok for p, v in push.items()},
            push_terminal / n_tok, push_leak / n_tok, leak / (n_tok * K), n_tok)


def test_neutral_leak_matches_a_reference_computation():
    """bench/stop_delta.neutral_leak (bench/neutral_leak.py's numbers) against the position-by-position reference.
    The stop id is the one most often among the student's candidates, so that there are leak positions to count."""
    student, pre, post = tiny(0), tiny(1), tiny(2)
    rows = samples(student)
    counts = torch.zeros(V)
    for s in rows:
        ids = torch.tensor([s["prompt_ids"] + s["token_ids"]])
        with torch.no_grad():
            lp = student(ids).logits[0, len(s["prompt_ids"]) - 1:-1]
        counts += torch.zeros(V).index_add_(0, torch.topk(lp, K).indices.flatten(), torch.ones(lp.shape[0] * K))
    stop_id = int(counts.argmax())
    rows = [dict(s, token_ids=s["token_ids"][:-1] + [stop_id]) if i in (0, 3) else s for i, s in enumerate(rows)]
    got = stop_delta.neutral_leak(student, pre, post, rows, stop_id, k=K)
    reward, push, push_terminal, push_leak, leak, n_tok = leak_reference(student, pre, post, rows, stop_id)
    assert got["tokens"] == n_tok and got["stopped"] == 3 and got["leak_positions"]["n"] > 2
    for p in ("raw", "neutral", "neutral-all"):
        key = p.replace("-", "_")
        assert got[f"reward_{key}"] == pytest.approx(reward[p], abs=1e-5), p
        assert got[f"push_{key}"] == pytest.approx(push[p], abs=1e-5), p
    assert got["push_terminal"] == pytest.approx(push_terminal, abs=1e-5)
    assert got["push_leak"] == pytest.approx(push_leak, abs=1e-5)
    assert got["leak"] == pytest.approx(leak, abs=1e-6)
    assert push["neutral"] != pytest.approx(push["neutral-all"], abs=1e-4)   # the leak is there to be told apart


def test_neutral_leak_with_no_leak_position_reports_nan_not_an_error():
    """A stop id the student never ranks among its candidates: nothing leaks, the means over no position are NaN."""
    student, pre, post = tiny(0), tiny(1), tiny(2)
    rows = samples(student)
    lp = torch.cat([stop_delta.all_logprobs(student, s["prompt_ids"], s["token_ids"]) for s in rows])
    never = int(lp.max(0).values.argmin())           # the id whose best log-prob anywhere is the lowest
    assert never not in torch.topk(lp, K).indices.flatten().tolist()
    got = stop_delta.neutral_leak(student, pre, post, rows, never, k=K)
    assert got["leak_positions"]["n"] == 0 and math.isnan(got["leak_positions"]["p_stop"])
    assert got["leak"] == 0.0 and got["push_leak"] == 0.0
    assert got["reward_neutral"] == pytest.approx(got["reward_neutral_all"], abs=1e-7)
