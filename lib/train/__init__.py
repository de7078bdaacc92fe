"""Training (DESIGN.md §7, §9): the numerics of the loop and everything 03_opd_train.py and 07_raft.py train with.

    opd.py             the OPD and Direct-OPD rewards and losses as pure functions
    collapse.py        the collapse watch: its thresholds, declared once, and the live watch
    scoring.py         the student's own tokens scored under a model (the one place the loop touches logits)
    dist.py            torchrun, FSDP2 and sharded checkpoints
    model_init.py      the trainer's models built on the meta device, sharded, then filled
    step_phases.py     how a step is cut into phases and micro-batches on each device
    checkpoint.py      a run's checkpoints and its continuation
    sft.py, sft_fsdp.py  completion-only SFT, on one process and FSDP2-sharded
    raft.py            RAFT's rejection-sampling bookkeeping and its SFT-side checks

May import: the plumbing (lib/*.py modules other than the resolvers lib/models.py and lib/benchmarks.py) and
lib/kernels/. Not the sampler, the grader, the gates, the report or the toy world: the loop's stages wire those in.
"""
