"""The one user-error type, `UserError` (each module its own subclass), and the one way every
command prints one: `microgpt: error: ...` on stderr."""

import re
import signal
import sys
from pathlib import Path

# the signals that stop a command, each after its step (SIGHUP: the terminal closed)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class UserError(ValueError):
    """Bad input from the user; the message names the problem and the fix."""


class DataError(UserError):
    """A problem with the data a run was given."""


class SamplingError(UserError):
    """A bad sampling setting, or no checkpoint to sample from."""


def decode_utf8(raw: bytes, where) -> str:
    """A data file's bytes as text (a byte-order mark dropped), else a DataError naming the line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        why = f"data file {where} is not UTF-8 (first bad byte on line {line}); re-save it as UTF-8"
        raise DataError(why) from None


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, else its type's name."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


def reason(e: BaseException) -> str:
    """An OSError's reason in words ("No space left on device"), else the first sentence."""
    return getattr(e, "strerror", None) or first_line(e).split(". ")[0][:200]


def print_error(message: object, note: str = "") -> None:
    """A user error in one line (an OSError: what failed, on which file, what to check)."""
    if isinstance(message, OSError):
        where = f" {message.filename}" if message.filename else ""
        if re.fullmatch(r"\..+\.tmp", Path(str(message.filename)).name):  # an atomic write's
            where = f" {Path(message.filename).parent}/"  # temporary file: its folder failed
        also = f" -> {message.filename2}" if getattr(message, "filename2", None) else ""
        message = f"cannot use{where}{also}: {reason(message)}; check the path and its disk"
    print(f"microgpt: error: {message}{note}", file=sys.stderr, flush=True)
