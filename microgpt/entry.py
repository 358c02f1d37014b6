"""The one front door of every command (train.py, sample.py, data/prepare.py, bench/run.py,
`python -m microgpt.heads` and `.compare`): what the process needs before torch loads, and how a
user error, an OS error, Ctrl-C or SIGTERM ends: one line on stderr and the documented exit code.

    from microgpt import entry
    with entry.loading(__name__):    # before the heavy imports
        import torch ...
    def main(argv=None) -> int:
        return entry.run(lambda: work(entry.ArgumentParser(...).parse_args(argv)))

Light on purpose (the standard library only): it must work before torch is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

from microgpt.errors import SIGNALS, UserError, print_error

USER_ERROR = 2  # bad input, or the OS refused (exit 128 + N: stopped by signal N)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one `microgpt: error:` line, exit 2."""

    def error(self, message: str):
        raise UserError(f"{message}; see {self.prog} --help")


@contextlib.contextmanager
def loading(module: str):
    """For the program's own module (`module` is `__name__`: "__main__"), what must be set before
    torch loads OpenMP, then the heavy imports: a signal meanwhile ends the process at once in one
    line (nothing is written yet, and an import cut short cannot unwind cleanly). Imported:
    nothing changes."""
    if module != "__main__":
        yield
        return
    # idle OpenMP threads sleep instead of spinning, so that processes sharing the cores slow each
    # other down gracefully; a wait the user chose is kept (OMP_WAIT_POLICY, or GOMP_SPINCOUNT:
    # how long GNU OpenMP's threads spin before they sleep)
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

    def stop(signum, frame):
        print(f"microgpt: interrupted ({signal.Signals(signum).name}): nothing was written",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(128 + signum)

    previous = set_handlers(stop)
    try:
        yield
    finally:
        set_handlers(previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def set_handlers(handler) -> dict:
    """Set `handler` (one for all, or {signal: handler} as returned) for SIGNALS;
    returns the previous ones ({} outside the main thread: signals are not ours to take there)."""
    handlers = handler if isinstance(handler, dict) else dict.fromkeys(SIGNALS, handler)
    with contextlib.suppress(ValueError):
        return {s: signal.signal(s, h) for s, h in handlers.items()}
    return {}


@contextlib.contextmanager
def front_door(interrupted: str = "nothing was written", cleanup=None):
    """Run the block; a UserError or OSError ends in one `microgpt: error:` line and exit 2,
    Ctrl-C or SIGTERM (KeyboardInterrupt(signal name[, what happened])) in one `microgpt:
    interrupted (SIGNAL): ...` line and exit 128 + its number (SystemExit). `interrupted`: what a
    stop leaves; `cleanup()`: removes what a failed command made, returns it (a folder) or None."""
    previous = set_handlers(_raise_interrupt)
    try:
        yield
    except BrokenPipeError:  # standard output closed (`| head`): no error, as Unix tools do
        with contextlib.suppress(OSError, ValueError):  # the exit's flush too
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + signal.SIGPIPE) from None
    except (KeyboardInterrupt, UserError, OSError) as e:
        set_handlers(signal.SIG_IGN)  # a second signal cannot cut the line or the clean-up
        removed = cleanup() if cleanup else None
        if not isinstance(e, KeyboardInterrupt):
            print_error(e, f" (removed the unused run folder {removed})" if removed else "")
            raise SystemExit(USER_ERROR) from None
        name = e.args[0] if e.args and e.args[0] in signal.Signals.__members__ else "SIGINT"
        what = e.args[1] if len(e.args) > 1 else interrupted
        if removed and len(e.args) < 2:
            what = f"before the first checkpoint; removed the run folder {removed}: start again"
        print(f"microgpt: interrupted ({name}): {what}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.Signals[name].value) from None
    finally:
        set_handlers(previous)


def run(work, interrupted: str = "nothing was written") -> int:
    """`work()` behind the front door: its exit status (0, or the code of its one line)."""
    try:
        with front_door(interrupted):
            work()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
