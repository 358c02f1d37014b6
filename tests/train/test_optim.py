"""optim=muon: Muon's orthogonalised update, which parameters it takes, and an exact resume."""

from __future__ import annotations

import math

import pytest
import torch

from microgpt import runs, system
from microgpt.config import ConfigError, load_config
from microgpt.model import GPT, GPTConfig
from microgpt.train.optim import ORTHOGONALISERS, POLAR_EXPRESS, Muon, make_optimizer, orthogonalise
from microgpt.train.trainer import Trainer, TrainingError, train


@pytest.mark.parametrize("shape", [(64, 64), (192, 64), (64, 256)])
def test_orthogonalise_is_the_quintic_newton_schulz_iteration(shape):
    g = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0))
    # the textbook form, on the wide orientation (X X^T the smaller Gram matrix)
    x = g.mT if shape[0] > shape[1] else g
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(5):
        gram = x @ x.mT
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    expected = x.mT if shape[0] > shape[1] else x
    torch.testing.assert_close(orthogonalise([g])[0], expected, rtol=0, atol=1e-5)


def test_polar_express_on_the_gram_side_lands_in_its_band_as_the_direct_iteration():
    """Its three quintics take singular values in [0.01, 1] (after scaling to norm 1) to [0.73,
    1.27]; carried by the Gram matrices of every shape at once, the same matrices as applied to
    each x directly."""
    gen = torch.Generator().manual_seed(0)
    gs = [torch.randn(4, 256, 64, generator=gen), torch.randn(2, 64, 64, generator=gen)]
    # a spectrum across the band: singular values 1 to 0.04 (0.33 to 0.013 at norm 1)
    u, _, v = torch.linalg.svd(gs[1])
    gs[1] = u @ torch.diag(torch.logspace(0, -1.4, 64)) @ v
    on_gram = orthogonalise(gs, POLAR_EXPRESS, gram=True)
    for g, y in zip(gs, on_gram):
        assert y.shape == g.shape
        sv = torch.linalg.svdvals(y)
        assert 0.72 < sv.min() and sv.max() < 1.28, (sv.min(), sv.max())
    # the band is the minimax's: both its ends nearly reached across that spectrum
    sv = torch.linalg.svdvals(on_gram[1])
    assert sv.min() < 0.8 and sv.max() > 1.2
    direct = orthogonalise(gs, POLAR_EXPRESS, gram=False)
    for a, b in zip(on_gram, direct):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    # in bf16 (as Muon runs it on a CPU with bf16): the same band, to bf16's rounding
    for y in orthogonalise(gs, POLAR_EXPRESS, gram=True, dtype=torch.bfloat16):
        sv = torch.linalg.svdvals(y.float())
        assert 0.7 < sv.min() and sv.max() < 1.32, (sv.min(), sv.max())


def test_polar_express_is_the_textbook_gram_side_iteration():
    """Q <- p(A) Q, A = Q G Q^T, y = Q x, G = x x^T, for each of two stacks batched together
    (one m); a tall g (a parameter: contiguous) alike."""
    assert ORTHOGONALISERS["polar-express"] == (POLAR_EXPRESS, True)
    gen, eye = torch.Generator().manual_seed(0), torch.eye(16, dtype=torch.float64)
    gs = [torch.randn(3, 16, n, generator=gen, dtype=torch.float64) for n in (40, 24)]
    ys = orthogonalise(gs, POLAR_EXPRESS, gram=True)
    for g, y in zip(gs, ys):
        x = g / (g.norm(dim=(-2, -1), keepdim=True) + 1e-7)
        G, Q = x @ x.mT, eye
        for a, b, c in POLAR_EXPRESS:
            A = Q @ G @ Q.mT
            Q = (a * eye + b * A + c * A @ A) @ Q
        torch.testing.assert_close(y, Q @ x, rtol=0, atol=1e-12)
    tall = orthogonalise([g.mT.contiguous() for g in gs], POLAR_EXPRESS, gram=True)
    for t, y in zip(tall, ys):
        torch.testing.assert_close(t, y.mT, rtol=0, atol=1e-12)


def test_orthogonalise_in_bf16_is_the_float32_iteration_rounded():
    g = torch.randn(4, 64, 256, generator=torch.Generator().manual_seed(0))
    exact, bf16 = orthogonalise([g])[0], orthogonalise([g], dtype=torch.bfloat16)[0].float()
    assert not torch.equal(bf16, exact)  # it ran in bf16
    # the same semi-orthogonal matrix to bf16's precision: singular values near 1 alike
    torch.testing.assert_close(bf16, exact, rtol=0, atol=0.03)
    sv = torch.linalg.svdvals(bf16)
    assert 0.5 < sv.min() and sv.max() < 1.3


@pytest.mark.parametrize(
    "setting, native, dtype",
    [
        ("auto", True, torch.bfloat16),
        ("auto", False, torch.float32),
        ("fp32", True, torch.float32),
        ("bf16", False, torch.bfloat16),
    ],
)
def test_muon_iterates_in_bf16_where_the_device_multiplies_it(
    tiny_cfg, monkeypatch, setting, native, dtype
):
    monkeypatch.setattr(system, "native_bf16", lambda device: native)
    config = load_config(tiny_cfg("optim=muon", f"optim.muon_precision={setting}"))
    model = GPT(GPTConfig(vocab_size=27, block_size=16, n_layer=1))
    assert make_optimizer(model, config, torch.device("cpu")).ns_dtype == dtype


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_weight_decay_takes_matrices_only_and_muon_the_blocks_matrices(tiny_cfg, optim):
    model = GPT(GPTConfig(vocab_size=27, block_size=16, n_layer=2, bias=True))
    config = load_config(tiny_cfg(f"optim={optim}"))
    o, opt = config.optim, make_optimizer(model, config, torch.device("cpu"))
    for group in opt.param_groups:
        dims = {p.dim() for p in group["params"]}
        assert dims == ({2} if group["weight_decay"] > 0 else {1}), group["weight_decay"]
    names = {id(p): n for n, p in model.named_parameters()}
    grouped = [[names[id(p)] for p in g["params"]] for g in opt.param_groups]
    assert sorted(sum(grouped, [])) == sorted(names.values())  # each parameter once
    if optim == "muon":
        layers = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
        blocks = sorted(f"blocks.{i}.{m}.weight" for i in range(2) for m in layers)
        assert sorted(grouped[0]) == blocks and opt.param_groups[0]["lr_ratio"] == o.muon_lr / o.lr
        assert sorted(grouped[1]) == ["lm_head.weight", "wpe.weight", "wte.weight"]


def test_muon_lowers_the_loss_and_resumes_exactly(tiny_cfg, tmp_path):
    muon = ("device=cpu", "optim=muon", "train.num_samples=0", "train.eval_every=4")
    muon += ("optim.decay=constant", "optim.warmup_steps=0")  # the same schedule for 4 or 8 steps

    def trainer(*settings, out):
        return Trainer(load_config(tiny_cfg(*muon, *settings, out=tmp_path / out)))

    whole = trainer("train.max_steps=8", out="whole")
    metrics = whole.run()
    trainer("train.max_steps=4", out="split").run()
    second = trainer("train.max_steps=8", "resume=true", out="split")
    assert second.run()["val_loss"] == metrics["val_loss"]
    for k, v in whole.model.state_dict().items():
        assert torch.equal(v, second.model.state_dict()[k]), k
    # a model that has learned nothing scores ln(vocab) nats: uniform over the characters
    assert metrics["val_loss"] < math.log(whole.model.config.vocab_size) - 0.1


def test_a_bad_muon_rate_is_refused_with_the_fix(tiny_cfg):
    with pytest.raises(ConfigError, match="optim.muon_lr=-1.0 must be > 0"):
        load_config(tiny_cfg("optim=muon", "optim.muon_lr=-1"))


def test_muon_carries_its_nesterov_momentum_from_step_to_step(tiny_cfg):
    model = GPT(GPTConfig(vocab_size=27, block_size=16, n_layer=1))
    opt = Muon(model, load_config(tiny_cfg("optim=muon")).optim)
    w = model.blocks[0].attn.proj.weight
    g1, g2 = torch.randn_like(w), torch.randn_like(w)
    for g in (g1, g2):
        for p in model.parameters():
            p.grad = g if p is w else torch.zeros_like(p)
        opt.step()
    # momentum 0.95: m1 = 0.05 g1, m2 = 0.95 m1 + 0.05 g2
    expected = 0.95 * (0.05 * g1) + 0.05 * g2
    torch.testing.assert_close(opt.state[w]["momentum"], expected)


def test_a_run_diverging_under_muon_names_muons_rate_not_adamws(tiny_cfg, tmp_path):
    """An absurd rate makes the weights non-finite (not an error inside the optimizer), and the
    message names the setting of the group that diverged."""
    with pytest.raises(TrainingError, match=r"non-finite loss at step \d+") as e:
        train(tiny_cfg("optim=muon", "optim.muon_lr=1e30"))
    assert "Try a lower optim.muon_lr=1e+30 (" in str(e.value) and "optim.lr" not in str(e.value)
    assert runs.discard() == str(tmp_path / "run")  # before its first checkpoint: no folder left
