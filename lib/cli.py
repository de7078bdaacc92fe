"""What every stage's command line shares."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` keeps the stage docstring's layout and shows every flag's default."""


def positive_int(text: str) -> int:
    """argparse `type=` for a count (steps, prompts, sequences, tokens): an integer ≥ 1, else argparse's one-line
    error naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {value}")
    return value
