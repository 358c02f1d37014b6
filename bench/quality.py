"""2. Time to quality: training seconds until the test loss first reaches each threshold."""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import figure, make_trainer, step, sync
from microgpt.train.loss import evaluate

THRESHOLDS = ((2.10, None), (2.00, 90.0), (1.95, 600.0))  # (test loss, target seconds)


def ttq_recipes(args) -> list[tuple[str, list[str]]]:
    """The recipes timed: the default (python train.py) and the 10-minute one (experiment=long)."""
    overrides = list(args.ttq_override)
    if args.ttq_steps:
        overrides.append(f"train.max_steps={args.ttq_steps}")
    if args.quick or args.ttq_override or args.ttq_steps:
        return [("default", overrides)]
    return [("default", overrides), ("experiment=long", ["experiment=long"])]


def ttq_curve(overrides, args, device, tmp: Path) -> dict:
    """Train one recipe, evaluating the test loss every ttq_eval_every steps (not timed)."""
    tr = make_trainer(overrides, args, tmp)
    c = tr.config
    test = tr.datasets["test"]
    every = args.ttq_eval_every
    train_s, eval_s, curve = 0.0, 0.0, []
    while tr.step < c.train.max_steps and train_s < args.ttq_budget:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(min(every, c.train.max_steps - tr.step)):
            step(tr)
            if train_s + time.perf_counter() - t0 >= args.ttq_budget:
                break
        sync(device)
        train_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        loss = evaluate(tr.model, test, c.train.eval_batch_size, tr.autocast)
        eval_s += time.perf_counter() - t1
        curve.append(
            {"step": tr.step, "train_s": train_s, "wall_s": train_s + eval_s, "test_loss": loss}
        )
    return {
        "recipe": f"conf/config.yaml ({c.model.name} preset) with overrides {overrides}",
        "max_steps": c.train.max_steps,
        "steps_run": tr.step,
        "eval_every": every,
        "budget_s": args.ttq_budget,
        "train_s": train_s,
        "eval_s": eval_s,
        "curve": curve,
    }


def run_time_to_quality(args, device, tmp: Path) -> dict:
    figures, info = {}, {}
    runs = {name: ttq_curve(overrides, args, device, tmp) for name, overrides in ttq_recipes(args)}
    for name, run in runs.items():
        curve = run["curve"]
        # the default recipe answers the 90-second target, experiment=long the 10-minute one
        targeted = {2.00} if name == "default" else {1.95}
        for th, limit in THRESHOLDS:
            hit = next((p for p in curve if p["test_loss"] <= th), None)
            figures[f"{name}: time to test loss {th:.2f}"] = figure(
                [hit["train_s"] if hit else None],
                "s",
                ("<=", limit) if limit and th in targeted and not args.quick else None,
                step=hit["step"] if hit else None,
                wall_s=hit["wall_s"] if hit else None,
            )
        best = min((p["test_loss"] for p in curve if p["train_s"] <= args.ttq_budget), default=None)
        figures[f"{name}: best test loss in {args.ttq_budget:g} s"] = figure(
            [best], "nats", None if args.quick or name == "default" else ("<=", 1.95)
        )
        figures[f"{name}: steps/s"] = figure(
            [run["steps_run"] / run["train_s"] if run["train_s"] else None], "steps/s"
        )
        info[name] = run
    info["timing"] = (
        "time = training steps only (test evaluations excluded; wall_s includes them); "
        "a threshold's time is that of the first evaluation at or below it"
    )
    return {"figures": figures, "info": info}
