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
