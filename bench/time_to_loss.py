"""Time to a loss: for names and text, a plain reference trained whole (names: the default run
before issue 27, bench.common.UNIT; text: nanoGPT's documented CPU recipe on microgpt's model
and nanoGPT's budget, REFERENCE), then microgpt's recipe at the same budget (the default run;
NANOGPT_ROW); the wall time each takes to reach the reference's final loss, each timed alike: where
its curve of evaluations first crosses it, interpolated linearly between the evaluation above it
and the first at or below it (the evaluations' own times are given too). Wall times of two runs
minutes apart move with the machine's load; so the same speed-up is also given as the ratio of
the steps to the loss (exact) times the ratio of the two steps' times, alternated in one process
(bench.common.alternate: a spread over rounds, start-up and evaluations left out)."""

import time
from pathlib import Path

from bench.common import alternate, attempt, compose, figure, make_trainer, recipe, run_overrides
from bench.targets import NANOGPT_ROW, REFERENCE, UNIT
from microgpt.runs import RunFolder
from microgpt.train.trainer import train
from microgpt.viz.tensorboard import VAL_LOSS

CASES = {"names": (UNIT, ("heads=4",)), "text": (REFERENCE, NANOGPT_ROW)}  # (reference, ours)
SIDES = ("reference", "microgpt")


def val_curve(overrides, args, tmp: Path) -> list[tuple[float, int, float]]:
    """python train.py with overrides, whole: [(seconds since the call, step, val loss)] of each
    evaluation, the last one the final loss (on the whole validation split)."""
    cfg = compose([*overrides, *run_overrides(args, tmp)])
    t0 = time.time()
    train(cfg)
    lines = RunFolder(cfg.out_dir).metrics()
    return [(line["time"] - t0, line["step"], line[VAL_LOSS]) for line in lines if VAL_LOSS in line]


def crossing(curve: list[tuple], loss: float, at: int = 0) -> tuple[float, float] | None:
    """(where the curve [(seconds, step, loss)] first reaches `loss`, interpolated linearly from
    the evaluation before; where its first evaluation at or below it is), None if never; in
    seconds, or with at=1 in steps."""
    for i, point in enumerate(curve):
        if point[-1] <= loss:
            if i == 0:
                return point[at], point[at]
            (x0, value0), (x, value) = (curve[i - 1][at], curve[i - 1][-1]), (point[at], point[-1])
            return x0 + (x - x0) * (value0 - loss) / (value0 - value), x
    return None


def run_time_to_loss(args, device, tmp: Path) -> dict:
    figures, info = {}, {}
    for case, sides in CASES.items():
        work = lambda: [val_curve(recipe(args, *o), args, tmp) for o in sides]  # noqa: E731
        if not (curves := attempt(figures, f"{case}: reference's time / microgpt's", "x", work)):
            continue
        reference, ours = curves
        # timed alike: where each side's curve first crosses the reference's final loss (a
        # reference whose curve ends going up crossed it before its end)
        ref_loss = reference[-1][2]
        (ref_s, ref_eval), reached = crossing(reference, ref_loss), crossing(ours, ref_loss)
        s, at_eval = reached or (None, None)
        target = None if args.quick else (">=", 1.0)
        figures[f"{case}: reference's final val loss"] = figure([ref_loss], "nats")
        figures[f"{case}: reference's wall time to it"] = figure([ref_s], "s")
        figures[f"{case}: microgpt's final val loss"] = figure([ours[-1][2]], "nats")
        figures[f"{case}: microgpt's wall time to the reference's"] = figure([s], "s")
        speed = ref_s / s if s else None
        figures[f"{case}: reference's time / microgpt's"] = figure([speed], "x", target)
        by_eval = [ref_eval / at_eval if at_eval else None]
        figures[f"{case}: the same at the first evaluations at or below it"] = figure(by_eval, "x")
        # the same from steps and step times: (steps to the loss, reference's / ours) x (a step's
        # seconds, reference's / ours), per round of the steps alternated
        ref_steps, our_steps = (crossing(c, ref_loss, at=1) for c in (reference, ours))
        steps = ref_steps[0] / our_steps[0] if our_steps else None
        figures[f"{case}: steps to it, reference's / microgpt's"] = figure([steps], "x")
        per = alternate([make_trainer(recipe(args, *o), args, tmp) for o in sides], args)
        step_ratio = [ref / our for (ref, _), (our, _) in zip(*per)]
        figures[f"{case}: step time, reference's / microgpt's"] = figure(step_ratio, "x")
        product = [steps * r if steps else None for r in step_ratio]
        figures[f"{case}: steps ratio x step time ratio"] = figure(product, "x", target)
        info[case] = {**dict(zip(SIDES, map(" ".join, sides))), "curves": dict(zip(SIDES, curves))}
    info["timing"] = (
        "wall time from train()'s call (start-up and evaluations included) to where each side's "
        "validation curve first crosses the reference's final loss, linear between evaluations (a "
        "large split is estimated on fixed rows while a run trains, read whole at its end)"
    )
    return {"figures": figures, "info": info}
