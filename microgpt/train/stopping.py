"""How a run stops early: a signal (stop after this step, write last.pt) or a divergence."""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path

from microgpt import entry
from microgpt.errors import UserError


class TrainingError(UserError):
    """The run cannot go on (diverged, interrupted); the message says what to do (the front door
    prints it in one line, exit 2)."""


class Interrupted(TrainingError):
    """Stopped by a signal (errors.SIGNALS) after writing last.pt (`checkpoint`): resumable."""

    def __init__(self, signal_name: str, step: int, max_steps: int, checkpoint: Path):
        super().__init__(
            f"{signal_name or 'signal'} received: stopped at step {step} of {max_steps} and wrote "
            f"{checkpoint}"
        )
        # the front door's exit code: 128 + the signal's number (130 SIGINT, 143 SIGTERM)
        self.checkpoint, self.signal_name = checkpoint, signal_name or "SIGINT"


def diverged(step: int, loss: float, grad_norm: float, setting: str, last: Path, what: str = ""):
    """The TrainingError saying what went non-finite at `step`, what is kept, what to try: a lower
    `setting` (the diverging group's rate, as the user set it)."""
    kept = "no checkpoint was written yet"
    if last.exists():
        kept = f"the last good checkpoint, {last}, is kept"
    what = what or ("loss" if not math.isfinite(loss) else "gradient")
    return TrainingError(
        f"non-finite {what} at step {step} (loss {loss}, grad norm {grad_norm}): the run diverged "
        f"and was stopped; {kept}. Try a lower {setting}, gradient clipping "
        f"(optim.grad_clip=1.0) or a longer optim.warmup_steps"
    )


class StopFlag:
    """The first SIGINT, SIGTERM or SIGHUP asks the loop to stop after this step; a second one,
    or one after the last step (`at_once`: the final evaluation and analysis), stops now:
    KeyboardInterrupt carrying the signal's name."""

    def __init__(self):
        self.requested, self.signal_name, self.at_once = False, "", False

    def __enter__(self):
        self._previous = entry.set_handlers(self._handle)
        return self

    def __exit__(self, *exc):
        entry.set_handlers(self._previous)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        # checkpoint writes are atomic (and hold signals), so stopping at once is safe
        if self.requested or self.at_once:
            raise KeyboardInterrupt(name)
        self.requested, self.signal_name = True, name
        print(f"\n{name}: stopping after this step and writing checkpoints/last.pt (press Ctrl-C "
              "again to stop at once)", file=sys.stderr, flush=True)  # fmt: skip
