"""The cross-pair anatomy (source §17; issue 32 item 6): every pair on ONE frozen set of student rollouts.

01_gates --gates anatomy_cross runs on the toy world into tests/test_report.py's fabricated campaign (its eval units,
runs and gates), then 05_stats and 06_report. Checked here, each by a computation of its own:

    the table's numbers        recomputed from the two files 01 wrote (the frozen rollouts and every model's per-token
                               log-probs): mean Δ, % Δ > 0 (all / where |Δ| ≥ the tie tolerance), mean abs Δ, Δ at
                               stop, log p(stop) at answer ends per model, the length-controlled AUROC (pairs counted
                               one by one here)
    the log-probs themselves   three rollouts re-scored with plain transformers (full log_softmax, gather), not
                               lib/train/scoring.py
    the freezing               a second run with other pairs reads the same rollouts back (same sha256), and the pair
                               both runs score gets the same numbers
    absent pairs               an unregistered pair and the RAFT pair before 07 has run are listed as skipped
    the README                 each cell of §1.2 equals its record (tests/test_report.py's check_tables)

Each check bites: a mutated lib/gates/anatomy.py (01 rerun) or 06_report.py must fail it (MUTANTS below).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lib.artifacts import read_json, sha256_file
from test_report import check_tables, make_campaign, run_mutant, run_stage

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent
PAIRS = ("toy", "toy-offsupport", "toy-raft", "no-such-pair")     # the last two cannot be scored here
GATE_ARGS = ("--pair", "toy", "--gates", "anatomy_cross", "--anatomy-prompts", "16", "--bootstrap", "500")


def run_gates(repo: Path, run_dir: Path, *extra) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                        "TOKENIZERS_PARALLELISM": "false",     # a mutated copy still finds the built toy world
                        "OPD_CACHE": os.environ.get("OPD_CACHE", str(REPO / ".cache"))}
    p = subprocess.run([sys.executable, str(repo / "01_gates.py"), "--run-dir", str(run_dir), *GATE_ARGS, *extra],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def crossed(tmp_path_factory):
    run_dir = make_campaign(tmp_path_factory.mktemp("cross") / "toy")
    run_gates(REPO, run_dir, "--cross-pairs", *PAIRS)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    return run_dir


# --- the independent recomputation ---

def stratified_auroc(scores, labels, lengths, n_bins=4):
    """Mann–Whitney over (correct, wrong) pairs of one length-quantile bin, counted pair by pair."""
    edges = np.unique(np.quantile(np.asarray(lengths, float), np.linspace(0, 1, n_bins + 1)))
    bins = [int(np.searchsorted(edges[1:-1], x, side="right")) for x in lengths]
    wins = pairs = 0.0
    for i in range(len(scores)):
        for j in range(len(scores)):
            if labels[i] and not labels[j] and bins[i] == bins[j]:
                pairs += 1
                wins += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    return wins / pairs if pairs else None


def expected_row(rollouts, lp, pre, post, student, tie_tol=1e-3):
    deltas = [np.array(lp[r["index"]][post]) - np.array(lp[r["index"]][pre]) for r in rollouts]
    d = np.concatenate(deltas)
    stopped = [r for r in rollouts if r["finish_reason"] == "stop"]
    ends = [r for r in stopped if r["extractor"] != "none"]
    graded = [(k, r) for k, r in enumerate(rollouts) if r["correct"] is not None]
    return {"n_tokens": len(d), "token_mean_delta": d.mean(), "pos_frac": (d > 0).mean(),
            "pos_frac_decided": (d[np.abs(d) >= tie_tol] > 0).mean(), "abs_mean_delta": np.abs(d).mean(),
            "stop_mean_delta": np.mean([lp[r["index"]][post][-1] - lp[r["index"]][pre][-1] for r in stopped]),
            "stop_n": len(stopped),
            "logp_stop": {role: np.mean([lp[r["index"]][m][-1] for r in ends])
                          for role, m in (("student", student), ("pi_pre", pre), ("pi_post", post))},
            "auroc": stratified_auroc([deltas[k].mean() for k, _ in graded], [r["correct"] for _, r in graded],
                                      [len(r["token_ids"]) for _, r in graded])}


def frozen(run_dir: Path):
    g = run_dir / "gates"
    rollouts = [json.loads(x) for x in (g / "anatomy_cross_samples.jsonl").read_text().splitlines()]
    lp = {json.loads(x)["index"]: json.loads(x)["logprobs"] for x in
          (g / "anatomy_cross_logprobs.jsonl").read_text().splitlines()}
    return rollouts, lp


def check_cross(run_dir: Path) -> dict:
    rep = read_json(run_dir / "gates" / "anatomy_cross.json")
    rollouts, lp = frozen(run_dir)
    assert rep["rollouts"]["sha256"] == sha256_file(run_dir / "gates" / "anatomy_cross_samples.jsonl")
    assert rep["rollouts"]["n_sequences"] == len(rollouts) == 16
    rows = {r["pair"]: r for r in rep["pairs"]}
    for r in rows.values():
        if r["status"] != "scored":
            continue
        want = expected_row(rollouts, lp, r["pi_pre"], r["pi_post"], rep["student"])
        for k in ("token_mean_delta", "pos_frac", "pos_frac_decided", "abs_mean_delta"):
            assert r[k] == pytest.approx(want[k], rel=1e-6, abs=1e-9), (r["pair"], k)
        assert r["n_tokens"] == want["n_tokens"] and r["stop"]["n"] == want["stop_n"]
        assert r["stop"]["mean_delta"] == pytest.approx(want["stop_mean_delta"], rel=1e-6, abs=1e-9)
        for role, v in want["logp_stop"].items():
            assert r["logp_stop_at_answer_end"][role] == pytest.approx(v, rel=1e-6, abs=1e-9), (r["pair"], role)
        assert r["auroc"]["length_controlled"] == pytest.approx(want["auroc"], abs=1e-12)
    return rows


def rescore(run_dir: Path, alias: str, rollouts) -> list[list[float]]:
    """log p of each sampled token by plain transformers: the full log_softmax of the logits, gathered."""
    from transformers import AutoModelForCausalLM
    from lib.models import resolve_model
    m = AutoModelForCausalLM.from_pretrained(resolve_model(alias, run_dir).path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([r["prompt_ids"] + r["token_ids"]])
            logp = m(ids).logits[0].log_softmax(-1)
            n = len(r["prompt_ids"])
            out.append([float(logp[n - 1 + t, tok]) for t, tok in enumerate(r["token_ids"])])
    return out


def test_every_pair_on_one_frozen_set_of_rollouts(crossed):
    rows = check_cross(crossed)
    assert [p for p, r in rows.items() if r["status"] == "scored"] == ["toy", "toy-offsupport"]
    assert "07_raft" in rows["toy-raft"]["reason"] and "not a registered pair" in rows["no-such-pair"]["reason"]
    # the off-support π_post never stops: it prices the student's stop far below π_pre does
    assert rows["toy-offsupport"]["stop"]["mean_delta"] < rows["toy"]["stop"]["mean_delta"] - 1
    rollouts, lp = frozen(crossed)
    for alias in ("toy-pre", "toy-post", "toy-post-offsupport", "toy-student"):
        got = rescore(crossed, alias, rollouts[:3])
        for r, ref in zip(rollouts[:3], got):
            assert lp[r["index"]][alias] == pytest.approx(ref, abs=2e-4), alias


def test_a_rerun_scores_the_same_rollouts(crossed, tmp_path):
    run_dir = tmp_path / "toy"
    shutil.copytree(crossed, run_dir)
    first = read_json(crossed / "gates" / "anatomy_cross.json")
    run_gates(REPO, run_dir, "--cross-pairs", "toy-offsupport", "toy")
    again = read_json(run_dir / "gates" / "anatomy_cross.json")
    assert again["rollouts"]["reused"] and again["rollouts"]["sha256"] == first["rollouts"]["sha256"]
    a = {r["pair"]: r for r in first["pairs"]}
    b = {r["pair"]: r for r in again["pairs"]}
    assert sorted(b) == ["toy", "toy-offsupport"]
    for name in b:
        assert b[name]["token_mean_delta"] == a[name]["token_mean_delta"] and b[name]["stop"] == a[name]["stop"]
    check_cross(run_dir)


def test_report_prints_the_cross_pair_table(crossed):
    assert check_tables(crossed) > 100
    readme = (crossed / "report" / "README.md").read_text()
    assert "### 1.2 Cross-pair anatomy" in readme and "Pair `toy-raft` not scored" in readme
    G = read_json(crossed / "stats" / "gates.json")
    assert G["anatomy_cross"]["pairs"] == read_json(crossed / "gates" / "anatomy_cross.json")["pairs"]


def mutated_repo(tmp: Path, path: str, old: str, new: str) -> Path:
    """A copy of the stage scripts and lib/ with one file mutated."""
    repo = tmp / "repo"
    shutil.copytree(REPO / "lib", repo / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    for f in REPO.glob("0*_*.py"):
        shutil.copy(f, repo / f.name)
    text = (repo / path).read_text()
    assert text.count(old) == 1, f"mutation target not found once in {path}: {old!r}"
    (repo / path).write_text(text.replace(old, new))
    return repo


GATE_MUTANTS = {   # name: (old, new) in lib/gates/anatomy.py; 01 reruns on a copy, check_cross must fail
    "π_post's stop log-prob taken from π_pre": ('"pi_post": lp[post][i][-1]} if stopped', '"pi_post": lp[pre][i][-1]} if stopped'),
    "scored one position late": ("lp_N[start:start + len(r[\"token_ids\"])].tolist()",
                                 "lp_N[start + 1:start + 1 + len(r[\"token_ids\"])].tolist()"),
}


@pytest.mark.parametrize("name", sorted(GATE_MUTANTS))
def test_cross_checks_catch_a_mutated_anatomy(crossed, tmp_path, name):
    run_dir = tmp_path / "toy"
    shutil.copytree(crossed, run_dir)
    repo = mutated_repo(tmp_path, "lib/gates/anatomy.py", *GATE_MUTANTS[name])
    run_gates(repo, run_dir, "--cross-pairs", "toy", "toy-offsupport")
    with pytest.raises(AssertionError):
        check_cross(run_dir)
        rollouts, lp = frozen(run_dir)
        got = rescore(run_dir, "toy-pre", rollouts[:3])
        for r, ref in zip(rollouts[:3], got):
            assert lp[r["index"]]["toy-pre"] == pytest.approx(ref, abs=2e-4)


def test_report_check_catches_a_mutated_cross_table(crossed, tmp_path):
    run_dir = tmp_path / "toy"
    shutil.copytree(crossed, run_dir)
    run_mutant("06_report.py", 'num(r["auroc"].get("length_controlled"), 3)', 'num(r["auroc"].get("raw"), 3)',
               run_dir, tmp_path)
    with pytest.raises(AssertionError):
        check_tables(run_dir)
