"""The training loop: `train(cfg)` builds a `Trainer` (device, data, model, optimizer, resume
state), runs it (`train_step`, evaluation, checkpoints, logging) and returns the final metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from microgpt import runs, system
from microgpt.checkpoint import Checkpoint
from microgpt.config import Config, ConfigError, check_training_memory, load_config
from microgpt.data.dataset import load_data
from microgpt.files import write_text
from microgpt.heads.analyse import analyse, probe_attention
from microgpt.model import GPT
from microgpt.sample.report import sample_for_run
from microgpt.tokenizer import BOUNDARY_ID
from microgpt.train.loss import LossWindow, StepResult, eval_rows, evaluate
from microgpt.train.optim import WeightAverage, fit_warmup, lr_at, make_optimizer
from microgpt.train.stopping import Interrupted, StopFlag, TrainingError, diverged
from microgpt.viz.tensorboard import TRAIN_LOSS, VAL_LOSS, TensorBoardLogger

log = logging.getLogger("microgpt")
HUGE_WEIGHT = 1e4  # a weight beyond it (or not finite) marks the group that diverged

__all__ = ["Interrupted", "Trainer", "TrainingError", "train"]


class Trainer:
    """One training run. Built from a validated Config; `run()` returns the final metrics."""

    def __init__(self, config: Config):
        self.config = config
        self._setup_system()
        # before the data: the checkpoint a resume continues (a missing run fails fast); the
        # folder is claimed in run() (_open_run_folder), and the notes said once it is
        _, self.resume_path = runs.resolve_resume(config.resume, self.out_dir)
        self.notes: list[str] = []
        if self.resume_path is None:
            # a new run's warmup fitted to its length; a resume keeps its checkpoint's (fitted
            # when the run began): an exact resume
            self.config, line = fit_warmup(self.config)
            self.notes += [line] if line else []
        self._setup_data()
        self._build_model()
        # the training batches: the global batch's order, each process taking its share
        c = self.config
        self.global_batch = c.train.batch_size * self.dist.world_size
        self.batches = self.data.train_batches(self.global_batch, c.seed, pack=c.train.pack)
        self.step, self.best_val_loss, self.history = 0, math.inf, {}
        self.window, self.run_id = LossWindow(), None  # run_id: set at the claim (rank 0)
        if self.resume_path is not None:
            self._load_resume()
        self.writer: TensorBoardLogger | None = None

    # ---- set-up, in this order (each step reads what the ones before it set)

    def _setup_system(self) -> None:
        """The device, CPU threads and, under torchrun, the process group and rank 0's folder."""
        c = self.config
        self.device = system.pick_device(c.device, ConfigError)
        self.threads = system.set_threads(c.threads)  # before any work: see microgpt/system.py
        self.dist, self.device = system.setup(self.device)
        self.is_main = self.dist.is_main
        # rank 0's folder is the run's, even where another node made its own
        own = Path(c.out_dir).expanduser()
        self.out_dir = Path(system.broadcast_from_main(str(own), self.dist))
        if own.resolve() != self.out_dir.resolve():
            with contextlib.suppress(OSError):
                own.rmdir()  # empty: non-zero ranks write nothing there (see microgpt.cli)
        self.folder = runs.RunFolder(self.out_dir)  # where each of the run's files lies
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32

    def _setup_data(self) -> None:
        """The data, encoded on the device; the config then names it by its absolute path."""
        c = self.config
        check_training_memory(c, self.device)  # before the data are encoded: lower bounds
        # compiled graphs want fixed shapes: no trimming of batches to their longest item
        d, trim = c.data, not c.train.compile
        self.data = data = load_data(d, c.model.block_size, self.device, trim)
        self.tokenizer, self.datasets = data.tokenizer, data.datasets
        # the checkpoint names the data by one absolute path, and its content's hash
        resolved = dataclasses.replace(d, path=str(Path(data.path).resolve()))
        self.config = dataclasses.replace(c, data=resolved)
        self.data_sha256 = data.sha256()
        self.probe_ids = data.probe_ids(c.log.probe)  # a DataError names log.probe

    def _build_model(self) -> None:
        """The GPT (seeded); what trains it wraps it in DDP, then torch.compile, as PyTorch
        documents (checkpoints hold self.model); AdamW or Muon, the weight average (train.ema),
        the precision and fp16's gradient scaler."""
        c = self.config
        torch.manual_seed(c.seed)
        self.model_config = c.model_for_data(self.tokenizer.vocab_size, self.data.block_size)
        check_training_memory(c, self.device, self.tokenizer.vocab_size, self.data.block_size)
        self.model = GPT(self.model_config).to(self.device)
        self.train_model: nn.Module = self.model
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DDP(self.model, device_ids=ids)
            torch.manual_seed(c.seed + self.dist.rank)  # each rank its own dropout stream
        if c.train.compile:
            self.train_model = torch.compile(self.train_model)
        self.optimizer = make_optimizer(self.model, c, self.device)
        self.ema = WeightAverage(self.model, c.train.ema) if c.train.ema > 0 else None
        # what is evaluated, sampled and kept as best.pt: the averaged weights, if any
        self.eval_model = self.ema.model if self.ema is not None else self.model
        self.precision = system.pick_precision(c.train.precision, self.device, ConfigError)
        # fp16 needs its gradients scaled (and the scale adapted); its state resumes exactly
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def _finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether a step may go on: a finite gradient norm (under fp16 an overflow is normal: the
        scaler skips the step and lowers the scale) and loss. Under DDP the norm alone decides:
        it comes from the all-reduced gradients, the same on every rank."""
        grad_ok = self.scaler.is_enabled() or math.isfinite(float(grad_norm))
        return grad_ok and (self.dist.enabled or math.isfinite(float(loss.detach())))

    def autocast(self, training: bool = False):
        """The precision's autocast (system.autocast); evaluation on a CPU runs in float32, so
        that the losses reported are the weights' own on a CPU with bf16 or without."""
        evaluating_on_cpu = not training and self.device.type == "cpu"
        return system.autocast(self.device, "fp32" if evaluating_on_cpu else self.precision)

    # ---- one step

    def train_step(self, check: bool = True) -> StepResult:
        """One optimisation step on this rank's share of the next global batch. check=False skips
        checking the loss and gradient norm are finite (a device sync)."""
        c = self.config
        lr = lr_at(self.step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_ratio", 1.0)
        # this rank's (x, y) of the next global batch, (B, T) each; its mean loss weighted to the
        # global batch's mean over its targets (whatever their split between ranks) times the world
        # size, as DDP averages gradients over ranks: a weight of 1 on one process
        x, y, n_mine, targets = self.batches.next(self.dist.rank, c.train.batch_size)
        weight = n_mine * self.dist.world_size / targets
        # packed rows: each item starts at a boundary token
        starts = x == BOUNDARY_ID if c.train.pack else None
        with self.autocast(training=True):
            _, loss = self.train_model(x, y, doc_starts=starts)
        self.scaler.scale(loss * weight).backward()
        self.scaler.unscale_(self.optimizer)  # clip the true gradients (no-op unless fp16)
        max_norm = c.optim.grad_clip or math.inf  # 0: no clipping, the norm alone
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if check and not self._finite(loss, grad_norm):
            loss, norm = float(loss.detach()), float(grad_norm)
            raise diverged(self.step + 1, loss, norm, self._diverging_rate(lr), self.folder.last)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model, self.step)
        self.step += 1
        return StepResult(loss.detach() * weight, grad_norm, lr, targets)

    def _diverging_rate(self, lr: float) -> str:
        """The rate setting of the parameter groups whose weights blew up (Muon's:
        optim.muon_lr), else of every group, with its value at this step (`lr` on the schedule)."""
        o, groups = self.config.optim, self.optimizer.param_groups
        # a healthy model's weights are O(1); a diverging group's are huge or not finite
        broken = [g for g in groups if not all(p.abs().max() < HUGE_WEIGHT for p in g["params"])]
        names = dict.fromkeys("muon_lr" if g.get("muon") else "lr" for g in broken or groups)
        # each group's rate at this step: the schedule's lr times its setting's share of optim.lr
        rates = {name: getattr(o, name) for name in names}
        said = [f"optim.{n}={v:g} ({lr * v / o.lr:.3g} at this step)" for n, v in rates.items()]
        return " or ".join(said)

    # ---- the loop

    def run(self) -> dict:
        max_steps = self.config.train.max_steps
        system.run_on_main(self._open_run_folder, self.dist)
        start, tokens_done, other_work = time.perf_counter(), 0, 0.0
        self.window.start_clock()  # throughput counts training alone, not the set-up
        metrics: dict = dict(self.history)
        # tqdm on stderr, rank 0 only; train.progress=null: only when stderr is a terminal
        progress = self.config.train.progress
        shown = self.is_main and (progress if progress is not None else sys.stderr.isatty())
        style = dict(dynamic_ncols=True, leave=False, file=sys.stderr)
        bar = tqdm(total=max_steps, initial=self.step, disable=not shown, **style)
        with bar, StopFlag() as stop, logging_redirect_tqdm(loggers=[logging.root]):
            self.model.train()
            while self.step < max_steps:
                out, spent = self.loop_step(metrics, bar, stop)
                tokens_done, other_work = tokens_done + out.tokens, other_work + spent
        # what `train` returns (every rank): the last metrics, the run's size and its throughput
        # (training alone: the seconds spent evaluating and saving left out, as logged)
        elapsed = time.perf_counter() - start
        metrics.update(step=self.step, params=self.model.num_params(), elapsed_s=elapsed)
        metrics.update(global_batch=self.global_batch, run_dir=str(self.out_dir))
        metrics["tokens_per_sec"] = tokens_done / max(elapsed - other_work, 1e-9)
        system.run_on_main(lambda: self._finish(metrics), self.dist)
        return metrics

    def loop_step(self, metrics: dict, bar, stop: StopFlag) -> tuple[StepResult, float]:
        """One step of the loop: train_step, the train loss window and its log line, then what is
        due after it (evaluation and last.pt, a snapshot, the head analysis); (the step's result,
        the seconds of that other work)."""
        c, max_steps = self.config, self.config.train.max_steps
        # off the CPU, float() waits for the GPU: check and agree on stopping every log_every steps
        check_every = 1 if self.device.type == "cpu" else c.train.log_every
        out = self.train_step(check=(self.step + 1) % check_every == 0)
        self.window.add(out)
        final = self.step == max_steps
        if self.step % c.train.log_every == 0 or final:
            metrics.update(self._log_window(out, bar))
        bar.update(1)
        # evaluation, checkpoints and the head analysis are not training: their time is left
        # out of tokens_per_sec (on a GPU, log_window's float() just synced)
        busy = time.perf_counter()
        stop.at_once = final  # after the last step a signal stops the final evaluation at once
        if self.step % c.train.eval_every == 0 or final:  # rank 0 evaluates; every rank saves
            metrics.update(system.run_on_main(lambda: self._evaluate(metrics), self.dist) or {})
            self._save_last(metrics)
            if self.is_main:
                self.writer.flush()
        if c.train.save_every and self.step % c.train.save_every == 0:
            system.run_on_main(lambda: self._save_snapshot(metrics), self.dist)
        if self.is_main and (self.step % c.log.attn_every == 0 or final):
            self._log_heads(self.step)
        spent = time.perf_counter() - busy
        self.window.paused += spent
        due = not final and self.step % check_every == 0  # a collective: every rank or none
        if due and system.over_ranks(stop.requested, "max", self.dist):
            self._save_last({**metrics, "interrupted_at": self.step})
            raise Interrupted(stop.signal_name, self.step, max_steps, self.folder.last)
        return out, spent

    def _open_run_folder(self) -> None:
        """Claim, lock and write the run folder (runs.open_run), say what the run is, open
        TensorBoard (rank 0)."""
        config_yaml = OmegaConf.to_yaml(OmegaConf.structured(self.config))
        args = (self.resume_path, self.run_id, self.step)
        self.run_id = runs.open_run(self.out_dir, config_yaml, *args)
        log.info(self.describe())
        log.info(f"run folder: {self.out_dir.resolve()}")
        if self.resume_path is not None:
            log.info(f"resumed from {self.resume_path} at step {self.step}")
        for line in self.notes:
            log.warning(line)
        # the checkpoint holds step k's state, so points up to k stand; later ones (written after
        # the checkpoint by a run that was killed) are dropped and written again from k + 1
        purge = self.step + 1 if self.resume_path else None
        self.writer = TensorBoardLogger(self.out_dir, purge_step=purge)
        if self.step == 0:
            self._log_heads(0)

    # ---- evaluation, checkpoints, logging

    def _checkpoint(self, metrics: dict, model: nn.Module | None = None, resume=None) -> Checkpoint:
        weights = (model or self.model).state_dict()
        state = dict(model=weights, step=self.step, metrics=dict(metrics), run_id=self.run_id)
        state.update(model_config=self.model_config.to_dict(), tokenizer=self.tokenizer.to_dict())
        state.update(train_config=self.config.to_dict(), split=self.data.record())
        return Checkpoint(**state, data_sha256=self.data_sha256, resume=resume)

    def _save_snapshot(self, metrics: dict) -> None:
        """checkpoints/step-NNNNNN.pt: the (averaged) weights and what describes them, no
        optimizer: for sample.py ckpt= and python -m microgpt.heads at this step."""
        self._checkpoint(metrics, self.eval_model).save(self.folder.snapshot(self.step))

    def _save_last(self, metrics: dict) -> None:
        """last.pt with the resume state; every rank calls it (each rank's RNG and loss window)."""
        mine = {"rng": rng_state(), "window": self.window.state_dict()}
        ranks = system.gather_objects(mine, self.dist)
        ema = self.ema.state_dict() if self.ema is not None else None
        resume = {"optimizer": self.optimizer.state_dict(), "sampler": self.batches.state_dict()}
        # rng: rank 0's, what a resume on another number of ranks uses
        resume.update(scaler=self.scaler.state_dict(), ema=ema, rng=ranks[0]["rng"], ranks=ranks)
        resume.update(best_val_loss=self.best_val_loss, world_size=self.dist.world_size)
        system.run_on_main(
            lambda: self._checkpoint(metrics, resume=resume).save(self.folder.last), self.dist
        )

    def _load_resume(self) -> None:
        """The state of last.pt (resume_path); each rank takes its own RNG and loss window where
        the world size is the checkpoint's, else rank 0's RNG."""
        # on the CPU: RNG states must stay CPU byte tensors; the weights and the optimizer's
        # state are copied to the device by load_state_dict
        ckpt = Checkpoint.load(self.resume_path, map_location="cpu")
        ckpt.check_resumable(self._checkpoint({}), self.global_batch, self.dist.world_size)
        r = ckpt.resume
        self.model.load_state_dict(ckpt.model)
        self.optimizer.load_state_dict(r["optimizer"])
        self.batches.load_state_dict(r["sampler"])
        if self.ema is not None and r.get("ema") is not None:
            self.ema.load_state_dict(r["ema"])
        if r.get("scaler"):
            self.scaler.load_state_dict(r["scaler"])
        per_rank = r.get("ranks") or []
        mine = per_rank[self.dist.rank] if len(per_rank) == self.dist.world_size else r
        set_rng_state(mine["rng"])
        self.window = LossWindow(mine.get("window"))
        self.best_val_loss, self.step = r["best_val_loss"], ckpt.step
        self.history = {k: v for k, v in ckpt.metrics.items() if k != "interrupted_at"}
        was, c = ckpt.train_config["train"]["max_steps"], self.config
        if was != c.train.max_steps and c.optim.decay != "constant":  # said once claimed
            self.notes.append(
                f"train.max_steps={c.train.max_steps} on a run of {was} steps: the {c.optim.decay} "
                f"schedule now spans {c.train.max_steps} steps, as a run started with it would; "
                f"the learning rate goes from {lr_at(self.step - 1, c, was):.3g} at step "
                f"{self.step} to {lr_at(self.step, c):.3g}"
            )
        self.run_id = ckpt.run_id  # None: written before run ids existed

    def _log_heads(self, step: int) -> None:
        """The probe's attention maps and the head analysis on validation items (rank 0): light
        while the run trains, whole at its end."""
        c, val = self.config, self.datasets["val"]
        x, y = val.batch(torch.arange(min(len(val), c.log.head_items)))  # (N, T)
        maps = probe_attention(self.eval_model, self.probe_ids)
        self.writer.attention_maps(step, maps, self.tokenizer.labels(self.probe_ids))
        light, boundary = step < c.train.max_steps, self.data.boundary
        report = analyse(self.eval_model, x, y, self.tokenizer, light=light, boundary=boundary)
        self.writer.heads(step, report)

    def _evaluate(self, metrics: dict) -> dict:
        """Validation loss (a large split estimated while the run trains), its log line and
        samples; best.pt if it improved (rank 0)."""
        c, val, final = self.config, self.datasets["val"], self.step == self.config.train.max_steps
        # best.pt is chosen on the same rows every time: a large split's estimate (eval_rows)
        score = evaluate(self.eval_model, val, c.train.eval_batch_size, self.autocast, True)
        rows, val_loss = len(eval_rows(val, True)), score
        if final and rows < len(val):  # the last evaluation reads the whole split
            val_loss = evaluate(self.eval_model, val, c.train.eval_batch_size, self.autocast)
        # off the CPU the train loss is checked every log_every steps
        if not math.isfinite(val_loss):
            rate = self._diverging_rate(lr_at(self.step - 1, c))
            raise diverged(self.step, val_loss, math.nan, rate, self.folder.last, "validation loss")
        # best_val_loss: the best score; the final one, or _test_best_checkpoint, makes it exact
        improved = score < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, score)
        best = val_loss if final and improved else self.best_val_loss
        out = {"val_loss": val_loss, "best_val_loss": best, "step": self.step}
        self.writer.scalars(self.step, {VAL_LOSS: val_loss})
        shown = sample_for_run(self.eval_model, self.data, None, seed=c.seed + self.step)
        self.writer.samples(self.step, shown.lines)
        if improved:
            self._checkpoint({**metrics, **out}, self.eval_model).save(self.folder.best)
        train_part = f", train loss {metrics['train_loss']:.4f}" if "train_loss" in metrics else ""
        part = ""  # an estimate says what it read: evenly spaced rows, the same every time
        if rows < len(val) and not final:
            part = (f"; val loss estimated on {rows:,} of the {len(val):,} validation rows, evenly"
                    f" spaced (the last evaluation reads all)")  # fmt: skip
        log.info(f"step {self.step}: val loss {val_loss:.4f} (best {best:.4f}){train_part}{part}")
        return out

    # ---- what rank 0 tells about the run: the bar, the train loss, the summary, the end

    def _log_window(self, out: StepResult, bar: tqdm) -> dict:
        """The window's train loss, summed over ranks; scalars and the bar (rank 0); a new
        window."""
        w = self.window
        # each rank's loss is weighted to the global mean times the world size (train_step)
        loss = system.over_ranks(float(w.loss), "sum", self.dist) / w.steps / self.dist.world_size
        tps = w.tokens_per_sec(time.perf_counter())  # after float(): the device has caught up
        if self.is_main:
            scalars = {TRAIN_LOSS: loss, "lr": out.lr, "train/grad_norm": float(out.grad_norm)}
            self.writer.scalars(self.step, {**scalars, "tokens_per_sec": tps})
            shown = f"loss {loss:.4f} lr {out.lr:.2e} {tps / 1000:.1f}k tok/s"
            bar.set_postfix_str(shown, refresh=False)
        self.window = LossWindow()
        return {"train_loss": loss, "tokens_per_sec": tps}

    def describe(self) -> str:
        """Three short lines: the model, the data, the recipe and the machine."""
        c, m, threads, world = self.config, self.model_config, self.threads, self.dist.world_size
        precision = "" if self.precision == "fp32" else f" {self.precision}"
        ranks = f" ({c.train.batch_size} x {world} ranks)" if self.dist.enabled else ""
        compiled = " compiled" if c.train.compile else ""
        split = f", split seed {c.data.split_seed}" if self.data.split.seeded else ""
        return (
            f"model {m.name}: {m.n_layer} layers, n_embd {m.n_embd}, "
            f"{m.n_head} head{'s' if m.n_head != 1 else ''} "
            f"({m.attn_impl}), {self.model.num_params():,} parameters\n"
            f"data {self.data.source} ({c.data.format}): {self.data.split.describe()}, vocab "
            f"{self.tokenizer.vocab_size}, block {m.block_size}{split}\n"
            f"train {c.train.max_steps} steps x batch {self.global_batch}{ranks}, lr "
            f"{c.optim.lr:g} ({c.optim.warmup_steps} warmup, {c.optim.decay}), seed {c.seed} | "
            f"{self.device}"
            f"{precision}{compiled}, {threads} thread{'s' if threads > 1 else ''}"
        )

    def _test_best_checkpoint(self, metrics: dict) -> nn.Module:
        """The test loss of best.pt's weights (as makemore reports it), written into best.pt with,
        where it was chosen on an estimate, its whole-split validation loss; the model tested."""
        c, best_path = self.config, self.folder.best
        best = Checkpoint.load(best_path, map_location="cpu") if best_path.exists() else None
        model = best.build_model(self.device)[0] if best is not None else self.eval_model
        test = evaluate(model, self.datasets["test"], c.train.eval_batch_size, self.autocast)
        metrics["test_loss"] = test  # a single figure: the Text and HParams tabs (_finish)
        val = self.datasets["val"]
        if best is not None and best.step < self.step and len(eval_rows(val, True)) < len(val):
            # best.pt was chosen on an estimate (_evaluate): its exact loss
            exact = evaluate(model, val, c.train.eval_batch_size, self.autocast)
            metrics["best_val_loss"] = best.metrics["best_val_loss"] = exact
            best.metrics["val_loss"] = exact
        if best is not None:
            best.metrics["test_loss"] = test
            best.save(best_path)
        return model

    def _finish(self, metrics: dict) -> None:
        """After the last step (rank 0): best.pt tested, the HParams row, the test loss line,
        samples.txt."""
        c = self.config
        model = self._test_best_checkpoint(metrics)
        # three columns, so that the HParams tab shows the metrics beside them (config.yaml: the
        # rest); the seed: runs that differ only by it sort together, and filter by it
        hparams = dict(heads=self.model_config.n_head, seed=c.seed, params=metrics["params"])
        results = {k: metrics[k] for k in ("best_val_loss", "test_loss") if k in metrics}
        self.writer.hparams(hparams, results, step=self.step)
        self.writer.close()
        test, best_val = metrics["test_loss"], metrics.get("best_val_loss", math.nan)
        log.info(
            f"test loss {test:.4f} nats/char ({test / math.log(2):.3f} bits; best val "
            f"{best_val:.4f}) after {self.step} steps in {metrics['elapsed_s']:.1f} s"
        )
        if c.train.num_samples:
            shown = sample_for_run(model, self.data, c.train.num_samples, seed=c.seed)
            write_text(self.out_dir / "samples.txt", "\n".join(shown.lines) + "\n")
            metrics["samples"] = shown.items
            log.info("samples:\n" + "\n".join(shown.lines))


def rng_state() -> dict:
    """This process's random state: torch's on the CPU, and CUDA's where it is in use (nothing
    in training draws from Python's `random`: the data split has its own `random.Random`)."""
    out = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict) -> None:
    """Restore rng_state()'s result (from a checkpoint loaded to any device): RNG states are CPU
    byte tensors, wherever torch.load's map_location put them."""
    torch.set_rng_state(state["torch"].detach().to("cpu", torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.detach().to("cpu", torch.uint8) for t in state["cuda"]])


def train(cfg) -> dict:
    """Train from a composed config (DictConfig, dict or Config) and return the final metrics."""
    trainer, ended = None, False
    try:
        trainer = Trainer(load_config(cfg))
        metrics = trainer.run()
        # rank 0 still evaluates and writes after the last step: a rank that left the process
        # group meanwhile would abort gloo ("terminate called without an active exception")
        system.barrier()
        ended = True
        return metrics
    finally:
        if trainer is not None:
            if trainer.writer is not None:
                trainer.writer.close()
            # the lock goes with the run; after an error, what it made stays known for clean-up
            runs.release(trainer.out_dir, forget=ended)
        system.teardown()
