"""Measuring the loss: the mean per character over batches (`TokenMean`), over a whole split
(`evaluate`), and the train loss of the steps between two log lines (`StepResult`,
`LossWindow`)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from microgpt.data.lines import CharDataset
from microgpt.system import eval_mode


class TokenMean:
    """The mean loss per real target (y >= 0) over batches: each batch's mean loss weighted by
    its number of targets, summed in float64 on the CPU."""

    def __init__(self):
        self.total, self.count = torch.zeros((), dtype=torch.float64), 0

    def add(self, loss: torch.Tensor, y: torch.Tensor) -> None:
        """A batch's mean loss (0-dim) and its targets y (B, T), -1 at padding."""
        n = int((y >= 0).sum())
        self.total += loss.detach().double().cpu() * n
        self.count += n

    @property
    def value(self) -> float:
        return float(self.total / max(self.count, 1))


@torch.no_grad()
def evaluate(model: nn.Module, dataset: CharDataset, batch_size: int, autocast=None) -> float:
    """Mean negative log-likelihood per character in nats (end token included) over a split."""
    mean = TokenMean()
    with eval_mode(model):
        for x, y in dataset.iter_batches(batch_size):
            with autocast() if autocast is not None else contextlib.nullcontext():
                _, loss = model(x, y)
            mean.add(loss, y)
    return mean.value


@dataclass
class StepResult:
    """What one training step did. loss is this rank's share of the global batch's mean loss."""

    loss: torch.Tensor  # a 0-dim tensor: reading it waits for the device
    grad_norm: torch.Tensor
    lr: float
    tokens: int  # target characters in the global batch
    padded: int  # positions this rank's model saw (B x T)


class LossWindow:
    """The train loss averaged over the steps since the last log line; saved with last.pt, so a
    resumed run logs the same means as one never interrupted."""

    def __init__(self, state: dict | None = None):
        state = state or {}
        self.loss = state.get("loss", 0.0)  # a sum of tensors while running: no device sync
        self.steps, self.tokens = state.get("steps", 0), state.get("tokens", 0)
        self.start_clock()

    def start_clock(self) -> None:
        """Time training from now: the tokens so far (a resumed window's) are not timed."""
        self.time, self.paused, self.untimed = time.perf_counter(), 0.0, self.tokens

    def exclude(self, seconds: float) -> None:
        """Seconds spent on other work (evaluation, checkpoints, the head analysis)."""
        self.paused += seconds

    def tokens_per_sec(self, now: float) -> float:
        """Training throughput since the clock started, the excluded time apart."""
        return (self.tokens - self.untimed) / max(now - self.time - self.paused, 1e-9)

    def add(self, out: StepResult) -> None:
        self.loss, self.steps, self.tokens = (
            self.loss + out.loss,
            self.steps + 1,
            self.tokens + out.tokens,
        )

    def state_dict(self) -> dict:
        return {"loss": float(self.loss), "steps": self.steps, "tokens": self.tokens}
