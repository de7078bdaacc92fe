"""The gates of DESIGN.md §8, run by 01_gates.py (and G1/G2 of 07_raft.py) before any GPU time is spent.

    checks.py          tokenizer compatibility, prompt lengths, context: pure functions over tokenizers and numbers
    chat_template.py   the chat-template gate
    anatomy.py         the shift anatomy: the pair's reward on the student's own samples, before training
    auroc.py           length-controlled AUROC for the anatomy

May import: the plumbing, lib/kernels/, lib/sample/, lib/train/ (scoring, the rewards) and lib/eval/ (grading).
"""
