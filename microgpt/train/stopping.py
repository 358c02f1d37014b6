"""How a run stops early: a signal (stop after this step, write last.pt) or a divergence."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path


class TrainingError(RuntimeError):
    """The run cannot go on (diverged, interrupted); the message says what to do."""


class Interrupted(TrainingError):
    """Stopped by SIGINT/SIGTERM after writing last.pt (`checkpoint`), from which it can resume."""

    def __init__(self, message: str, checkpoint: Path):
        super().__init__(message)
        self.checkpoint = checkpoint


class StopFlag:
    """The first SIGINT/SIGTERM asks the loop to stop after this step; a second SIGINT stops now."""

    def __init__(self):
        self.requested = False
        self.signal_name = ""
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        if self.requested:  # the second one: checkpoint writes are atomic, so stopping is safe
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(
            f"\n{self.signal_name}: stopping after this step and writing checkpoints/last.pt "
            f"(press Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
