"""Save (atomically) and load (safely) a self-describing checkpoint.

A checkpoint is a dict of plain containers and tensors only, so it loads with
`torch.load(weights_only=True)` and nothing in it can run code:

    format, version     "microgpt-checkpoint", 1
    model               the plain module's state_dict (no `_orig_mod.` / `module.` prefixes)
    model_config        GPTConfig as a dict
    tokenizer           CharTokenizer as a dict
    train_config        the resolved training config as a dict
    step, metrics       the step it was written at, and {val_loss, best_val_loss, ...}
    split               {"train": [...], "val": [...], "test": [...]}: the items of each split
    resume              (last.pt) optimizer, schedule position, RNG states and data order

Writing goes to a temporary file in the same folder, which is flushed, fsynced and then moved
over the old file with os.replace: a process killed at any moment leaves the previous
checkpoint whole.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch
import torch.nn as nn

from microgpt.files import atomic_write
from microgpt.model import GPT, GPTConfig
from microgpt.tokenizer import CharTokenizer

FORMAT = "microgpt-checkpoint"
VERSION = 1
REQUIRED_KEYS = ("model", "model_config", "tokenizer")
ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain GPT inside a torch.compile and/or DistributedDataParallel wrapper."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):  # DDP
            model = model.module
        else:
            return model


def save_checkpoint(checkpoint: dict, path: str | os.PathLike) -> Path:
    """Write `checkpoint` to `path` atomically: temporary file, flush, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        torch.save({"format": FORMAT, "version": VERSION, **checkpoint}, f)
    return path


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load a microgpt checkpoint with torch.load(weights_only=True); CheckpointError if unusable."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a file (use run=FOLDER to pick a run)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): it was never written completely")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != ZIP_MAGIC:  # torch.save writes a zip archive; anything else is not ours and is never unpickled
        raise CheckpointError(f"{path} is not a microgpt checkpoint (not a file written by torch.save)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "not allowed" in str(e):
            raise CheckpointError(
                f"refused to load {path}: it holds Python objects that could run code when unpickled; "
                f"microgpt checkpoints hold plain data only, so this file is not one (or was tampered with)"
            ) from None
        raise CheckpointError(f"{path} is not a readable checkpoint ({_first_line(e)})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"{path} is truncated or corrupt and cannot be read ({_first_line(e)}); "
            f"use another checkpoint (best.pt or last.pt of the run)"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or any(k not in ckpt for k in REQUIRED_KEYS):
        raise CheckpointError(f"{path} is not a microgpt checkpoint (no {FORMAT!r} format marker or model)")
    if ckpt.get("version", 0) > VERSION:
        raise CheckpointError(
            f"{path} was written by a newer microgpt (checkpoint version {ckpt['version']} > {VERSION}); upgrade"
        )
    return ckpt


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0].split(". ")[0][:200] if text else type(e).__name__  # the first sentence


def model_from_checkpoint(ckpt: dict, device="cpu", path: str | os.PathLike = "checkpoint") -> tuple[GPT, CharTokenizer]:
    """Rebuild the model (in eval mode, on `device`) and its tokenizer from a loaded checkpoint."""
    try:
        config = GPTConfig(**ckpt["model_config"])
        tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"])
        model = GPT(config)
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"{path} holds a model that cannot be rebuilt: {_first_line(e)}") from None
    return model.to(device).eval(), tokenizer
