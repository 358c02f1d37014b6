"""What rank 0 tells about a run: the summary line at its start, and at its end the test loss of
best.pt's weights (as makemore reports it), samples.txt, the HParams row and the last log lines.

The functions take the Trainer (they read its fields and call nothing above it).
"""

from __future__ import annotations

import logging
import math

from microgpt.files import write_text
from microgpt.runs import RunFolder
from microgpt.sample.report import sample_for_run
from microgpt.train.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from microgpt.train.loss import evaluate

log = logging.getLogger("microgpt")


def summary(trainer) -> str:
    """One line: the model, the data, the recipe, the device ."""
    c, m = trainer.config, trainer.model_config
    kv = f" ({m.n_kv_head} kv heads)" if m.n_kv_head != m.n_head else ""
    precision = "" if trainer.precision == "fp32" else f" {trainer.precision}"
    world = trainer.dist.world_size
    ranks = f" ({c.train.batch_size} x {world} ranks)" if trainer.dist.enabled else ""
    return (
        f"model {m.name}: {m.n_layer} layers, n_embd {m.n_embd}, {m.n_head} heads{kv}, "
        f"attn {m.attn_impl}, {trainer.model.num_params():,} parameters | data "
        f"{trainer.data_path} ({c.data.format}): {trainer.data.describe()}, vocab "
        f"{trainer.tokenizer.vocab_size}, block {m.block_size} | {c.train.max_steps} steps x "
        f"batch {trainer.global_batch}{ranks}, lr {c.optim.lr:g} ({c.optim.warmup_steps} warmup, "
        f"{c.optim.decay}) | device {trainer.device}{precision}"
        f"{' compiled' if c.train.compile else ''}, {trainer.threads} "
        f"thread{'s' if trainer.threads > 1 else ''} | seed {c.seed}"
    )


def finish(trainer, metrics: dict) -> None:
    """The test loss of best.pt's weights (as makemore reports it), samples, hparams."""
    c, m = trainer.config, trainer.model_config
    best_path = RunFolder(trainer.out_dir).best
    model, best = trainer.eval_model, None
    if best_path.exists():
        best = load_checkpoint(best_path, map_location="cpu")
        model, _ = model_from_checkpoint(best, device=trainer.device, path=best_path)
    test = evaluate(model, trainer.datasets["test"], c.train.eval_batch_size, trainer.autocast)
    metrics["test_loss"] = test
    trainer.writer.scalars(trainer.step, {"loss/test": test})
    if best is not None:  # best.pt gains the test loss
        best["metrics"]["test_loss"] = test
        save_checkpoint(best, best_path)
    lines = []
    if c.train.num_samples:
        shown = sample_for_run(model, trainer.data, c.train.num_samples, seed=c.seed)
        lines = shown.lines
        write_text(trainer.out_dir / "samples.txt", "\n".join(lines) + "\n")
        metrics["samples"] = shown.items
    hparams = {
        "heads": m.n_head,
        "kv_heads": m.n_kv_head,
        "n_layer": m.n_layer,
        "n_embd": m.n_embd,
        "params": metrics["params"],
        "model": m.name,
        "attn_impl": m.attn_impl,
        "batch_size": trainer.global_batch,
        "lr": c.optim.lr,
        "max_steps": c.train.max_steps,
        "dropout": m.dropout,
        "seed": c.seed,
    }
    keys = ("best_val_loss", "val_loss", "test_loss")
    trainer.writer.hparams(
        hparams, {f"hparams/{k}": metrics[k] for k in keys if k in metrics}, step=trainer.step
    )
    trainer.writer.close()
    best_val = metrics.get("best_val_loss", math.nan)
    log.info(
        f"test loss {test:.4f} nats/char ({test / math.log(2):.3f} bits; best val "
        f"{best_val:.4f}) after {trainer.step} steps in {metrics['elapsed_s']:.1f} s"
    )
    if lines:
        log.info("samples:\n" + "\n".join(lines))
