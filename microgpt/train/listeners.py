"""What hears a Trainer: its loop calls each listener at the points below (rank 0 alone), and the
listeners say what the run shows: TensorBoard's scalars and HParams row (TensorBoard), the
probe's maps and the head analysis (HeadAnalysis), samples (Samples), the progress bar
(ProgressBar). Each reads the trainer it is handed; none changes it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from microgpt.files import write_text
from microgpt.heads.analyse import analyse, probe_attention
from microgpt.sample.report import sample_for_run
from microgpt.train.loss import StepResult
from microgpt.viz.tensorboard import TRAIN_LOSS, VAL_LOSS, TensorBoardLogger

log = logging.getLogger("microgpt")


class Listener:
    """The loop's events, in the order a run emits them; each does nothing unless overridden."""

    def on_start(self, trainer) -> None:
        """The run folder is claimed and the run said; the first step comes next."""

    def on_step(self, trainer, result: StepResult, window: dict | None) -> None:
        """A training step is done; window: the train loss and throughput where a window ended
        (every train.log_every steps and at the last)."""

    def on_evaluated(self, trainer, metrics: dict) -> None:
        """The validation loss was measured (val_loss, best_val_loss, step)."""

    def on_saved(self, trainer, path: Path) -> None:
        """A checkpoint was written: best.pt, last.pt or a snapshot."""

    def on_step_end(self, trainer) -> None:
        """The step's evaluation and checkpoints are done; what runs here is not training's time."""

    def on_finished(self, trainer, metrics: dict, model) -> None:
        """After the last step: best.pt tested (model: its weights), metrics the run's last."""

    def close(self) -> None:
        """The run is over, whichever way it ended."""


class TensorBoard(Listener):
    """The run's TensorBoardLogger (its folder, metrics.jsonl): train and validation scalars as
    they come, the HParams row at the end; the other listeners draw into its `writer`."""

    writer: TensorBoardLogger | None = None

    def on_start(self, trainer) -> None:
        # the checkpoint holds step k's state, so points up to k stand; later ones (written after
        # the checkpoint by a run that was killed) are dropped and written again from k + 1
        purge = trainer.step + 1 if trainer.resume_path else None
        self.writer = TensorBoardLogger(trainer.out_dir, purge_step=purge)

    def on_step(self, trainer, result: StepResult, window: dict | None) -> None:
        if window is not None:
            loss, tps, grad_norm = window["train_loss"], window["tokens_per_sec"], result.grad_norm
            scalars = {TRAIN_LOSS: loss, "lr": result.lr, "train/grad_norm": float(grad_norm)}
            self.writer.scalars(trainer.step, {**scalars, "tokens_per_sec": tps})

    def on_evaluated(self, trainer, metrics: dict) -> None:
        self.writer.scalars(trainer.step, {VAL_LOSS: metrics["val_loss"]})

    def on_saved(self, trainer, path: Path) -> None:
        self.writer.flush()  # TensorBoard up to date with the checkpoint

    def on_finished(self, trainer, metrics: dict, model) -> None:
        # three columns, so that the HParams tab shows the metrics beside them (config.yaml: the
        # rest); the seed: runs that differ only by it sort together, and filter by it
        hparams = dict(heads=trainer.model_config.n_head, seed=trainer.config.seed)
        hparams["params"] = metrics["params"]
        results = {k: metrics[k] for k in ("best_val_loss", "test_loss") if k in metrics}
        self.writer.hparams(hparams, results, step=trainer.step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class HeadAnalysis(Listener):
    """The probe's attention maps and the head analysis on validation items, into TensorBoard: at
    step 0, every log.attn_every steps (light while the run trains) and whole after the last."""

    def __init__(self, tensorboard: TensorBoard):
        self.tensorboard = tensorboard

    def on_start(self, trainer) -> None:
        if trainer.step == 0:
            self.log(trainer)

    def on_step_end(self, trainer) -> None:
        if trainer.step % trainer.config.log.attn_every == 0 or trainer.final:
            self.log(trainer)

    def log(self, trainer) -> None:
        t, val, writer = trainer, trainer.datasets["val"], self.tensorboard.writer
        x, y = val.batch(torch.arange(min(len(val), t.config.log.head_items)))  # (N, T)
        maps = probe_attention(t.eval_model, t.probe_ids)
        writer.attention_maps(t.step, maps, t.tokenizer.labels(t.probe_ids))
        light, boundary = not t.final, t.data.boundary  # light while the run trains
        report = analyse(t.eval_model, x, y, t.tokenizer, light=light, boundary=boundary)
        writer.heads(t.step, report)


class Samples(Listener):
    """Samples of the (averaged) weights: a few at each evaluation, into TensorBoard's text; after
    the last step train.num_samples of best.pt's, said, written to samples.txt and returned in
    the metrics (`samples`)."""

    def __init__(self, tensorboard: TensorBoard):
        self.tensorboard = tensorboard

    def on_evaluated(self, trainer, metrics: dict) -> None:
        seed = trainer.config.seed + trainer.step
        shown = sample_for_run(trainer.eval_model, trainer.data, None, seed=seed)
        self.tensorboard.writer.samples(trainer.step, shown.lines)

    def on_finished(self, trainer, metrics: dict, model) -> None:
        if n := trainer.config.train.num_samples:
            shown = sample_for_run(model, trainer.data, n, seed=trainer.config.seed)
            write_text(trainer.folder.samples_file, "\n".join(shown.lines) + "\n")
            metrics["samples"] = shown.items
            log.info("samples:\n" + "\n".join(shown.lines))


class ProgressBar(Listener):
    """tqdm on stderr while the run trains (train.progress; null: where stderr is a terminal), the
    log lines written above it, the last window's loss, rate and throughput beside it."""

    def __init__(self):
        self.open = contextlib.ExitStack()

    def on_start(self, trainer) -> None:
        shown = trainer.config.train.progress
        shown = shown if shown is not None else sys.stderr.isatty()
        style = dict(dynamic_ncols=True, leave=False, file=sys.stderr)
        steps = dict(total=trainer.config.train.max_steps, initial=trainer.step)
        self.bar = self.open.enter_context(tqdm(**steps, disable=not shown, **style))
        self.open.enter_context(logging_redirect_tqdm(loggers=[logging.root]))

    def on_step(self, trainer, result: StepResult, window: dict | None) -> None:
        if window is not None:
            loss, tps = window["train_loss"], window["tokens_per_sec"]
            said = f"loss {loss:.4f} lr {result.lr:.2e} {tps / 1000:.1f}k tok/s"
            self.bar.set_postfix_str(said, refresh=False)
        self.bar.update(1)

    def on_step_end(self, trainer) -> None:
        if trainer.final:  # the bar goes before the run's last lines
            self.close()

    def close(self) -> None:
        self.open.close()


def default_listeners() -> list[Listener]:
    """What a run shows, in the order each event reaches them (the bar last: it opens after the
    step-0 analysis and closes after the last one)."""
    tensorboard = TensorBoard()
    return [tensorboard, HeadAnalysis(tensorboard), Samples(tensorboard), ProgressBar()]
