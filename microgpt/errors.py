"""The errors of bad input that more than one layer raises (bad data, in any format; a bad
sampling setting, from the settings schema and from decoding), and the one way every command
prints a user error: one line, `microgpt: error: ...`, on stderr."""

import sys


class DataError(ValueError):
    """A problem with the data a run was given; the message names the problem and the fix."""


class SamplingError(ValueError):
    """A bad sampling setting, or no checkpoint to sample from; the message says what is valid."""


def decode_utf8(raw: bytes, where) -> str:
    """A data file's bytes as text (a leading byte-order mark dropped); not UTF-8: a DataError
    naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig")  # -sig: a leading byte-order mark is not part of the data
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"data file {where} is not UTF-8 (first bad byte on line {line}); "
            f"re-save it as UTF-8 or fix that line"
        ) from None


def print_error(message: object) -> None:
    """A user error, as every command prints it: `microgpt: error: <message>` on stderr."""
    print(f"microgpt: error: {message}", file=sys.stderr, flush=True)
