"""One micro-batch of 03_opd_train's loop, through the script's own functions, against plain Hugging Face code.

The script's step 2 (score_micro_batch), step 3 (opd.advantages) and step 4 (micro_batch_loss) run on real toy
rollouts; the reference re-derives every quantity from `lm(input_ids).logits` with log_softmax, written here
independently (top-K by torch.topk, PPO at ratio 1, k3 by its formula), and the two gradients must agree.
"""
import copy
import importlib.util
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import INTERPRETED, REPO
from lib import benchmarks
from lib.data import prompt_ids
from lib.sample.engine import HFEngine, sample
from lib.toy import builder
from lib.train import opd
from lib.train.scoring import TokenScorer, pack

pytestmark = pytest.mark.usefixtures("one_thread")
K = 4


def load_03():
    spec = importlib.util.spec_from_file_location("opd_train_03", REPO / "03_opd_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def world():
    return make_world()


def make_world():
    """The toy pair, four training prompts and the student's own sampled rollouts of them, packed as 03 packs."""
    builder.build()
    tok = AutoTokenizer.from_pretrained(builder.model_dir("student"))
    lms = {k: AutoModelForCausalLM.from_pretrained(builder.model_dir(k), dtype=torch.float32).eval()
           for k in ("student", "pre", "post")}
    rows, _ = benchmarks.load_benchmark("toy_train", require_answer=False)
    prompts = [prompt_ids(tok, r["problem"]) for r in rows[:4]]
    outs = sample(HFEngine(copy.deepcopy(lms["student"]), tok, batch_size=8), prompts, list(range(4)),
                  temperature=1.0, top_p=1.0, max_new_tokens=24, progress=False)
    batch = pack(prompts, [o.token_ids for o in outs], tok.pad_token_id)
    return dict(tok=tok, lms=lms, prompts=prompts, outs=outs, batch=batch, m03=load_03())


def hf_logprobs(lm, batch, temperature=1.0):
    """(N, V) log-softmax at each response position, from a plain forward (the reference side)."""
    logits = lm(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
    return torch.log_softmax(logits[batch.rows_N, batch.cols_N].float() / temperature, -1)


def reference_loss(reward, student_lm, lms, batch, kl_coef, topk_ids=None):
    """The step's loss for one micro-batch written from scratch (on-policy: ratio = exp(lp − lp.detach()) = 1)."""
    y = batch.targets_N[:, None]
    lp_V = hf_logprobs(student_lm, batch)
    with torch.no_grad():
        post_V, pre_V, ref_V = (hf_logprobs(lms[k], batch) for k in ("post", "pre", "pre"))
    if reward == "delta-topk":
        ids = lp_V.detach().topk(K, -1).indices if topk_ids is None else topk_ids
        w = torch.softmax(lp_V.detach().gather(1, ids), -1)
        adv = w * (post_V.gather(1, ids) - pre_V.gather(1, ids))
    elif reward == "delta-sampled":
        ids, adv = y, post_V.gather(1, y) - pre_V.gather(1, y)
    else:   # classic OPD: −clamp(log π_θ − log π_T, ±10) on the sampled token
        ids, adv = y, -(lp_V.detach().gather(1, y) - post_V.gather(1, y)).clamp(-10, 10)
    lp = lp_V.gather(1, ids)
    pg = (-adv * torch.exp(lp - lp.detach())).sum()
    x = (ref_V.gather(1, y)[:, 0] - lp_V.gather(1, y)[:, 0]).clamp(-20, 20)   # verl's low_var_kl clamps
    k3 = (torch.exp(x) - x - 1).clamp(-10, 10).sum()
    return (pg + kl_coef * k3) / len(y)


def assert_grads_close(got: dict, lm, rel=1e-4):
    """Every parameter's gradient within rel × that tensor's largest entry (fp32 sums in different orders)."""
    for n, p in lm.named_parameters():
        scale = p.grad.abs().max().item() + 1e-8
        assert (got[n] - p.grad).abs().max().item() <= rel * scale, n


def script_grads(world, reward, kl_coef, topk_ids=None, packed=False):
    """The script's loss and student gradient; `packed`: every model on lib/kernels/varlen.py's padding-free batches."""
    m03, batch = world["m03"], world["batch"]
    lms = {k: copy.deepcopy(v) for k, v in world["lms"].items()} if packed else world["lms"]
    if packed:
        batch = pack(world["prompts"], [o.token_ids for o in world["outs"]], world["tok"].pad_token_id, packed=True)
    scorer = lambda lm, **kw: TokenScorer(lm, packed=packed, **kw)   # noqa: E731
    student = scorer(copy.deepcopy(lms["student"]), fused_linear=True)
    teachers = ({"teacher": scorer(lms["post"])} if reward == "opd"
                else {"pi_post": scorer(lms["post"]), "pi_pre": scorer(lms["pre"])})
    ref = scorer(lms["pre"])                   # a reference unlike the student, so the KL term has a gradient
    mb = m03.score_micro_batch(student, teachers, ref, batch, K if reward == "delta-topk" else 0, world["outs"])
    if topk_ids is not None:                   # candidates other than the student's own top-K: must be used as given
        with torch.no_grad():
            mb["topk_ids"], mb["old_topk"] = topk_ids, student(batch, None, topk_ids_NK=topk_ids)[2]
            mb["lp_t"] = {k: m(batch, torch.cat([batch.targets_N[:, None], topk_ids], 1)) for k, m in teachers.items()}
    mb["adv"], _ = opd.advantages(reward, mb["lp_t"], mb["old_N"], mb["old_topk"])
    loss, *_ = m03.micro_batch_loss(student, mb, kl_coef, len(batch.targets_N), clip_eps=0.2)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in student.lm.named_parameters()}


def test_scoring_reads_each_teachers_stop_probability_for_the_conditional_policy(world):
    """--eos-policy conditional asks step 2 for each teacher's log p(stop) too (the stop ids as extra columns): the
    other columns are unchanged, log p(stop) is the plain forward's over every stop id, and the tokens of responses
    the cap cut are marked (--truncated-policy)."""
    from lib.sample.completion import stop_ids
    m03, batch, lms, outs = world["m03"], world["batch"], world["lms"], world["outs"]
    student = TokenScorer(copy.deepcopy(lms["student"]))
    teachers = {"pi_post": TokenScorer(lms["post"]), "pi_pre": TokenScorer(lms["pre"])}
    stop_t = torch.tensor(stop_ids(world["tok"], builder.model_dir("student")))
    plain = m03.score_micro_batch(student, teachers, None, batch, K, outs)
    with_stop = m03.score_micro_batch(student, teachers, None, batch, K, outs, stop_t)
    assert plain["lp_stop_t"] is None
    with torch.no_grad():
        for k, lm in (("pi_post", lms["post"]), ("pi_pre", lms["pre"])):
            assert torch.equal(plain["lp_t"][k], with_stop["lp_t"][k])
            want = hf_logprobs(lm, batch)[:, stop_t].logsumexp(-1)
            assert torch.allclose(with_stop["lp_stop_t"][k], want, atol=1e-5)
    trunc = torch.cat([torch.full((len(o.token_ids),), o.finish_reason == "length") for o in outs])
    assert trunc.any() and not trunc.all() and torch.equal(with_stop["is_trunc_N"], trunc)   # both kinds here


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("reward", opd.REWARDS)
def test_micro_batch_gradient_equals_plain_hf(world, reward, packed):
    """The script's micro-batch (padded rows, or packed end to end) = the loss and gradient of plain padded HF."""
    loss, got = script_grads(world, reward, kl_coef=0.7, packed=packed)
    lm = copy.deepcopy(world["lms"]["student"])
    want_loss = reference_loss(reward, lm, world["lms"], world["batch"], 0.7)
    want_loss.backward()
    assert loss == pytest.approx(want_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(got, lm)
    assert max(g.abs().max().item() for g in got.values()) > 0


def test_update_uses_the_stored_candidates(world):
    """Stored ids that are NOT the student's top-K: the update's gradient is the reference's at exactly those ids."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, world["lms"]["student"].config.vocab_size, (len(world["batch"].targets_N), K), generator=g)
    _, got = script_grads(world, "delta-topk", kl_coef=0.0, topk_ids=ids)
    lm = copy.deepcopy(world["lms"]["student"])
    reference_loss("delta-topk", lm, world["lms"], world["batch"], 0.0, topk_ids=ids).backward()
    assert_grads_close(got, lm)


@pytest.mark.parametrize("fused", [True, False])
def test_scorer_given_ids_temperature_and_entropy(world, fused):
    """TokenScorer: given ids scored with grad = log_softmax(logits / T) at those ids; entropy of the same."""
    lm, batch, T = copy.deepcopy(world["lms"]["student"]), world["batch"], 0.7
    scorer = TokenScorer(lm, fused_linear=fused, temperature=T)
    lp_N, chosen, topk_lp, ent = scorer(batch, None, topk=K)
    want_V = hf_logprobs(lm, batch, T).detach()
    assert torch.equal(chosen, want_V.topk(K, -1).indices)
    torch.testing.assert_close(topk_lp, want_V.gather(1, chosen), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, -(want_V.exp() * want_V).sum(-1), atol=1e-5, rtol=1e-5)
    ids = torch.randint(0, want_V.shape[1], chosen.shape, generator=torch.Generator().manual_seed(1))
    lp2, _, given_lp, _ = scorer(batch, None, topk_ids_NK=ids)
    assert torch.equal(lp2, lp_N)
    torch.testing.assert_close(given_lp, want_V.gather(1, ids), atol=1e-5, rtol=1e-5)
    wts = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    (given_lp * wts).sum().backward()
    got = {n: p.grad.clone() for n, p in lm.named_parameters()}
    lm.zero_grad()
    (hf_logprobs(lm, batch, T).gather(1, ids) * wts).sum().backward()
    assert_grads_close(got, lm)
    with torch.no_grad():
        lp_NJ, ent_t = scorer(batch, ids, with_entropy=True)
    torch.testing.assert_close(lp_NJ, want_V.gather(1, ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_t, ent, atol=1e-6, rtol=1e-6)


def test_one_opd_step_raises_the_teachers_argmax(world):
    """One optimizer step of classic OPD through 03's functions (AdamW as the loop's, at a step small enough to be
    first-order: larger ones overshoot on this 0.8M-parameter model with tied embeddings, whichever the sign): the
    student's log-prob of the teacher's argmax token, averaged over the rollouts' positions, goes up (+2.9e-4 here;
    the sign-flipped reward moves it by −4.2e-4)."""
    m03, lms, batch = world["m03"], world["lms"], world["batch"]
    student = TokenScorer(copy.deepcopy(lms["student"]))
    teacher = TokenScorer(lms["post"])
    with torch.no_grad():
        argmax = hf_logprobs(lms["post"], batch).argmax(-1, keepdim=True)

    def on_argmax():
        with torch.no_grad():
            return hf_logprobs(student.lm, batch).gather(1, argmax).mean().item()

    before = on_argmax()
    mb = m03.score_micro_batch(student, {"teacher": teacher}, None, batch, 0, world["outs"])
    mb["adv"], _ = opd.advantages("opd", mb["lp_t"], mb["old_N"], mb["old_topk"])
    optim = torch.optim.AdamW(student.parameters(), lr=1e-5, weight_decay=0.01)
    loss, *_ = m03.micro_batch_loss(student, mb, 0.0, len(batch.targets_N), clip_eps=0.2)
    loss.backward()
    optim.step()
    after = on_argmax()
    assert after > before + 1e-4, (before, after)


def test_micro_batch_plan_by_token_budget():
    from lib.train.scoring import micro_batch_plan as plan
    lengths = [30, 100, 55, 60, 20, 250, 45]
    assert plan(lengths, 3) == [[0, 1, 2], [3, 4, 5], [6]]                       # no budget: sampling order
    got = plan(lengths, 3, max_tokens=150)
    # longest first; rows × longest ≤ 150; 250 alone (over budget); every sequence exactly once
    assert got == [[5], [1], [3, 2], [6, 0, 4]]
    assert sorted(i for g in got for i in g) == list(range(len(lengths)))
    assert all(len(g) * max(lengths[i] for i in g) <= 150 for g in got if len(g) > 1)
    even = plan(lengths, 3, max_tokens=150, n_micro=6)                            # another rank planned 6
    assert even == [[5], [1], [3], [2], [6], [0, 4]]                              # the most-padded split first
    # one split only: the group of 3 × 45 = 135 token slots goes before the pair of 2 × 60 = 120
    assert plan(lengths, 3, max_tokens=150, n_micro=5) == [[5], [1], [3, 2], [6], [0, 4]]
    with pytest.raises(ValueError, match="micro-batches"):
        plan(lengths, 3, max_tokens=150, n_micro=8)


def test_scoring_in_big_micro_batches_regrouped_equals_scoring_in_the_update_plan(world):
    """Step 2 in one micro-batch of all four rollouts (as scoring's own budget packs it on CUDA), regrouped into the
    update's two = step 2 run on those two directly: the same top-K ids, stop and truncation flags and sampler
    log-probs, the log-probs (each teacher's log p(stop) too, as --eos-policy conditional asks) and entropies to float
    tolerance (padding differs); regrouping back returns the very tensors."""
    from lib.sample.completion import stop_ids
    from lib.train.scoring import regroup
    m03, lms, tok, outs = world["m03"], world["lms"], world["tok"], world["outs"]
    student, ref = TokenScorer(lms["student"]), TokenScorer(lms["pre"])
    teachers = {"pi_post": TokenScorer(lms["post"]), "pi_pre": TokenScorer(lms["pre"])}

    def score(idx):
        batch = pack([world["prompts"][i] for i in idx], [outs[i].token_ids for i in idx], tok.pad_token_id)
        return m03.score_micro_batch(student, teachers, ref, batch, K, [outs[i] for i in idx], stop_t)

    stop_t = torch.tensor(stop_ids(tok, builder.model_dir("student")))
    big, small, n_tok = [[0, 1, 2, 3]], [[2, 0], [3, 1]], [len(o.token_ids) for o in outs]
    assert len(set(n_tok)) > 1                                         # sequences of different lengths
    scored = [score(i) for i in big]
    got, want = regroup(scored, big, small, n_tok, skip="batch"), [score(i) for i in small]
    for g, w in zip(got, want):
        assert set(g) == set(w) - {"batch"}
        for k in ("topk_ids", "is_stop_N", "is_trunc_N", "sampler_N"):
            assert torch.equal(g[k], w[k]), k
        for k in ("old_N", "old_topk", "ent_N", "ref_N", "delta_N"):
            torch.testing.assert_close(g[k], w[k], atol=1e-5, rtol=1e-5)
        for k in ("pi_post", "pi_pre"):
            torch.testing.assert_close(g["lp_t"][k], w["lp_t"][k], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(g["ent_t"][k], w["ent_t"][k], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(g["lp_stop_t"][k], w["lp_stop_t"][k], atol=1e-5, rtol=1e-5)
    back, orig = leaves(regroup(got, small, big, n_tok)[0]), leaves(scored[0])
    assert back.keys() == orig.keys() and all(torch.equal(back[k], orig[k]) for k in orig)


def test_sampler_gap_sums_over_the_tokens_that_have_a_sampler_logprob():
    """rollout/logprob_gap's sums (lib/scoring.sampler_gap) against a hand computation: a NaN sampler log-prob (the
    engine returned none for that rollout) adds neither to the sum nor to the count."""
    from lib.train.scoring import sampler_gap
    nan = float("nan")
    sampler = [torch.tensor([-1.0, nan, nan, -0.5]), torch.tensor([-2.0, -3.0]), torch.tensor([nan])]
    scored = [torch.tensor([-1.25, -7.0, -9.0, -0.5]), torch.tensor([-2.5, -2.0]), torch.tensor([-4.0])]
    total, count = sampler_gap(sampler, scored)
    assert float(total) == 0.25 + 0.0 + 0.5 + 1.0 and int(count) == 4
    with pytest.raises(ValueError):
        sampler_gap(sampler, scored[:2])                           # every micro-batch has both


def leaves(mb):
    """{'key' or 'key/teacher': tensor} of a scored micro-batch, without its Batch."""
    out = {}
    for k, v in mb.items():
        for kk, t in (v.items() if isinstance(v, dict) else [("", v)]):
            if k != "batch":
                out[f"{k}/{kk}".rstrip("/")] = t
    return out


def test_counts_below_one_are_refused_in_one_line_naming_the_flag(world, capsys):
    p = world["m03"].parse_args
    for flag, value, said in (("--micro-batch", "0", "got 0"), ("--steps", "-3", "got -3"),
                              ("--logprob-gap-every", "x", "got 'x'"), ("--max-tokens-per-micro", "0", "got 0")):
        with pytest.raises(SystemExit):
            p(["--pair=toy", f"{flag}={value}"])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.endswith(f": argument {flag}: expected a whole number ≥ 1, {said} (see --help)"), err  # prog: argv[0]
    assert p(["--pair=toy", "--micro-batch=3"]).micro_batch == 3


def test_micro_batch_auto_rule(world, monkeypatch):
    """`--micro-batch auto`: the rule as pure functions on given sizes, against hand arithmetic; an explicit count or
    token budget wins; off CUDA auto is the old default (8 sequences); on CUDA a token budget from the memory left."""
    from types import SimpleNamespace
    from lib.train import step_phases as sp
    p = world["m03"].parse_args
    assert p(["--pair=toy"]).micro_batch == 8 and p(["--pair=toy", "--micro-batch", "auto"]).micro_batch == "auto"
    # the per-token estimate at Qwen2.5-1.5B (hidden 1536, MLP 8960, 28 layers): 28 · 2 · (8 · 1536 + 4 · 8960)
    assert sp.update_token_bytes(1536, 8960, 28, False) == 28 * 2 * (12288 + 35840) == 2_695_168
    assert sp.update_token_bytes(1536, 8960, 28, True) == 28 * 4 * 1536 + 2 * 2 * (12288 + 35840) == 364_544
    # an upper estimate: above what bench/RESULTS.md §8 measured (18.7 GiB more at 16 more sequences of ≈ 565 tokens)
    assert sp.update_token_bytes(1536, 8960, 28, False) > 18.7 * 2**30 / (16 * 565)
    # 0.75 of (100 − 20) GiB at 2,695,168 bytes a token = 23,903.2 tokens → 23 × 1024
    assert sp.auto_tokens_per_micro(100 * 2**30, 20 * 2**30, 2_695_168) == 23 * 1024 == 23_552
    assert sp.auto_tokens_per_micro(100 * 2**30, 20 * 2**30, 2_695_168, share=0.5) == 15 * 1024   # 15,935.5
    assert sp.auto_tokens_per_micro(2**30, 4 * 2**30, 1000) == 1024          # nothing left: one quantum
    assert sp.auto_tokens_per_micro(10**9, 0, 10**6, quantum=1) == 750
    # balanced_token_budget: the least budget with as few micro-batches; 7 × 10 tokens under 60 is 6 + 1, under 40
    # 4 + 3; [250, 100, 60, 55, 45, 30, 20] under 150 is 4 groups and needs 135 (45 · 3) for them
    from lib.train.scoring import micro_batch_plan
    assert sp.balanced_token_budget([10] * 7, 60) == 40 and micro_batch_plan([10] * 7, 1, 60) == [list(range(6)), [6]]
    assert micro_batch_plan([10] * 7, 1, 40) == [[0, 1, 2, 3], [4, 5, 6]]
    assert sp.balanced_token_budget([30, 100, 55, 60, 20, 250, 45], 150) == 135
    assert sp.balanced_token_budget([10] * 7, 70) == 70 and sp.balanced_token_budget([500], 100) == 1
    # resolve_micro_batch: an explicit count wins everywhere, with or without a token budget; auto off CUDA is 8
    d = SimpleNamespace(world=2, device="cuda:0", main=False)
    args = SimpleNamespace(micro_batch=16, max_tokens_per_micro=None, batch_prompts=64, rollouts=4,
                           offload_optimizer=False, activation_checkpointing=False)
    assert sp.resolve_micro_batch(args, None, None, d, cuda=True) == (16, None)
    args.max_tokens_per_micro = 3000
    assert sp.resolve_micro_batch(args, None, None, d, cuda=True) == (16, 3000)
    args.micro_batch = "auto"
    assert sp.resolve_micro_batch(args, None, None, d, cuda=False) == (8, 3000)
    assert sp.resolve_micro_batch(args, None, None, d, cuda=True) == (128, 3000)    # the given budget, B·n/W rows
    args.max_tokens_per_micro = None
    assert sp.resolve_micro_batch(args, None, None, d, cuda=False) == (8, None)
    # on CUDA (memory faked): free = 60 GiB unused + 4 GiB the allocator holds unused; reserved: the workspace, the
    # gradients (400 B), AdamW's moments (800 B) and the bf16 copy (200 B) of 100 fp32 parameters
    student = torch.nn.Linear(10, 10, bias=False)
    student.lm = SimpleNamespace(config=SimpleNamespace(hidden_size=1536, intermediate_size=8960,
                                                        num_hidden_layers=28))
    optim = torch.optim.AdamW(student.parameters())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (60 * 2**30, 140 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 30 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 26 * 2**30)
    reserve = sp.SAMPLER_WORKSPACE + 400 + 800 + 200
    want = int(0.75 * (64 * 2**30 - reserve)) // 2_695_168 // 1024 * 1024
    assert want == 17 * 1024 and sp.resolve_micro_batch(args, student, optim, d, cuda=True) == (128, want)
    args.activation_checkpointing, args.offload_optimizer = True, True
    want = int(0.75 * (64 * 2**30 - reserve + 800)) // 364_544 // 1024 * 1024
    assert want == 129 * 1024 and sp.resolve_micro_batch(args, student, optim, d, cuda=True) == (128, want)


def test_step_phase_defaults_cpu_unchanged_cuda_scaled(world):
    """--compile auto is off here (CPU) and on on CUDA; scoring uses the update's plan on CPU (None) and 4× the
    update's micro-batch on CUDA; the built-in sampler's slots: --micro-batch × 8 on CPU, B·n/W on CUDA."""
    from lib.train.step_phases import PhaseClock, resolve_auto, sampler_slots, score_limits
    p = world["m03"].parse_args
    a = p(["--pair=toy"])
    assert a.compile is False and not torch.cuda.is_available()
    assert p(["--compile"]).compile is True and p(["--compile", "on"]).compile is True
    assert p(["--compile", "off"]).compile is False and p(["--no-compile"]).compile is False
    assert a.packing is False and p(["--packing", "on"]).packing is True     # padded on CPU unless asked
    assert resolve_auto("auto", True) is True and resolve_auto("auto", False) is False
    assert resolve_auto("on", False) is True and resolve_auto("off", True) is False
    from lib.train.dist import RECOMPILE_LIMIT, allow_recompiles
    saved = torch._dynamo.config.recompile_limit
    try:     # compiled layers of four models need more than dynamo's default 8 graphs, or the rest run eagerly
        torch._dynamo.config.recompile_limit = 8
        allow_recompiles()
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT > 8
    finally:
        torch._dynamo.config.recompile_limit = saved
    assert score_limits(a, cuda=False) is None and score_limits(a, cuda=True) == (32, None)
    b = p(["--max-tokens-per-micro=1000"])
    assert score_limits(b, cuda=False) is None and score_limits(b, cuda=True) == (8, 4000)
    c = p(["--score-tokens-per-micro=5000"])
    assert score_limits(c, cuda=False) == score_limits(c, cuda=True) == (8, 5000)
    assert sampler_slots(a, world=1, cuda=False) == 64 and sampler_slots(a, world=2, cuda=True) == 128
    assert sampler_slots(a, world=1, cuda=True) == 256
    clock = PhaseClock(None, cuda=False)
    clock.start()
    for name in ("sync", "gen"):
        clock.mark(name)
    assert list(clock.seconds) == ["sync", "gen"] and clock.peak_gb == {"sync": None, "gen": None}
    assert 0 <= sum(clock.seconds.values()) <= clock.total()
    import gc
    cycles = []
    gc.disable()
    try:     # gc_seconds: the time inside collections, charged to the phase they ran in
        clock.start()
        cycles += [[[]] for _ in range(200_000)]
        for c in cycles:
            c[0].append(c)
        cycles.clear()
        gc.collect()
        clock.mark("sync")
        clock.mark("gen")
    finally:
        gc.enable()
    assert 0.0 < clock.gc_seconds["sync"] <= clock.seconds["sync"] and clock.gc_seconds["gen"] == 0.0
    from lib.train.step_phases import freeze_heap
    import weakref

    class Node:
        pass
    kept, dead = [Node() for _ in range(1000)], Node()
    dead.self, gone = dead, weakref.ref(dead)     # a cycle: only a collection frees it
    del dead
    frozen = gc.get_freeze_count()
    try:     # freeze_heap: garbage collected first, the survivors frozen (no later collection rescans them)
        freeze_heap()
        assert gone() is None and gc.get_freeze_count() >= frozen + len(kept)
    finally:
        gc.unfreeze()


def explained_oom(monkeypatch, record) -> str:
    """The one line lib.sample.resident.explain_oom makes of a CUDA OOM once `record()` has recorded an engine, after
    checking that with nothing recorded an OOM passes unchanged, as any other error does with or without a record,
    and that the line keeps the OOM as its cause."""
    from lib.sample import resident
    monkeypatch.setattr(resident, "RESIDENT", {})
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nmore text")
    for err in (oom, ValueError("not memory")):             # nothing recorded: unchanged
        with pytest.raises(type(err)) as caught, resident.explain_oom():
            raise err
        assert caught.value is err
    record()
    with pytest.raises(ValueError), resident.explain_oom():
        raise ValueError("not memory")
    with pytest.raises(SystemExit) as caught, resident.explain_oom():
        raise oom
    assert caught.value.__cause__ is oom
    msg = str(caught.value)
    assert "\n" not in msg and "Tried to allocate 2.00 GiB" in msg
    return msg


def test_an_oom_beside_a_resident_vllm_engine_names_its_share_and_the_fixes(monkeypatch):
    """lib.sample.resident.explain_oom, around 03's main: with a resident vLLM engine recorded (as VLLMEngine records
    it on CUDA), a CUDA OOM becomes one line with the engine's GiB, its share and both fixes; without one, the OOM
    passes unchanged, as any other error does."""
    from lib.sample import vllm_engine
    msg = explained_oom(monkeypatch, lambda: vllm_engine.record_footprint(21.6, 0.15))
    assert "vLLM engine" in msg and "(21.6 GiB)" in msg and "--gpu-memory-utilization 0.15" in msg
    assert "drop --no-vllm-sleep" in msg and "lower --gpu-memory-utilization" in msg


def test_an_oom_beside_the_sampler_s_resident_cache_names_it_and_the_fixes(monkeypatch, world):
    """lib.sample.resident.explain_oom, around 03's main: with the built-in sampler's cache recorded as resident
    (HFEngine.record_resident, as 03 records it), a CUDA OOM becomes one line with its GiB, its slots and the fixes.
    What is recorded is the held decoder's slots and its bytes, which cover the K and V tensors it really holds (read
    from their storage, not from lib/sample/decode.slot_bytes' formula) and are mostly them; with nothing held,
    nothing is recorded; and a cache beside a resident vLLM engine names both."""
    from lib.sample import resident, vllm_engine
    eng = HFEngine(copy.deepcopy(world["lms"]["student"]), world["tok"], batch_size=3)
    prompts = world["prompts"]
    sample(eng, prompts, list(range(len(prompts))), temperature=1.0, top_p=1.0, max_new_tokens=6, progress=False)
    msg = explained_oom(monkeypatch, eng.record_resident)
    gib = eng.held_bytes() / 2**30
    assert "KV cache for 3 slots" in msg and f"({gib:.1f} GiB)" in msg
    assert "add --sampler-sleep" in msg and "lower --micro-batch" in msg and "--sampler-kv-margin" in msg
    both = explained_oom(monkeypatch, lambda: (eng.record_resident(), vllm_engine.record_footprint(21.6, 0.15)))
    assert "KV cache for 3 slots" in both and "(21.6 GiB)" in both

    recorded = resident.RESIDENT
    kv = sum(t.untyped_storage().nbytes() for t in eng.decoder.k + eng.decoder.v)
    assert recorded["hf"]["slots"] == eng.decoder.S == 3
    assert recorded["hf"]["gib"] * 2**30 == eng.held_bytes() and kv <= eng.held_bytes() <= 1.25 * kv
    eng.sleep()
    assert eng.held_bytes() == 0
    eng.record_resident()
    assert "hf" not in recorded


# --- --student-scores sampler: the student's pre-update scores from the sampler's own logits ---

def sampled_with_scores(world, temperature, k=K):
    """The world's four prompts sampled again by a decoder that records the student's scores (candidates = k)."""
    eng = HFEngine(copy.deepcopy(world["lms"]["student"]), world["tok"], batch_size=8,
                   decoder_options={"candidates": k})
    return sample(eng, world["prompts"], list(range(4)), temperature=temperature, top_p=1.0, max_new_tokens=24,
                  progress=False)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_scores_equal_a_plain_forward_at_the_temperature(world, temperature):
    """The decoder's recorded scores, per drawn token, against log_softmax(logits / T) of a plain HF forward over
    the finished sequences: the drawn token's log-prob, torch.topk's K ids, their log-probs and the entropy. At
    T = 1 recording changes no draw (the world's rollouts, sampled without it, come back to the bit)."""
    outs = sampled_with_scores(world, temperature)
    batch = pack(world["prompts"], [o.token_ids for o in outs], world["tok"].pad_token_id)
    with torch.no_grad():
        want_V = hf_logprobs(world["lms"]["student"], batch, temperature)
    got = {f: torch.cat([getattr(o.student, f) for o in outs]) for f in
           ("logprobs", "topk_ids", "topk_logprobs", "entropy")}
    assert got["topk_ids"].shape == (len(batch.targets_N), K)
    assert torch.equal(got["topk_ids"], want_V.topk(K, -1).indices)
    # fp32 through two code paths: a few ulps apart, more where the CPU's kernels reduce in another order (an AMD EPYC
    # of family 25, AVX-512, at T = 0.7: 1.06e-5 at a log-prob of −1.9, where atol 1e-5 alone had been enough elsewhere)
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["logprobs"], want_V.gather(1, batch.targets_N[:, None])[:, 0], **tol)
    torch.testing.assert_close(got["topk_logprobs"], want_V.gather(1, got["topk_ids"]), **tol)
    torch.testing.assert_close(got["entropy"], -(want_V.exp() * want_V).sum(-1), **tol)
    if temperature == 1.0:
        assert [o.token_ids for o in outs] == [o.token_ids for o in world["outs"]]
        assert [o.logprobs for o in outs] == [o.logprobs for o in world["outs"]]
        assert [o.finish_reason for o in outs] == [o.finish_reason for o in world["outs"]]


@pytest.mark.parametrize("reward", opd.REWARDS)
def test_a_sampler_scored_micro_batch_has_the_plain_hf_gradient(world, reward):
    """Step 2 without the student's forward (its scores from the sampler) and step 4 with PPO's old log-probs from
    the update's own forward: the loss and gradient of plain HF, as the recomputing path has (the test above)."""
    m03 = world["m03"]
    outs = sampled_with_scores(world, 1.0, K if reward == "delta-topk" else 0)
    student = TokenScorer(copy.deepcopy(world["lms"]["student"]))
    calls = []
    student.register_forward_pre_hook(lambda *a: calls.append(1))
    lms = world["lms"]
    teachers = ({"teacher": TokenScorer(lms["post"])} if reward == "opd"
                else {"pi_post": TokenScorer(lms["post"]), "pi_pre": TokenScorer(lms["pre"])})
    mb = m03.score_micro_batch(student, teachers, TokenScorer(lms["pre"]), world["batch"],
                               K if reward == "delta-topk" else 0, outs)
    assert not calls                                              # no forward of the student in step 2
    mb["adv"], _ = opd.advantages(reward, mb["lp_t"], mb["old_N"], mb["old_topk"])
    loss, pg_N, clipped_NK, neg_log_ratio_NK, _ = m03.micro_batch_loss(
        student, mb, 0.7, len(world["batch"].targets_N), clip_eps=0.2, old_from_update=True)
    loss.backward()
    assert len(calls) == 1 and not clipped_NK.any() and not neg_log_ratio_NK.any()     # ratio exactly 1
    # sampler = trainer, fp32 through two code paths: the tolerance of the test above (a 2-core Intel Xeon of family 6
    # model 167 put one of 90 log-probs 1.10e-5 apart, at −3.6, where atol 1e-5 alone had held on every other CPU)
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mb["update_N"], mb["old_N"], **tol)
    torch.testing.assert_close(mb["update_topk"], mb["old_topk"], **tol)
    lm = copy.deepcopy(lms["student"])
    want = reference_loss(reward, lm, lms, world["batch"], 0.7)
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    assert_grads_close({n: p.grad for n, p in student.lm.named_parameters()}, lm)


@INTERPRETED
def test_the_decoder_records_the_same_scores_through_the_triton_passes(world):
    """Decoder(scores_impl="triton") (Triton's interpreter on CPU): the same draws, and the same recorded scores as the
    torch ops' to float rounding."""
    def run(impl):
        from lib.sample.scores_triton import student_scores_fused
        eng = HFEngine(copy.deepcopy(world["lms"]["student"]), world["tok"], batch_size=8,
                       decoder_options={"candidates": K, "scores_impl": impl})
        outs = sample(eng, world["prompts"], list(range(4)), temperature=0.7, top_p=1.0, max_new_tokens=24,
                      progress=False)
        assert (eng.decoder.scores_c is student_scores_fused) == (impl == "triton")
        return outs

    a, b = run("torch"), run("triton")
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for f in ("logprobs", "topk_logprobs", "entropy"):
        torch.testing.assert_close(torch.cat([getattr(o.student, f) for o in b]),
                                   torch.cat([getattr(o.student, f) for o in a]), atol=1e-5, rtol=0)
    assert torch.equal(torch.cat([o.student.topk_ids for o in b]), torch.cat([o.student.topk_ids for o in a]))


def test_sampler_scores_of_another_k_are_refused(world):
    """Scores recorded with K candidates given to a step that scores another number: one clear error, not a silent
    slice."""
    outs = sampled_with_scores(world, 1.0, K)
    lms = world["lms"]
    teachers = {"pi_post": TokenScorer(lms["post"]), "pi_pre": TokenScorer(lms["pre"])}
    with pytest.raises(ValueError, match=f"recorded {K} candidates a token, the step scores {K - 1}"):
        world["m03"].score_micro_batch(TokenScorer(lms["student"]), teachers, None, world["batch"], K - 1, outs)
