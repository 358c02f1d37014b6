"""GPTConfig validation, parameter counts of the presets, loss, weight tying, dropout, variants,
the forward in its three steps, packed documents."""

import math

import pytest
import torch

from microgpt.model import ATTN_IMPLS, GPT, GPTConfig, MultiHeadAttention, document_positions

# The presets of the issue, as GPTConfig fields (the YAML presets mirror these).
MICRO = {"n_layer": 1, "n_embd": 16, "n_head": 4, "norm": "rmsnorm", "activation": "relu"}
SMALL = {"n_layer": 4, "n_embd": 64, "n_head": 4}
BASE = {"block_size": 256, "n_layer": 6, "n_embd": 384, "n_head": 6}


def tiny(**kw):
    base = {"vocab_size": 7, "block_size": 8, "n_layer": 2, "n_embd": 16, "n_head": 4}
    return GPTConfig(**{**base, **kw})


# ---------------------------------------------------------------- sizes and settings


@pytest.mark.parametrize("d,h,bias", [(512, 8, True), (16, 1, False), (64, 8, False)])
def test_attention_has_4dd_weights_and_4d_biases(d, h, bias):
    attn = MultiHeadAttention(GPTConfig(n_embd=d, n_head=h, bias=bias))
    assert sum(p.numel() for p in attn.parameters()) == 4 * d * d + (4 * d if bias else 0)


def test_preset_sizes_and_the_loss_at_init_near_log_vocab():
    # micro by hand: wte 27*16 + wpe 16*16 + attn 4*16*16 + mlp 2*16*64 + lm_head 27*16
    # (rmsnorm has no gain, and there are no biases)
    assert GPT(GPTConfig(**MICRO)).num_params() == 4192
    torch.manual_seed(0)
    small, idx = GPT(GPTConfig(**SMALL)), torch.randint(0, 27, (8, 16))
    assert 0.19e6 < small.num_params() < 0.21e6
    assert abs(small(idx, idx)[1].item() - math.log(27)) < 0.1
    base = GPT(GPTConfig(**BASE)).eval()
    assert 10e6 < base.num_params() < 11.5e6
    with torch.no_grad():
        logits, loss = base(torch.randint(0, 27, (1, 256)), torch.randint(0, 27, (1, 256)))
    assert logits.shape == (1, 256, 27) and torch.isfinite(loss)


@pytest.mark.parametrize(
    "setting,message",
    [
        ({"n_embd": 30}, r"n_embd=30 is not divisible by n_head=4.*\[1, 2, 3, 5, 6, 10, 15, 30\]"),
        *(
            ({field: value}, rf"{field}={value!r} must be a positive integer")
            for field in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "mlp_ratio")
            for value in (0, 2.0, True)
        ),
        ({"attn_impl": "batched"}, r"attn_impl='batched' is unknown; choose one of \['loop', 's"),
        ({"norm": "x"}, r"norm='x' is unknown; choose one of \['layernorm', 'rmsnorm'\]"),
        ({"activation": "x"}, r"activation='x' is unknown; choose one of \['gelu', 'relu'\]"),
        ({"dropout": 1.0}, r"dropout=1.0 must be in \[0, 1\)"),
        ({"dropout": -0.1}, r"dropout=-0.1 must be in \[0, 1\)"),
        ({"mlp": "no"}, r"mlp='no' must be true or false"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(setting, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**setting)


# ---------------------------------------------------------------- loss, tying, dropout, variants


def test_loss_is_mean_cross_entropy_over_targets_not_minus_one():
    torch.manual_seed(0)
    m = GPT(tiny())
    idx, targets = torch.randint(0, 7, (3, 8)), torch.randint(0, 7, (3, 8))
    targets[0, 5:] = -1
    targets[2, 1:] = -1
    logits, loss = m(idx, targets)
    logp = logits.log_softmax(-1)
    terms = [-logp[b, t, targets[b, t]] for b in range(3) for t in range(8) if targets[b, t] != -1]
    assert len(terms) == 24 - 3 - 7
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    assert m(idx)[1] is None  # no targets: no loss
    with pytest.raises(ValueError, match=r"sequence of 9 tokens is longer than block_size=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_tie_weights_shares_the_tensor():
    tied, untied = GPT(tiny(tie_weights=True)), GPT(tiny())
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() - tied.num_params() == 7 * 16  # counted once
    idx = torch.randint(0, 7, (2, 8))
    _, loss = tied(idx, idx)
    loss.backward()
    assert tied.wte.weight.grad is tied.lm_head.weight.grad  # one tensor, one gradient


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_dropout_only_in_train_mode(impl):
    idx = torch.randint(0, 7, (2, 8))
    m = GPT(tiny(dropout=0.3, attn_impl=impl)).train()
    assert not torch.allclose(m(idx)[0], m(idx)[0])
    with torch.no_grad():
        m.eval()
        assert torch.equal(m(idx)[0], m(idx)[0])
        plain = GPT(tiny(attn_impl=impl))  # dropout 0: train mode is eval mode
        torch.testing.assert_close(plain.train()(idx)[0], plain.eval()(idx)[0], atol=1e-6, rtol=0)


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
    assert any(name.endswith("bias") for name, _ in m.named_parameters()) == bias
    if norm == "rmsnorm":  # x / rms(x), no gain
        x = torch.randn(2, 3, 16)
        expected = x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
        torch.testing.assert_close(m.norm_f(x), expected)


# ---------------------------------------------------------------- the forward in three steps


def test_forward_with_attention_is_forward_plus_each_layers_weights():
    m = GPT(tiny(n_layer=3))
    idx = torch.randint(0, 7, (2, 5))
    logits, loss, att = m.forward_with_attention(idx)
    assert logits.shape == (2, 5, 7) and loss is None
    assert len(att) == 3 and all(a.shape == (2, 4, 5, 5) for a in att)
    plain = m(idx, idx)  # always (logits, loss)
    assert len(plain) == 2 and torch.equal(plain[0], logits) and plain[1] is not None


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_running_from_a_cached_layer_equals_the_full_forward(impl):
    """embed, run_layers from any layer on the stream cached there, unembed: the forward's logits,
    bit for bit (what the head analysis runs its ablations on)."""
    torch.manual_seed(0)
    m = GPT(tiny(n_layer=3, attn_impl=impl, dropout=0.1)).eval()
    idx = torch.randint(0, 7, (2, 8))
    with torch.no_grad():
        full, _ = m(idx)
        first = m.embed(idx)
        streams = [first] + m.run_layers(first)[0]  # entering each layer, then leaving the last
        for start in range(3):
            assert torch.equal(m.unembed(m.run_layers(streams[start], start)[0][-1]), full)
        # a token's position is its place in the row: the same ids shifted change the stream
        assert not torch.allclose(m.embed(idx[:, 1:]), first[:, :-1])
        assert torch.equal(m.embed(idx[:, 1:], 1), first[:, 1:])


def test_positions_restart_and_attention_stays_inside_each_document():
    starts = torch.tensor([[1, 0, 0, 1, 0, 1]], dtype=torch.bool)
    positions, mask = document_positions(starts)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0]]
    # query 4 (the second document's second token) sees keys 3 and 4 only
    assert mask[0, 0, 4].tolist() == [False, False, False, True, True, False]
    assert mask.shape == (1, 1, 6, 6)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_a_packed_row_gives_each_documents_own_logits_and_loss(impl):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=27, block_size=8, attn_impl=impl)).eval()
    docs = [torch.tensor([[0, 5, 13, 13, 1]]), torch.tensor([[0, 15, 12, 9, 22, 9, 1]])]
    docs.append(torch.tensor([[0, 1, 22, 1]]))
    # 16 tokens: longer than block_size, which only bounds each document
    row = torch.cat(docs, dim=1)
    targets = torch.cat([torch.roll(d, -1, dims=1) for d in docs], dim=1)
    logits, loss = model(row, targets, doc_starts=row == 0)
    alone = [model(d, torch.roll(d, -1, dims=1)) for d in docs]
    torch.testing.assert_close(logits, torch.cat([lg for lg, _ in alone], dim=1))
    # the mean over all 16 targets: each document's mean weighted by its length
    sizes = torch.tensor([d.size(1) for d in docs], dtype=torch.float)
    expected = (torch.stack([lo for _, lo in alone]) * sizes).sum() / sizes.sum()
    torch.testing.assert_close(loss, expected)
