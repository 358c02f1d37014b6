"""How a run stops early: a signal (stop after this step, write last.pt) or a divergence."""

from __future__ import annotations

import math
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


def interrupted(signal_name: str, step: int, max_steps: int, last: Path) -> Interrupted:
    """What a run stopped by a signal says: where it stopped, and how to continue."""
    return Interrupted(
        f"{signal_name or 'signal'} received: stopped at step {step} of {max_steps} and wrote "
        f"{last}; to continue: python train.py resume={last}",
        checkpoint=last,
    )


def diverged(
    step: int, loss: float, grad_norm: float, lr: float, last: Path, what: str = ""
) -> TrainingError:
    """What went non-finite at which step (being taken, or just taken for the validation loss),
    and what to try."""
    kept = "no checkpoint was written yet"
    if last.exists():
        kept = f"the last good checkpoint, {last}, is kept"
    what = what or ("loss" if not math.isfinite(loss) else "gradient")
    return TrainingError(
        f"non-finite {what} at step {step} (loss {loss}, grad norm {grad_norm}, lr {lr:.3g}): "
        f"the run diverged and was stopped; {kept}. Try a lower optim.lr, gradient clipping "
        f"(optim.grad_clip=1.0) or a longer optim.warmup_steps"
    )


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
