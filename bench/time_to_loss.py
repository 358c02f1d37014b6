"""Time to a loss: the plain reference (nanoGPT's documented CPU recipe on microgpt's model and
nanoGPT's budget of characters) trained whole, then microgpt's recipe at the same budget; the
wall time each takes to reach the reference's final loss."""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import compose, figure, run_overrides
from bench.targets import NANOGPT_ROW, QUICK, REFERENCE
from microgpt.train.trainer import train
from microgpt.viz.tensorboard import METRICS_FILE, read_metrics


def val_curve(overrides, args, tmp: Path) -> list[tuple[float, float]]:
    """python train.py with overrides, whole: [(seconds since the call, val loss)] of each
    evaluation, the last one the final loss (on the whole validation split)."""
    cfg = compose([*overrides, *run_overrides(args, tmp)])
    t0 = time.time()
    train(cfg)
    lines = read_metrics(Path(cfg.out_dir) / METRICS_FILE)
    return [(line["time"] - t0, line["loss/val"]) for line in lines if "loss/val" in line]


def run_time_to_loss(args, device, tmp: Path) -> dict:
    shrink = QUICK if args.quick else ()
    reference = val_curve([*REFERENCE, *shrink], args, tmp)
    ours = val_curve([*NANOGPT_ROW, *shrink], args, tmp)
    ref_s, ref_loss = reference[-1]
    reached = next((s for s, loss in ours if loss <= ref_loss), None)
    speed, target = ref_s / reached if reached else None, None if args.quick else (">=", 1.0)
    figures = {
        "reference: final val loss": figure([ref_loss], "nats"),
        "reference: wall time to it": figure([ref_s], "s"),
        "microgpt: final val loss": figure([ours[-1][1]], "nats"),
        "microgpt: wall time to the reference's": figure([reached], "s"),
        "reference's time / microgpt's": figure([speed], "x", target),
    }
    info = {
        "reference": " ".join(REFERENCE),
        "microgpt": " ".join(NANOGPT_ROW),
        "timing": "wall time from train()'s call (start-up and evaluations included) to the first "
        "validation at or below the reference's final loss (a large split is estimated on fixed "
        "rows while a run trains, read whole at its end)",
        "curves": {"reference": reference, "microgpt": ours},
    }
    return {"figures": figures, "info": info}
