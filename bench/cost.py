"""Cost as a ratio: a recipe's training step timed against today's default step, the two
alternating in one process, so that whatever else the machine does slows both alike.

A recipe's cost is then (its step / the default step) x (its steps / the default's steps): its
whole training in units of today's default run (`python train.py heads=4`), evaluations
excluded. Absolute seconds come with it, with the machine's load at the time. With loop=True
the whole step of Trainer.run's loop is timed (issue 27's training speed: chars_ratio, the real
characters/s of the loop against the old default's).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import make_trainer, step, sync
from microgpt.train import summary
from microgpt.train.stopping import StopFlag
from microgpt.train.trainer import StepResult
from microgpt.viz.tensorboard import TensorBoardLogger

# the unit of cost: the default run before issue 27 (AdamW, padded rows, no averaging), pinned
# so that the unit stays put while the defaults move
DEFAULT_RECIPE = ["heads=4", "optim=adamw", "train.pack=0", "train.ema=0"]
BUSY_LOAD = 0.5  # a timing taken with more than this much other work running is marked


def others_running() -> int | None:
    """Runnable tasks on the machine besides this process's torch threads (the fourth field of
    /proc/loadavg, sampled now, less torch's thread count: its idle threads spin for a while after
    each step and count as runnable), or None where there is no /proc."""
    try:
        running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
        return max(0, int(running) - torch.get_num_threads())
    except (OSError, ValueError, IndexError):
        return None


def load() -> dict:
    """os.getloadavg() (1, 5 and 15 minutes) and the other runnable tasks right now."""
    one, five, fifteen = os.getloadavg() if hasattr(os, "getloadavg") else (None,) * 3
    return {"loadavg": [one, five, fifteen], "others_running": others_running()}


def busy(loads: list[dict]) -> bool:
    """Whether other work ran while we timed: the median count of other runnable tasks sampled
    between rounds is above BUSY_LOAD (where /proc says), else the 1-minute load average at the
    start. (The load average alone would count this benchmark's own earlier sections.)"""
    others = [x["others_running"] for x in loads if x["others_running"] is not None]
    if others:
        return statistics.median(others) > BUSY_LOAD
    first = loads[0]["loadavg"][0] if loads else None
    return first is not None and first > BUSY_LOAD


def loop_stepper(tr) -> Callable[[], tuple[StepResult, float]]:
    """One step of Trainer.run's loop (train_step and the loop's per-step work: the loss window,
    the log line every log_every steps to TensorBoard, the stop check): a callable giving (the
    step's result, the seconds it spent evaluating or saving, which are not training)."""
    tr.writer = TensorBoardLogger(tr.out_dir)
    metrics, bar, stop = {}, summary.progress_bar(tr), StopFlag()
    tr.model.train()
    return lambda: tr.loop_step(metrics, bar, stop)


def time_steps(advance: Callable[[], tuple[StepResult, float]], n: int, device) -> tuple:
    """(seconds, real characters) of n steps of `advance`, the time it spent evaluating left out."""
    sync(device)
    t0, chars, other = time.perf_counter(), 0, 0.0
    for _ in range(n):
        out, spent = advance()
        chars, other = chars + out.tokens, other + spent
    sync(device)
    return time.perf_counter() - t0 - other, chars


def cost_ratio(
    overrides, args, tmp: Path, rounds: int, block_s: float, warmup: int = 5, loop: bool = False
) -> dict:
    """The recipe's step against the default step: `rounds` rounds, each timing a block of about
    block_s seconds of each (the order swapped every round), the ratio per round, and medians;
    chars_ratio: the recipe's real characters/s over the default's. loop: time the whole step of
    Trainer.run's loop (Trainer.loop_step), not train_step alone."""
    trainers = [make_trainer(DEFAULT_RECIPE, args, tmp), make_trainer(list(overrides), args, tmp)]
    steppers = [loop_stepper(tr) if loop else lambda tr=tr: (step(tr), 0.0) for tr in trainers]
    device = trainers[0].device
    for advance in steppers:
        time_steps(advance, warmup, device)
    k = [max(1, round(block_s / (time_steps(a, 3, device)[0] / 3))) for a in steppers]
    loads, ratios, chars_ratios, base_s, recipe_s = [load()], [], [], [], []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        per_step, chars_s = [0.0, 0.0], [0.0, 0.0]
        for i in order:
            seconds, chars = time_steps(steppers[i], k[i], device)
            per_step[i], chars_s[i] = seconds / k[i], chars / seconds
        base_s.append(per_step[0])
        recipe_s.append(per_step[1])
        ratios.append(per_step[1] / per_step[0])
        chars_ratios.append(chars_s[1] / chars_s[0])
        loads.append(load())
    step_ratio = statistics.median(ratios)
    steps = [tr.config.train.max_steps for tr in trainers]
    return {
        "step_ratio": step_ratio,
        "ratios": ratios,
        "chars_ratio": statistics.median(chars_ratios),
        "chars_ratios": chars_ratios,
        "run_cost": step_ratio * steps[1] / steps[0],
        "default_step_s": statistics.median(base_s),
        "recipe_step_s": statistics.median(recipe_s),
        "recipe_train_s": statistics.median(recipe_s) * steps[1],
        "steps": {"default": steps[0], "recipe": steps[1]},
        "block_steps": {"default": k[0], "recipe": k[1]},
        "loads": loads,
        "busy": busy(loads),
    }
