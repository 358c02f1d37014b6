"""threads=auto, measured: a CPU run times a few training steps of a copy of its model at 1 thread
and at each doubling up to the cores it may use, then takes the fastest (issue 44). Small bf16
steps run slower on two threads than on one, a large model's faster, and a busy core slows the
counts that need it: only a measurement knows. A run's last digits depend on its thread count,
so more threads win only where clearly faster (MARGIN), and the log says what was chosen, why,
and how to pin it (`threads=N`)."""

from __future__ import annotations

import copy
import statistics
import time

import torch

from microgpt.tokenizer import BOUNDARY_ID
from microgpt.train.optim import WeightAverage, make_optimizer

MARGIN = 0.9  # more threads replace fewer only where a step takes at most 90% of the time
CALLS = 5  # timed steps per count, after one untimed; 2 where a step takes over a second
SLOW_STEP = 1.0


def candidates(cores: int) -> list[int]:
    """1, 2, 4, ... below `cores`, and `cores`."""
    counts = [1]
    while counts[-1] * 2 < cores:
        counts.append(counts[-1] * 2)
    return counts + [cores] if cores > 1 else counts


def fastest(step, counts: list[int], calls: int = CALLS, clock=time.perf_counter):
    """(chosen count, {count: median seconds a step}): `step()` timed at each count, the counts
    alternated call by call; walking up from the fewest, a count replaces the one chosen only
    where its median is at most MARGIN times that one's. Leaves torch at the chosen count."""
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    for n in counts:  # untimed: first calls pay for kernels and buffers
        torch.set_num_threads(n)
        t0 = clock()
        step()
        if clock() - t0 > SLOW_STEP:
            calls = min(calls, 2)
    for _ in range(calls):
        for n in counts:
            torch.set_num_threads(n)
            t0 = clock()
            step()
            seconds[n].append(clock() - t0)
    medians = {n: statistics.median(s) for n, s in seconds.items()}
    chosen = counts[0]
    for n in counts[1:]:
        if medians[n] <= MARGIN * medians[chosen]:
            chosen = n
    torch.set_num_threads(chosen)
    return chosen, medians


def measured_threads(trainer, cores: int) -> tuple[int, str]:
    """Time the trainer's step (a copy of its model, a fresh optimizer, a batch of random ids of
    the run's shape; its RNG untouched) at each candidate count up to `cores`; (count, log line)."""
    c = trainer.config
    model = copy.deepcopy(trainer.model)
    optimizer = make_optimizer(model, c, trainer.device)
    ema = WeightAverage(model, c.train.ema) if trainer.ema is not None else None
    shape = (c.train.batch_size, trainer.data.block_size)
    with torch.random.fork_rng(devices=[]):
        x = torch.randint(trainer.tokenizer.vocab_size, shape, device=trainer.device)
        y = torch.randint(trainer.tokenizer.vocab_size, shape, device=trainer.device)
        starts = x == BOUNDARY_ID if c.train.pack else None

        def step():
            with trainer.autocast(training=True):
                _, loss = model(x, y, doc_starts=starts)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.optim.grad_clip or 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if ema is not None:
                ema.update(model, 0)

        chosen, medians = fastest(step, candidates(cores))
    times = ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in medians.items())
    line = (
        f"threads=auto chose {chosen} of {cores} cores, the fastest step measured ({times} a "
        f"step; more threads only where {1 - MARGIN:.0%} faster); threads=N sets a count"
    )
    return chosen, line
