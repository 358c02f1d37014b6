"""The training loop: data, model, AdamW with warmup and decay, evaluation, checkpoints, logging.

`train(cfg)` takes a composed config (a DictConfig from Hydra, a dict, or a `Config`), runs, and
returns the final metrics. Everything a run writes goes under `cfg.out_dir`:

    config.yaml               the resolved config
    events.out.tfevents.*     TensorBoard: scalars, per-head attention maps, samples, hparams
    checkpoints/best.pt       the best validation loss so far
    checkpoints/last.pt       the latest state, with what an exact resume needs
    samples.txt               the names sampled at the end, marked new or found in a split
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from omegaconf import OmegaConf
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from microgpt import distributed
from microgpt.checkpoint import (CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint,
                                 unwrap_model)
from microgpt.config import Config, ConfigError, load_config
from microgpt.files import pick_device, write_text
from microgpt.data import BatchSampler, CharDataset, DataError, Split, block_size_for, read_items, split_items
from microgpt.model import GPT
from microgpt.sampling import format_marked, mark_items, sample_items
from microgpt.tokenizer import CharTokenizer

log = logging.getLogger("microgpt")

# Settings that may differ when a run is resumed; every other setting must match the checkpoint's.
RESUMABLE_CHANGES = ("train.max_steps", "train.eval_every", "train.eval_batch_size", "train.log_every",
                     "train.num_samples", "train.progress", "train.compile", "train.amp", "log.", "device",
                     "out_dir", "resume")


class TrainingError(RuntimeError):
    """The run cannot go on (diverged, interrupted); the message says what to do."""


class Interrupted(TrainingError):
    """Stopped by SIGINT/SIGTERM after writing last.pt (`checkpoint`), from which the run can resume."""

    def __init__(self, message: str, checkpoint: Path):
        super().__init__(message)
        self.checkpoint = checkpoint


# ----------------------------------------------------------------------------- set-up


def resolve_data_path(path: str) -> Path:
    """A relative path is tried from the working directory, then from the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    repo_root = Path(__file__).resolve().parent.parent
    return repo_root / p if (repo_root / p).exists() else p


def make_optimizer(model: nn.Module, config: Config, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (Linear weights, embeddings) only, never on biases or norm gains."""
    o = config.optim
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                             fused=device.type in ("cuda", "cpu"))  # fused: one kernel for all parameters


def lr_at(step: int, config: Config) -> float:
    """Linear warmup over warmup_steps, then cosine / linear decay to min_lr_ratio * lr at max_steps."""
    o, total = config.optim, config.train.max_steps
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.decay == "constant" or total <= o.warmup_steps:
        return o.lr
    progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if o.decay == "cosine" else 1 - progress
    return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * shape)


@torch.no_grad()
def evaluate(model: nn.Module, dataset: CharDataset, batch_size: int, autocast=contextlib.nullcontext) -> float:
    """Mean negative log-likelihood per character in nats (end token included) over the whole split."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for x, y in dataset.iter_batches(batch_size):
        n = int((y >= 0).sum())
        with autocast():
            _, loss = model(x, y)
        total += loss.double().cpu() * n
        count += n
    model.train(was_training)
    return float(total / count)


# ----------------------------------------------------------------------------- signals


class StopFlag:
    """The first SIGINT/SIGTERM asks the loop to stop after the current step; a second SIGINT stops at once."""

    def __init__(self):
        self.requested = False
        self.signal_name = ""
        self._previous = {}

    def __enter__(self):
        if _in_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        if self.requested:  # the second one: checkpoint writes are atomic, so stopping here is safe
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(f"\n{self.signal_name}: stopping after this step and writing checkpoints/last.pt "
              f"(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------- RNG state


def rng_state() -> dict:
    version, state, gauss = random.getstate()
    out = {"torch": torch.get_rng_state(), "python": {"version": version, "state": list(state), "gauss": gauss}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- the run


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume_compatible(saved: dict, current: dict, path: Path) -> None:
    """Refuse to resume when a setting outside RESUMABLE_CHANGES differs from the checkpoint's."""
    a, b = _flatten(saved), _flatten(current)
    def may_change(key: str) -> bool:
        return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE_CHANGES)

    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not may_change(k))
    if differing:
        details = ", ".join(f"{k}: {a.get(k)!r} in the checkpoint, {b.get(k)!r} now" for k in differing)
        raise ConfigError(
            f"cannot resume from {path}: settings differ from the checkpoint's ({details}). Resume with the "
            f"checkpoint's settings (only {', '.join(r.rstrip('.') for r in RESUMABLE_CHANGES)} may change), "
            f"or start a new run without resume"
        )


def _resume_path(config: Config, out_dir: Path) -> Path | None:
    if config.resume is False or config.resume in ("false", "False"):
        return None
    if config.resume is True or config.resume in ("true", "True"):
        path = out_dir / "checkpoints" / "last.pt"
        if not path.exists():
            raise CheckpointError(
                f"resume=true but there is no run to resume: {path} does not exist (from the command line, "
                f"resume=true continues the newest run under outputs/ or multirun/); pass resume=PATH to a "
                f"checkpoint, or start a new run without resume"
            )
        return path
    return Path(config.resume).expanduser()


class Trainer:
    """One training run. Built from a validated Config; `run()` returns the final metrics."""

    def __init__(self, config: Config):
        self.config = config
        c = config
        self.out_dir = Path(c.out_dir).expanduser()
        self.device = pick_device(c.device, ConfigError)
        self.dist = distributed.setup(self.device.type)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", distributed.cuda_index(self.dist))
        self.is_main = self.dist.is_main
        if self.dist.enabled:  # rank 0's folder is the run's, even where another node's Hydra made its own
            own, self.out_dir = self.out_dir, Path(distributed.broadcast_from_main(str(self.out_dir), self.dist))
            if own.resolve() != self.out_dir.resolve():
                with contextlib.suppress(OSError):
                    own.rmdir()  # empty: non-zero ranks write nothing there (see microgpt.cli.register)
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32

        self.resume_path = _resume_path(c, self.out_dir)  # checked before the data: a missing run fails fast
        if self.resume_path is None and (self.out_dir / "checkpoints" / "last.pt").exists():
            # two runs started in the same second share Hydra's folder; never overwrite another run
            raise ConfigError(
                f"{self.out_dir} already holds a run (checkpoints/last.pt); continue it with resume=true, "
                f"or write the new run to another folder"
            )

        # data: items -> tokenizer (all items' characters) -> split -> padded tensors on the device
        path = resolve_data_path(c.data.path)
        items = read_items(path)
        self.data_path = path
        self.tokenizer = CharTokenizer.from_items(items)
        longest = block_size_for(items)
        block_size = c.model.block_size or longest
        if longest > block_size:
            too_long = next(s for s in items if len(s) + 1 > block_size)
            raise DataError(
                f"{path}: item {too_long!r} has {len(too_long)} characters but model.block_size={block_size} "
                f"fits at most {block_size - 1}; raise model.block_size to at least {longest} or set it to null "
                f"(the longest item + 1)"
            )
        self.split = split_items(items, c.seed)
        trim = not c.train.compile  # compiled graphs want fixed shapes
        self.datasets = {name: CharDataset.from_items(getattr(self.split, name), self.tokenizer, block_size,
                                                      device=self.device, trim=trim)
                         for name in ("train", "val", "test")}
        self.probe = c.log.probe if c.log.probe is not None else self.split.val[0]
        try:
            self.tokenizer.check(self.probe, what="log.probe")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if len(self.probe) + 1 > block_size:
            raise ConfigError(f"log.probe={self.probe!r} is longer than block_size-1={block_size - 1} characters")

        # model and optimizer
        torch.manual_seed(c.seed)
        random.seed(c.seed)
        self.model_config = c.gpt_config(self.tokenizer.vocab_size, block_size)
        self.model = GPT(self.model_config).to(self.device)
        # DDP first, then compile: the order PyTorch documents (the compiler splits the graph at
        # DDP's gradient buckets). Checkpoints always hold self.model, the plain GPT.
        self.train_model: nn.Module = self.model
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_model = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if c.train.compile:
            self.train_model = torch.compile(self.train_model)
        self.optimizer = make_optimizer(self.model, c, self.device)
        self.use_amp = c.train.amp and self.device.type == "cuda"
        self.global_batch = c.train.batch_size * self.dist.world_size
        self.sampler = BatchSampler(len(self.datasets["train"]), self.global_batch, c.seed,
                                    lengths=self.datasets["train"].lengths, group_by_length=c.train.group_by_length)
        self.step = 0
        self.best_val_loss = math.inf
        self.history: dict[str, float] = {}
        self.resumed_from: Path | None = None

        if self.resume_path is not None:
            self._load_resume(self.resume_path)
        self.writer = None

    # ---- helpers

    def autocast(self):
        if self.use_amp:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _checkpoint(self, metrics: dict, with_resume_state: bool) -> dict:
        ckpt = {
            "model": unwrap_model(self.model).state_dict(),
            "model_config": self.model_config.to_dict(),
            "tokenizer": self.tokenizer.to_dict(),
            "train_config": self.config.to_dict(),
            "step": self.step,
            "metrics": dict(metrics),
            "split": self.split.to_dict(),
        }
        if with_resume_state:
            ckpt["resume"] = {
                "optimizer": self.optimizer.state_dict(),
                "sampler": self.sampler.state_dict(),
                "rng": rng_state(),
                "best_val_loss": self.best_val_loss,
                "world_size": self.dist.world_size,
            }
        return ckpt

    def _load_resume(self, path: Path) -> None:
        ckpt = load_checkpoint(path, map_location=self.device)
        if "resume" not in ckpt:
            raise CheckpointError(f"{path} has no training state to resume from (best.pt holds weights only); "
                                  f"resume from checkpoints/last.pt")
        check_resume_compatible(ckpt["train_config"], self.config.to_dict(), path)
        if ckpt["model_config"] != self.model_config.to_dict():
            differing = sorted(k for k in ckpt["model_config"] if ckpt["model_config"][k] != self.model_config.to_dict().get(k))
            raise ConfigError(f"cannot resume from {path}: the model differs in {', '.join(differing)}")
        if Split.from_dict(ckpt["split"]) != self.split or CharTokenizer.from_dict(ckpt["tokenizer"]) != self.tokenizer:
            raise ConfigError(f"cannot resume from {path}: {self.data_path} no longer holds the data the run "
                              f"was trained on (different items or split); restore it or start a new run")
        if ckpt["step"] >= self.config.train.max_steps:
            raise ConfigError(f"nothing to resume: {path} is at step {ckpt['step']} and train.max_steps="
                              f"{self.config.train.max_steps}; pass a larger train.max_steps to train on")
        self.model.load_state_dict(ckpt["model"])
        r = ckpt["resume"]
        if r["sampler"]["batch_size"] != self.global_batch:  # the data order is drawn per global batch
            ranks = r.get("world_size", 1)
            raise ConfigError(
                f"cannot resume from {path}: it was trained with a global batch of {r['sampler']['batch_size']} "
                f"({ranks} rank{'s' if ranks != 1 else ''}) but this run's is {self.global_batch} (train.batch_size="
                f"{self.config.train.batch_size} x {self.dist.world_size} ranks); resume on {ranks} rank(s)"
            )
        self.optimizer.load_state_dict(r["optimizer"])
        self.sampler.load_state_dict(r["sampler"])
        set_rng_state(r["rng"])
        self.best_val_loss = r["best_val_loss"]
        self.step = ckpt["step"]
        self.history = {k: v for k, v in ckpt["metrics"].items() if k != "interrupted_at"}
        self.resumed_from = path

    def _save(self, name: str, metrics: dict, with_resume_state: bool) -> None:
        if self.is_main:
            save_checkpoint(self._checkpoint(metrics, with_resume_state), self.out_dir / "checkpoints" / name)

    def summary(self) -> str:
        c, m = self.config, self.model_config
        s = self.split
        return (
            f"model {c.model.name}: {m.n_layer} layers, n_embd {m.n_embd}, {m.n_head} heads"
            f"{f' ({m.n_kv_head} kv heads)' if m.n_kv_head != m.n_head else ''}, attn {m.attn_impl}, "
            f"{self.model.num_params():,} parameters | data {self.data_path}: {len(s.train):,} train / "
            f"{len(s.val):,} val / {len(s.test):,} test items, vocab {self.tokenizer.vocab_size}, block {m.block_size} | "
            f"{c.train.max_steps} steps x batch {self.global_batch}"
            f"{f' ({c.train.batch_size} x {self.dist.world_size} ranks)' if self.dist.enabled else ''}, "
            f"lr {c.optim.lr:g} ({c.optim.warmup_steps} warmup, {c.optim.decay}) | device {self.device}"
            f"{' bf16' if self.use_amp else ''}{' compiled' if c.train.compile else ''} | seed {c.seed}"
        )

    def _log_attention(self, step: int) -> None:
        """Per-head attention maps of the probe item and per-head entropy on validation items."""
        from microgpt.tensorboard import attention_entropy, labels_for

        model = self.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            ids = [self.tokenizer.boundary_id, *self.tokenizer.encode(self.probe)]
            x = torch.tensor([ids], device=self.device)
            _, _, attention = model(x, return_attn=True)
            self.writer.attention_maps(step, [a[0].float().cpu() for a in attention], labels_for(ids, self.tokenizer))
            val = self.datasets["val"]
            n = min(len(val), self.config.log.entropy_items)
            xv, yv = val.batch(torch.arange(n))
            _, _, attention = model(xv, return_attn=True)
            self.writer.attention_entropy(step, attention_entropy([a.float().cpu() for a in attention], (yv >= 0).cpu()))
        model.train(was_training)

    def _samples(self, n: int, seed: int) -> list[tuple[str, str]]:
        names = sample_items(self.model, self.tokenizer, n, seed=seed)
        return mark_items(names, self.split)

    # ---- the loop

    def run(self) -> dict:
        c = self.config
        if self.is_main:
            from microgpt.tensorboard import TensorBoardLogger

            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.resumed_from is None:  # claim the folder: a run started in the same second stops here
                try:
                    (self.out_dir / "checkpoints").mkdir()
                except FileExistsError:
                    raise ConfigError(
                        f"{self.out_dir} already holds a run (a checkpoints folder); continue it with "
                        f"resume=true, or write the new run to another folder"
                    ) from None
            # a resume keeps the run's config.yaml and writes its own beside it
            name = "config.yaml" if self.resumed_from is None else f"config.resume-step{self.step}.yaml"
            write_text(self.out_dir / name, OmegaConf.to_yaml(OmegaConf.structured(c)))
            log.info(self.summary())
            log.info(f"run folder: {self.out_dir.resolve()}")
            if self.resumed_from is not None:
                log.info(f"resumed from {self.resumed_from} at step {self.step}")
            # the checkpoint holds step k's state, so points up to k stand; later ones (written after
            # the checkpoint by a run that was killed) are dropped and written again from k + 1
            self.writer = TensorBoardLogger(self.out_dir, purge_step=self.step + 1 if self.resumed_from else None)
            if self.step == 0:
                self._log_attention(0)

        progress = c.train.progress if c.train.progress is not None else sys.stderr.isatty()
        bar = tqdm(total=c.train.max_steps, initial=self.step, disable=not (progress and self.is_main),
                   dynamic_ncols=True, leave=False, file=sys.stderr)
        start = time.perf_counter()
        metrics: dict = dict(self.history)
        window = {"loss": 0.0, "steps": 0, "tokens": 0, "time": time.perf_counter()}
        check_every = 1 if self.device.type == "cpu" else c.train.log_every
        max_norm = c.optim.grad_clip if c.optim.grad_clip > 0 else math.inf
        lengths = self.datasets["train"].lengths
        tokens_done = 0
        try:
            with StopFlag() as stop, logging_redirect_tqdm(loggers=[logging.root]):
                self.model.train()
                while self.step < c.train.max_steps:
                    lr = lr_at(self.step, c)
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                    idx = self.sampler.next_batch()  # (global batch,) indices, the same on every rank
                    n_global = int((lengths[idx] + 1).sum())  # target characters in the global batch
                    mine = idx[self.dist.rank * c.train.batch_size:(self.dist.rank + 1) * c.train.batch_size]
                    x, y = self.datasets["train"].batch(mine)
                    n_mine = int((lengths[mine] + 1).sum())
                    with self.autocast():
                        _, loss = self.train_model(x, y)
                    # the mean over the global batch's characters, whatever their split between ranks
                    # (DDP averages gradients over ranks, hence the world_size factor)
                    scaled = loss * (n_mine * self.dist.world_size / n_global)
                    scaled.backward()
                    share = loss.detach() * (n_mine / n_global)  # summed over ranks: the global batch's loss
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
                    # off the CPU, float() waits for the GPU: only every log_every steps. grad_norm is
                    # computed from the all-reduced gradients, so every rank decides alike (a non-finite
                    # loss on one rank makes the gradients, and so grad_norm, non-finite on all)
                    if (self.step + 1) % check_every == 0:
                        bad = not math.isfinite(float(grad_norm)) or (
                            not self.dist.enabled and not math.isfinite(float(loss.detach())))
                        if bad:
                            self._diverged(float(loss.detach()), float(grad_norm), lr)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.step += 1
                    tokens_done += n_global
                    window["loss"] = window["loss"] + share  # a tensor: no wait for the GPU here
                    window["steps"] += 1
                    window["tokens"] += n_global
                    if self.step % c.train.log_every == 0 or self.step == c.train.max_steps:
                        window["loss"] = distributed.sum_over_ranks(float(window["loss"]), self.dist)
                        now = time.perf_counter()  # after float(): the GPU has caught up
                        tps = window["tokens"] / max(now - window["time"], 1e-9)
                        train_loss = window["loss"] / window["steps"]
                        metrics.update(train_loss=train_loss, tokens_per_sec=tps)
                        if self.is_main:
                            self.writer.scalars(self.step, {"loss/train": train_loss, "lr": lr,
                                                            "grad_norm": float(grad_norm), "tokens_per_sec": tps})
                            bar.set_postfix_str(f"loss {train_loss:.4f} lr {lr:.2e} {tps / 1000:.1f}k tok/s", refresh=False)
                        window = {"loss": 0.0, "steps": 0, "tokens": 0, "time": now}
                    bar.update(1)
                    final = self.step == c.train.max_steps
                    if self.step % c.train.eval_every == 0 or final:
                        metrics.update(self._evaluate_and_save(metrics))
                    if self.is_main and (self.step % c.log.attn_every == 0 or final):
                        self._log_attention(self.step)
                    # ranks agree on stopping through an all-reduce, which on GPUs waits for the
                    # step: there only every log_every steps (a signal stops within log_every steps)
                    ask = not self.dist.enabled or check_every == 1 or self.step % c.train.log_every == 0
                    if ask and distributed.any_rank(stop.requested, self.dist) and not final:
                        self._save("last.pt", {**metrics, "interrupted_at": self.step}, with_resume_state=True)
                        last = self.out_dir / "checkpoints" / "last.pt"
                        raise Interrupted(
                            f"{stop.signal_name or 'signal'} received: stopped at step {self.step} of "
                            f"{c.train.max_steps} and wrote {last}; to continue, run again with the same "
                            f"settings and resume={last}", checkpoint=last)
        finally:
            bar.close()
        elapsed = time.perf_counter() - start
        return self._finish(metrics, elapsed, tokens_done)

    def _diverged(self, loss: float, grad_norm: float, lr: float, what: str = "") -> None:
        last = self.out_dir / "checkpoints" / "last.pt"
        kept = f"the last good checkpoint, {last}, is kept" if last.exists() else "no checkpoint was written yet"
        what = what or ("loss" if not math.isfinite(loss) else "gradient")
        step = self.step if what == "validation loss" else self.step + 1
        raise TrainingError(
            f"non-finite {what} at step {step} "
            f"(loss {loss}, grad norm {grad_norm}, lr {lr:.3g}): the run diverged and was stopped; {kept}. "
            f"Try a lower optim.lr, gradient clipping (optim.grad_clip=1.0) or a longer optim.warmup_steps"
        )

    def _evaluate_and_save(self, metrics: dict) -> dict:
        """Validation loss on the whole split; best.pt if it improved; last.pt always (rank 0)."""
        if not self.is_main:
            return {}
        val_loss = evaluate(self.model, self.datasets["val"], self.config.train.eval_batch_size, self.autocast)
        if not math.isfinite(val_loss):  # off the CPU the loss is checked every log_every steps only
            self._diverged(val_loss, math.nan, lr_at(self.step - 1, self.config), what="validation loss")
        improved = val_loss < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, val_loss)
        out = {"val_loss": val_loss, "best_val_loss": self.best_val_loss, "step": self.step}
        self.writer.scalars(self.step, {"loss/val": val_loss})
        marked = self._samples(10, seed=self.config.seed + self.step)
        self.writer.samples(self.step, format_marked(marked))
        if improved:
            self._save("best.pt", {**metrics, **out}, with_resume_state=False)
        self._save("last.pt", {**metrics, **out}, with_resume_state=True)
        self.writer.flush()
        train_part = f", train loss {metrics['train_loss']:.4f}" if "train_loss" in metrics else ""
        log.info(f"step {self.step}: val loss {val_loss:.4f} (best {self.best_val_loss:.4f}){train_part}")
        return out

    def _finish(self, metrics: dict, elapsed: float, tokens_done: int) -> dict:
        c = self.config
        metrics = {**metrics, "step": self.step, "params": self.model.num_params(), "elapsed_s": elapsed,
                   "global_batch": self.global_batch, "run_dir": str(self.out_dir)}
        if elapsed > 0 and tokens_done:
            metrics["tokens_per_sec"] = tokens_done / elapsed
        if self.is_main:
            # test loss of the best checkpoint's weights, as makemore reports it
            best_path = self.out_dir / "checkpoints" / "best.pt"
            model, best = self.model, None
            if best_path.exists():
                best = load_checkpoint(best_path, map_location="cpu")
                model, _ = model_from_checkpoint(best, device=self.device, path=best_path)
            metrics["test_loss"] = evaluate(model, self.datasets["test"], c.train.eval_batch_size, self.autocast)
            self.writer.scalars(self.step, {"loss/test": metrics["test_loss"]})
            if best is not None:  # best.pt gains the test loss
                best["metrics"]["test_loss"] = metrics["test_loss"]
                save_checkpoint(best, best_path)
            lines = []
            if c.train.num_samples:
                marked = mark_items(sample_items(model, self.tokenizer, c.train.num_samples, seed=c.seed), self.split)
                lines = format_marked(marked)
                write_text(self.out_dir / "samples.txt", "\n".join(lines) + "\n")
                metrics["samples"] = [name for name, _ in marked]
            m = self.model_config
            hparams = {"heads": m.n_head, "kv_heads": m.n_kv_head, "n_layer": m.n_layer, "n_embd": m.n_embd,
                       "params": metrics["params"], "model": c.model.name, "attn_impl": m.attn_impl,
                       "batch_size": self.global_batch, "lr": c.optim.lr, "max_steps": c.train.max_steps,
                       "dropout": m.dropout, "seed": c.seed}
            final = {f"hparams/{k}": metrics[k] for k in ("best_val_loss", "val_loss", "test_loss") if k in metrics}
            self.writer.hparams(hparams, final, step=self.step)
            self.writer.close()
            log.info(f"test loss {metrics['test_loss']:.4f} (best val {metrics.get('best_val_loss', math.nan):.4f}) "
                     f"after {self.step} steps in {elapsed:.1f} s")
            if lines:
                log.info("samples:\n" + "\n".join(lines))
        return metrics


def train(cfg) -> dict:
    """Train from a composed config (DictConfig, dict or Config) and return the final metrics."""
    config = load_config(cfg)
    trainer = None
    try:
        trainer = Trainer(config)
        metrics = trainer.run()
        # rank 0 still evaluates and writes after the last step: a rank that left the process group
        # meanwhile would abort gloo ("terminate called without an active exception")
        distributed.barrier()
        return metrics
    finally:
        if trainer is not None and trainer.writer is not None:
            trainer.writer.close()
        distributed.teardown()
