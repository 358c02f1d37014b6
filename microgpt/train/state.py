"""What a Trainer holds, outside its loop: the machine, the data and the model it is built from
(`machine`, `load`, `build_model`, in this order), the checkpoints it writes (`checkpoint`, with
last.pt's `resume_state`), how a resume takes last.pt back (`load_resume`, the RNG included) and
best.pt's test (`tested_best`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from microgpt import system
from microgpt.checkpoint import Checkpoint
from microgpt.config import Config, ConfigError, check_training_memory
from microgpt.data.dataset import Data, load_data
from microgpt.model import GPT, GPTConfig
from microgpt.train.loss import LossWindow, eval_rows, evaluate
from microgpt.train.optim import lr_at
from microgpt.train.threads import measured_threads


def machine(c: Config) -> tuple[torch.device, int, system.DistInfo, Path]:
    """The device, CPU threads and, under torchrun, the process group; the run's folder (rank
    0's, even where another node made its own)."""
    device = system.pick_device(c.device, ConfigError)
    threads = system.set_threads(c.threads)  # before any work: see microgpt/system.py
    dist, device = system.setup(device)
    own = Path(c.out_dir).expanduser()
    out_dir = Path(system.broadcast_from_main(str(own), dist))
    if own.resolve() != out_dir.resolve():
        with contextlib.suppress(OSError):
            own.rmdir()  # empty: non-zero ranks write nothing there (see microgpt.cli)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32
    return device, threads, dist, out_dir


def measure_threads(t) -> str | None:
    """threads=auto on a CPU of several cores (no OMP_NUM_THREADS, no torchrun): the count its
    step runs fastest at, measured (microgpt.train.threads); the line that says so."""
    auto = t.config.threads == "auto" and system.env_threads(os.environ) is None
    if not auto or t.threads < 2 or t.device.type != "cpu" or t.dist.enabled:
        return None
    t.threads, line = measured_threads(t, t.threads)
    return line


def load(c: Config, device: torch.device) -> tuple[Config, Data]:
    """The data, encoded on the device, and the config naming them by their absolute path."""
    # compiled graphs want fixed shapes: no trimming of batches to their longest item
    d, trim = c.data, not c.train.compile
    data = load_data(d, c.model.block_size, device, trim)
    resolved = dataclasses.replace(d, path=str(Path(data.path).resolve()))
    return dataclasses.replace(c, data=resolved), data


def build_model(c: Config, data: Data, device, dist) -> tuple[GPTConfig, GPT, nn.Module]:
    """The GPT (seeded) and what trains it: wrapped in DDP, then torch.compile, as PyTorch
    documents (checkpoints hold the GPT itself)."""
    torch.manual_seed(c.seed)
    model_config = c.model_for_data(data.tokenizer.vocab_size, data.block_size)
    # once, with the data's sizes (the start-up checks ran it with lower bounds before the data)
    check_training_memory(c, device, data.tokenizer.vocab_size, data.block_size)
    model = GPT(model_config).to(device)
    train_model: nn.Module = model
    if dist.enabled:
        ids = [device.index] if device.type == "cuda" else None
        train_model = DDP(model, device_ids=ids)
        torch.manual_seed(c.seed + dist.rank)  # each rank its own dropout stream
    if c.train.compile:
        train_model = torch.compile(train_model)
    return model_config, model, train_model


def checkpoint(t, metrics: dict, model: nn.Module | None = None, resume=None) -> Checkpoint:
    """The Trainer t's checkpoint at its step: `model`'s weights (default: t.model) and all that
    describes them; `resume`: last.pt's resume state."""
    state = dict(model=(model or t.model).state_dict(), step=t.step, metrics=dict(metrics))
    state.update(model_config=t.model_config.to_dict(), tokenizer=t.tokenizer.to_dict())
    state.update(train_config=t.config.to_dict(), split=t.data.record(), run_id=t.run_id)
    return Checkpoint(**state, data_sha256=t.data_sha256, resume=resume)


def resume_state(t) -> dict:
    """What last.pt adds to a checkpoint for an exact resume; every rank calls it (each rank's RNG
    and loss window)."""
    mine = {"rng": rng_state(), "window": t.window.state_dict()}
    ranks = system.gather_objects(mine, t.dist)
    ema = t.ema.state_dict() if t.ema is not None else None
    resume = {"optimizer": t.optimizer.state_dict(), "sampler": t.batches.state_dict()}
    # rng: rank 0's, what a resume on another number of ranks uses
    resume.update(scaler=t.scaler.state_dict(), ema=ema, rng=ranks[0]["rng"], ranks=ranks)
    return {**resume, "best_val_loss": t.best_val_loss, "world_size": t.dist.world_size}


def load_resume(t) -> None:
    """The state of last.pt (t.resume_path) into the Trainer t; each rank takes its own RNG and
    loss window where the world size is the checkpoint's, else rank 0's RNG."""
    # on the CPU: RNG states must stay CPU byte tensors; the weights and the optimizer's
    # state are copied to the device by load_state_dict
    ckpt = Checkpoint.load(t.resume_path, map_location="cpu")
    ckpt.check_resumable(checkpoint(t, {}), t.global_batch, t.dist.world_size)
    r = ckpt.resume
    t.model.load_state_dict(ckpt.model)
    t.optimizer.load_state_dict(r["optimizer"])
    t.batches.load_state_dict(r["sampler"])
    if t.ema is not None and r.get("ema") is not None:
        t.ema.load_state_dict(r["ema"])
    if r.get("scaler"):
        t.scaler.load_state_dict(r["scaler"])
    per_rank = r.get("ranks") or []
    mine = per_rank[t.dist.rank] if len(per_rank) == t.dist.world_size else r
    set_rng_state(mine["rng"])
    t.window = LossWindow(mine.get("window"))
    t.best_val_loss, t.step = r["best_val_loss"], ckpt.step
    t.history = {k: v for k, v in ckpt.metrics.items() if k != "interrupted_at"}
    was, c = ckpt.train_config["train"]["max_steps"], t.config
    if was != c.train.max_steps and c.optim.decay != "constant":  # said once claimed
        t.notes.append(
            f"train.max_steps={c.train.max_steps} on a run of {was} steps: the {c.optim.decay} "
            f"schedule now spans {c.train.max_steps} steps, as a run started with it would; "
            f"the learning rate goes from {lr_at(t.step - 1, c, was):.3g} at step "
            f"{t.step} to {lr_at(t.step, c):.3g}"
        )
    t.run_id = ckpt.run_id


def tested_best(t, metrics: dict) -> nn.Module:
    """The test loss of best.pt's weights (as makemore reports it), into metrics and best.pt,
    with, where best.pt was chosen on an estimate, its whole-split validation loss; the model
    tested (t.eval_model where there is no best.pt)."""
    c, best_path = t.config, t.folder.best
    best = Checkpoint.load(best_path, map_location="cpu") if best_path.exists() else None
    model = best.build_model(t.device)[0] if best is not None else t.eval_model
    test = evaluate(model, t.datasets["test"], c.train.eval_batch_size, t.autocast)
    metrics["test_loss"] = test  # a single figure: the Text and HParams tabs
    val = t.datasets["val"]
    if best is not None and best.step < t.step and len(eval_rows(val, True)) < len(val):
        # best.pt was chosen on an estimate (Trainer._evaluate): its exact loss
        exact = evaluate(model, val, c.train.eval_batch_size, t.autocast)
        metrics["best_val_loss"] = best.metrics["best_val_loss"] = exact
        best.metrics["val_loss"] = exact
    if best is not None:
        best.metrics["test_loss"] = test
        best.save(best_path)
    return model


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
