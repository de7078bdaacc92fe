"""What every stage's command line shares."""
from __future__ import annotations

import argparse
import math
import os
import re
import sys


def progress_bars_only_on_terminals() -> None:
    """Off a terminal (a log file, CI, `nohup`), the progress bars of transformers ("Loading weights", once per model
    load) and of huggingface_hub are turned off: a bar redrawn with carriage returns becomes one line of thousands of
    characters in a log. The stages' own bars already use tqdm's `disable=None` (shown only on a terminal)."""
    if sys.stderr.isatty():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")       # read when transformers / the hub is imported
    if "transformers" in sys.modules:                                  # …and already imported by this stage
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusal of a bad flag is one line (`03_opd_train.py: argument --lr: expected a finite number >
    0, got 'inf' (see --help)`), not the usage block before it; exit status 2 as argparse's. Every stage builds
    one first thing, so it is also where the stage's progress bars are kept off log files."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        progress_bars_only_on_terminals()

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` keeps the stage docstring's layout and shows every flag's default."""


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ {least}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse `type=` for a count (steps, prompts, sequences, tokens): an integer ≥ 1, else argparse's one-line
    error naming the flag."""
    return _whole(text, 1)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """argparse `type=` for any finite number (a threshold that may be negative)."""
    return _number(text)


def positive_float(text: str) -> float:
    """argparse `type=` for a rate, a bound or a time: a finite number > 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse `type=` for a coefficient or a floor that may be 0: a finite number ≥ 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse `type=` for a count that may be 0 (0: skip): a whole number ≥ 0."""
    return _whole(text, 0)


def fraction(text: str) -> float:
    """argparse `type=` for a share or a probability in (0, 1] (top-p, a memory share)."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def open_fraction(text: str) -> float:
    """argparse `type=` for a fraction in [0, 1) (a warmup or held-out share)."""
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@=-]*$")


def name_error(text) -> str | None:
    """Why `text` is not a single path component (a run name, an alias), or None: no separator, no `..`, no
    leading dot or dash, no control or space characters, at most 200 characters."""
    if not isinstance(text, str) or not text:
        return f"expected a non-empty name, got {text!r}"
    if len(text) > 200 or text in (".", "..") or ".." in text or not NAME_OK.match(text):
        return (f"{text!r} is not a single folder name: use letters, digits and . _ + @ = - (no '/', no '..', not "
                f"starting with '.' or '-')")
    return None


def path_name(text: str) -> str:
    """argparse `type=` for a name that becomes one folder (--run-name, --alias): a single path component."""
    if (why := name_error(text)) is not None:
        raise argparse.ArgumentTypeError(why)
    return text
