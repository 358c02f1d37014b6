"""bench/ times the library's own training step and decoder, not copies of them.

The step: three steps through bench.common.step leave the same weights and the same train loss,
to the bit, as Trainer.run with max_steps=3, with clipping, warm-up and weight decay all in play.
A step without clipping ends elsewhere, so a bench step that drifted from the trainer's would fail.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from microgpt.config import load_config
from microgpt.model import GPT, GPTConfig
from microgpt.train.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # bench/ is a package at the repository root, not an installed one
    sys.path.insert(0, str(REPO))

from bench.common import step  # noqa: E402
from bench.cost import loop_stepper, time_steps  # noqa: E402
from bench.sampling import decode  # noqa: E402

STEPS = 3
# a clip far below the tiny model's gradient norm (about 1-3), so every step is clipped
STEP_CFG = [f"train.max_steps={STEPS}", f"train.log_every={STEPS}", "optim.grad_clip=0.05"]


def bench_steps(cfg) -> tuple[Trainer, list]:
    tr = Trainer(load_config(cfg))
    return tr, [step(tr) for _ in range(STEPS)]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, same: bool = True) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    equal = all(torch.equal(pa[k], pb[k]) for k in pa)
    assert equal is same, "weights differ" if same else "weights agree"


def test_bench_step_is_the_trainers_step(tiny_cfg, tmp_path):
    bench, outs = bench_steps(tiny_cfg(*STEP_CFG, out=tmp_path / "bench"))
    assert all(float(o.grad_norm) > 0.05 for o in outs)  # the clip bites
    assert [o.lr for o in outs] != [outs[0].lr] * STEPS  # the warm-up moves the learning rate

    trainer = Trainer(load_config(tiny_cfg(*STEP_CFG, out=tmp_path / "run")))
    metrics = trainer.run()
    assert trainer.step == bench.step == STEPS
    assert_same_weights(bench.model, trainer.model)
    window = 0.0  # summed as Trainer.run's LossWindow sums it
    for o in outs:
        window = window + o.loss
    assert float(window) / STEPS == metrics["train_loss"]

    unclipped, _ = bench_steps(tiny_cfg(*STEP_CFG, "optim.grad_clip=0", out=tmp_path / "nc"))
    assert_same_weights(unclipped.model, trainer.model, same=False)


def test_bench_loop_step_is_the_loops_step(tiny_cfg, tmp_path):
    """bench/cost.py's loop timing runs Trainer.run's whole step: the same weights, and the train
    loss logged every log_every steps, as the loop logs it."""
    bench = Trainer(load_config(tiny_cfg(*STEP_CFG, out=tmp_path / "bench")))
    seconds, chars = time_steps(loop_stepper(bench), STEPS, bench.device)
    assert seconds > 0 and chars > 0
    assert bench.window.steps == 0  # the window was logged at step STEPS, then a new one begun
    assert '"loss/train"' in (bench.out_dir / "metrics.jsonl").read_text()

    trainer = Trainer(load_config(tiny_cfg(*STEP_CFG, out=tmp_path / "run")))
    trainer.run()
    assert_same_weights(bench.model, trainer.model)


def test_bench_step_counts_the_batch(tiny_cfg, tmp_path):
    tr, outs = bench_steps(tiny_cfg(*STEP_CFG, out=tmp_path / "run"))
    lengths = tr.datasets["train"].lengths
    for o in outs:
        assert o.padded % tr.config.train.batch_size == 0  # B x T
        assert tr.config.train.batch_size <= o.tokens <= o.padded
        assert o.padded // tr.config.train.batch_size <= int(lengths.max()) + 1


@pytest.mark.parametrize("use_cache", [True, False])
def test_decode_fills_the_context(use_cache):
    """A context of N positions is the boundary and N - 1 sampled tokens, block_size permitting."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=27, block_size=16, n_layer=1, n_embd=16, n_head=2)).eval()
    for context, sampled in ((8, 7), (16, 15), (32, 15)):  # 32 > block_size: 15 at most
        g = torch.Generator().manual_seed(0)
        assert decode(model, context, use_cache, g) == sampled
