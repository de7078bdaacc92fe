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
