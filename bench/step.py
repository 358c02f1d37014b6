"""Where a step goes: microgpt's recipe (Muon, weight averaging) against the same model and batch
trained with AdamW alone, on the names default and the text recipe at nanoGPT's batch (12 x 64),
alternated in one process. The optimizer's step and the weight average are timed apart (their
calls wrapped in a clock; the step itself is Trainer.train_step), the rest is the forward and
backward passes, the batch and clipping. Newton-Schulz's FLOPs are counted against the model's."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from torch import nn

from bench.common import alternate, error_figure, figure, make_trainer
from bench.targets import NANOGPT_ROW, QUICK

CASES = {  # case: (the recipe's overrides, its target: the step at most this times AdamW's)
    "names": (("heads=4",), 1.1),
    "text 12x64": (NANOGPT_ROW, 1.2),
}
ADAMW = ("optim=adamw", "train.ema=0")  # the same model and batch, AdamW alone
VARIANTS = {  # each case's steps, alternated with AdamW's, which they are divided by
    "recipe": (),
    "recipe, fp32 Newton-Schulz": ("optim.muon_precision=fp32",),  # the recipe before issue 36
    "recipe, bf16 autocast": ("train.precision=bf16",),
}
NS_STEPS = 5  # Newton-Schulz iterations a step (microgpt.train.optim.orthogonalise)


class Clock:
    """Wraps obj.name in a timer: the seconds its calls took, summed, in `seconds`."""

    def __init__(self, obj, name: str):
        self.seconds, call = 0.0, getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return call(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(obj, name, timed)


def ns_flops(tr) -> float:
    """Newton-Schulz's FLOPs a step: per matrix of Muon's, wide side n and short side m, each
    iteration's three matmuls (x x^T: 2m^2n, the polynomial's gram^2: 2m^3, its product with x:
    2m^2n)."""
    flops = 0.0
    for group in tr.optimizer.param_groups:
        for p in group["params"] if group.get("muon") else []:
            m, n = sorted(p.shape)
            flops += NS_STEPS * (4 * m * m * n + 2 * m**3)
    return flops


def model_flops(tr) -> float:
    """The model's forward and backward FLOPs a step (nanoGPT's count: 6 per weight of the
    matmuls per position, 12 n_layer n_embd T per position for attention), on every position of
    the batch, padding included."""
    x, _, _, _ = tr.batches.next(0, tr.config.train.batch_size)  # one batch's shape (B, T)
    linear = [mod for mod in tr.model.modules() if isinstance(mod, nn.Linear)]
    m, matmul = tr.model_config, sum(mod.weight.numel() for mod in linear)
    positions, T = x.numel(), x.size(1)
    return positions * (6 * matmul + 12 * m.n_layer * m.n_embd * T)


def run_step(args, device, tmp: Path) -> dict:
    figures, info = {}, {"overrides": args.row_override}
    shrink = QUICK if args.quick else ()
    compiled = {"recipe, compiled": ("train.compile=true",)} if args.compile else {}
    variants = {**VARIANTS, **compiled, "AdamW": ADAMW}
    for case, (overrides, target) in CASES.items():
        try:
            trainers = [
                make_trainer([*overrides, *extra, *args.row_override, *shrink], args, tmp)
                for extra in variants.values()
            ]
            clocks = [Clock(tr.optimizer, "step") for tr in trainers]
            averages = [Clock(tr.ema, "update") if tr.ema is not None else None for tr in trainers]
            per = alternate(trainers, args.rounds, args.block_s, 1 if args.quick else 5)
        except Exception as e:  # noqa: BLE001 -- a case that cannot run (no text file) is told
            figures[f"{case}: recipe / AdamW"] = error_figure(e, "x")
            continue
        adamw = per[-1]
        for name, tr, rounds, clock, average in zip(variants, trainers, per, clocks, averages):
            ms = [1e3 * s for s, _ in rounds]
            opt, avg = 1e3 * clock.seconds / tr.step, 1e3 * (average.seconds if average else 0)
            avg /= tr.step
            figures[f"{case}: {name} step"] = figure(ms, "ms")
            if tr is not trainers[-1]:
                judged = None if args.quick or name != "recipe" else ("<=", target)
                ratio = [a / b for (a, _), (b, _) in zip(rounds, adamw)]
                figures[f"{case}: {name} / AdamW"] = figure(ratio, "x", judged)
            figures[f"{case}: {name}: optimizer"] = figure([opt], "ms")
            if average:
                figures[f"{case}: {name}: weight average"] = figure([avg], "ms")
            rest = statistics.median(ms) - opt - avg
            figures[f"{case}: {name}: forward, backward, batch, clip"] = figure([rest], "ms")
        ns, model = ns_flops(trainers[0]), model_flops(trainers[0])
        figures[f"{case}: Newton-Schulz FLOPs / model's"] = figure([ns / model], "x")
        info[case] = {"overrides": overrides, "ns_gflop": ns / 1e9, "model_gflop": model / 1e9}
    info["variants"] = {name: " ".join(extra) for name, extra in variants.items()}
    return {"figures": figures, "info": info}
