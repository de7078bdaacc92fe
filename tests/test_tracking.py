"""lib/tracking.py: the W&B run is named after its campaign and run, its project taken from the flag, then
$WANDB_PROJECT, then the default; one run id per run folder (a rerun resumes it, another campaign's run of the same
name does not). wandb itself is not installed here: a stand-in module records what wandb.init was given."""
import sys
import types

import pytest

from lib import tracking


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    run = types.SimpleNamespace(log=lambda metrics, step: calls.append(("log", metrics, step)),
                                finish=lambda: calls.append(("finish",)))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return run

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return calls


def test_wandb_run_names_project_and_ids(fake_wandb, tmp_path, monkeypatch):
    a = tmp_path / "runs" / "toy" / "train" / "delta-topk"
    b = tmp_path / "runs" / "openthinker" / "train" / "delta-topk"
    t = tracking.open_tracker("wandb", a, {"lr": 1e-6})
    t.log({"step": 1, "actor/kl_loss": 0.5, "collapsed": True, "note": "text", "nan": float("nan")}, step=1)
    t.close()
    init = fake_wandb[0][1]
    assert (init["project"], init["name"], init["group"]) == ("direct-opd", "toy/delta-topk", "toy")
    assert fake_wandb[1] == ("log", {"actor/kl_loss": 0.5, "collapsed": 1.0}, 1)
    assert fake_wandb[2] == ("finish",)

    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    tracking.open_tracker("wandb", b, {})
    assert (fake_wandb[3][1]["project"], fake_wandb[3][1]["name"]) == ("from-env", "openthinker/delta-topk")
    tracking.open_tracker("wandb", b, {}, project="from-flag")
    assert fake_wandb[4][1]["project"] == "from-flag"
    assert fake_wandb[3][1]["id"] != init["id"]                            # same run name, other campaign
    assert fake_wandb[4][1]["id"] == fake_wandb[3][1]["id"]                # the same folder resumes its run
