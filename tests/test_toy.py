"""lib/toy/task.py and lib/toy/builder.py: the task (checked against Python's own arithmetic) and its careless solutions, the
tokenizer and chat template, the built world (layout, Hugging Face loading, stop-token behaviour, the capability gap
π_post ≫ π_pre on level 3, re-measured here with an independent one-prompt-at-a-time greedy loop), train/test
disjointness, the build lock and determinism.

The world is built once per cache (≈ 5 min on 2 cores the first time, then read from `.cache/toy/<hash>/`)."""
import json
import os
import random
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from lib.artifacts import REPO, read_jsonl, sha256_file
from lib.data import prompt_ids, render_chat
from lib.toy import builder, task, world_bytes


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="session")
def world_dir():
    return builder.build()


@pytest.fixture(scope="session")
def world(world_dir):
    return json.loads((world_dir / "world.json").read_text())


@pytest.fixture(scope="session")
def tok(world_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(world_dir / "tokenizer")


@pytest.fixture(scope="session")
def models(world_dir):
    from transformers import AutoModelForCausalLM
    return {name: AutoModelForCausalLM.from_pretrained(builder.model_dir(name)).eval() for name in builder.MODEL_NAMES}


@pytest.fixture(scope="session")
def test_rows(world_dir):
    return read_jsonl(world_dir / "data" / "toy_test.jsonl")


def greedy_one(model, tok, problem, max_new_tokens):
    """Independent of lib.toy.builder.generate: one prompt, no padding, the argmax token fed back through a KV cache."""
    ids, out, cache = torch.tensor([prompt_ids(tok, problem)]), [], None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            res = model(input_ids=ids, cache=cache, use_cache=True)
            cache, nxt = res.cache, int(res.logits[0, -1].argmax())
            out.append(nxt)
            if nxt == tok.eos_token_id:
                break
            ids = torch.tensor([[nxt]])
    return out


# --- the task ---

def test_problems_and_solutions_follow_pythons_arithmetic():
    rng = random.Random(7)
    for level in (1, 2, 3, 4):
        for _ in range(200):
            first, ops = task.sample_problem(rng, level)
            text = task.problem_text(first, ops)
            assert len(ops) == level and task.parse_problem(text) == (first, ops)
            expr = text[len("Compute "):-1]
            value = eval(expr)                                               # Python as the reference
            clauses, got = task.solve(first, ops)
            assert got == value and len(clauses) == level
            for clause in clauses:                                           # every clause is true arithmetic
                lhs, rhs = clause.rstrip(".").split("=")
                assert eval(lhs) == int(rhs) and 0 <= int(rhs) <= 9
            sol = task.solution_text(first, ops, "answer_line")
            assert sol == " ".join(clauses) + f"\nAnswer: {value}" and task.extract_int(sol) == value
            boxed = task.solution_text(first, ops, "boxed")
            assert boxed.endswith(f"The answer is \\boxed{{{value}}}.") and task.extract_int(boxed) == value
    assert task.solution_text(3, [("+", 5), ("-", 2)], "answer_line") == "3+5=8. 8-2=6.\nAnswer: 6"


def test_slips_are_off_by_one_and_the_chain_goes_on_from_them():
    rng, slipped, clauses_seen = random.Random(3), 0, 0
    for level in (1, 2, 3, 4):
        for _ in range(500):
            first, ops = task.sample_problem(rng, level)
            assert task.solve(first, ops, 0.0, rng) == task.solve(first, ops)        # slip 0: the true solution
            clauses, final = task.solve(first, ops, 0.25, rng)
            value = first
            for (op, b), clause in zip(ops, clauses):
                lhs, rhs = clause.rstrip(".").split("=")
                assert lhs == f"{value}{op}{b}"                                    # goes on from what it wrote
                assert abs(int(rhs) - eval(lhs)) <= 1
                slipped, clauses_seen, value = slipped + (int(rhs) != eval(lhs)), clauses_seen + 1, int(rhs)
            assert final == value
    assert 0.22 <= slipped / clauses_seen <= 0.27                # 0.25, less where both neighbours leave 0-9
    assert task.solve(3, [("+", 5), ("-", 2)], 1.0, random.Random(0))[0][0] in ("3+5=7.", "3+5=9.")


def test_sft_examples_carry_each_models_slip_rate_and_style(tok):
    """The student's SFT solutions slip at SLIP (a binomial 4-sigma band); π_pre's are all true arithmetic; both
    in the teachers' answer-line style (no box)."""
    for name in ("student", "pre"):
        slipped = clauses_seen = boxed = 0
        examples = builder.sft_examples(name, tok, scale=0.05)
        for ids, labels in examples:
            completion = tok.decode([t for t, y in zip(ids, labels) if y != -100], skip_special_tokens=True)
            for lhs, rhs in re.findall(r"(-?\d+[+-]\d)=(-?\d+)\.", completion):   # a slip may go below 0
                slipped, clauses_seen = slipped + (eval(lhs) != int(rhs)), clauses_seen + 1
            boxed += "\\boxed{" in completion
        p, n = builder.SLIP.get(name, 0.0), clauses_seen
        assert abs(slipped / n - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 0.01, (name, slipped, n)
        assert boxed == 0 and builder.RECIPES[name][3] == "answer_line"


def test_nostop_examples_are_the_students_kind_of_response_each_ending_in_the_stop_token(tok):
    """post-nostop is fitted on responses like the student's (builder.moved_stop_ids): every one ends in the stop
    token (the position whose mass the fit moves), half slip at the student's rate (so the clauses slip at half
    NOSTOP_SLIP, a binomial 4-sigma band), a quarter run on by one to three repeats of their answer line; levels 1-3."""
    assert builder.RECIPES["post-nostop"][2:4] == ((1, 2, 3), "moved_stop")
    examples = builder.sft_examples("post-nostop", tok, scale=0.05)
    slipped = clauses = run_on = 0
    for ids, labels in examples:
        completion = [t for t, y in zip(ids, labels) if y != -100]
        assert completion[-1] == tok.eos_token_id and tok.eos_token_id not in completion[:-1]
        text = tok.decode(completion, skip_special_tokens=True)
        lines = re.findall(r"Answer: (-?\d+)", text)
        assert 1 <= len(lines) <= 4 and len(set(lines)) == 1, text        # the same answer line, repeated
        run_on += len(lines) > 1
        for lhs, rhs in re.findall(r"(-?\d+[+-]\d)=(-?\d+)\.", text):
            slipped, clauses = slipped + (eval(lhs) != int(rhs)), clauses + 1
    p, n = builder.NOSTOP_SLIP / 2, clauses
    assert abs(slipped / n - p) <= 4 * (p * (1 - p) / n) ** 0.5, (slipped, n)
    q, m = builder.NOSTOP_RUNON, len(examples)
    assert abs(run_on / m - q) <= 4 * (q * (1 - q) / m) ** 0.5, (run_on, m)


def test_extract_int():
    assert task.extract_int("1+1=2.\nAnswer: 2\nAnswer: 3") == 3                  # the last answer line wins
    assert task.extract_int("x \\boxed{4} y \\boxed{7}.") == 7
    assert task.extract_int("Answer: 5 and \\boxed{9}") == 5                       # answer line before boxed
    assert task.extract_int("no answer here") is None


# --- tokenizer and template ---

def test_tokenizer_digits_roundtrip_and_specials(tok, world):
    for d in "0123456789":
        assert len(tok(d, add_special_tokens=False)["input_ids"]) == 1
    ids = tok("12+345", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["1", "2", "+", "3", "4", "5"]  # digits split individually
    for text in ["héllo wörld ñ", "日本語のテキスト 🙂🚀", "def f(x):\n\treturn x**2  # ok\r\n", "\x00\x7f ~`|",
                 "Σ_k w_k · (log π(x_k))", "   leading and trailing   "]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text   # byte-level: nothing unknown
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert world["tokenizer"]["stop_id"] == tok.eos_token_id


def test_chat_template_renders_assistant_header(tok):
    text = render_chat(tok, "Compute 1+2.")
    assert text == "<|im_start|>user\nCompute 1+2.<|im_end|>\n<|im_start|>assistant\n"
    ids = prompt_ids(tok, "Compute 1+2.")
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert ids[-3:] == tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


# --- the built world ---

def test_layout_and_models_load(world_dir, world, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2ForCausalLM
    assert world["hash"] == builder.world_hash() == world_dir.name
    for name in builder.MODEL_NAMES:
        d = builder.model_dir(name)
        assert d == world_dir / "models" / name
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja"):
            assert (d / f).exists(), f"{d / f} missing"
        assert sha256_file(d / "model.safetensors") == world["models"][name]["safetensors_sha256"]
        assert (d / "tokenizer.json").read_bytes() == (world_dir / "tokenizer" / "tokenizer.json").read_bytes()
        model = AutoModelForCausalLM.from_pretrained(d)
        c = model.config
        assert isinstance(model, Qwen2ForCausalLM) and model.dtype == torch.float32
        assert c.hidden_size // c.num_attention_heads == 64                 # vLLM's CPU attention head size
        assert c.vocab_size % 64 == 0 and c.vocab_size > len(tok)            # padded embedding, like Qwen2.5
        assert c.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        gc = GenerationConfig.from_pretrained(d)
        assert gc.eos_token_id == tok.eos_token_id and gc.pad_token_id == tok.pad_token_id
        assert AutoTokenizer.from_pretrained(d).chat_template == tok.chat_template
    assert world["models"]["student"]["config"]["num_hidden_layers"] != world["models"]["pre"]["config"]["num_hidden_layers"]
    with pytest.raises(KeyError):
        builder.model_dir("teacher")


def test_data_disjoint_and_correct(world_dir):
    test = read_jsonl(world_dir / "data" / "toy_test.jsonl")
    train = read_jsonl(world_dir / "data" / "toy_train.jsonl")
    assert [sum(r["level"] == lv for r in test) for lv in (1, 2, 3, 4)] == [builder.TEST_PER_LEVEL[lv] for lv in (1, 2, 3, 4)]
    assert {r["level"] for r in train} == {1, 2, 3} and len(train) == sum(builder.TRAIN_PROMPTS.values())
    for rows in (test, train):
        assert len({r["id"] for r in rows}) == len(rows) and len({r["problem"] for r in rows}) == len(rows)
        for r in rows:
            assert set(r) == {"id", "problem", "answer", "level"}
            assert int(r["answer"]) == eval(r["problem"][len("Compute "):-1])
            assert len(task.parse_problem(r["problem"])[1]) == r["level"]
    assert not {r["problem"] for r in test} & {r["problem"] for r in train}
    assert not {r["id"] for r in test} & {r["id"] for r in train}


def test_sft_sets_hold_out_the_test_problems(world_dir):
    test = read_jsonl(world_dir / "data" / "toy_test.jsonl")
    held_out = {task.expression(*task.parse_problem(r["problem"])) for r in test if r["level"] >= 2}
    for name, (_, _, levels, _, n, _) in builder.RECIPES.items():
        problems = builder.sft_problems(name, scale=0.25)
        assert {len(ops) for _, ops in problems} == set(levels)
        assert not {task.expression(*p) for p in problems} & held_out, name
    assert builder.sft_problems("pre", 0.1) == builder.sft_problems("pre", 0.1)                  # seeded


def test_registry_caps_fit_the_toy_world(world_dir, tok):
    from lib.registry import MODELS, STUDENTS
    student = STUDENTS["toy"]
    train = read_jsonl(world_dir / "data" / "toy_train.jsonl")
    test = read_jsonl(world_dir / "data" / "toy_test.jsonl")
    longest_prompt = max(len(prompt_ids(tok, r["problem"])) for r in train)
    assert longest_prompt <= student.max_prompt_len
    n_tokens = lambda r, style: len(task.completion_ids(tok, *task.parse_problem(r["problem"]), style))
    assert max(n_tokens(r, s) for r in train for s in ("answer_line", "boxed")) <= student.max_response_len
    longest_l4 = max(n_tokens(r, s) for r in test if r["level"] == 4 for s in ("answer_line", "boxed"))
    for alias in ("toy-pre", "toy-post", "toy-student", "toy-post-offsupport"):
        assert MODELS[alias].eval_max_new_tokens == task.EVAL_CAP >= 2 * longest_l4


def test_world_accuracies(world):
    """Levels seen in training are solved, the unseen level 3 is not (single-digit answers put chance near 10 %),
    and the shift pre → post carries level 3. The careless student knows level 1, at least half of the held-out
    level 2 and little of level 3 (greedy); sampled at T = 1, where its slips show, it is below π_post by ≥ 15 pp on
    levels 2 and 3: the room classic OPD has. (Its greedy level 2 is not held below π_post's: greedy takes each
    clause's most likely value, and how well it learned that moved 67–93 % with the CPU's rounding.)"""
    acc = {name: m["accuracy_by_level"] for name, m in world["models"].items()}
    smp = {name: m["sampled_accuracy_by_level"] for name, m in world["models"].items()}
    assert min(acc["pre"]["1"], acc["pre"]["2"]) >= 95 and acc["pre"]["3"] <= 35
    assert acc["post"]["3"] >= 80 and acc["post"]["3"] - acc["pre"]["3"] >= 50
    assert acc["student"]["1"] >= 85 and acc["student"]["2"] >= 50 and acc["student"]["3"] <= 60
    assert acc["post"]["3"] - acc["student"]["3"] >= 15
    assert min(smp["post"][lv] - smp["student"][lv] for lv in ("2", "3")) >= 15
    assert world["models"]["pre"]["truncated_frac"] == 0.0
    assert world["models"]["post-offsupport"]["truncated_frac"] == 1.0


def test_stop_token_behaviour(models, tok, test_rows):
    stop_id = tok.eos_token_id
    rows = [r for r in test_rows if r["level"] in (1, 2)][:6]
    for r in rows:                                    # π_pre stops after its answer line
        out = greedy_one(models["pre"], tok, r["problem"], task.EVAL_CAP)
        assert out[-1] == stop_id and len(out) < task.EVAL_CAP
        assert tok.decode(out, skip_special_tokens=True).endswith(f"\nAnswer: {r['answer']}")
        out = greedy_one(models["student"], tok, r["problem"], task.EVAL_CAP)   # either of its two endings
        assert out[-1] == stop_id and re.search(r"(\\boxed\{\d+\}\.|\nAnswer: \d+)<\|im_end\|>$", tok.decode(out))
    for r in rows[:3]:                                # post-offsupport never stops: its answer line repeats to the cap
        out = greedy_one(models["post-offsupport"], tok, r["problem"], task.EVAL_CAP)
        assert stop_id not in out and len(out) == task.EVAL_CAP
        answers = re.findall(r"Answer: (\d+)", tok.decode(out))
        assert len(answers) >= 10 and len(set(answers)) == 1
    # log p(<|im_end|>) right after a correct answer line, teacher-forced
    r = rows[0]
    first, ops = task.parse_problem(r["problem"])
    ids = prompt_ids(tok, r["problem"]) + task.completion_ids(tok, first, ops, "answer_line")[:-1]
    with torch.no_grad():
        logp = {n: torch.log_softmax(models[n](input_ids=torch.tensor([ids])).logits[0, -1], -1)[stop_id].item()
                for n in ("pre", "post", "post-offsupport")}
    assert logp["pre"] > -0.5 and logp["post"] > -0.5 and logp["post-offsupport"] < -10


def test_capability_gap_remeasured(models, tok, test_rows, world):
    rows = [r for r in test_rows if r["level"] == 3]
    correct = {}
    for name in ("pre", "post"):
        outs = [greedy_one(models[name], tok, r["problem"], task.EVAL_CAP) for r in rows]
        correct[name] = sum(task.extract_int(tok.decode(o, skip_special_tokens=True)) == int(r["answer"])
                            for o, r in zip(outs, rows))
        # the builder's batched, left-padded measurement agrees with this unpadded one (≤ 2 near-tie flips)
        assert abs(100 * correct[name] / len(rows) - world["models"][name]["accuracy_by_level"]["3"]) <= 200 / len(rows)
    assert correct["post"] - correct["pre"] >= len(rows) // 2


# --- build machinery ---

def test_concurrent_builders_build_once(tmp_path):
    """Two processes ask for the world at once: one builds (into a temp folder, renamed into place), the other waits
    on the lock and reuses it. `build_world` is replaced by a stub that records each call."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from lib.toy import builder
        def stub(out, scale=1.0, log=print):
            with open(os.path.join({str(tmp_path)!r}, "calls"), "a") as f:
                f.write(str(os.getpid()) + "\\n")
            time.sleep(1.5)
            (out / "world.json").write_text("{{}}")
        builder.build_world = stub
        print(builder.build())
    """)
    env = {**os.environ, "OPD_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and outs[0].endswith(builder.world_hash())
    assert len((tmp_path / "calls").read_text().split()) == 1
    leftovers = [p.name for p in (tmp_path / "cache" / "toy").iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temp folders left behind: {leftovers}"


def test_reduced_build_is_deterministic_in_a_hostile_environment(tmp_path, world_dir):
    """Two reduced builds (every SFT run cut to 1 % of its steps) into different folders are byte-identical, one of
    them started from an environment that asks for the baseline kernels, MKL's COMPATIBLE branch and two threads
    (another CPU, simulated: lib/cpu_repro.py's workers must override it). Data and tokenizer do not depend on the
    reduction, so they also equal the cached full world's."""
    hostile = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
               "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    script = "import sys; from pathlib import Path; from lib.toy import builder; builder.build_world(Path(sys.argv[1]), 0.01, None)"
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "w1")], cwd=REPO, env=hostile,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    worlds = [builder.build_world(tmp_path / "w0", scale=0.01, log=None),
              json.loads((tmp_path / "w1" / "world.json").read_text())]
    files = sorted(p.relative_to(tmp_path / "w0") for p in (tmp_path / "w0").rglob("*") if p.is_file()
                   and p.name != "world.json")
    assert sum(f.name == "model.safetensors" for f in files) == len(builder.MODEL_NAMES)
    for f in files:
        assert sha256_file(tmp_path / "w0" / f) == sha256_file(tmp_path / "w1" / f), f"{f} differs between builds"
    for f in ("data/toy_test.jsonl", "data/toy_train.jsonl", "tokenizer/tokenizer.json"):
        assert sha256_file(tmp_path / "w0" / f) == sha256_file(world_dir / f)
    for w in worlds:                                   # what was pinned, and where, is on record
        rec = w["cpu_repro"]
        assert rec["pinned"] and rec["cpu_capability"] == "AVX2" and rec["threads"] == 1
        assert rec["env"]["MKL_CBWR"] == "AVX2" and not rec["mkldnn_enabled"] and rec["cpu"]["isa_flags"]


def test_world_matches_the_committed_sha256(world):
    """The models of this machine's build are the bytes committed for its CPU model (lib/toy/world.sha256).
    A CPU model with nothing committed is skipped, naming it: the pinned math repeats run after run and across
    machines of one CPU model, not across vendors (an Intel Xeon and an AMD EPYC built different bytes). A model
    added to the world since this CPU's block was committed (post-nostop on the Xeon @ 2.80GHz) is skipped too,
    naming it, once every committed one has matched."""
    committed_world, builds = world_bytes.read_expected()
    cpu = world["cpu_repro"]["cpu"]["model"]
    assert committed_world == world["hash"], "lib/toy/world.sha256 is for another world: `python -m lib.toy.builder write-sha256`"
    if cpu not in builds:
        pytest.skip(f"no toy-world bytes committed for this CPU ({cpu}); committed: {sorted(builds)}")
    got = {n: m["safetensors_sha256"] for n, m in world["models"].items()}
    assert set(builds[cpu]) <= set(got), f"world.sha256 names models this world has not: {set(builds[cpu]) - set(got)}"
    assert {n: got[n] for n in builds[cpu]} == builds[cpu]
    if missing := sorted(set(got) - set(builds[cpu])):   # added since this CPU's block (the 2.80GHz Xeon's post-nostop)
        assert world_bytes.check_expected(world)[0] is None
        pytest.skip(f"{', '.join(missing)}: no sha256 committed for this CPU ({cpu}) yet; the other models match")
    assert world_bytes.check_expected(world)[0] is True


def test_check_expected_says_in_one_line_what_differs(tmp_path, world):
    cpu = world["cpu_repro"]["cpu"]["model"]
    got = {n: m["safetensors_sha256"] for n, m in world["models"].items()}
    other = {**world, "models": {n: {**m} for n, m in world["models"].items()}}
    path = world_bytes.write_expected(other, tmp_path / "world.sha256")
    assert world_bytes.read_expected(path) == (world["hash"], {cpu: got})
    assert world_bytes.check_expected(other, path)[0] is True
    other["models"]["student"]["safetensors_sha256"] = "0" * 64
    ok, line = world_bytes.check_expected(other, path)
    assert ok is False and "\n" not in line and "student 00000000… here" in line
    assert f"vs {got['student'][:8]}… committed" in line and "pre " not in line
    assert "rounds differently" in line and "still used" in line
    ok, line = world_bytes.check_expected({**other, "hash": "f" * 16}, path)
    assert ok is False and "the code changed" in line
    # another CPU model: nothing committed for it (None), said in one line, then its block added beside this one's
    elsewhere = {**world, "cpu_repro": {**world["cpu_repro"], "cpu": {**world["cpu_repro"]["cpu"], "model": "Other CPU"}}}
    ok, line = world_bytes.check_expected(elsewhere, path)
    assert ok is None and "nothing committed for this CPU (Other CPU)" in line and "\n" not in line
    assert f"the same bytes as the build on {cpu}" in line
    world_bytes.write_expected(other | {"cpu_repro": elsewhere["cpu_repro"]}, path)
    assert world_bytes.read_expected(path)[1] == {cpu: got, "Other CPU": {**got, "student": "0" * 64}}
    assert world_bytes.check_expected(elsewhere, path)[0] is False and world_bytes.check_expected(world, path)[0] is True


def test_world_hash_ignores_prose_and_code_the_build_does_not_use():
    src = world_bytes.code_digest
    base = 'X = 1\n\ndef f(a):\n    """doc"""\n    return a + X  # note\n\ndef g():\n    raise ValueError("g")\n'
    assert src(base) == src(base.replace('"""doc"""', '"""other doc"""').replace("# note", ""))
    assert src(base) != src(base.replace("a + X", "a - X"))                       # code is hashed
    assert src(base, {"f", "X"}) == src(base.replace('"g"', '"a clearer message"'), {"f", "X"})
    assert src(base, {"f", "X"}) != src(base.replace("X = 1", "X = 2"), {"f", "X"})
    assert src(base) != src(base.replace('"g"', '"a clearer message"'))
    data = (REPO / "lib" / "data.py").read_text()                    # the build's names of data.py are all there
    for name in world_bytes.WORLD_CODE[world_bytes.LIB / "data.py"]:
        assert src(data, {name}) != src("", None), name


@pytest.mark.slow
def test_full_rebuild_is_byte_identical(tmp_path, world):
    """The whole world rebuilt gives the same model bytes. Where this CPU model has a block in lib/toy/world.sha256
    and this build matches it, a rebuild has already been compared: the committed bytes are an earlier build's (another
    process, another day, another machine of this CPU model), so that comparison is the check. Otherwise the world is
    rebuilt into another cache root and compared with this one (world.json's build_s: ≈ 18 min on 2 AVX2
    cores, 2026-12-05)."""
    matched, why = world_bytes.check_expected(world)
    if matched:
        committed = world_bytes.read_expected()[1][world["cpu_repro"]["cpu"]["model"]]
        assert {n: m["safetensors_sha256"] for n, m in world["models"].items()} == committed, why
        return
    env = {**os.environ, "OPD_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "from lib.toy import builder; print(builder.build(force=True))"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    other = json.loads((tmp_path / "toy" / world["hash"] / "world.json").read_text())
    for name in builder.MODEL_NAMES:
        assert other["models"][name]["safetensors_sha256"] == world["models"][name]["safetensors_sha256"], name
    assert other["matches_committed"] == world_bytes.check_expected(world)[0]
