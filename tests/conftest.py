"""Shared fixtures: the real Hydra config, composed and shrunk, with outputs in tmp_path."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from microgpt.cli import register
from microgpt.data.lines import encode_items
from microgpt.tokenizer import CharTokenizer

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

register()
# The test models are tiny: one thread is faster than two fighting over small matmuls, and it keeps
# the suite's time steady on a busy 2-core machine. The environment says so too, so that
# `threads=auto` (microgpt/system.py) in the trainer keeps one thread.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


def compose_config(overrides=(), config_name: str = "config"):
    """Compose conf/<config_name>.yaml with overrides, as `python train.py ...` would."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def close(a, b, atol: float = 1e-5) -> None:
    """a equals b to atol (fp32 implementations of one function), no relative slack."""
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


def read_events(path) -> EventAccumulator:
    """Every event of a run's folder, nothing sampled (EventAccumulator keeps a sample by
    default), once its writer is flushed and closed."""
    guidance = {"images": 0, "scalars": 0, "tensors": 0}
    return EventAccumulator(str(path), size_guidance=guidance).Reload()


def make_names(n: int = 300, seed: int = 0) -> list[str]:
    """Pronounceable fake names, for data files small enough to train on in a second."""
    rng = random.Random(seed)
    cons, vows = "bcdfghjklmnprstvz", "aeiouy"
    names = set()
    while len(names) < n:
        k = rng.randint(1, 4)
        names.add(
            "".join(rng.choice(cons) + rng.choice(vows) for _ in range(k))[: rng.randint(2, 8)]
        )
    return sorted(names)


BLOCK = 8  # the block size of the `rows` fixture


@pytest.fixture(scope="module")
def rows():
    """Names of 1..7 characters as (x, y) rows of block size 8, and their tokenizer."""
    names = [n for n in make_names(200, seed=3) if len(n) < BLOCK]
    tok = CharTokenizer.from_items(names)
    x, y = encode_items(names, tok, BLOCK)  # (N, 8) each
    return x, y, tok


@pytest.fixture
def names_file(tmp_path) -> Path:
    path = tmp_path / "names.txt"
    path.write_text("\n".join(make_names()) + "\n")
    return path


TINY = [
    "model.n_layer=1",
    "model.n_embd=16",
    "heads=2",
    "train.batch_size=16",
    "train.max_steps=12",
    "train.eval_every=6",
    "train.log_every=3",
    "train.num_samples=5",
    "log.attn_every=6",
    "log.head_items=32",
    "optim.warmup_steps=2",
]


@pytest.fixture
def tiny_cfg(tmp_path, names_file):
    """A config for a run of a second or two, writing into tmp_path/run."""

    def make(*extra, out: Path | None = None):
        out = out or tmp_path / "run"
        return compose_config([*TINY, f"data.path={names_file}", f"out_dir={out}", *extra])

    return make
