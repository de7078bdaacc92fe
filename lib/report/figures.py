"""The report's figures (matplotlib, Agg backend), drawn from the stats/*.json records of 05_stats.

Every function takes plain records and a path and writes one PNG. PNGs are byte-stable across rebuilds: fixed
backend, fixed dpi, fixed fonts, and no `Software`/time metadata, so a rebuild from the same stats is byte-identical.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lib.artifacts import atomic_write_bytes  # noqa: E402

DPI = 110
plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
                     "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": DPI})
BAND = dict(color="tab:red", alpha=0.12, lw=0)   # the collapse band (DESIGN.md §7.5), shaded on every step axis
PANELS = (("response_length/mean", "response length (mean tokens)"),
          ("response_length/clip_ratio", "length-clip ratio"),
          ("delta_opd/weighted_reward_mean", "reward mean (the run's own reward)"),
          ("actor/kl_coef", "KL coefficient"),
          ("actor/entropy", "entropy"),
          ("actor/grad_norm", "grad norm"))


def save(fig, path) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return str(path)


def _errbar(res):
    lo, hi = res["ci95_pp"]
    return [[res["gain_pp"] - lo], [hi - res["gain_pp"]]]


def gains_forest(rows: list[dict], title: str, path) -> str:
    """One horizontal CI bar per gain record (label, result), zero line drawn; a gain counts when its bar misses 0."""
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(rows) + 1.2))
    for i, (label, res) in enumerate(rows):
        color = "tab:green" if res["ci95_pp"][0] > 0 else "tab:red" if res["ci95_pp"][1] < 0 else "tab:gray"
        ax.errorbar(res["gain_pp"], i, xerr=_errbar(res), fmt="o", color=color, capsize=4)
        ax.annotate(f"{res['gain_pp']:+.2f}", (res["gain_pp"], i), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel("paired gain (pp), 95 % bootstrap CI")
    ax.set_title(title)
    return save(fig, path)


def student_curve(series: dict, bands: dict, title: str, path) -> str:
    """Student gain vs training step per run ({run: [(step, result)]}), the collapse band of each run shaded."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for k, (run, pts) in enumerate(sorted(series.items())):
        steps = [s for s, _ in pts]
        gains = [r["gain_pp"] for _, r in pts]
        lo = [r["gain_pp"] - r["ci95_pp"][0] for _, r in pts]
        hi = [r["ci95_pp"][1] - r["gain_pp"] for _, r in pts]
        ax.errorbar([s + 0.3 * k for s in steps], gains, yerr=[lo, hi], fmt="o-", capsize=4, label=run)
        if bands.get(run):
            a, b = bands[run]
            ax.axvspan(a - 0.5, b + 0.5, **BAND, label=f"{run}: collapse band {a}–{b}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("training step (checkpoint)")
    ax.set_ylabel("gain vs student init (pp)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save(fig, path)


def teacher_vs_student(points: list[dict], path) -> str:
    """Teacher gain (x) against the latest evaluated checkpoint's student gain (y), both with their CIs; y = x
    dashed."""
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    for p in points:
        ax.errorbar(p["teacher"]["gain_pp"], p["student"]["gain_pp"], xerr=_errbar(p["teacher"]),
                    yerr=_errbar(p["student"]), fmt="o", capsize=3, label=p["label"])
    xs = [p["teacher"]["ci95_pp"][1] for p in points] + [p["student"]["ci95_pp"][1] for p in points] + [1.0]
    ns = [p["teacher"]["ci95_pp"][0] for p in points] + [p["student"]["ci95_pp"][0] for p in points] + [-1.0]
    lim = (min(ns) - 1, max(xs) + 1)
    ax.plot(lim, lim, "k--", lw=0.8, label="full transfer (y = x)")
    ax.axhline(0, color="k", lw=0.6)
    ax.axvline(0, color="k", lw=0.6)
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("teacher gain π_post − π_pre (pp)")
    ax.set_ylabel("student gain, latest evaluated checkpoint (pp)")
    ax.set_title("teacher gain vs student gain")
    ax.legend(fontsize=7)
    return save(fig, path)


def training_curves(run: dict, path) -> str:
    """The six DESIGN.md §7.4 panels of one run against step, the collapse band shaded, checkpoints marked."""
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.6), sharex=True)
    band = run["watch"]["collapse_band"]
    for ax, (key, label) in zip(axes.flat, PANELS):
        pts = [(s, v) for s, v in run["curves"].get(key, []) if v is not None]
        if pts:
            ax.plot([s for s, _ in pts], [v for _, v in pts], lw=1.2, color="tab:blue")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        if band:
            ax.axvspan(band[0] - 0.5, band[1] + 0.5, **BAND)
        for c in run["checkpoints"]:
            ax.axvline(c, color="gray", lw=0.6, ls=":")
        if key == "response_length/clip_ratio":
            ax.axhline(0.5, color="tab:red", lw=0.6, ls="--")
        if key == "delta_opd/weighted_reward_mean":
            ax.axhline(0, color="k", lw=0.6)
        ax.set_title(label)
    for ax in axes[1]:
        ax.set_xlabel("step")
    note = f"collapse band {band[0]}–{band[1]}" if band else "no collapse (clip ratio never > 0.5)"
    fig.suptitle(f"training run {run['run']} — {note}; dotted: checkpoints")
    fig.tight_layout()
    return save(fig, path)


def answer_format(rows: list[tuple[str, dict]], title: str, path) -> str:
    """Stacked answer_line / boxed / none shares (percent of samples) per unit."""
    fig, ax = plt.subplots(figsize=(6.4, 0.4 * len(rows) + 1.3))
    colors = {"answer_line": "tab:blue", "boxed": "tab:orange", "none": "tab:gray"}
    for i, (label, split) in enumerate(rows):
        left = 0.0
        for k, c in colors.items():
            w = split.get(k) or 0.0
            ax.barh(i, w, left=left, color=c, label=k if i == 0 else None)
            left += w
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of samples")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def loss_curve(curves: dict, title: str, path) -> str:
    """RAFT SFT loss curves: {label: [[step, loss], ...]}."""
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    for label, pts in sorted(curves.items()):
        ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", ms=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save(fig, path)
