"""The one exception for bad input and missing assets: one line naming the item and the fix.

`UserError` is a `SystemExit`, so a stage that does not catch it exits with status 1 and prints that line alone —
no traceback. Raise it for what the user can fix (a name, a file, a flag); raise ordinary exceptions for bugs.
"""


class UserError(SystemExit):
    def __init__(self, message: str):
        if "\n" in message:
            raise ValueError(f"a UserError is one line; got {message!r}")
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.code)


def refuse_in_one_line(stage: str, *kinds: type) -> None:
    """For a stage written as a top-level script (05_stats, 06_report): an uncaught exception of one of `kinds` (a
    refused input: a changed file, a unit that cannot be paired) ends the process with status 1 and its message as
    one line `<stage>: <message>` on stderr, not a traceback. Any other exception keeps its traceback (a bug)."""
    import sys
    previous = sys.excepthook

    def hook(tp, exc, tb):
        if issubclass(tp, kinds):
            print(f"{stage}: {' '.join(str(exc).split())}", file=sys.stderr)
        else:
            previous(tp, exc, tb)
    sys.excepthook = hook
