"""01_gates and its pure logic (lib/gates/checks.py, lib/gates/chat_template.py, lib/gates/anatomy.py, lib/gates/auroc.py) against references computed independently here:
the real Qwen2.5 tokenizer and its DeepSeek-style variant (lib/qwen_tokenizer.py), tiny hand-built byte-level BPEs
with known differences, brute-force AUROCs, and hand-checked anatomy numbers; the stage end to end on the toy world."""
import json
import math
import time

import numpy as np
import pytest

from helpers import run_script
from lib import qwen_tokenizer
from lib.gates import anatomy, auroc, chat_template, checks


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer.build("qwen2.5")


@pytest.fixture(scope="module")
def deepseek():
    return qwen_tokenizer.build("deepseek")


# --- tokenizer gate on the real Qwen tokenizers ---

def test_identical_real_qwen_trio_passes_fast(qwen):
    other = qwen_tokenizer.build("qwen2.5")                   # a separate object from the same files
    strings = checks.roundtrip_strings(["What is $1+1$?", "Find all $x$ with $x^2=4$."], 500)
    t0 = time.monotonic()
    rep = checks.compare_tokenizers({"student": qwen, "pi_pre": other, "pi_post": qwen},
                                   {"student": 152064, "pi_pre": 151936, "pi_post": 151936}, strings)
    took = time.monotonic() - t0
    print(f"151,665-id trio compared in {took:.2f} s")
    assert rep["status"] == "PASS", rep["reasons"]
    assert rep["ordinary"] == {"n_checked": 151_643, "n_mismatch": 0, "mismatch_ids": []}
    assert rep["special_diff_ids"] == []
    assert rep["roundtrip"]["n_strings"] == 500 and rep["roundtrip"]["n_lossy"] == 0
    assert rep["embedding"]["student"]["padding"] == 152064 - 151665
    assert sum("embedding padding" in w for w in rep["warnings"]) == 3        # warned, not failed
    assert took < 30, f"the 151k-id check took {took:.1f} s; it must take seconds"


def test_deepseek_variant_reports_exactly_the_seven_ids_with_both_strings(qwen, deepseek):
    rep = checks.compare_tokenizers({"student": qwen, "pi_pre": qwen, "pi_post": deepseek}, None,
                                   checks.roundtrip_strings([], 200))
    assert rep["status"] == "PASS", rep["reasons"]            # the source campaign passed this trio
    assert rep["special_diff_ids"] == list(range(151_643, 151_650))
    for d, qs, ds in zip(rep["special_diffs"], qwen_tokenizer.QWEN25_SPECIALS, qwen_tokenizer.DEEPSEEK_SPECIALS):
        assert d["strings"] == {"student": qs, "pi_pre": qs, "pi_post": ds}
    assert rep["ordinary"]["n_mismatch"] == 0
    assert any("151643–151649" in w for w in rep["warnings"])


def test_id_bytes_matches_decoding_each_id(qwen):
    """Reference: decode(id) for ids whose bytes are valid UTF-8 on their own; known ids by hand."""
    assert checks.id_bytes(qwen, [9707, 1879]) == [b"Hello", b" world"]     # "Hello world" → [9707, 1879]
    ids = list(range(0, 151_643, 37))
    got = checks.id_bytes(qwen, ids)
    checked = 0
    for i, b in zip(ids, got):
        s = qwen.decode([i], clean_up_tokenization_spaces=False)
        if "\ufffd" not in s:
            assert b == s.encode(), i
            checked += 1
    assert checked > 3000
    assert checks.id_bytes(qwen, [10**6]) == [None]


# --- tiny byte-level BPEs with known differences ---

def tiny_tokenizer(merged: list[str], specials=("<eos>",)):
    """A byte-level BPE: 256 byte symbols, then `merged` two-symbol tokens (in that id order), then specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    table = {b: c for c, b in checks._byte_decoder().items()}
    vocab = {table[b]: b for b in range(256)}
    for t in merged:
        vocab[t] = len(vocab)
    merges = [(t[0], t[1]) for t in merged]
    tk = Tokenizer(models.BPE(vocab, merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=specials[0])
    tok.add_special_tokens({"additional_special_tokens": list(specials[1:])})
    return tok


def test_swapped_ordinary_ids_fail_and_are_named():
    a = tiny_tokenizer(["ab", "cd", "ef"])
    b = tiny_tokenizer(["ab", "ef", "cd"])                     # ids 257 and 258 swapped
    rep = checks.compare_tokenizers({"student": a, "pi_pre": a, "pi_post": b}, None, ["abcdef", "x y"])
    assert rep["status"] == "FAIL"
    assert rep["ordinary"]["mismatch_ids"] == [257, 258]
    assert rep["roundtrip"]["n_ids_differ"] == 1 and rep["roundtrip"]["ids_differ"][0]["string"] == "abcdef"
    assert any("2 ordinary ids" in r for r in rep["reasons"])


@pytest.mark.parametrize("odd", ["pi_pre", "pi_post"])
def test_every_tokenizer_is_compared_not_only_the_last(odd):
    """The gate compares each tokenizer with the student's, wherever the odd one stands: its swapped ids, its
    different tokenisation, its lossy round trip and its pipeline hash are each found in second place as in third."""
    from tokenizers import normalizers
    a = tiny_tokenizer(["ab", "cd", "ef"])
    b = tiny_tokenizer(["ab", "ef", "cd"])                     # ids 257 and 258 swapped
    rep = checks.compare_tokenizers({"student": a, "pi_pre": a, "pi_post": a} | {odd: b}, None, ["abcdef", "x y"])
    assert rep["status"] == "FAIL" and rep["ordinary"]["mismatch_ids"] == [257, 258]
    assert rep["roundtrip"]["n_ids_differ"] == 1
    assert any("pipelines" in w for w in rep["warnings"])
    lower = tiny_tokenizer(["ab", "cd", "ef"])
    lower.backend_tokenizer.normalizer = normalizers.Lowercase()          # "Ab" comes back as "ab"
    rep = checks.compare_tokenizers({"student": a, "pi_pre": a, "pi_post": a} | {odd: lower}, None, ["Ab", "ab"])
    assert rep["status"] == "FAIL" and rep["roundtrip"]["n_lossy"] == 1
    assert rep["roundtrip"]["lossy"][0]["tokenizer"] == odd


def test_an_id_special_in_one_tokenizer_only_is_listed():
    """Id 256 is the merged token "ab" in one tokenizer and the same string added as a token in the other: the same
    string, special in one only, so it is listed among the special ids that differ (a warning, not a failure)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    a = tiny_tokenizer(["ab"])
    table = {b: c for c, b in checks._byte_decoder().items()}
    tk = Tokenizer(models.BPE({table[b]: b for b in range(256)}, []))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_tokens(["ab"])                                                   # id 256, an added token
    c = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")   # id 257, as in a
    assert a.convert_ids_to_tokens(256) == c.convert_ids_to_tokens(256) == "ab"
    rep = checks.compare_tokenizers({"student": a, "pi_pre": a, "pi_post": c}, None, ["ab ab"])
    assert rep["special_diff_ids"] == [256]
    assert rep["special_diffs"][0]["special"] == {"student": False, "pi_pre": False, "pi_post": True}


def test_special_strings_and_embedding_rows():
    a = tiny_tokenizer(["ab"], ("<eos>", "<a>"))
    b = tiny_tokenizer(["ab"], ("<eos>", "<b>"))
    rep = checks.compare_tokenizers({"student": a, "pi_pre": a, "pi_post": b},
                                   {"student": 300, "pi_pre": len(a), "pi_post": len(b) - 1}, ["ab ab"])
    assert rep["special_diff_ids"] == [258]
    assert rep["special_diffs"][0]["strings"] == {"student": "<a>", "pi_pre": "<a>", "pi_post": "<b>"}
    assert rep["status"] == "FAIL" and any("no embedding row" in r for r in rep["reasons"])     # 259 > 258 rows
    assert any("student: config.vocab_size 300 > len(tokenizer) 259" in w for w in rep["warnings"])
    assert sum("embedding padding" in w for w in rep["warnings"]) == 1      # pi_pre's rows equal its tokenizer: fine


def test_roundtrip_strings_are_nfc_and_mixed():
    import unicodedata
    s = checks.roundtrip_strings([f"problem {i}" for i in range(1000)], 500)
    assert len(s) == 500 and all(unicodedata.normalize("NFC", x) == x for x in s)
    assert sum(x.startswith("problem ") for x in s) == 300                       # 60 % benchmark text
    assert any(any(ord(c) > 0x3000 for c in x) for x in s) and any("\n" in x for x in s)


# --- prompt length ---

def test_length_audit_names_the_prompt_one_token_over_the_cap(qwen):
    from lib.data import prompt_ids
    rows = [("p-short", "What is 1+1?"), ("p-long", "Compute the sum of the first one hundred primes. " * 3),
            ("p-mid", "Find x if 2x+3=7.")]
    lengths = {i: len(prompt_ids(qwen, p)) for i, p in rows}
    cap = lengths["p-long"] - 1
    rep = checks.length_audit(lengths, cap)
    assert rep["status"] == "FAIL"
    assert rep["over_cap"] == [{"id": "p-long", "tokens": cap + 1}]
    assert "prompt p-long is" in rep["reasons"][0] and rep["max"] == cap + 1 and rep["headroom"] == -1
    assert sum(h["count"] for h in rep["histogram"]) == 3
    ok = checks.length_audit(lengths, cap + 1)
    assert ok["status"] == "PASS" and ok["over_cap"] == [] and ok["headroom"] == 0


def test_length_histogram_by_hand():
    rep = checks.length_audit({"a": 0, "b": 9, "c": 10, "d": 19, "e": 25}, cap=19, n_bins=2)
    # top = max(25, 19) = 25 → width ceil(26/2) = 13: [0, 12] holds 0, 9, 10; [13, 25] holds 19, 25
    assert [(h["lo"], h["hi"], h["count"]) for h in rep["histogram"]] == [(0, 12, 3), (13, 25, 2)]
    assert rep["over_cap"] == [{"id": "e", "tokens": 25}]


# --- context ---

def test_context_gate_with_the_source_reports_numbers():
    row = dict(model="qwen2.5-math-1.5b", benchmark="math500", protocol="sample4", longest_prompt=871,
               longest_id="x", max_position_embeddings=4096)
    assert checks.context_check([dict(row, max_new_tokens=3_200)])["status"] == "PASS"          # 871 + 3200 ≤ 4096
    assert checks.context_check([dict(row, max_new_tokens=3_225)])["status"] == "PASS"          # exactly 4096
    bad = checks.context_check([dict(row, max_new_tokens=3_584)])                             # the original cap
    assert bad["status"] == "FAIL" and bad["rows"][0]["needed"] == 4455
    assert "4455 > max_position_embeddings 4096" in bad["reasons"][0] and "to 3225" in bad["reasons"][0]


# --- template ---

def test_template_checks_on_real_qwen_and_deepseek(qwen, deepseek):
    from lib.data import assistant_header, dapo_prompt, render_chat
    assert chat_template.injected_system(qwen) == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert chat_template.end_of_turn_id(qwen) == 151645                         # <|im_end|>
    assert chat_template.end_of_turn_id(deepseek) == 151643                     # <｜end▁of▁sentence｜>
    prompt = render_chat(qwen, dapo_prompt("What is 1+1?"))
    rep = chat_template.template_report(qwen, prompt, header=assistant_header(qwen), stop=[151643, 151645], gen_eos=[151645],
                                template_note="injects 'You are Qwen, created by Alibaba Cloud…'")
    assert rep["status"] == "PASS" and rep["warnings"] == []
    assert rep["rendered_tail"].endswith("<|im_start|>assistant\n") and len(rep["rendered_tail"]) == 64
    # a generation config that stops only on <|endoftext|>: sampling would run past <|im_end|>
    bad = chat_template.template_report(qwen, prompt, header=assistant_header(qwen), stop=[151643], gen_eos=[151643])
    assert bad["status"] == "FAIL" and "'<|im_end|>' (id 151645)" in bad["reasons"][0]
    assert any("does not note" in w for w in bad["warnings"])           # injected but no registry note
    # a prompt that does not end with the header
    cut = chat_template.template_report(qwen, prompt[:-3], header=assistant_header(qwen), stop=[151645], gen_eos=[151645])
    assert cut["status"] == "FAIL" and "assistant header" in cut["reasons"][0]
    ds = chat_template.template_report(deepseek, render_chat(deepseek, "hi"), header=assistant_header(deepseek),
                               stop=[151643], gen_eos=[151643])
    assert ds["status"] == "PASS" and ds["rendered_tail"].endswith("<｜Assistant｜><think>\n")
    assert ds["injected_system"] is None                                # this template drops system messages


def test_no_injection_detected_for_a_plain_chatml_template(qwen):
    import copy
    tok = copy.deepcopy(qwen)
    tok.chat_template = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                         "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                         "{%- endif %}")
    assert chat_template.injected_system(tok) == ""
    rep = chat_template.template_report(tok, "x<|im_start|>assistant\n", header="<|im_start|>assistant\n", stop=[151645],
                                gen_eos=[151645], template_note="injects 'You are Qwen…'")
    assert any("none was rendered" in w for w in rep["warnings"])


# --- anatomy: AUROC with length control ---

def brute_auroc(scores, labels, strata):
    win = n = 0
    for i in range(len(scores)):
        for j in range(len(scores)):
            if labels[i] and not labels[j] and strata[i] == strata[j]:
                n += 1
                win += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    return (win / n if n else None), n


def test_stratified_auroc_matches_brute_force_and_removes_a_length_confound():
    rng = np.random.default_rng(0)
    s, y, st = rng.normal(size=60).round(1), rng.random(60) < 0.4, rng.integers(0, 3, 60)
    assert auroc.stratified_auroc(s, y, st)[0] == pytest.approx(brute_auroc(s, y, st)[0])
    assert auroc.stratified_auroc(s, y, st)[1] == brute_auroc(s, y, st)[1]
    # long sequences are wrong and score low, but within each length bin the score is anti-informative
    lengths = np.array([10, 11, 12, 13, 100, 101, 102, 103])
    score = np.array([5.0, 6.0, 5.0, 6.0, 1.0, 2.0, 1.0, 2.0])
    correct = np.array([False, True, False, True, False, True, False, True]) == False   # noqa: E712
    strata = auroc.length_strata(lengths, 2)
    assert strata.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    raw, _ = auroc.stratified_auroc(score, correct)
    lc, n_pairs = auroc.stratified_auroc(score, correct, strata)
    assert lc == 0.0 and n_pairs == 8 and raw == pytest.approx(brute_auroc(score, correct, [0] * 8)[0])
    assert auroc.stratified_auroc([1, 2], [True, True])[0] is None


def test_length_strata_keep_ties_together():
    st = auroc.length_strata([48] * 6 + [10, 20, 30, 40], 4)       # six samples at the cap
    assert len(set(st[:6].tolist())) == 1


def test_bootstrap_is_the_statistic_on_resampled_multisets():
    rng = np.random.default_rng(1)
    s, y, st = rng.normal(size=20), rng.random(20) < 0.5, rng.integers(0, 2, 20)
    boot = auroc.bootstrap_aurocs(s, y, st, n_resamples=50, seed=42)
    counts = np.random.default_rng(42).multinomial(20, np.full(20, 1 / 20), size=50)    # the same draws
    for b in range(50):
        idx = np.repeat(np.arange(20), counts[b])
        want = brute_auroc(s[idx], y[idx], st[idx])[0]
        assert (math.isnan(boot[b]) and want is None) or boot[b] == pytest.approx(want)
    ci = auroc.bootstrap_auroc_ci(s, y, st, n_resamples=10_000)
    point = auroc.stratified_auroc(s, y, st)[0]
    assert ci["ci"][0] <= point <= ci["ci"][1] and ci["seed"] == 42
    # the CI is the 2.5 / 97.5 % quantiles of the defined resamples; one positive in six leaves many undefined
    full = auroc.bootstrap_aurocs(s, y, st, n_resamples=10_000, seed=42)
    assert ci["ci"] == pytest.approx(np.quantile(full[~np.isnan(full)], [0.025, 0.975]).tolist())
    s6, y6 = np.array([0.3, 0.1, 0.5, 0.2, 0.9, 0.4]), np.array([True, False, False, False, False, False])
    boot6 = auroc.bootstrap_aurocs(s6, y6, n_resamples=2_000, seed=42)
    ci6, ok = auroc.bootstrap_auroc_ci(s6, y6, n_resamples=2_000), boot6[~np.isnan(boot6)]
    assert ci6["n_dropped"] == int(np.isnan(boot6).sum()) > 0
    assert ci6["ci"] == pytest.approx([np.quantile(ok, 0.025), np.quantile(ok, 0.975)])


# --- anatomy: summary and gate ---

def seq(delta, weighted=None, stopped=True, answer_end=True, lp=None, correct=None):
    return dict(delta=np.array(delta, float), weighted=np.array(weighted or [0.0] * len(delta), float),
                stopped=stopped, answer_end=answer_end, correct=correct, n_tokens=len(delta),
                lp_stop=lp or ({"student": -0.1, "pi_pre": -0.2, "pi_post": -0.3} if stopped else None))


def test_summary_by_hand():
    seqs = [seq([1.0, -1.0, 0.5], [0.1, 0.2, 0.3], correct=True, lp={"student": -0.1, "pi_pre": -1.0, "pi_post": -0.5}),
            seq([-2.0, 0.0], [0.0, -0.6], stopped=False, correct=False),
            seq([0.5, 3.0], [0.0, 0.0], answer_end=False, correct=None, lp={"student": 0, "pi_pre": 0, "pi_post": 0})]
    st = anatomy.summarise(seqs, n_resamples=200)
    assert st["n_tokens"] == 7
    assert st["token_mean_delta"] == pytest.approx(2.0 / 7)
    assert st["student_weighted_mean"] == pytest.approx(0.0)
    assert st["pos_frac"] == pytest.approx(4 / 7) and st["abs_mean_delta"] == pytest.approx(8.0 / 7)
    assert st["stop"] == {"n": 2, "mean_delta": pytest.approx(1.75), "pos_frac": 1.0}       # 0.5 and 3.0
    assert st["interior_mean_delta"] == pytest.approx((1.0 - 1.0 - 2.0 + 0.0 + 0.5) / 5)
    assert st["logp_stop_at_answer_end"] == {"n": 1, "student": pytest.approx(-0.1), "pi_pre": -1.0, "pi_post": -0.5}
    assert st["accuracy"] == 0.5 and st["stop_rate"] == pytest.approx(2 / 3)
    # two graded sequences of different lengths: no (correct, wrong) pair shares a length bin; raw AUROC is 1
    assert st["auroc"]["length_controlled"] is None and "no length bin" in st["auroc"]["why"]
    assert st["auroc"]["raw"] == 1.0 and (st["auroc"]["n_correct"], st["auroc"]["n_wrong"]) == (1, 1)


def test_anatomy_boundaries_by_hand():
    """A tie is |Δ| < tie_tol, a decided token |Δ| ≥ tie_tol; the stop rate counts every stop, after an answer or not;
    the gate fails strictly below each threshold (a value equal to it passes) and on any non-finite Δ."""
    seqs = [seq([0.5, -0.5, 0.25, 0.0]), seq([0.25], answer_end=False), seq([1.0], stopped=False, answer_end=False)]
    st = anatomy.summarise(seqs, n_resamples=10, tie_tol=0.25)
    assert st["tie_frac"] == pytest.approx(1 / 6)                    # only 0.0; the two 0.25s are decided …
    assert st["pos_frac_decided"] == pytest.approx(4 / 5)            # … and positive: 0.5, 0.25, 0.25, 1.0 of five
    assert st["stop_rate"] == pytest.approx(2 / 3) and st["stop"] == {"n": 2, "mean_delta": 0.125, "pos_frac": 0.5}
    at = {"n_sequences": 2, "non_finite_tokens": 0, "stop": {"n": 2, "mean_delta": -0.5}, "abs_mean_delta": 0.25,
          "pos_frac": 0.5, "pos_frac_decided": 0.5, "tie_tol": 1e-3, "token_mean_delta": 0.0,
          "logp_stop_at_answer_end": {"n": 2, "student": -0.1, "pi_pre": -0.2, "pi_post": -0.3}}
    assert anatomy.anatomy_gate(at, min_stop_delta=-0.5, min_abs_delta=0.25, min_pos_frac=0.5) == []
    below = lambda x: np.nextafter(x, -np.inf)                        # noqa: E731
    for key, why in (("stop", "terminal stop token"), ("abs_mean_delta", "shift magnitude"),
                     ("pos_frac_decided", "have Δ > 0")):
        worse = at | ({"stop": {"n": 2, "mean_delta": below(-0.5)}} if key == "stop" else {key: below(at[key])})
        reasons = anatomy.anatomy_gate(worse, min_stop_delta=-0.5, min_abs_delta=0.25, min_pos_frac=0.5)
        assert len(reasons) == 1 and why in reasons[0], (key, reasons)
    reasons = anatomy.anatomy_gate(at | {"non_finite_tokens": 3}, -0.5, 0.25, 0.5)
    assert len(reasons) == 1 and reasons[0].startswith("3 tokens have a non-finite Δ")


def test_pair_sequences_by_hand():
    """The cross-pair anatomy's per-sequence input: Δ = log π_post − log π_pre per token; an answer end is a stop
    after an extracted answer; log p(stop) is each model's own, read at the last token of a stopped sequence only."""
    rollouts = [{"index": 0, "finish_reason": "stop", "extractor": "answer_line", "correct": True,
                 "token_ids": [1, 2]},
                {"index": 1, "finish_reason": "length", "extractor": "none", "correct": False, "token_ids": [3]},
                {"index": 2, "finish_reason": "stop", "extractor": "none", "correct": None, "token_ids": [4, 5]}]
    lp = {"post": [[-0.125, -0.25], [-1.0], [-0.5, -0.25]], "pre": [[-0.25, -0.75], [-0.5], [-0.5, -1.0]],
          "stu": [[-0.5, -0.0625], [-2.0], [-0.75, -0.125]]}
    s = anatomy.pair_sequences(rollouts, lp, pre="pre", post="post", student="stu")
    assert [x["delta"].tolist() for x in s] == [[0.125, 0.5], [-0.5], [0.0, 0.75]]
    assert [(x["stopped"], x["answer_end"], x["n_tokens"], x["correct"]) for x in s] == [
        (True, True, 2, True), (False, False, 1, False), (True, False, 2, None)]
    assert s[0]["lp_stop"] == {"student": -0.0625, "pi_pre": -0.75, "pi_post": -0.25} and s[1]["lp_stop"] is None
    assert s[2]["lp_stop"] == {"student": -0.125, "pi_pre": -1.0, "pi_post": -0.25}


def test_anatomy_gate_fails_an_off_support_pair_with_the_numbers():
    lp = {"student": -0.01, "pi_pre": -0.5, "pi_post": -60.0}
    seqs = [seq([0.2, 0.1, -59.5], lp=lp, correct=True), seq([0.3, -0.1, -59.5], lp=lp, correct=False)]
    st = anatomy.summarise(seqs, n_resamples=100)
    reasons = anatomy.anatomy_gate(st, min_stop_delta=-10, min_abs_delta=0.01, min_pos_frac=0.4)
    assert len(reasons) == 1 and "-59.500 nats" in reasons[0] and "-60.000" in reasons[0]
    assert "off support" in reasons[0]
    ok = anatomy.summarise([seq([0.2, 0.1, -0.5]), seq([0.3, -0.1, 0.2])], n_resamples=10)
    assert anatomy.anatomy_gate(ok, -10, 0.01, 0.4) == []
    tiny = anatomy.summarise([seq([0.001, 0.002, -0.001])], n_resamples=10)
    assert any("shift magnitude" in r for r in anatomy.anatomy_gate(tiny, -10, 0.01, 0.4))
    never = anatomy.summarise([seq([0.1, 0.2], stopped=False)], n_resamples=10)
    why = [r for r in anatomy.anatomy_gate(never, -10, 0.01, 0.4) if "none of the 1 samples stopped" in r]
    assert why and "--max-response-len" in why[0]
    assert "--max-response-len" in run_script("01_gates.py", "--help").stdout     # the fix it names is a real flag
    neg = anatomy.summarise([seq([-0.3, -0.2, 0.1, 0.0])], n_resamples=10)       # 0.0 is a tie: 1 of 3 decided
    assert any("33.3 % of the student's tokens where" in r for r in anatomy.anatomy_gate(neg, -10, 0.01, 0.4))


def test_anatomy_ties_do_not_vote():
    """Where both teachers are sure of a token (the toy's levels 1-2) Δ is float rounding; its sign says nothing. Six
    ties (|Δ| < 1e-3) and four decided tokens, three of them > 0: 30 % > 0 over all, 75 % where the pair has an
    opinion — the gate counts the latter, and both are reported."""
    st = anatomy.summarise([seq([-1e-5, -2e-5, -3e-6, -1e-6, -4e-5, -1e-5, 2.0, 1.5, -0.5, 0.7])], n_resamples=10)
    assert st["pos_frac"] == pytest.approx(0.3) and st["tie_frac"] == pytest.approx(0.6)
    assert st["pos_frac_decided"] == pytest.approx(0.75) and st["tie_tol"] == 1e-3
    assert anatomy.anatomy_gate(st, -10, 0.01, 0.4) == []
    strict = anatomy.summarise([seq([-1e-5, -2e-5, -3e-6, -1e-6, -4e-5, -1e-5, 2.0, 1.5, -0.5, 0.7])], n_resamples=10,
                               tie_tol=0.0)                                        # no tolerance: the raw 30 %
    assert strict["pos_frac_decided"] == pytest.approx(0.3) and anatomy.anatomy_gate(strict, -10, 0.01, 0.4)
    ties = anatomy.summarise([seq([0.0, 1e-5, -2e-5])], n_resamples=10)          # all ties: no share, and no crash
    assert ties["pos_frac_decided"] is None and anatomy._f(ties["pos_frac_decided"], ".1f", 100) == "n/a"
    assert [r for r in anatomy.anatomy_gate(ties, -10, 0.01, 0.4) if "shift magnitude" in r]


# --- the stage end to end on the toy world ---

def run_gates(*argv, timeout=600):
    t0 = time.monotonic()
    p = run_script("01_gates.py", *argv, check=False, timeout=timeout,
                   env={"OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"})
    print(f"01_gates {' '.join(argv)}: rc {p.returncode} in {time.monotonic() - t0:.1f} s\n{p.stdout}")
    return p


@pytest.mark.e2e
def test_e2e_toy_pair_passes_every_gate(tmp_path):
    p = run_gates("--run-dir", str(tmp_path), "--pair", "toy", "--anatomy-prompts", "24", "--bootstrap", "2000")
    assert p.returncode == 0, p.stdout + p.stderr
    g = tmp_path / "gates"
    for name in ("tokenizer", "prompt_length", "context", "template", "anatomy"):
        rep = json.loads((g / f"{name}.json").read_text())
        assert rep["gate"] == name and rep["status"] == "PASS", (name, rep["reasons"])
        assert (g / f"{name}.md").exists()
        assert any(line.startswith(f"[01] {name}") and "PASS" in line for line in p.stdout.splitlines())
    a = json.loads((g / "anatomy.json").read_text())
    assert "| token-mean Δ (nats) |" in p.stdout and a["n_sequences"] == 24
    rows = [json.loads(x) for x in (g / "anatomy_samples.jsonl").read_text().splitlines()]
    # the summary is the per-token pooling of what the sample file holds
    n = sum(r["n_tokens"] for r in rows)
    assert a["n_tokens"] == n and a["token_mean_delta"] == pytest.approx(
        sum(r["seq_mean_delta"] * r["n_tokens"] for r in rows) / n, rel=1e-5, abs=1e-6)
    stops = [r["delta_at_stop"] for r in rows if r["finish_reason"] == "stop"]
    assert a["stop"]["n"] == len(stops) and a["stop"]["mean_delta"] == pytest.approx(sum(stops) / len(stops))
    assert a["sampler_logprob_gap"] < 1e-3                    # the sampler and lib/scoring agree on the same tokens
    m = json.loads((g / "manifest.json").read_text())
    assert m["gates"] == {k: "PASS" for k in ("tokenizer", "prompt_length", "context", "template", "anatomy")}
    assert m["allowed"] == [] and "anatomy_samples.jsonl" in m["outputs"]


@pytest.mark.e2e
def test_e2e_offsupport_pair_fails_the_anatomy_gate_and_says_why(tmp_path):
    # On the pinned toy world the off-support teacher's Δ at the student's stop is ≈ −6.8 nats, inside the default
    # −10 (which lets the source report's RL pair, −6.3, pass): the negative control is run at a stricter −5.
    p = run_gates("--run-dir", str(tmp_path), "--pair", "toy-offsupport", "--gates", "anatomy",
                  "--anatomy-prompts", "16", "--bootstrap", "1000", "--min-stop-delta", "-5")
    assert p.returncode == 1, p.stdout + p.stderr
    a = json.loads((tmp_path / "gates" / "anatomy.json").read_text())
    assert a["status"] == "FAIL" and a["allowed"] is False and a["reasons"]
    # every reason is an off-support signature: anti-EOS at the stop token, or a shift negative on most tokens
    assert all("terminal stop token" in r or "Δ > 0" in r for r in a["reasons"]), a["reasons"]
    lp = a["logp_stop_at_answer_end"]
    print(f"off-support pair: Δ@stop {a['stop']['mean_delta']:+.3f}, log p(stop) π_pre {lp['pi_pre']:+.3f} "
          f"π_post {lp['pi_post']:+.3f}, {100 * a['pos_frac']:.1f} % tokens > 0")
    assert lp["pi_post"] < lp["pi_pre"] and a["stop"]["mean_delta"] < 0      # π_post is the side that will not stop
    assert all(f"FAIL: {r}" in p.stdout for r in a["reasons"]) and "--allow anatomy" in p.stdout
    assert json.loads((tmp_path / "gates" / "manifest.json").read_text())["failed"] == ["anatomy"]


@pytest.mark.e2e
def test_e2e_prompt_one_token_over_the_cap_is_named(tmp_path):
    from transformers import AutoTokenizer
    from lib import models
    from lib.data import prompt_ids
    tok = AutoTokenizer.from_pretrained(models.resolve_model("toy-student").path)
    rows = [{"id": "short", "problem": "Compute 1+2."}, {"id": "long", "problem": "Compute 1+2-3+4-1+5+2-3+1."},
            {"id": "mid", "problem": "Compute 4-1+5."}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cap = len(prompt_ids(tok, rows[1]["problem"])) - 1
    assert all(len(prompt_ids(tok, r["problem"])) <= cap for r in rows if r["id"] != "long")
    p = run_gates("--run-dir", str(tmp_path), "--pair", "toy", "--gates", "prompt_length",
                  "--train-data", str(tmp_path / "prompts.jsonl"), "--max-prompt-len", str(cap))
    assert p.returncode == 1
    rep = json.loads((tmp_path / "gates" / "prompt_length.json").read_text())
    assert rep["over_cap"] == [{"id": "long", "tokens": cap + 1}] and rep["n_prompts"] == 3
    assert f"prompt long is {cap + 1} tokens" in p.stdout
    ok = run_gates("--run-dir", str(tmp_path), "--pair", "toy", "--gates", "prompt_length",
                   "--train-data", str(tmp_path / "prompts.jsonl"), "--max-prompt-len", str(cap + 1))
    assert ok.returncode == 0
    allowed = run_gates("--run-dir", str(tmp_path), "--pair", "toy", "--gates", "prompt_length", "--allow",
                        "prompt_length", "--train-data", str(tmp_path / "prompts.jsonl"), "--max-prompt-len", str(cap))
    assert allowed.returncode == 0 and "FAIL (allowed)" in allowed.stdout
    m = json.loads((tmp_path / "gates" / "manifest.json").read_text())
    assert m["allowed"] == ["prompt_length"] and m["gates"] == {"prompt_length": "FAIL"} and m["passed"] is True
