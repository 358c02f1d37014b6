"""The training loop: `train(cfg)` builds a `Trainer` (from train.state's set-up steps: the
machine, the data, the model; then its own state, a resume's taken back from last.pt) and runs
it: `train_step`, evaluation and checkpoints, each point of the loop an event its listeners hear
(train.listeners: TensorBoard, the head analysis, samples, the progress bar); it returns the final
metrics.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time

import torch
from omegaconf import OmegaConf

from microgpt import runs, system
from microgpt.checkpoint import Checkpoint
from microgpt.config import Config, ConfigError, load_config
from microgpt.train import state
from microgpt.train.listeners import Listener, default_listeners
from microgpt.train.loss import LossWindow, StepResult, eval_rows, evaluate, rank_batch
from microgpt.train.optim import WeightAverage, fit_warmup, lr_at, make_optimizer
from microgpt.train.stopping import Interrupted, StopFlag, TrainingError, diverged
from microgpt.train.threads import measured_threads

log = logging.getLogger("microgpt")
HUGE_WEIGHT = 1e4  # a weight beyond it (or not finite) marks the group that diverged

__all__ = ["Interrupted", "Trainer", "TrainingError", "train"]


class Trainer:
    """One training run. Built from a validated Config; `run()` returns the final metrics. Its
    loop's events reach rank 0's `listeners` (train.listeners.Listener; append one to hear them)."""

    def __init__(self, config: Config):
        self.device, self.threads, self.dist, self.out_dir = state.machine(config)
        self.folder = runs.RunFolder(self.out_dir)  # where each of the run's files lies
        # before the data: the checkpoint a resume continues (a missing run fails fast); the
        # folder is claimed in run() (_open_run_folder), and the notes said once it is
        _, self.resume_path = runs.resolve_resume(config.resume, self.out_dir)
        self.notes: list[str] = []
        if self.resume_path is None:
            # a new run's warmup fitted to its length; a resume keeps its checkpoint's (fitted
            # when the run began): an exact resume
            config, line = fit_warmup(config)
            self.notes += [line] if line else []
        self.config, self.data = c, data = state.load(config, self.device)
        self.tokenizer, self.datasets = data.tokenizer, data.datasets
        # the checkpoint names the data by their content's hash too
        self.data_sha256 = data.sha256()
        self.probe_ids = data.probe_ids(c.log.probe)  # a DataError names log.probe
        built = state.build_model(c, data, self.device, self.dist)
        self.model_config, self.model, self.train_model = built
        self.optimizer = make_optimizer(self.model, c, self.device)
        self.ema = WeightAverage(self.model, c.train.ema) if c.train.ema > 0 else None
        # what is evaluated, sampled and kept as best.pt: the averaged weights, if any
        self.eval_model = self.ema.model if self.ema is not None else self.model
        self.precision = system.pick_precision(c.train.precision, self.device, ConfigError)
        # fp16 needs its gradients scaled (and the scale adapted); its state resumes exactly
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.threads_from = system.threads_origin(c.threads, self.threads, os.environ)
        # threads=auto on a CPU of several cores (no OMP_NUM_THREADS, no torchrun): measured
        auto = c.threads == "auto" and system.env_threads(os.environ) is None
        if auto and self.threads > 1 and self.device.type == "cpu" and not self.dist.enabled:
            self.threads, line = measured_threads(self, self.threads)
            self.notes.append(line)
            self.threads_from = "threads=auto measured it the fastest"
        # the training batches: the global batch's order, each process taking its share
        self.global_batch = c.train.batch_size * self.dist.world_size
        self.batches = data.train_batches(self.global_batch, c.seed, pack=c.train.pack)
        # metrics: the last of each figure (a resume's from last.pt); run_id: set at the claim
        self.step, self.best_val_loss, self.metrics, self.run_id = 0, math.inf, {}, None
        self.window = LossWindow()
        if self.resume_path is not None:
            self._resume()
        self.listeners: list[Listener] = default_listeners() if self.dist.is_main else []

    def _resume(self) -> None:
        """The state of last.pt (resume_path) taken back: weights, optimizer, sampler, averaged
        weights, scaler, RNG, loss window, step, best score, metrics and run id. Each rank takes
        its own RNG and loss window where the world size is the checkpoint's, else rank 0's RNG."""
        # on the CPU: RNG states must stay CPU byte tensors; the weights and the optimizer's
        # state are copied to the device by load_state_dict
        ckpt = Checkpoint.load(self.resume_path, map_location="cpu")
        ckpt.check_resumable(self.checkpoint({}), self.global_batch, self.dist.world_size)
        r, c = ckpt.resume, self.config
        self.model.load_state_dict(ckpt.model)
        self.optimizer.load_state_dict(r["optimizer"])
        self.batches.load_state_dict(r["sampler"])
        if self.ema is not None and r.get("ema") is not None:
            self.ema.load_state_dict(r["ema"])
        if r.get("scaler"):
            self.scaler.load_state_dict(r["scaler"])
        per_rank = r.get("ranks") or []
        mine = per_rank[self.dist.rank] if len(per_rank) == self.dist.world_size else r
        state.set_rng_state(mine["rng"])
        self.window = LossWindow(mine.get("window"))
        self.best_val_loss, self.step, self.run_id = r["best_val_loss"], ckpt.step, ckpt.run_id
        self.metrics = {k: v for k, v in ckpt.metrics.items() if k != "interrupted_at"}
        was = ckpt.train_config["train"]["max_steps"]
        if was != c.train.max_steps and c.optim.decay != "constant":  # said once claimed
            self.notes.append(
                f"train.max_steps={c.train.max_steps} on a run of {was} steps: the {c.optim.decay} "
                f"schedule now spans {c.train.max_steps} steps, as a run started with it would; "
                f"the learning rate goes from {lr_at(self.step - 1, c, was):.3g} at step "
                f"{self.step} to {lr_at(self.step, c):.3g}"
            )

    @property
    def final(self) -> bool:
        """Whether the last step is done."""
        return self.step == self.config.train.max_steps

    def emit(self, event: str, *args) -> None:
        """Each listener's `event` (a Listener method), in order."""
        for listener in self.listeners:
            getattr(listener, event)(self, *args)

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
        batch = rank_batch(self.batches, self.dist, c.train.batch_size, c.train.pack)
        x, y, starts, weight, targets = batch  # (B, T) each, (B, T) or None
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
        """The steps left, then best.pt tested; the listeners closed however it ends."""
        try:
            system.run_on_main(self._open_run_folder, self.dist)
            start, tokens_done, other_work = time.perf_counter(), 0, 0.0
            self.window.start_clock()  # throughput counts training alone, not the set-up
            with StopFlag() as stop:
                self.model.train()
                while self.step < self.config.train.max_steps:
                    out, spent = self.loop_step(stop)
                    tokens_done, other_work = tokens_done + out.tokens, other_work + spent
            # what `train` returns (every rank): the last metrics, the run's size and its
            # throughput (training alone: the seconds spent evaluating and saving left out)
            elapsed, metrics = time.perf_counter() - start, self.metrics
            metrics.update(step=self.step, params=self.model.num_params(), elapsed_s=elapsed)
            metrics.update(global_batch=self.global_batch, run_dir=str(self.out_dir))
            metrics["tokens_per_sec"] = tokens_done / max(elapsed - other_work, 1e-9)
            system.run_on_main(self._finish, self.dist)
            return metrics
        finally:
            for listener in self.listeners:
                listener.close()

    def loop_step(self, stop: StopFlag) -> tuple[StepResult, float]:
        """One step of the loop: train_step and the train loss window (on_step), then what is due
        after it (evaluation and last.pt, a snapshot; on_step_end); (the step's result, the
        seconds of that other work)."""
        c, metrics = self.config, self.metrics
        # off the CPU, float() waits for the GPU: check and agree on stopping every log_every steps
        check_every = 1 if self.device.type == "cpu" else c.train.log_every
        out = self.train_step(check=(self.step + 1) % check_every == 0)
        self.window.add(out)
        window = self._end_window() if self.step % c.train.log_every == 0 or self.final else None
        metrics.update(window or {})
        self.emit("on_step", out, window)
        # evaluation, checkpoints and the head analysis are not training: their time is left
        # out of tokens_per_sec (on a GPU, _end_window's float() just synced)
        busy = time.perf_counter()
        stop.at_once = self.final  # after the last step a signal stops the final work at once
        if self.step % c.train.eval_every == 0 or self.final:  # rank 0 evaluates; all ranks save
            metrics.update(system.run_on_main(self._evaluate, self.dist) or {})
            self._save_last(metrics)
        if c.train.save_every and self.step % c.train.save_every == 0:
            snapshot = self.folder.snapshot(self.step)  # the (averaged) weights, no optimizer
            system.run_on_main(lambda: self._save(metrics, snapshot, self.eval_model), self.dist)
        self.emit("on_step_end")
        spent = time.perf_counter() - busy
        self.window.paused += spent
        due = not self.final and self.step % check_every == 0  # a collective: every rank or none
        if due and system.over_ranks(stop.requested, "max", self.dist):
            self._save_last({**metrics, "interrupted_at": self.step})
            raise Interrupted(stop.signal_name, self.step, c.train.max_steps, self.folder.last)
        return out, spent

    def _open_run_folder(self) -> None:
        """Claim, lock and write the run folder (runs.open_run), say what the run is (rank 0)."""
        config_yaml = OmegaConf.to_yaml(OmegaConf.structured(self.config))
        args = (self.resume_path, self.run_id, self.step)
        self.run_id = runs.open_run(self.out_dir, config_yaml, *args)
        log.info(self.describe())
        log.info(f"run folder: {self.out_dir.resolve()}")
        if self.resume_path is not None:
            log.info(f"resumed from {self.resume_path} at step {self.step}")
        for line in self.notes:
            log.warning(line)
        self.emit("on_start")

    # ---- checkpoints: the trainer's, not a listener's, since last.pt gathers every rank's RNG and
    # loss window (listeners run on rank 0 alone) and a stop saves it from inside the loop; best.pt
    # and the snapshots stay beside it: one writer of the run's checkpoints, heard as on_saved

    def checkpoint(self, metrics: dict, model=None, resume=None) -> Checkpoint:
        """The run's checkpoint at its step: `model`'s weights (default: self.model) and all that
        describes them; `resume`: last.pt's resume state."""
        saved = dict(model=(model or self.model).state_dict(), step=self.step, run_id=self.run_id)
        saved.update(model_config=self.model_config.to_dict(), tokenizer=self.tokenizer.to_dict())
        saved.update(train_config=self.config.to_dict(), split=self.data.record(), resume=resume)
        return Checkpoint(**saved, metrics=dict(metrics), data_sha256=self.data_sha256)

    def _save(self, metrics: dict, path, model=None, resume=None) -> None:
        """self.checkpoint(...) to `path`; on_saved."""
        self.checkpoint(metrics, model, resume).save(path)
        self.emit("on_saved", path)

    def _save_last(self, metrics: dict) -> None:
        """last.pt with what an exact resume needs; every rank calls it (each rank's RNG and loss
        window gathered; rank 0's RNG: what a resume on another number of ranks uses)."""
        mine = {"rng": state.rng_state(), "window": self.window.state_dict()}
        ranks = system.gather_objects(mine, self.dist)
        ema = self.ema.state_dict() if self.ema is not None else None
        resume = {"optimizer": self.optimizer.state_dict(), "sampler": self.batches.state_dict()}
        resume.update(scaler=self.scaler.state_dict(), ema=ema, rng=ranks[0]["rng"], ranks=ranks)
        resume.update(best_val_loss=self.best_val_loss, world_size=self.dist.world_size)
        system.run_on_main(lambda: self._save(metrics, self.folder.last, None, resume), self.dist)

    # ---- evaluation, what rank 0 says

    def _evaluate(self) -> dict:
        """Validation loss (a large split estimated while the run trains), on_evaluated, best.pt
        if it improved, the log line (rank 0)."""
        c, val, final, metrics = self.config, self.datasets["val"], self.final, self.metrics
        # best.pt is chosen on the same rows every time: a large split's estimate (eval_rows)
        score = evaluate(self.eval_model, val, c.train.eval_batch_size, self.autocast, True)
        rows, val_loss = len(eval_rows(val, True)), score
        if final and rows < len(val):  # the last evaluation reads the whole split
            val_loss = evaluate(self.eval_model, val, c.train.eval_batch_size, self.autocast)
        # off the CPU the train loss is checked every log_every steps
        if not math.isfinite(val_loss):
            rate = self._diverging_rate(lr_at(self.step - 1, c))
            raise diverged(self.step, val_loss, math.nan, rate, self.folder.last, "validation loss")
        # best_val_loss: the best score; the final one, or _finish, makes it exact
        improved = score < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, score)
        best = val_loss if final and improved else self.best_val_loss
        out = {"val_loss": val_loss, "best_val_loss": best, "step": self.step}
        self.emit("on_evaluated", out)
        if improved:
            self._save({**metrics, **out}, self.folder.best, self.eval_model)
        train_part = f", train loss {metrics['train_loss']:.4f}" if "train_loss" in metrics else ""
        part = ""  # an estimate says what it read: evenly spaced rows, the same every time
        if rows < len(val) and not final:
            part = (f"; val loss estimated on {rows:,} of the {len(val):,} validation rows, evenly"
                    f" spaced (the last evaluation reads all)")  # fmt: skip
        log.info(f"step {self.step}: val loss {val_loss:.4f} (best {best:.4f}){train_part}{part}")
        return out

    def _end_window(self) -> dict:
        """The window's train loss, summed over ranks, and throughput; a new window."""
        w = self.window
        # each rank's loss is weighted to the global mean times the world size (train_step)
        loss = system.over_ranks(float(w.loss), "sum", self.dist) / w.steps / self.dist.world_size
        tps = w.tokens_per_sec(time.perf_counter())  # after float(): the device has caught up
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
            f"{self.device}{precision}{compiled}, {threads} thread{'s' if threads > 1 else ''} "
            f"({self.threads_from})"
        )

    def _finish(self) -> None:
        """After the last step (rank 0): the test loss of best.pt's weights (as makemore reports
        it; eval_model's where there is no best.pt) into the metrics and best.pt, with, where
        best.pt was chosen on an estimate, its whole-split validation loss; a line; on_finished."""
        metrics, batch, val = self.metrics, self.config.train.eval_batch_size, self.datasets["val"]
        best_path = self.folder.best
        best = Checkpoint.load(best_path, map_location="cpu") if best_path.exists() else None
        model = best.build_model(self.device)[0] if best is not None else self.eval_model
        test = evaluate(model, self.datasets["test"], batch, self.autocast)
        metrics["test_loss"] = test  # a single figure: the Text and HParams tabs
        if best is not None and best.step < self.step and len(eval_rows(val, True)) < len(val):
            # best.pt was chosen on an estimate (_evaluate): its exact loss
            exact = evaluate(model, val, batch, self.autocast)
            metrics["best_val_loss"] = best.metrics["best_val_loss"] = exact
            best.metrics["val_loss"] = exact
        if best is not None:
            best.metrics["test_loss"] = test
            best.save(best_path)
        best_val = metrics.get("best_val_loss", math.nan)
        log.info(
            f"test loss {test:.4f} nats/char ({test / math.log(2):.3f} bits; best val "
            f"{best_val:.4f}) after {self.step} steps in {metrics['elapsed_s']:.1f} s"
        )
        self.emit("on_finished", metrics, model)


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
            # the lock goes with the run; after an error, what it made stays known for clean-up
            runs.release(trainer.out_dir, forget=ended)
        # the DDP model (its reducer holds the process group) freed here, before the group goes:
        # freed later by the garbage collector, a rank hung at exit now and then under load
        trainer = None
        gc.collect()
        system.teardown()
