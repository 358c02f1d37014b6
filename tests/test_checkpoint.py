"""A loaded checkpoint is checked against its schema: every field's type and range, once, at load;
a file that fails names the field."""

import os
import re
import signal

import pytest
import torch

from microgpt.checkpoint import Checkpoint, CheckpointError, checksum
from microgpt.config import Config
from microgpt.model import GPT, GPTConfig

MODEL = dict(vocab_size=5, block_size=4, n_layer=1, n_embd=8, n_head=2)


def saved(tmp_path, **changes):
    """A small valid checkpoint's dict with `changes`, written with a matching checksum."""
    config, split = GPTConfig(**MODEL), {"train": ["ab"], "val": ["c"], "test": ["d"]}
    model, tokenizer = GPT(config).state_dict(), {"chars": "abcd", "boundary_id": 0}
    ckpt = Checkpoint(model, config.to_dict(), tokenizer, Config().to_dict(), 3, split=split)
    raw = {**ckpt.to_dict(), **changes}
    raw["checksum"] = checksum(raw)
    tmp_path.mkdir(exist_ok=True)
    torch.save(raw, path := tmp_path / "last.pt")
    return path


def test_a_valid_checkpoint_loads_with_its_model_and_a_text_split(tmp_path):
    ckpt = Checkpoint.load(saved(tmp_path))
    model, tokenizer = ckpt.build_model()
    assert ckpt.step == 3 and tokenizer.vocab_size == 5 and model.config.n_head == 2
    split = {"bounds": [0, 2, 3, 4], "digest": "sha256:0"}  # a text's: integer bounds
    assert Checkpoint.load(saved(tmp_path, split=split)).split == split


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("train_config", [1, 2], "train_config must be a mapping with the groups"),
        ("split", {"train": [1], "val": [], "test": []}, "split must be"),
        # a text's bounds are integers (issue 43: nothing guarded it)
        ("split", {"bounds": [0, 1.5, 3], "digest": "sha256:0"}, "split must be lists of"),
        ("split", {"bounds": [0, True, 3], "digest": "sha256:0"}, "split must be lists of"),
        ("step", "abc", "step must be a non-negative integer, found 'abc'"),
        ("step", -1, "step must be a non-negative integer, found -1"),
        ("tokenizer", {"chars": ["a"]}, "tokenizer must be a mapping: chars a string"),
        ("tokenizer", {"chars": "abcd", "boundary_id": 3}, "tokenizer must be a mapping: chars"),
        ("metrics", [], "metrics must be a mapping of names to numbers, found []"),
        ("resume", {"optimizer": 1}, "resume must be a mapping of the optimizer, sampler"),
        ("model", {"w": 1}, "model must be a mapping of parameter names to tensors"),
        ("model_config", {**MODEL, "n_head": "x"}, "model_config.n_head='x' must be a positive"),
        ("model_config", {**MODEL, "n_kv_head": 2}, "model_config holds settings this microgpt"),
        ("model_config", {**MODEL, "block_size": None}, "model_config.block_size must be"),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_refused_by_name(tmp_path, field, value, says):
    path = saved(tmp_path, **{field: value})
    with pytest.raises(CheckpointError) as e:
        Checkpoint.load(path)
    assert str(e.value).startswith(f"checkpoint {path}: field {says}")


@pytest.mark.parametrize(
    "name, change, says",
    [
        ("wte.weight", lambda t: t.fill_(float("nan")), "wte.weight holds NaN or inf"),
        ("lm_head.weight", lambda t: t.fill_(float("inf")), "weight holds NaN or inf"),
        ("wte.weight", lambda t: t[:-1], "wrong shape for its model (wte.weight: 4x8, its config"
                                         " gives 5x8)"),
    ],
)  # fmt: skip
def test_weights_not_finite_or_of_the_wrong_shape_are_refused_at_load(tmp_path, name, change, says):
    """issue 43: NaN weights crashed the head analysis' eigen-solver; a wrong shape was a
    traceback on resume (load_state_dict)."""
    model = GPT(GPTConfig(**MODEL)).state_dict()
    model[name] = change(model[name].clone())
    path = saved(tmp_path, model=model)
    with pytest.raises(CheckpointError, match=re.escape(f"{path} holds weights ")) as e:
        Checkpoint.load(path)
    assert says in str(e.value)


def test_a_full_disk_during_a_save_is_one_line_with_the_resume_command(tmp_path, monkeypatch):
    last = saved(tmp_path / "checkpoints")  # the run's last.pt (RunFolder names it)
    before = last.read_bytes()

    def full_disk(*args, **kwargs):  # what torch.save raises on a full tmpfs
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 1344 vs 1238"
        )

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.load(last).save(last)
    assert str(e.value).startswith(f"cannot write {last}: ") and "\n" not in str(e.value)
    assert str(e.value).endswith(f"python train.py resume={last}") and last.read_bytes() == before


def test_a_signal_inside_a_save_is_raised_once_the_checkpoint_is_whole(tmp_path, monkeypatch):
    ckpt, real_save = Checkpoint.load(saved(tmp_path)), torch.save

    def interrupted_save(obj, f):  # a second Ctrl-C lands mid-write
        os.kill(os.getpid(), signal.SIGINT)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", interrupted_save)
    # Python's own Ctrl-C handler, whatever an earlier test in this process left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            ckpt.save(tmp_path / "new.pt")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert Checkpoint.load(tmp_path / "new.pt").step == 3
