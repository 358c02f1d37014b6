"""python -m microgpt.heads RUN: see microgpt/heads/command.py."""

import signal
import sys


def _interrupted(signum, frame):
    """Ctrl-C: one line and exit 130, never a traceback (an analysis is written atomically)."""
    print("microgpt: interrupted (SIGINT): files already written are whole", file=sys.stderr)
    sys.exit(130)


signal.signal(signal.SIGINT, _interrupted)

from microgpt.heads.command import main  # noqa: E402  (after the handler: torch loads slowly)

sys.exit(main())
