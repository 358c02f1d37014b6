"""The targets table: each recipe's loss at its budget over several seeds (train() run whole per
seed, as python train.py runs it: exact whatever the machine's load), and its cost in runs of the
plain reference on names (its step timed against that one's, alternated in one process)."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import QUICK, UNIT, alternate, compose, make_trainer, measure, run_overrides
from microgpt.system import share, usable_cores
from microgpt.train.trainer import train

# nanoGPT's documented CPU budget on text: 2,000 steps x 12 windows x 64 characters
NANOGPT = ("experiment=shakespeare", "train.max_steps=2000", "train.batch_size=12")
NANOGPT = (*NANOGPT, "model.block_size=64")
# microgpt's recipe for it (ReLU and a 50-step warmup since 2026-11-28: better over 5 paired
# seeds, docs/benchmarks-nanogpt-row.json)
NANOGPT_ROW = (*NANOGPT, "optim.muon_lr=0.01", "train.ema=0.995", "model.activation=relu")
NANOGPT_ROW = (*NANOGPT_ROW, "optim.warmup_steps=50")
# the plain reference: nanoGPT's documented CPU recipe on microgpt's model, the same characters
# (AdamW, lr 1e-3 cosine to 1e-4, beta2 0.99, warmup 100, weight decay 0.1, clipping 1.0,
# dropout 0, tied embeddings, no averaging, float32 as nanoGPT on a CPU)
REFERENCE = (*NANOGPT, "optim=adamw", "optim.lr=1e-3", "optim.min_lr_ratio=0.1")
REFERENCE = (*REFERENCE, "optim.betas=[0.9,0.99]", "optim.warmup_steps=100")
REFERENCE = (*REFERENCE, "optim.weight_decay=0.1", "optim.grad_clip=1.0", "model.dropout=0")
REFERENCE = (*REFERENCE, "model.tie_weights=true", "train.ema=0", "train.precision=fp32")


@dataclass(frozen=True)
class Row:
    key: str  # --rows picks rows by it
    recipe: str
    overrides: tuple[str, ...]
    metric: str  # a key of train()'s metrics
    target: float | None  # the median loss to reach, at most; None: reported
    budget: float | None  # the cost allowed, in runs of UNIT; None: nanoGPT's characters
    second_file: bool = False  # also trained on SECOND_FILE, without a target


ROWS = (
    Row("names", "python train.py heads=4", ("heads=4",), "test_loss", 1.94, 1, True),
    Row("long", "experiment=long", ("experiment=long",), "test_loss", 1.87, 6.5, True),
    Row("nanogpt", "text, nanoGPT's budget", NANOGPT_ROW, "best_val_loss", 1.75, None),
    Row("reference", "text, nanoGPT's recipe and budget", REFERENCE, "best_val_loss", None, None),
    Row("text", "experiment=shakespeare", ("experiment=shakespeare",), "best_val_loss", 1.60, 3.5),
)
SECOND_FILE = "data=names-1980s"  # names never tuned on


def loss(overrides: list[str], metric: str) -> float:
    """One seed's loss: train() run whole, as python train.py would."""
    return float(train(compose(overrides))[metric])


def losses(row: Row, args, tmp: Path) -> list[float]:
    """The row's loss for each seed; with --jobs N, N seeds at once in their own processes, the
    cores shared between them (the losses are the same: only the time changes)."""
    jobs = min(args.jobs, len(args.seeds))
    extra = [] if jobs < 2 or args.threads else [f"threads={share(usable_cores(), jobs)}"]
    runs = [[*row.overrides, f"seed={s}", *run_overrides(args, tmp), *extra] for s in args.seeds]
    if jobs < 2:
        return [loss(overrides, row.metric) for overrides in runs]
    spawn = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch threads
    with ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        return list(pool.map(loss, runs, [row.metric] * len(runs)))


def cost(row: Row, args, tmp: Path) -> list[float]:
    """The row's run in runs of UNIT, per round: (its step / UNIT's step) x (its steps / UNIT's)."""
    shrink = QUICK if args.quick else ()
    unit, recipe = (make_trainer([*o, *shrink], args, tmp) for o in (UNIT, row.overrides))
    per = alternate([unit, recipe], args)
    steps = recipe.config.train.max_steps / unit.config.train.max_steps
    return [b / a * steps for (a, _), (b, _) in zip(*per)]


def run_targets(args, device, tmp: Path) -> dict:
    figures, shrink = {}, QUICK if args.quick else ()
    for row in (r for r in ROWS if r.key in args.rows):
        row = replace(row, overrides=(*row.overrides, *args.row_override))
        files = {row.key: ()}
        if row.second_file:
            files[f"{row.key} [names-1980s]"] = (SECOND_FILE,)
        for name, data in files.items():
            target = None if data or args.quick or row.target is None else ("<=", row.target)
            key = f"{name}: {row.metric}"
            run = replace(row, overrides=(*row.overrides, *data, *shrink))
            measure(figures, key, "nats", target, losses, run, args, tmp, seeds=args.seeds)
        budget = None if row.budget is None or args.quick else ("<=", row.budget)
        measure(figures, f"{row.key}: cost", "runs", budget, cost, row, args, tmp)
    info = {"unit": " ".join(UNIT), "seeds": args.seeds}
    return {"figures": figures, "info": info}


def format_targets(results: dict) -> str:
    """The table: each row's budget, cost, target and loss (median, min-max)."""
    figs = results["sections"]["targets"]["figures"]

    def show(name: str, digits: int = 4) -> str:
        f = figs[name]
        if f["median"] is None:
            return f"error: {f.get('error', '')[:50]}"
        spread = f" ({f['min']:.{digits}f}-{f['max']:.{digits}f})" if f["n"] > 1 else ""
        return f"{f['median']:.{digits}f}{spread}"

    lines = ["recipe | budget (runs) | cost (runs) | target | loss (median, min-max)"]
    for row in (r for r in ROWS if f"{r.key}: cost" in figs):
        budget = "nanoGPT's characters" if row.budget is None else f"<= {row.budget:g}"
        target = f"<= {row.target:g}" if row.target else "the nanogpt row beats it"
        cost, loss = show(f"{row.key}: cost", 2), show(f"{row.key}: {row.metric}")
        lines.append(" | ".join([row.recipe, budget, cost, target, loss]))
        if row.second_file:
            second = show(f"{row.key} [names-1980s]: {row.metric}")
            lines.append(f"  on names-1980s | | | | {second}")
    return "\n".join(lines)
