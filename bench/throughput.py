"""Training throughput against a plain reference GPT: microgpt's step (Muon, names packed into
rows, weight averaging) and the same model trained plainly (bench.common.PLAIN), alternated in
one process, per preset, batch and attention implementation."""

import itertools
from pathlib import Path

from bench.common import PLAIN, alternate, attempt, figure, make_trainer

SPEED_TARGET = 1.5  # the default's real characters/s against the plain GPT's (issue 36; 27: 2)


def run_throughput(args, device, tmp: Path) -> dict:
    figures = {}
    for preset, batch, impl in itertools.product(args.presets, args.batches, args.impls):
        name = f"{preset} b{batch} {impl}{' compiled' if args.compile else ''}"
        case = [f"model={preset}", f"train.batch_size={batch}", f"model.attn_impl={impl}"]
        case += [f"train.compile={str(args.compile).lower()}", *args.row_override]

        def work():
            return alternate([make_trainer(c, args, tmp) for c in (case, [*case, *PLAIN])], args)

        if not (per := attempt(figures, f"{name} chars/s", "chars/s", work)):
            continue
        default = (preset, batch, impl) == ("small", 128, "sdpa") and not args.quick
        speed = [a / b for (_, a), (_, b) in zip(*per)]
        figures[f"{name} chars/s"] = figure([c for _, c in per[0]], "chars/s")
        figures[f"{name} steps/s"] = figure([1 / s for s, _ in per[0]], "steps/s")
        figures[f"{name} plain chars/s"] = figure([c for _, c in per[1]], "chars/s")
        figures[f"{name} / plain"] = figure(speed, "x", (">=", SPEED_TARGET) if default else None)
    info = {
        "plain": " ".join(PLAIN),
        "counting": "chars/s: real targets a second (characters and end tokens, no padding); "
        "each round times about --block-s seconds of each step, the order reversed every round",
    }
    return {"figures": figures, "info": info}
