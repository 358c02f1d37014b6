"""The error of bad data, shared by every data format (microgpt.data, microgpt.text), and the
one way every command prints a user error: one line, `microgpt: error: ...`, on stderr."""

import sys


class DataError(ValueError):
    """A problem with the data a run was given; the message names the problem and the fix."""


def print_error(message: object) -> None:
    """A user error, as every command prints it: `microgpt: error: <message>` on stderr."""
    print(f"microgpt: error: {message}", file=sys.stderr, flush=True)
