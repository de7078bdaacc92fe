"""03_opd_train.py itself descends: the loop users run moves the student toward its teacher.

The sign tests of tests/test_opd.py call the loss and do their own backward and optimizer step, so they cannot see a
flipped update inside 03's loop (`(-loss).backward()` once passed every test). This test runs 03 as a user does, for
six steps of classic OPD on the toy pair, and checks what the method promises with an independent measurement: the
reverse KL to the teacher, KL(π_student(·|x) ‖ π_post(·|x)) over the whole vocabulary, falls at the positions the
initial student's own greedy responses visit (the objective OPD descends, on-policy) and at those of its teacher's
greedy responses, on training prompts. The measurement is plain transformers, teacher-forced, fp32: nothing of
lib/train/ is used to judge lib/train/.

Six steps, not two: after two steps the drop was within one seed's noise (seed 42: 0.7736 → 0.7649; seed 1: → 0.7839,
a rise). Measured after six, on an Intel Xeon @ 2.80GHz (2 cores), on the student's / the teacher's responses:
seed 42 0.7736 → 0.7065 / 0.7004 → 0.6250, seed 1 → 0.7311 / 0.6619, seed 2 → 0.7350 / 0.6859; with the loss
negated in 03's loop (`(-loss).backward()`, seed 42) the first rose to 1.6817 and the test failed.
"""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import run_script
from lib import benchmarks
from lib.data import prompt_ids
from lib.toy import builder

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPTS = 24                      # held to the first training prompts the run saw (its shuffle, seed 42)


@pytest.fixture(scope="module")
def world():
    return builder.build()


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def greedy_responses(model, tok, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The model's greedy response ids to each prompt (ended at its stop token, or at the cap)."""
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
        out.append(y[0, len(ids):].tolist())
    return out


@torch.no_grad()
def token_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """(R, V) log-softmax of the model's next-token distribution at each response position, teacher-forced."""
    x = torch.tensor([prompt + response])
    logits = model(x).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1)


def reverse_kl(student, teacher, pairs) -> float:
    """The mean over response positions of KL(student ‖ teacher), each over the whole vocabulary."""
    kl_sum = n = 0.0
    for prompt, response in pairs:
        ls, lt = token_logprobs(student, prompt, response), token_logprobs(teacher, prompt, response)
        kl_sum += (ls.exp() * (ls - lt)).sum().item()
        n += len(response)
    return kl_sum / n


def test_six_steps_of_classic_opd_move_the_student_toward_its_teacher(world, tmp_path):
    run = tmp_path / "run"
    run_script("03_opd_train.py", "--pair=toy", "--reward=opd", "--batch-prompts=16", "--rollouts=4", "--lr=2e-4",
               "--micro-batch=16", "--steps=6", "--save-every=6", f"--run-dir={run}", "--seed=42", timeout=900)
    tok = AutoTokenizer.from_pretrained(builder.model_dir("student"))
    teacher, before = load(builder.model_dir("post")), load(builder.model_dir("student"))
    after = load(run / "train" / "opd" / "step_000006")

    rows, _ = benchmarks.load_benchmark("toy_train", require_answer=False)
    prompts = [prompt_ids(tok, r["problem"]) for r in rows[:PROMPTS]]
    for whose, model in (("the student's", before), ("the teacher's", teacher)):
        pairs = list(zip(prompts, greedy_responses(model, tok, prompts, max_new_tokens=48)))
        kl0, kl1 = reverse_kl(before, teacher, pairs), reverse_kl(after, teacher, pairs)
        print(f"KL(student ‖ teacher) on {whose} greedy responses: {kl0:.4f} → {kl1:.4f}")
        assert kl1 < kl0, f"on {whose} greedy responses the reverse KL to the teacher rose: {kl0:.4f} → {kl1:.4f}"
