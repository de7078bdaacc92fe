"""The toy world (DESIGN.md §10): tiny Qwen2 models on an arithmetic task, built on 2 CPU cores in minutes, that let
the whole campaign run (and be tested) without a GPU or the hub.

    builder.py       builds, caches and checks the world's five models, its benchmark and its training prompts
    task.py          the task and its Qwen2-style byte-level BPE chat tokenizer
    world_bytes.py   what determines the world's bytes, and the committed sha256 (world.sha256) they are checked
                     against

A fixture the real path never touches: outside lib/toy/ only the resolvers lib/models.py and lib/benchmarks.py
(which turn the toy's names into its files) import it, and tests and bench scripts. May import: the plumbing and
lib/train/sft.py (the world is trained with the project's own SFT).
"""
