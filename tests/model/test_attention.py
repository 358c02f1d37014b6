"""Multi-head attention: `loop` (the reference) and `sdpa` are one function, checked against each
other (outputs, loss, every gradient, attention weights) and against torch.nn.MultiheadAttention
with the same weights. All in fp32, atol 1e-5."""

import pytest
import torch
import torch.nn as nn

from microgpt.model import ATTN_IMPLS, GPT, GPTConfig, MultiHeadAttention
from tests.conftest import close


def randomize(module: nn.Module, seed: int, std: float = 0.2) -> nn.Module:
    """Weights large enough that attention is far from uniform (0.02 init hides scaling bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return module


def config(n_head=4, impl="loop", **kw):
    base = {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_embd": 32, "bias": True}
    return GPTConfig(**{**base, "n_head": n_head, "attn_impl": impl, **kw})


def batch(B=3, T=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 11, (B, T), generator=g)
    targets = torch.randint(0, 11, (B, T), generator=g)
    targets[0, -3:] = -1  # padded targets are ignored by the loss
    return idx, targets


@pytest.mark.parametrize("T", [8, 5])
@pytest.mark.parametrize("n_head", [1, 4, 8])
def test_loop_and_sdpa_same_logits_loss_grads_and_weights(n_head, T):
    loop = randomize(GPT(config(n_head, "loop")), seed=0)
    sdpa = GPT(config(n_head, "sdpa"))
    sdpa.load_state_dict(loop.state_dict())  # strict: the same keys for both
    idx, targets = batch(T=T)
    results = []
    for m in (loop, sdpa):
        logits, loss, attention = m.forward_with_attention(idx, targets)
        loss.backward()
        results.append((logits, loss, dict(m.named_parameters()), attention))
    (ref_logits, ref_loss, ref_params, ref_att), (logits, loss, params, att) = results
    assert ref_logits.abs().max() > 0.1  # not a degenerate comparison
    close(logits, ref_logits)
    close(loss, ref_loss)
    for name, p in ref_params.items():
        assert p.grad.abs().sum() > 0, name  # every parameter takes part
        close(params[name].grad, p.grad)
    assert len(att) == 2  # one per layer
    for a, ref in zip(att, ref_att, strict=True):
        assert a.shape == (3, n_head, T, T)  # (B, H, T, Tk)
        close(a, ref)
        close(a.sum(-1), torch.ones(3, n_head, T))  # each query's weights sum to 1
        assert (a.triu(diagonal=1) == 0).all()  # no weight on future keys


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("n_head", [1, 4])
def test_equals_torch_multihead_attention(n_head, impl):
    """An independent reference: head h reads channels [h*hd, (h+1)*hd) of Q, K and V, the heads
    are concatenated in order into W_O; the weights per head."""
    C, T = 32, 8
    ours = randomize(MultiHeadAttention(config(n_head, impl)), seed=n_head, std=0.3)
    theirs = nn.MultiheadAttention(C, n_head, bias=True, batch_first=True)
    with torch.no_grad():  # same layout: rows [0, C) are Q, then K, then V
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.proj.weight)  # W_O
        theirs.out_proj.bias.copy_(ours.proj.bias)
    x = torch.randn(2, T, C, generator=torch.Generator().manual_seed(7))
    y, att = ours(x, return_attn=True)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # True = may not attend
    y_ref, att_ref = theirs(
        x, x, x, attn_mask=future, need_weights=True, average_attn_weights=False
    )
    close(y, y_ref)
    close(att, att_ref)  # (B, H, T, T), per head


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_causality(impl):
    """Changing token t never changes the logits at positions < t, and does change position t."""
    m = randomize(GPT(config(4, impl)), seed=2).eval()
    idx, _ = batch(T=8)
    with torch.no_grad():
        logits, _ = m(idx)
        for t in range(8):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 1) % 11
            new, _ = m(changed)
            close(new[:, :t], logits[:, :t], atol=1e-6)
            assert not torch.allclose(new[:, t], logits[:, t], atol=1e-4)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_the_hook_point_is_each_heads_output_on_its_way_into_wo(impl):
    """`hook_z` sees z (B, T, H, hd), W_O's input split per head: the one place every head
    intervention (microgpt.heads, whose tests scale heads through it) goes through."""
    m = randomize(MultiHeadAttention(config(4, impl)), seed=5).eval()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    seen, into = [], []
    m.hook_z.register_forward_hook(lambda mod, args, z: seen.append(z))
    m.proj.register_forward_pre_hook(lambda mod, args: into.append(args[0]))
    with torch.no_grad():
        m(x)
        assert seen[0].shape == (2, 5, 4, 8)  # (B, T, H, hd)
        # (B, T, H, hd) -> (B, T, C): head h at channels [h*hd, (h+1)*hd)
        assert torch.equal(seen[0].reshape(2, 5, 32), into[0])
