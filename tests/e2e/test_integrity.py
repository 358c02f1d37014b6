"""Checkpoints prove their integrity: a checksum of everything in them is written with them and
checked at load, and a save that fails (a full or read-only disk) says which checkpoint is whole
and how to resume from it."""

from __future__ import annotations

import errno

import pytest
import torch

from microgpt import checkpoint as ckpt_module
from microgpt.checkpoint import Checkpoint, CheckpointError, checksum
from microgpt.model import GPT, GPTConfig

CONFIG = {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 4, "block_size": 8}


def _checkpoint() -> Checkpoint:
    g = torch.Generator().manual_seed(0)
    shapes = GPT(GPTConfig(**CONFIG)).state_dict()  # the weights its config gives (checked)
    return Checkpoint(
        model={k: torch.randn(t.shape, generator=g) for k, t in shapes.items()},
        model_config=CONFIG,
        tokenizer={"chars": "abc"},
        step=7,
        metrics={"val_loss": 2.5},
    )


def test_a_checkpoint_loads_back_whole_with_its_checksum(tmp_path):
    path = _checkpoint().save(tmp_path / "best.pt")
    raw = torch.load(path, weights_only=True)
    assert raw["checksum"].startswith("sha256:") and len(raw["checksum"]) == 71
    loaded = Checkpoint.load(path)
    assert all(torch.equal(t, _checkpoint().model[k]) for k, t in loaded.model.items())
    assert loaded.step == 7 and loaded.resume is None and "resume" not in raw


def test_a_checkpoint_saved_as_a_plain_dict_with_its_checksum_loads(tmp_path):
    """The layout on disk: format, version, the fields and the checksum, as written before the
    typed Checkpoint existed."""
    old = {"format": "microgpt-checkpoint", "version": 1, "run_id": "r1", "split": None}
    old.update({k: v for k, v in _checkpoint().to_dict().items() if k not in old})
    old["checksum"] = checksum(old)
    torch.save(old, tmp_path / "old.pt")
    loaded = Checkpoint.load(tmp_path / "old.pt")
    assert loaded.run_id == "r1" and loaded.metrics == {"val_loss": 2.5}
    assert loaded.to_dict().keys() == old.keys() - {"checksum"}


def test_a_checkpoint_written_before_checksums_still_loads(tmp_path):
    path = tmp_path / "old.pt"
    fields = {k: v for k, v in _checkpoint().to_dict().items() if v is not None}
    torch.save({"format": "microgpt-checkpoint", "version": 1, **fields}, path)
    assert Checkpoint.load(path).step == 7


def test_a_failed_first_save_says_no_checkpoint_of_the_run_is_whole(tmp_path, monkeypatch):
    """(A failed save beside an earlier checkpoint: tests/test_checkpoint.py.)"""

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_module, "atomic_write", full_disk)
    with pytest.raises(CheckpointError, match="no checkpoint of this run was written yet"):
        _checkpoint().save(tmp_path / "run" / "checkpoints" / "best.pt")
