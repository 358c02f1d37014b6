"""Cost as a ratio: a recipe's training step timed against today's default step, the two
alternating in one process, so that whatever else the machine does slows both alike.

A recipe's cost is then (its step / the default step) x (its steps / the default's steps): its
whole training in units of today's default run (`python train.py heads=4`), evaluations
excluded. Absolute seconds come with it, with the machine's load at the time.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

from bench.common import make_trainer, step, sync

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


def time_steps(tr, n: int) -> float:
    """Seconds for n training steps."""
    sync(tr.device)
    t0 = time.perf_counter()
    for _ in range(n):
        step(tr)
    sync(tr.device)
    return time.perf_counter() - t0


def cost_ratio(overrides, args, tmp: Path, rounds: int, block_s: float, warmup: int = 5) -> dict:
    """The recipe's step against the default step: `rounds` rounds, each timing a block of about
    block_s seconds of each (the order swapped every round), the ratio per round, and medians."""
    base = make_trainer(DEFAULT_RECIPE, args, tmp)
    recipe = make_trainer(list(overrides), args, tmp)
    for tr in (base, recipe):
        time_steps(tr, warmup)
    k = [max(1, round(block_s / (time_steps(tr, 3) / 3))) for tr in (base, recipe)]
    loads, ratios, base_s, recipe_s = [load()], [], [], []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        per_step = [0.0, 0.0]
        for i in order:
            per_step[i] = time_steps((base, recipe)[i], k[i]) / k[i]
        base_s.append(per_step[0])
        recipe_s.append(per_step[1])
        ratios.append(per_step[1] / per_step[0])
        loads.append(load())
    step_ratio = statistics.median(ratios)
    steps = (base.config.train.max_steps, recipe.config.train.max_steps)
    return {
        "step_ratio": step_ratio,
        "ratios": ratios,
        "run_cost": step_ratio * steps[1] / steps[0],
        "default_step_s": statistics.median(base_s),
        "recipe_step_s": statistics.median(recipe_s),
        "recipe_train_s": statistics.median(recipe_s) * steps[1],
        "steps": {"default": steps[0], "recipe": steps[1]},
        "block_steps": {"default": k[0], "recipe": k[1]},
        "loads": loads,
        "busy": busy(loads),
    }
