"""Statistics and the report (DESIGN.md §6, §11): what 05_stats.py and 06_report.py compute and draw.

    stats.py      the paired per-problem bootstrap and the rules built on it: pure numerics, no disk
    campaign.py   reading a campaign folder (eval units, training runs, manifests), verified first
    conditions.py which runs are seeds of one condition (identical settings), snapshots, the cross-condition row
    hypotheses.py lib/registry.py's hypotheses evaluated clause by clause on 05_stats' records
    rollouts.py   what the students wrote: extraction on truncated samples (source §8.3), rollout excerpts
    figures.py    the report's figures, from the records of 05_stats

May import: the plumbing, and lib/train/collapse.py (the collapse thresholds, declared once).
"""
