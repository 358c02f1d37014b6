"""6. The microgpt.py setting: `python train.py experiment=microgpt`, end to end, timed."""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import compose, figure, run_overrides
from microgpt.train.trainer import train


def run_microgpt(args, device, tmp: Path) -> dict:
    times, val, test = [], [], []
    for _ in range(args.repeats):
        cfg = compose(["experiment=microgpt", *run_overrides(args, tmp), "train.num_samples=0"])
        t0 = time.perf_counter()
        metrics = train(cfg)
        times.append(time.perf_counter() - t0)
        val.append(metrics.get("val_loss"))
        test.append(metrics.get("test_loss"))
    figures = {
        "experiment=microgpt wall time": figure(times, "s", None if args.quick else ("<", 5.0)),
        "final val loss": figure(val, "nats"),
        "test loss": figure(test, "nats"),
    }
    info = {
        "what": "train(compose(['experiment=microgpt'])): 1,000 steps of the "
        "micro preset at batch 1, with set-up, evaluation, checkpoints and TensorBoard logging "
        "(train.num_samples=0)",
        "reference": "Karpathy's microgpt.py: 379 s for the same 1,000 steps on this machine",
    }
    return {"figures": figures, "info": info}
