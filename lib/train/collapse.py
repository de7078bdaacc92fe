"""The collapse watch (DESIGN.md §7.5): its thresholds, declared once, and the live watch the training loop feeds.

A run has collapsed once more than CLIP_ONSET of a step's rollouts hit the response cap; CLIP_SINK marks the sink
(a run of steps above 0.9). 03_opd_train.py feeds `CollapseWatch` step by step; lib/report/campaign.py recomputes the
same from metrics.jsonl with the same two numbers. Pure Python (no torch), so the report's readers can import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CLIP_ONSET, CLIP_SINK = 0.5, 0.9      # collapse onset: clip_ratio > 0.5; sink: clip_ratio > 0.9
CLIP_HELD = 0.1      # a fix held a run (prevented its collapse, issue 32's bar) if its clip ratio stayed below this


@dataclass
class CollapseWatch:
    onset_clip: float = CLIP_ONSET
    run_clip: float = CLIP_SINK
    collapse_onset_step: int | None = None
    length_runaway_step: int | None = None
    first_mean_length: float | None = None
    longest_clip90_run: int = 0
    current_run: int = 0
    history: list = field(default_factory=list)

    def update(self, step: int, clip_ratio: float, mean_length: float) -> list[str]:
        """Feed one step; returns the events that fired on it (printed live by the training loop)."""
        events = []
        if self.first_mean_length is None:
            self.first_mean_length = mean_length
        if self.collapse_onset_step is None and clip_ratio > self.onset_clip:
            self.collapse_onset_step = step
            events.append(f"collapse onset: clip_ratio {clip_ratio:.2f} > {self.onset_clip}")
        if self.length_runaway_step is None and mean_length > 2 * self.first_mean_length:
            self.length_runaway_step = step
            events.append(f"length runaway: mean length {mean_length:.0f} > 2 × step-1's {self.first_mean_length:.0f}")
        self.current_run = self.current_run + 1 if clip_ratio > self.run_clip else 0
        self.longest_clip90_run = max(self.longest_clip90_run, self.current_run)
        return events

    @property
    def collapsed(self) -> bool:
        return self.collapse_onset_step is not None

    def summary(self) -> dict:
        return {"collapse_onset_step": self.collapse_onset_step, "length_runaway_step": self.length_runaway_step,
                "longest_clip90_run": self.longest_clip90_run}
