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


# --- per condition (issue 32 item 7): a condition is one set of settings, its seeds drawn together ---

def _colors(n: int) -> list:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def teacher_student_by_condition(rows: list[dict], path) -> str:
    """One row per condition × benchmark: the teacher gain of the condition's own pair (hollow square) and the
    condition's pooled student gain (filled dot), each with its CI; rows whose pair's teacher gain was not measured
    show the student alone. rows: {"label", "teacher": result | None, "student": result}."""
    fig, ax = plt.subplots(figsize=(7.2, 0.5 * len(rows) + 1.4))
    first_teacher = next((i for i, r in enumerate(rows) if r["teacher"] is not None), None)
    for i, r in enumerate(rows):
        if r["teacher"] is not None:
            ax.errorbar(r["teacher"]["gain_pp"], i - 0.15, xerr=_errbar(r["teacher"]), fmt="s", mfc="white",
                        color="tab:purple", capsize=3,
                        label="teacher gain of its pair (π_post − π_pre)" if i == first_teacher else None)
        s = r["student"]
        color = "tab:green" if s["ci95_pp"][0] > 0 else "tab:red" if s["ci95_pp"][1] < 0 else "tab:gray"
        ax.errorbar(s["gain_pp"], i + 0.15, xerr=_errbar(s), fmt="o", color=color, capsize=3,
                    label="student gain, pooled over seeds" if i == 0 else None)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel("gain (pp), 95 % bootstrap CI")
    ax.set_title("teacher gain vs student gain, per condition")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def gain_vs_step_by_condition(panels: list[dict], title: str, path) -> str:
    """Small multiples, one panel per condition: student gain vs checkpoint step for each of its runs (seeds), each
    run's collapse band shaded.
    panels: {"condition", "series": {run: [(step, result)]}, "bands": {run: [a, b] | None}}."""
    n = len(panels)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False, sharey=True)
    for ax, p in zip(axes.flat, panels):
        for k, (run, pts) in enumerate(sorted(p["series"].items())):
            pts = sorted(pts, key=lambda x: x[0])
            ax.errorbar([s + 0.2 * k for s, _ in pts], [r["gain_pp"] for _, r in pts],
                        yerr=[[r["gain_pp"] - r["ci95_pp"][0] for _, r in pts],
                              [r["ci95_pp"][1] - r["gain_pp"] for _, r in pts]], fmt="o-", capsize=3, ms=4, label=run)
            band = p["bands"].get(run)
            if band:
                ax.axvspan(band[0] - 0.5, band[1] + 0.5, **BAND)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_title(p["condition"], fontsize=8)
        ax.set_xlabel("step")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("gain vs student init (pp)")
    fig.suptitle(f"{title} — shaded: collapse band (clip ratio > 0.5 from the onset)")
    fig.tight_layout()
    return save(fig, path)


def dynamics_by_condition(conditions: list[dict], path) -> str:
    """Mean response length and length-clip ratio against step, one colour per condition: each run a thin line,
    the condition's mean over its runs at each step a thick one; the clip-ratio onset threshold dashed.
    conditions: {"condition", "runs": {run: {"length": [[step, v]], "clip": [[step, v]]}}}."""
    fig, (ax_len, ax_clip) = plt.subplots(1, 2, figsize=(12, 4.2))
    for color, c in zip(_colors(len(conditions)), conditions):
        for key, ax in (("length", ax_len), ("clip", ax_clip)):
            by_step = {}
            for pts in c["runs"].values():
                pts = [(s, v) for s, v in pts[key] if v is not None]
                ax.plot([s for s, _ in pts], [v for _, v in pts], color=color, lw=0.6, alpha=0.45)
                for s, v in pts:
                    by_step.setdefault(s, []).append(v)
            steps = sorted(by_step)
            ax.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], color=color, lw=1.8,
                    label=f"{c['condition']} ({len(c['runs'])} run{'s' if len(c['runs']) > 1 else ''})")
    ax_clip.axhline(0.5, color="tab:red", lw=0.7, ls="--", label="collapse onset threshold")
    ax_len.set_title("mean response length")
    ax_clip.set_title("length-clip ratio")
    for ax in (ax_len, ax_clip):
        ax.set_xlabel("step")
    ax_clip.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return save(fig, path)


def all_one_extractor(splits: list[dict]) -> bool:
    """True when every bar would be one 100 % segment of the same extractor: a chart that says nothing."""
    full = {k for s in splits for k, v in s.items() if v is not None and abs(v - 100.0) < 1e-9}
    return bool(splits) and len(full) == 1 and all(any(abs((v or 0) - 100.0) < 1e-9 for v in s.values())
                                                   for s in splits)
