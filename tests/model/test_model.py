"""GPTConfig validation, parameter counts of the presets, loss, weight tying, dropout, variants."""

import re

import pytest
import torch
import torch.nn.functional as F

from microgpt.kv_cache import KVCache
from microgpt.model import GPT, GPTConfig, MultiHeadAttention

# The presets of the issue, as GPTConfig fields (the YAML presets mirror these).
MICRO = {
    "vocab_size": 27,
    "block_size": 16,
    "n_layer": 1,
    "n_embd": 16,
    "n_head": 4,
    "norm": "rmsnorm",
    "activation": "relu",
    "bias": False,
    "tie_weights": False,
}
SMALL = {"vocab_size": 27, "block_size": 16, "n_layer": 4, "n_embd": 64, "n_head": 4}
BASE = {"vocab_size": 27, "block_size": 256, "n_layer": 6, "n_embd": 384, "n_head": 6}


def tiny(**kw):
    base = {"vocab_size": 7, "block_size": 8, "n_layer": 2, "n_embd": 16, "n_head": 4}
    return GPTConfig(**{**base, **kw})


# ---------------------------------------------------------------- parameter counts


def test_attention_params_with_bias_is_4dd_plus_4d():
    d = 512
    attn = MultiHeadAttention(GPTConfig(n_embd=d, n_head=8, bias=True))
    n = sum(p.numel() for p in attn.parameters())
    assert n == 4 * d * d + 4 * d == 1_050_624


@pytest.mark.parametrize("d,h", [(16, 1), (16, 4), (64, 8)])
def test_attention_params_without_bias_is_4dd(d, h):
    attn = MultiHeadAttention(GPTConfig(n_embd=d, n_head=h, bias=False))
    assert sum(p.numel() for p in attn.parameters()) == 4 * d * d


def test_micro_preset_has_4192_params():
    m = GPT(GPTConfig(**MICRO))
    assert m.num_params() == 4192
    # by hand: wte 27*16 + wpe 16*16 + attn 4*16*16 + mlp 2*16*64 + lm_head 27*16
    # (rmsnorm has no gain, and there are no biases)
    assert 27 * 16 + 16 * 16 + 4 * 16 * 16 + 2 * 16 * 64 + 27 * 16 == 4192


def test_small_preset_is_about_0_2m_params():
    n = GPT(GPTConfig(**SMALL)).num_params()
    assert 0.19e6 < n < 0.21e6, n


def test_base_preset_builds_and_runs_a_forward():
    m = GPT(GPTConfig(**BASE)).eval()
    assert 10e6 < m.num_params() < 11.5e6
    idx = torch.randint(0, 27, (1, 256))
    with torch.no_grad():
        logits, loss = m(idx, idx)
    assert logits.shape == (1, 256, 27)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("n_head", [2, 4, 8])
def test_mqa_shrinks_kv_projections_and_cache_by_n_head(n_head):
    C = 32
    mha = GPTConfig(n_embd=C, n_head=n_head, n_layer=2, block_size=8)
    mqa = GPTConfig(n_embd=C, n_head=n_head, n_kv_head=1, n_layer=2, block_size=8)
    w_mha = MultiHeadAttention(mha).qkv.weight
    w_mqa = MultiHeadAttention(mqa).qkv.weight
    assert w_mha.shape == (3 * C, C)
    assert w_mqa.shape == (C + 2 * C // n_head, C)  # Q keeps C rows, K and V get C/n_head each
    assert (w_mha.shape[0] - C) == n_head * (w_mqa.shape[0] - C)
    nbytes = [KVCache.for_model(GPT(c), batch_size=3).nbytes for c in (mha, mqa)]
    assert nbytes[0] == n_head * nbytes[1]


# ---------------------------------------------------------------- validation


def test_n_embd_not_divisible_by_n_head_names_both_values():
    with pytest.raises(ValueError, match=r"n_embd=30 is not divisible by n_head=4") as e:
        GPTConfig(n_embd=30, n_head=4)
    assert "[1, 2, 3, 5, 6, 10, 15, 30]" in str(e.value)  # the valid head counts


def test_n_head_not_divisible_by_n_kv_head():
    with pytest.raises(ValueError, match=r"n_head=4 is not divisible by n_kv_head=3") as e:
        GPTConfig(n_embd=16, n_head=4, n_kv_head=3)
    assert "[1, 2, 4]" in str(e.value)


@pytest.mark.parametrize(
    "field", ["vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_kv_head", "mlp_ratio"]
)
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_non_positive_or_non_int_sizes_rejected(field, value):
    with pytest.raises(ValueError, match=rf"{field}={value!r} must be a positive integer"):
        GPTConfig(**{field: value})


@pytest.mark.parametrize(
    "field,choices",
    [
        ("attn_impl", "['loop', 'batched', 'sdpa']"),
        ("norm", "['layernorm', 'rmsnorm']"),
        ("activation", "['gelu', 'relu']"),
    ],
)
def test_unknown_choice_lists_valid_ones(field, choices):
    with pytest.raises(
        ValueError, match=re.escape(f"{field}='bogus' is unknown; choose one of {choices}")
    ):
        GPTConfig(**{field: "bogus"})


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_bad_dropout(p):
    with pytest.raises(ValueError, match=re.escape(f"dropout={p!r} must be in [0, 1)")):
        GPTConfig(dropout=p)


def test_n_kv_head_defaults_to_n_head():
    assert GPTConfig(n_head=4).n_kv_head == 4
    assert GPTConfig(n_embd=16, n_head=4).head_dim == 4
    assert GPTConfig(**MICRO).to_dict()["n_kv_head"] == 4


def test_sequence_longer_than_block_size_rejected():
    m = GPT(tiny())
    with pytest.raises(ValueError, match=r"sequence of 9 tokens is longer than block_size=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


# ---------------------------------------------------------------- loss, tying, dropout, variants


def test_loss_is_mean_cross_entropy_over_targets_not_minus_one():
    torch.manual_seed(0)
    m = GPT(tiny())
    idx = torch.randint(0, 7, (3, 8))
    targets = torch.randint(0, 7, (3, 8))
    targets[0, 5:] = -1
    targets[2, 1:] = -1
    logits, loss = m(idx, targets)
    logp = logits.log_softmax(-1)
    keep = targets != -1
    manual = -logp[keep].gather(1, targets[keep][:, None]).mean()
    torch.testing.assert_close(loss, manual)
    # by hand, one term at a time
    terms = [-logp[b, t, targets[b, t]] for b in range(3) for t in range(8) if targets[b, t] != -1]
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    assert len(terms) == 24 - 3 - 7
    # no targets: no loss
    assert m(idx)[1] is None


def test_tie_weights_shares_the_tensor():
    tied, untied = GPT(tiny(tie_weights=True)), GPT(tiny())
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() - tied.num_params() == 7 * 16  # counted once
    idx = torch.randint(0, 7, (2, 8))
    _, loss = tied(idx, idx)
    loss.backward()
    assert tied.wte.weight.grad is tied.lm_head.weight.grad  # one tensor, one gradient


def test_dropout_train_mode_varies_eval_mode_deterministic():
    m = GPT(tiny(dropout=0.3))
    idx = torch.randint(0, 7, (2, 8))
    m.train()
    a, _ = m(idx)
    b, _ = m(idx)
    assert not torch.allclose(a, b)
    m.eval()
    with torch.no_grad():
        c, _ = m(idx)
        d, _ = m(idx)
    assert torch.equal(c, d)


@pytest.mark.parametrize("attn_impl", ["loop", "batched", "sdpa"])
def test_dropout_zero_train_equals_eval(attn_impl):
    m = GPT(tiny(attn_impl=attn_impl))
    idx = torch.randint(0, 7, (2, 8))
    with torch.no_grad():
        a, _ = m.train()(idx)
        b, _ = m.eval()(idx)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("bias", [False, True])
def test_norm_activation_bias_variants_run_and_train(norm, activation, bias):
    m = GPT(tiny(norm=norm, activation=activation, bias=bias))
    idx = torch.randint(0, 7, (2, 8))
    logits, loss = m(idx, idx)
    assert logits.shape == (2, 8, 7) and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    norms = [type(mod).__name__ for mod in m.modules() if "Norm" in type(mod).__name__]
    assert norms and set(norms) == {"LayerNorm" if norm == "layernorm" else "RMSNorm"}
    acts = {type(mod).__name__ for mod in m.modules()} & {"GELU", "ReLU"}
    assert acts == {"GELU" if activation == "gelu" else "ReLU"}
    has_bias = any(name.endswith("bias") for name, _ in m.named_parameters())
    assert has_bias == bias


def test_rmsnorm_is_x_over_rms():
    m = GPT(tiny(norm="rmsnorm"))
    x = torch.randn(2, 3, 16)
    expected = x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
    torch.testing.assert_close(m.norm_f(x), expected)


def test_forward_shapes_and_forward_with_attention():
    m = GPT(tiny(n_layer=3))
    idx = torch.randint(0, 7, (2, 5))
    logits, loss, att = m.forward_with_attention(idx)
    assert logits.shape == (2, 5, 7) and loss is None
    assert len(att) == 3 and all(a.shape == (2, 4, 5, 5) for a in att)
    # forward always returns (logits, loss), the same as forward_with_attention's first two
    plain = m(idx)
    assert len(plain) == 2 and torch.equal(plain[0], logits)
    with_targets = m(idx, idx)
    assert len(with_targets) == 2 and with_targets[1] is not None


def test_loss_at_init_is_near_log_vocab():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**SMALL))
    idx = torch.randint(0, 27, (8, 16))
    _, loss = m(idx, idx)
    assert abs(loss.item() - F.cross_entropy(torch.zeros(1, 27), torch.tensor([0])).item()) < 0.1
