"""The loss: its mean per character over a split (`evaluate`), a rank's share of a training batch
and its weight (`rank_batch`), and the train loss of the steps between two log lines
(`StepResult`, `LossWindow`)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from microgpt.data.lines import Rows
from microgpt.system import DistInfo, eval_mode
from microgpt.tokenizer import BOUNDARY_ID

# during training, a split of more positions is estimated on evenly spaced rows of about this many
# (a text's 253k-character validation slice: 1 window in 16, as many as nanoGPT's estimate reads)
ESTIMATE_POSITIONS = 2**14


def eval_rows(dataset: Rows, estimate: bool = False) -> Tensor:
    """The rows evaluate reads: all, or (estimate) evenly spaced ones holding about
    ESTIMATE_POSITIONS positions, the same every time."""
    n = len(dataset)
    every = math.ceil(n * dataset.block_size / ESTIMATE_POSITIONS) if estimate else 1
    return torch.arange(0, n, max(every, 1))


@torch.inference_mode()
def evaluate(
    model: nn.Module, dataset: Rows, batch_size: int, autocast=nullcontext, estimate: bool = False
) -> float:
    """Mean negative log-likelihood per character in nats (end token included) over a split's
    eval_rows: each batch's mean weighted by its real targets (y >= 0), summed in float64."""
    rows = eval_rows(dataset, estimate)
    total, count = torch.zeros((), dtype=torch.float64), 0
    with eval_mode(model):
        for start in range(0, len(rows), batch_size):
            x, y = dataset.batch(rows[start : start + batch_size])
            with autocast():
                _, loss = model(x, y)
            n = (y >= 0).sum()
            # summed on the device, in order: read once, at the end
            total = total.to(loss.device) + loss.detach().double() * n
            count = count + n
    return float(total / max(int(count), 1))


def rank_batch(batches, dist: DistInfo, batch_size: int, pack: int) -> tuple:
    """This rank's (x, y) of the next global batch, (B, T) each; where rows are packed, the item
    starts (else None); the weight of its mean loss, to the global batch's mean over its targets
    (whatever their split between ranks) times the world size, as DDP averages gradients over
    ranks (a weight of 1 on one process); the global batch's targets."""
    x, y, n_mine, targets = batches.next(dist.rank, batch_size)
    starts = x == BOUNDARY_ID if pack else None  # packed rows: each item starts at a boundary token
    return x, y, starts, n_mine * dist.world_size / targets, targets


@dataclass
class StepResult:
    """What one training step did. loss: this rank's share of the global batch's mean loss, times
    the world size (the loss itself on one process)."""

    loss: torch.Tensor  # a 0-dim tensor: reading it waits for the device
    grad_norm: torch.Tensor
    lr: float
    tokens: int  # target characters in the global batch


class LossWindow:
    """The train loss averaged over the steps since the last log line; saved with last.pt, so a
    resumed run logs the same means as one never interrupted."""

    def __init__(self, state: dict | None = None):
        # loss: a sum of tensors while running (no device sync)
        state = {"loss": 0.0, "steps": 0, **(state or {})}
        self.loss, self.steps = state["loss"], state["steps"]
        self.start_clock()

    def start_clock(self) -> None:
        """Time training from now: `tokens` counts the target tokens trained since, `paused`
        gathers the seconds spent on other work (evaluation, checkpoints, the head analysis)."""
        self.time, self.paused, self.tokens = time.perf_counter(), 0.0, 0

    def tokens_per_sec(self, now: float) -> float:
        """Training throughput since the clock started, the excluded time apart."""
        return self.tokens / max(now - self.time - self.paused, 1e-9)

    def add(self, out: StepResult) -> None:
        self.loss = self.loss + out.loss
        self.steps, self.tokens = self.steps + 1, self.tokens + out.tokens

    def state_dict(self) -> dict:
        return {"loss": float(self.loss), "steps": self.steps}
