"""How long the head analysis takes: microgpt.heads.analyse.analyse on validation rows, those of
--run's checkpoint or, without one, the small preset with fresh weights on the default run's
validation split (the same shapes and work as the default run's analysis, so the same time)."""

from pathlib import Path

import torch

from bench.common import figure, make_trainer, timed
from microgpt.checkpoint import Checkpoint
from microgpt.data.lines import CharDataset
from microgpt.heads.analyse import analyse

TARGET_S = 5.0


def heads_setting(args, tmp: Path):
    """(model, x, y, tokenizer, what): --run's model and validation rows, else a preset's."""
    if args.run:
        ckpt = Checkpoint.load(args.checkpoint)
        model, tokenizer = ckpt.build_model("cpu")
        val = CharDataset.from_items(ckpt.split["val"], tokenizer, model.config.block_size)
        return model.eval(), val.X, val.Y, tokenizer, str(args.checkpoint)
    tr = make_trainer(["model=micro" if args.quick else "model=small"], args, tmp)
    val = tr.datasets["val"]
    x, y = val.batch(torch.arange(len(val)))  # (N, T) each
    return tr.model.eval(), x, y, tr.tokenizer, f"{tr.config.model.name} preset, fresh weights"


def run_heads(args, device, tmp: Path) -> dict:
    model, x, y, tokenizer, what = heads_setting(args, tmp)
    report = analyse(model, x, y, tokenizer)  # a warm-up
    times = [timed(lambda: analyse(model, x, y, tokenizer), device) for _ in range(args.repeats)]
    c = model.config
    target = None if args.quick else ("<", TARGET_S)
    info = {
        "what": what,
        "model": f"{c.n_layer} layers, {c.n_head} heads, n_embd {c.n_embd}",
        "rows": f"{report.items:,} items, {report.tokens:,} characters",
    }
    return {"figures": {"analyse": figure(times, "s", target)}, "info": info}
