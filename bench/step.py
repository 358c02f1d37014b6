"""Where a step goes: microgpt's recipe (Muon, weight averaging) against the same model and batch
trained with AdamW alone, and against the plain GPT (bench.common.PLAIN: AdamW, padded rows, no
averaging; on text the same as AdamW's), on the names default and the text recipe at nanoGPT's
batch (12 x 64), alternated in one process. The optimizer's step and the weight average are timed
apart (their calls wrapped in a clock; the step itself is Trainer.train_step), the rest is the
forward and backward passes, the batch and clipping. The orthogonalisation's FLOPs are counted
against the model's."""

import statistics
import time
from pathlib import Path

from torch import nn

from bench.common import PLAIN, alternate, attempt, figure, make_trainer, recipe
from bench.targets import NANOGPT_ROW
from bench.throughput import SPEED_TARGET

CASES = {  # case: (the recipe's overrides, its target: the step at most this times AdamW's)
    "names": (("heads=4",), 1.1),
    "text 12x64": (NANOGPT_ROW, 1.2),
}
ADAMW = ("optim=adamw", "train.ema=0")  # the same model and batch, AdamW alone
VARIANTS = {  # each case's steps, alternated with AdamW's and the plain GPT's
    "recipe": (),
    "recipe, no autocast": ("train.precision=fp32",),  # Newton-Schulz still in bf16
    "recipe, Newton-Schulz": ("optim.muon_ortho=newton-schulz",),  # before issue 44
}


def clock(obj, name: str) -> list[float]:
    """Wraps obj.name in a timer: the seconds of each call, appended to the list returned."""
    seconds, call = [], getattr(obj, name)

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = call(*a, **k)
        seconds.append(time.perf_counter() - t0)
        return out

    setattr(obj, name, timed)
    return seconds


def ns_flops(tr) -> float:
    """The orthogonalisation's FLOPs a step: per matrix, short side m, wide n, T quintics of
    x x^T, gram^2 and the product with x (2m^2n + 2m^3 + 2m^2n); on the Gram side x x^T and the
    product once, 4T - 3 matmuls of m^3 (microgpt.train.optim.gram_side)."""
    t, gram = len(tr.optimizer.ortho[0]), tr.optimizer.ortho[1]
    shapes = [sorted(p.shape) for g in tr.optimizer.param_groups if g["muon"] for p in g["params"]]
    wide, square = (1, 4 * t - 3) if gram else (t, t)  # 4 m^2 n matmuls, 2 m^3 ones
    return sum(4 * m * m * n * wide + square * 2 * m**3 for m, n in shapes)


def model_flops(tr) -> float:
    """The model's forward and backward FLOPs a step (nanoGPT's count: 6 per weight of the
    matmuls per position, 12 n_layer n_embd T per position for attention), on every position of
    the batch, padding included."""
    x, _, _, _ = tr.batches.next(0, tr.config.train.batch_size)  # one batch's shape (B, T)
    linear = [mod for mod in tr.model.modules() if isinstance(mod, nn.Linear)]
    m, matmul = tr.model_config, sum(mod.weight.numel() for mod in linear)
    return x.numel() * (6 * matmul + 12 * m.n_layer * m.n_embd * x.size(1))  # T: x.size(1)


def time_variants(args, tmp: Path, overrides, variants: dict):
    """The variants' Trainers, the clocks of their optimizer's steps and weight averages, and
    their rounds of steps alternated (bench.common.alternate), by name."""
    trainers = {
        n: make_trainer(recipe(args, *overrides, *x), args, tmp) for n, x in variants.items()
    }
    clocks = {n: clock(tr.optimizer, "step") for n, tr in trainers.items()}
    averages = {n: clock(tr.ema, "update") for n, tr in trainers.items() if tr.ema}
    return trainers, clocks, averages, dict(zip(trainers, alternate(list(trainers.values()), args)))


def run_step(args, device, tmp: Path) -> dict:
    figures, info = {}, {"overrides": args.row_override}
    compiled = {"recipe, compiled": ("train.compile=true",)} if args.compile else {}
    variants = {**VARIANTS, **compiled, "AdamW": ADAMW, "plain": PLAIN}
    for case, (overrides, target) in CASES.items():
        key, work = f"{case}: recipe / AdamW", time_variants
        if not (measured := attempt(figures, key, "x", work, args, tmp, overrides, variants)):
            continue
        trainers, clocks, averages, rounds = measured
        for name, tr in trainers.items():
            ms = [1e3 * s for s, _ in rounds[name]]
            figures[f"{case}: {name} step"] = figure(ms, "ms")
            if name not in ("AdamW", "plain"):
                judged = None if args.quick or name != "recipe" else ("<=", target)
                ratio = [a / b for (a, _), (b, _) in zip(rounds[name], rounds["AdamW"])]
                figures[f"{case}: {name} / AdamW"] = figure(ratio, "x", judged)
            if name != "plain":
                judged = None if args.quick or name != "recipe" else (">=", SPEED_TARGET)
                speed = [a / b for (_, a), (_, b) in zip(rounds[name], rounds["plain"])]
                figures[f"{case}: {name} chars/s / plain's"] = figure(speed, "x", judged)
            opt = 1e3 * sum(clocks[name]) / tr.step  # over every step taken, warm-up included
            avg = 1e3 * sum(averages[name]) / tr.step if name in averages else 0.0
            figures[f"{case}: {name}: optimizer"] = figure([opt], "ms")
            if name in averages:
                figures[f"{case}: {name}: weight average"] = figure([avg], "ms")
            rest = statistics.median(ms) - opt - avg
            figures[f"{case}: {name}: forward, backward, batch, clip"] = figure([rest], "ms")
        ns, model = ns_flops(trainers["recipe"]), model_flops(trainers["recipe"])
        figures[f"{case}: orthogonalisation FLOPs / model's"] = figure([ns / model], "x")
        info[case] = {"overrides": overrides, "ns_gflop": ns / 1e9, "model_gflop": model / 1e9}
    info["variants"] = {name: " ".join(extra) for name, extra in variants.items()}
    return {"figures": figures, "info": info}
