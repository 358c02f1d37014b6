"""The user errors: one type, `UserError`, that every bad input raises (a setting, data, a
checkpoint, a folder; each module its own subclass), and the one way every command prints one:
one line, `microgpt: error: ...`, on stderr (an operating-system failure included)."""

import sys


class UserError(ValueError):
    """Bad input from the user; the message names the problem and the fix."""


class DataError(UserError):
    """A problem with the data a run was given."""


class SamplingError(UserError):
    """A bad sampling setting, or no checkpoint to sample from."""


def decode_utf8(raw: bytes, where) -> str:
    """A data file's bytes as text (a leading byte-order mark dropped); not UTF-8: a DataError
    naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"data file {where} is not UTF-8 (first bad byte on line {line}); "
            f"re-save it as UTF-8 or fix that line"
        ) from None


def error_line(e: BaseException) -> str:
    """A user error's message; an OSError as what failed, on which file, and what to check."""
    if not isinstance(e, OSError):
        return str(e)
    where = f" {e.filename}" if e.filename else ""
    also = f" -> {e.filename2}" if getattr(e, "filename2", None) else ""
    reason = e.strerror or (str(e).splitlines() or [type(e).__name__])[0]
    return (
        f"cannot use{where}{also}: {reason}; check that the path exists, is readable (and "
        f"writable, for an output) and that its disk has space"
    )


def print_error(message: object) -> None:
    """A user error, as every command prints it: `microgpt: error: <message>` on stderr."""
    text = error_line(message) if isinstance(message, BaseException) else message
    print(f"microgpt: error: {text}", file=sys.stderr, flush=True)
