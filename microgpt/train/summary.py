"""What rank 0 tells about a run: at its start the claimed folder, config and summary line; while
it trains the progress bar and train loss; at its end best.pt's test loss (as makemore reports
it), samples.txt and the HParams row. The functions read the Trainer's fields."""

from __future__ import annotations

import logging
import math
import sys
import time

from omegaconf import OmegaConf
from tqdm.auto import tqdm

from microgpt import runs, system
from microgpt.checkpoint import Checkpoint
from microgpt.files import remove_leftovers, write_text
from microgpt.sample.report import sample_for_run
from microgpt.train.loss import LossWindow, StepResult, eval_rows, evaluate
from microgpt.viz.tensorboard import TensorBoardLogger

log = logging.getLogger("microgpt")


def start(trainer) -> tuple[str, TensorBoardLogger]:
    """Claim the run folder, write its config, say what the run is; (the run id, TensorBoard)."""
    out_dir, resumed_from, step = trainer.out_dir, trainer.resumed_from, trainer.step
    if resumed_from is None:  # one exclusive create: a run started alongside stops here
        run_id = runs.claim_new(out_dir)
    else:  # only into this run's own folder, or a new one
        run_id = runs.claim_resume(out_dir, resumed_from, trainer.run_id)
    runs.lock(out_dir)  # until the run ends (train's finally): one process per folder
    checkpoints = runs.RunFolder(out_dir).checkpoints
    checkpoints.mkdir(exist_ok=True)
    remove_leftovers(checkpoints)  # .tmp files of saves killed mid-write
    # a resume keeps the run's config.yaml and writes its own beside it
    name = "config.yaml" if resumed_from is None else f"config.resume-step{step}.yaml"
    write_text(out_dir / name, OmegaConf.to_yaml(OmegaConf.structured(trainer.config)))
    log.info(summary(trainer))
    log.info(f"run folder: {out_dir.resolve()}")
    if resumed_from is not None:
        log.info(f"resumed from {resumed_from} at step {step}")
    for line in trainer.notes:
        log.warning(line)
    # the checkpoint holds step k's state, so points up to k stand; later ones (written after
    # the checkpoint by a run that was killed) are dropped and written again from k + 1
    purge = step + 1 if resumed_from else None
    return run_id, TensorBoardLogger(out_dir, purge_step=purge)


def progress_bar(trainer) -> tqdm:
    """tqdm on stderr, rank 0 only; train.progress=null: only when stderr is a terminal."""
    c = trainer.config
    progress = c.train.progress if c.train.progress is not None else sys.stderr.isatty()
    return tqdm(
        total=c.train.max_steps,
        initial=trainer.step,
        disable=not (progress and trainer.is_main),
        dynamic_ncols=True,
        leave=False,
        file=sys.stderr,
    )


def log_window(trainer, out: StepResult, bar: tqdm) -> dict:
    """The window's train loss, summed over ranks; scalars and the bar (rank 0); a new window."""
    w = trainer.window
    loss = system.sum_over_ranks(float(w.loss), trainer.dist) / w.steps
    now = time.perf_counter()  # after float(): the device has caught up
    tps = w.tokens_per_sec(now)
    if trainer.is_main:
        scalars = {"loss/train": loss, "lr": out.lr, "train/grad_norm": float(out.grad_norm)}
        trainer.writer.scalars(trainer.step, {**scalars, "tokens_per_sec": tps})
        bar.set_postfix_str(
            f"loss {loss:.4f} lr {out.lr:.2e} {tps / 1000:.1f}k tok/s", refresh=False
        )
    trainer.window = LossWindow()
    return {"train_loss": loss, "tokens_per_sec": tps}


def summary(trainer) -> str:
    """One line: the model, the data, the recipe, the device."""
    c, m = trainer.config, trainer.model_config
    kv = f" ({m.n_kv_head} kv heads)" if m.n_kv_head != m.n_head else ""
    precision = "" if trainer.precision == "fp32" else f" {trainer.precision}"
    ranks = f" ({c.train.batch_size} x {trainer.dist.world_size} ranks)"
    ranks = ranks if trainer.dist.enabled else ""
    return (
        f"model {m.name}: {m.n_layer} layers, n_embd {m.n_embd}, {m.n_head} heads{kv}, "
        f"attn {m.attn_impl}, {trainer.model.num_params():,} parameters | data "
        f"{trainer.data.source} ({c.data.format}): {trainer.data.split.describe()}, vocab "
        f"{trainer.tokenizer.vocab_size}, block {m.block_size} | {c.train.max_steps} steps x "
        f"batch {trainer.global_batch}{ranks}, lr {c.optim.lr:g} ({c.optim.warmup_steps} warmup, "
        f"{c.optim.decay}) | device {trainer.device}{precision}"
        f"{' compiled' if c.train.compile else ''}, {trainer.threads} "
        f"thread{'s' if trainer.threads > 1 else ''} | seed {c.seed}"
    )


def final_metrics(trainer, metrics: dict, elapsed: float, tokens: int, other_work: float) -> dict:
    """What `train` returns (every rank): the last metrics, the run's size and its throughput
    (training alone: `other_work`, the seconds spent evaluating and saving, left out)."""
    metrics = {**metrics, "step": trainer.step, "params": trainer.model.num_params()}
    metrics.update(
        elapsed_s=elapsed, global_batch=trainer.global_batch, run_dir=str(trainer.out_dir)
    )
    if elapsed > other_work and tokens:  # training throughput, as logged
        metrics["tokens_per_sec"] = tokens / (elapsed - other_work)
    return metrics


def finish(trainer, metrics: dict) -> None:
    """The test loss of best.pt's weights (as makemore reports it), samples, hparams."""
    c, m = trainer.config, trainer.model_config
    best_path = runs.RunFolder(trainer.out_dir).best
    model, best = trainer.eval_model, None
    if best_path.exists():
        best = Checkpoint.load(best_path, map_location="cpu")
        model, _ = best.build_model(trainer.device)
    test = evaluate(model, trainer.datasets["test"], c.train.eval_batch_size, trainer.autocast)
    metrics["test_loss"] = test
    trainer.writer.scalars(trainer.step, {"loss/test": test})
    val = trainer.datasets["val"]
    if best is not None and best.step < trainer.step and len(eval_rows(val, True)) < len(val):
        # best.pt was chosen on an estimate (Trainer._evaluate_and_save_best): its exact loss
        exact = evaluate(model, val, c.train.eval_batch_size, trainer.autocast)
        metrics["best_val_loss"] = best.metrics["best_val_loss"] = best.metrics["val_loss"] = exact
    if best is not None:  # best.pt gains the test loss
        best.metrics["test_loss"] = test
        best.save(best_path)
    lines = []
    if c.train.num_samples:
        shown = sample_for_run(model, trainer.data, c.train.num_samples, seed=c.seed)
        lines = shown.lines
        write_text(trainer.out_dir / "samples.txt", "\n".join(lines) + "\n")
        metrics["samples"] = shown.items
    hparams = {"heads": m.n_head, "kv_heads": m.n_kv_head, "n_layer": m.n_layer, "n_embd": m.n_embd}
    hparams.update(params=metrics["params"], model=m.name, attn_impl=m.attn_impl)
    hparams.update(batch_size=trainer.global_batch, lr=c.optim.lr, max_steps=c.train.max_steps)
    hparams.update(dropout=m.dropout, seed=c.seed)
    keys = ("best_val_loss", "val_loss", "test_loss")
    scores = {f"result/{k}": metrics[k] for k in keys if k in metrics}
    trainer.writer.hparams(hparams, scores, step=trainer.step)
    trainer.writer.close()
    best_val = metrics.get("best_val_loss", math.nan)
    log.info(
        f"test loss {test:.4f} nats/char ({test / math.log(2):.3f} bits; best val "
        f"{best_val:.4f}) after {trainer.step} steps in {metrics['elapsed_s']:.1f} s"
    )
    if lines:
        log.info("samples:\n" + "\n".join(lines))
