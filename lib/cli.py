"""What every stage's command line shares."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` keeps the stage docstring's layout and shows every flag's default."""
