"""The set-up steps a Trainer is built from, each returning values (none reaches into a trainer):
the machine, the data and the model (`machine`, `load`, `build_model`, in this order); the random
state a checkpoint keeps and a resume restores (`rng_state`, `set_rng_state`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from microgpt import system
from microgpt.config import Config, ConfigError, check_training_memory
from microgpt.data.dataset import Data, load_data
from microgpt.model import GPT, GPTConfig


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
