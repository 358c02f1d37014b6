"""Multi-head attention: the three implementations are one function.

`loop`, `batched` and `sdpa` are checked against each other (outputs, loss, every gradient,
attention weights), against torch.nn.MultiheadAttention with the same weights, and against an
independent per-head reference written here from the formula. All in fp32, atol 1e-5.
"""

import math

import pytest
import torch
import torch.nn as nn

from microgpt.model import ATTN_IMPLS, GPT, GPTConfig, MultiHeadAttention

ATOL = 1e-5

# (n_head, n_kv_head): MHA for 1, 2, 4, 8 heads, GQA with n_kv_head strictly between 1 and n_head,
# MQA with n_kv_head = 1.
HEADS = [(1, 1), (2, 2), (4, 4), (8, 8), (4, 2), (8, 2), (8, 4), (2, 1), (4, 1), (8, 1)]
HEAD_IDS = [f"h{h}kv{kv}" for h, kv in HEADS]


def close(a, b, atol=ATOL):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


def randomize(module: nn.Module, seed: int, std: float = 0.2) -> nn.Module:
    """Weights large enough that attention is far from uniform (0.02 init hides scaling bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return module


def config(n_head, n_kv_head, impl="loop", **kw):
    base = {
        "vocab_size": 11,
        "block_size": 8,
        "n_layer": 2,
        "n_embd": 32,
        "n_head": n_head,
        "n_kv_head": n_kv_head,
        "bias": True,
        "attn_impl": impl,
    }
    return GPTConfig(**{**base, **kw})


def same_models(n_head, n_kv_head, seed=0, **kw):
    """One GPT per impl, all holding the same weights (the state_dict is impl-independent)."""
    ref = randomize(GPT(config(n_head, n_kv_head, "loop", **kw)), seed)
    models = {}
    for impl in ATTN_IMPLS:
        m = GPT(config(n_head, n_kv_head, impl, **kw))
        m.load_state_dict(ref.state_dict())  # strict: same keys for every impl
        models[impl] = m
    return models


def same_attention(n_head, n_kv_head, seed=0, **kw):
    ref = randomize(MultiHeadAttention(config(n_head, n_kv_head, "loop", **kw)), seed, std=0.3)
    out = {}
    for impl in ATTN_IMPLS:
        m = MultiHeadAttention(config(n_head, n_kv_head, impl, **kw))
        m.load_state_dict(ref.state_dict())
        out[impl] = m
    return out


def batch(vocab=11, B=3, T=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    targets[0, -3:] = -1  # padded targets are ignored by the loss
    return idx, targets


def test_state_dict_is_impl_independent():
    keys = {impl: list(GPT(config(4, 2, impl)).state_dict()) for impl in ATTN_IMPLS}
    assert keys["loop"] == keys["batched"] == keys["sdpa"]


@pytest.mark.parametrize("T", [8, 5])
@pytest.mark.parametrize("n_head,n_kv_head", HEADS, ids=HEAD_IDS)
def test_impls_same_logits_loss_and_grads(n_head, n_kv_head, T):
    models = same_models(n_head, n_kv_head)
    idx, targets = batch(T=T)
    results = {}
    for impl, m in models.items():
        logits, loss = m(idx, targets)
        loss.backward()
        grads = {name: p.grad.clone() for name, p in m.named_parameters()}
        results[impl] = (logits, loss, grads)
    ref_logits, ref_loss, ref_grads = results["loop"]
    assert ref_logits.abs().max() > 0.1  # not a degenerate comparison
    for impl in ("batched", "sdpa"):
        logits, loss, grads = results[impl]
        close(logits, ref_logits)
        close(loss, ref_loss)
        assert grads.keys() == ref_grads.keys()
        for name in ref_grads:
            assert ref_grads[name].abs().sum() > 0, name  # every parameter takes part
            close(grads[name], ref_grads[name])


@pytest.mark.parametrize("n_head,n_kv_head", HEADS, ids=HEAD_IDS)
def test_impls_same_attention_weights(n_head, n_kv_head):
    models = same_models(n_head, n_kv_head)
    idx, _ = batch(T=6)
    atts = {impl: m.forward_with_attention(idx)[2] for impl, m in models.items()}
    for impl in ATTN_IMPLS:
        assert len(atts[impl]) == 2  # one per layer
        for a, ref in zip(atts[impl], atts["loop"], strict=True):
            assert a.shape == (3, n_head, 6, 6)  # (B, H, T, Tk)
            close(a, ref)
            close(a.sum(-1), torch.ones(3, n_head, 6))  # each query's weights sum to 1
            assert (a.triu(diagonal=1) == 0).all()  # no weight on future keys


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("n_head", [1, 2, 4, 8])
def test_equals_torch_multihead_attention(n_head, impl):
    C, T = 32, 8
    ours = randomize(MultiHeadAttention(config(n_head, n_head, impl)), seed=n_head, std=0.3)
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


def reference_attention(x, m: MultiHeadAttention):
    """softmax(Q_h K_g^T / sqrt(hd) + causal) V_g per head, concatenated in head order, then W_O.

    Written from the formula, independently of the model's code: head h uses channels
    [h*hd, (h+1)*hd) of Q, and group g = h // (n_head // n_kv_head) of K and V.
    """
    _, T, C = x.shape
    H, Hkv = m.n_head, m.n_kv_head
    hd = C // H
    W, b = m.qkv.weight, m.qkv.bias
    Wq, Wk, Wv = W[:C], W[C : C + Hkv * hd], W[C + Hkv * hd :]
    bq, bk, bv = b[:C], b[C : C + Hkv * hd], b[C + Hkv * hd :]
    Q, K, V = x @ Wq.T + bq, x @ Wk.T + bk, x @ Wv.T + bv
    causal = torch.full((T, T), float("-inf")).triu(diagonal=1)  # 0 on and below the diagonal
    heads, weights = [], []
    for h in range(H):
        g = h // (H // Hkv)
        q = Q[..., h * hd : (h + 1) * hd]
        k = K[..., g * hd : (g + 1) * hd]
        v = V[..., g * hd : (g + 1) * hd]
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + causal, dim=-1)
        weights.append(a)
        heads.append(a @ v)
    return torch.cat(heads, dim=-1) @ m.proj.weight.T + m.proj.bias, torch.stack(weights, dim=1)


@pytest.mark.parametrize("n_head,n_kv_head", HEADS, ids=HEAD_IDS)
def test_equals_independent_per_head_reference(n_head, n_kv_head):
    mods = same_attention(n_head, n_kv_head, seed=n_head * 10 + n_kv_head)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y_ref, att_ref = reference_attention(x, mods["loop"])
    for m in mods.values():
        y, att = m(x, return_attn=True)
        close(y, y_ref)
        close(att, att_ref)


@pytest.mark.parametrize("n_head,n_kv_head", [(4, 4), (4, 2), (4, 1)])
def test_head_h_owns_its_channel_slice(n_head, n_kv_head):
    """Zeroing head 1's slice of W_O's input columns changes nothing that head 0 contributes."""
    mods = same_attention(n_head, n_kv_head, seed=5)
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(4))
    hd = 32 // n_head
    for m in mods.values():
        with torch.no_grad():
            m.proj.weight[:, hd:] = 0  # keep only head 0's output channels
            m.proj.bias.zero_()
            y, _ = m(x)
            y_ref, _ = reference_attention(x, m)
        close(y, y_ref)
        # changing head 1's query weights leaves the output unchanged: head 1 is not mixed in
        with torch.no_grad():
            m.qkv.weight[hd : 2 * hd] += 1.0
            y2, _ = m(x)
        close(y2, y)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("n_head,n_kv_head", [(4, 4), (4, 2), (4, 1)])
def test_causality_gpt(impl, n_head, n_kv_head):
    """Changing token t never changes the logits at positions < t, and does change position t."""
    m = randomize(GPT(config(n_head, n_kv_head, impl)), seed=2).eval()
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
def test_causality_attention_module(impl):
    m = randomize(MultiHeadAttention(config(4, 2, impl)), seed=3)
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y, _ = m(x)
        for t in range(8):
            x2 = x.clone()
            x2[:, t] += torch.randn(2, 32, generator=torch.Generator().manual_seed(t))
            y2, _ = m(x2)
            close(y2[:, :t], y[:, :t], atol=1e-6)
            assert not torch.allclose(y2[:, t:], y[:, t:], atol=1e-4)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_the_hook_point_is_each_heads_output_on_its_way_into_wo(impl):
    """`hook_z` sees z (B, T, H, hd), W_O's input split per head, and W_O reads what it returns:
    the one place every head intervention (microgpt.heads) goes through."""
    m = randomize(MultiHeadAttention(config(4, 2, impl)), seed=5).eval()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    seen, into = [], []
    hooks = [
        m.hook_z.register_forward_hook(lambda mod, args, z: seen.append(z)),
        m.proj.register_forward_pre_hook(lambda mod, args: into.append(args[0])),
    ]
    with torch.no_grad():
        y, _ = m(x)
        assert seen[0].shape == (2, 5, 4, 8)  # (B, T, H, hd)
        # (B, T, H, hd) -> (B, T, C): head h at channels [h*hd, (h+1)*hd)
        assert torch.equal(seen[0].reshape(2, 5, 32), into[0])
        for h in hooks:
            h.remove()
        # a hook that zeroes head 1 acts as zero columns of W_O for it
        zero = m.hook_z.register_forward_hook(
            lambda mod, args, z: z * torch.tensor([1, 0, 1, 1.0])[:, None]
        )
        got, _ = m(x)
        zero.remove()
        m.proj.weight[:, 8:16] = 0
        close(got, m(x)[0])
        assert not torch.allclose(got, y, atol=1e-3)
