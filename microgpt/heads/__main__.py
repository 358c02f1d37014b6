"""python -m microgpt.heads RUN: see microgpt/heads/command.py."""

import os
import signal
import sys

INTERRUPTED = "microgpt: interrupted (SIGINT): files already written are whole"


def _while_loading(signum, frame):
    """Ctrl-C while torch loads: nothing is written yet, and an import cut short cannot unwind."""
    print(INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(130)


signal.signal(signal.SIGINT, _while_loading)
from microgpt.heads.command import main  # noqa: E402

signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    code = main()
except KeyboardInterrupt:  # an analysis being written is left whole (microgpt.files.atomic_write)
    print(INTERRUPTED, file=sys.stderr)
    code = 130
sys.exit(code)
