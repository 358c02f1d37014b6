"""Direct logit attribution (microgpt.heads.attribution): against a hand computation from the
weights, and its parts adding up to the logit whatever the model and the heads switched off."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from microgpt.heads.attribution import attribute, traced
from microgpt.heads.circuits import replaced_heads
from microgpt.model import GPT, GPTConfig

V, T = 7, 6


def random_model(n_layer=1, seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=V, block_size=T, n_layer=n_layer, n_embd=8, n_head=2, **kw)
    model = GPT(config)
    with torch.no_grad():  # larger weights than the init's: parts that differ, sharp attention
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() > 1 else 0.3))
    return model.eval()


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_attribution_matches_a_hand_computation(norm):
    """One layer (2 heads, an MLP, every bias), computed here with plain matrix arithmetic."""
    model = random_model(bias=True, norm=norm)
    idx, pin, target = torch.tensor([[0, 3, 1, 4, 4, 2]]), 4, 5
    W = {k: v.double() for k, v in model.state_dict().items()}

    def normed(x, name):  # (T, C) -> (T, C)
        if norm == "rmsnorm":  # no gain, no centering
            return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
        x = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        return x * W[f"{name}.weight"] + W[f"{name}.bias"]

    embed = W["wte.weight"][idx[0]] + W["wpe.weight"][:T]  # (T, C)
    q, k, v = (normed(embed, "blocks.0.norm1") @ W["blocks.0.attn.qkv.weight"].T
               + W["blocks.0.attn.qkv.bias"]).split(8, dim=1)  # fmt: skip
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []  # each head's output through its columns of W_O, (T, C)
    for h in range(2):
        cols = slice(4 * h, 4 * h + 4)
        weights = (q[:, cols] @ k[:, cols].T / 2).masked_fill(~causal, -math.inf).softmax(-1)
        heads.append(weights @ v[:, cols] @ W["blocks.0.attn.proj.weight"][:, cols].T)
    bias = W["blocks.0.attn.proj.bias"]
    stream = embed + sum(heads) + bias
    hidden = normed(stream, "blocks.0.norm2") @ W["blocks.0.mlp.fc.weight"].T
    mlp = F.gelu(hidden + W["blocks.0.mlp.fc.bias"]) @ W["blocks.0.mlp.proj.weight"].T
    mlp = mlp + W["blocks.0.mlp.proj.bias"]
    final = (stream + mlp)[pin]
    unembed = W["lm_head.weight"][target]
    if norm == "layernorm":
        scale, gain = (final.var(unbiased=False) + 1e-5).rsqrt(), W["norm_f.weight"]
        share = lambda x: ((x - x.mean()) * scale * gain) @ unembed  # noqa: E731
        rest = share(bias) + W["norm_f.bias"] @ unembed
    else:
        scale = (final.pow(2).mean() + 1e-5).rsqrt()
        share = lambda x: (x * scale) @ unembed  # noqa: E731
        rest = share(bias)

    parts = attribute(model, traced(model, idx), 0, pin, target)
    close = lambda a, b: abs(float(a) - float(b)) < 1e-5  # noqa: E731
    assert close(parts.embed, share(embed[pin]))
    assert all(close(parts.heads[0, h], share(heads[h][pin])) for h in range(2))
    assert close(parts.mlps[0], share(mlp[pin])) and close(parts.rest, rest)
    assert close(parts.logit, normed(final[None], "norm_f")[0] @ unembed)


@pytest.mark.parametrize(
    "settings",
    [{}, {"bias": True}, {"norm": "rmsnorm", "bias": True}, {"mlp": False}, {"tie_weights": True}],
)
def test_the_parts_add_up_to_the_logit_with_heads_switched_off(settings):
    model = random_model(n_layer=3, seed=1, **settings)
    idx = torch.randint(V, (2, T), generator=torch.Generator().manual_seed(0))
    drop = torch.zeros(3, 2, dtype=torch.bool)
    drop[0, 1] = drop[2, 0] = True
    means = torch.randn(3, 2, 4)  # (L, H, hd): any value a head may be replaced by
    for value in (None, means):
        with replaced_heads(model, drop, value), torch.no_grad():
            run = traced(model, idx)
            logits, _ = model(idx)
        assert torch.equal(run.logits, logits)  # the trace is the model's own pass
        for row, pin, target in [(0, 0, 3), (0, 5, 6), (1, 3, 0)]:
            parts = attribute(model, run, row, pin, target)
            total = parts.embed + float(parts.heads.sum() + parts.mlps.sum()) + parts.rest
            assert abs(total - parts.logit) < 1e-4 and parts.logit == float(
                logits[row, pin, target]
            )
            if value is None:  # a zeroed head adds nothing
                assert parts.heads[0, 1] == 0 and parts.heads[2, 0] == 0
