"""Optional experiment trackers for the training loops: `--logger none|tensorboard|wandb` (default none).

Metric names are verl's (`actor/kl_loss`, `response_length/mean`, …), so a run overlays on a verl user's dashboards.
Each tracker is imported only when asked for and is never required: a missing package is a one-line error naming
the `pip install` that fixes it. Only numbers are logged (booleans as 0/1; None and text skipped). Rank 0 only.

- tensorboard: event files in `<run>/tensorboard/`, written on CPU through torch.utils.tensorboard; a resumed run
  purges the events past its checkpoint, as metrics.jsonl drops its rows past it.
- wandb: one run per run folder, resumed in place with `resume="allow"`: its id is the folder's name and a hash of its
  path, its name `<campaign>/<run>` (runs/toy/train/delta-topk → `toy/delta-topk`), grouped by campaign. The project
  is 03's `--wandb-project`, else $WANDB_PROJECT (wandb's own variable), else `direct-opd`.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

LOGGERS = ("none", "tensorboard", "wandb")
DEFAULT_PROJECT = "direct-opd"


class Tracker:
    """The no-op tracker (`--logger none`): the interface the others share."""

    def log(self, metrics: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def scalars(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and v == v}     # bools are ints; NaN dropped


class TensorBoard(Tracker):
    def __init__(self, out: Path, config: dict, resume_step: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise SystemExit("--logger tensorboard needs the tensorboard package: pip install tensorboard") from None
        self.w = SummaryWriter(log_dir=str(Path(out) / "tensorboard"),
                               purge_step=resume_step + 1 if resume_step else None)
        if not resume_step:
            self.w.add_text("config", "\n".join(f"    {k}: {v}" for k, v in sorted(config.items())), 0)

    def log(self, metrics, step):
        for k, v in scalars(metrics).items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def close(self):
        self.w.close()


def wandb_names(out: Path, project: str | None) -> dict:
    """wandb.init's project, name, group and id for the run folder `out` (<run dir>/train/<run>)."""
    out = Path(out).resolve()
    campaign = out.parent.parent.name if out.parent.name == "train" else out.parent.name
    return {"project": project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            "name": f"{campaign}/{out.name}",
            "group": campaign,
            "id": f"{out.name}-{hashlib.sha256(str(out).encode()).hexdigest()[:8]}"}


class WandB(Tracker):
    def __init__(self, out: Path, config: dict, project: str | None):
        try:
            import wandb
        except ImportError:
            raise SystemExit("--logger wandb needs the wandb package: pip install wandb") from None
        self.run = wandb.init(**wandb_names(out, project), resume="allow", dir=str(Path(out).resolve()), config=config)

    def log(self, metrics, step):
        self.run.log(scalars(metrics), step=step)

    def close(self):
        self.run.finish()


def open_tracker(kind: str, out: Path, config: dict, *, resume_step: int = 0, project: str | None = None) -> Tracker:
    if kind == "tensorboard":
        return TensorBoard(out, config, resume_step)
    if kind == "wandb":
        return WandB(out, config, project)
    if kind != "none":
        raise SystemExit(f"--logger {kind!r} is not one of {', '.join(LOGGERS)}")
    return Tracker()
