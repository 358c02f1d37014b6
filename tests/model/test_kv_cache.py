"""KVCache, and cached decoding equal to a full forward at every position (litgpt test_kv_cache)."""

import pytest
import torch

from microgpt.kv_cache import KVCache
from microgpt.model import ATTN_IMPLS, GPT, GPTConfig

ATOL = 1e-5
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA
HEAD_IDS = ["mha", "gqa", "mqa"]


def close(a, b):
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def model(impl, n_head=4, n_kv_head=4, seed=0, **kw):
    cfg = {
        "vocab_size": 11,
        "block_size": 12,
        "n_layer": 2,
        "n_embd": 32,
        "n_head": n_head,
        "n_kv_head": n_kv_head,
        "attn_impl": impl,
        "bias": True,
    }
    m = GPT(GPTConfig(**{**cfg, **kw})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m


def tokens(B=3, T=12, seed=1):
    return torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n_head,n_kv_head", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize("prompt", [1, 4])
def test_prefill_then_one_token_per_step_equals_full_forward(impl, n_head, n_kv_head, prompt):
    m = model(impl, n_head, n_kv_head)
    idx = tokens()
    with torch.no_grad():
        full, _ = m(idx)  # (B, T, vocab)
        cache = KVCache.for_model(m, batch_size=3)
        logits, _ = m(idx[:, :prompt], kv_cache=cache)  # prefill the prompt in one forward
        steps = [logits]
        for t in range(prompt, idx.size(1)):
            assert cache.pos == t
            logits, _ = m(idx[:, t : t + 1], kv_cache=cache)  # then one token per step
            steps.append(logits)
    assert cache.pos == idx.size(1)
    close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("n_head,n_kv_head", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_chunked_prefill_equals_full_forward(impl, n_head, n_kv_head):
    """Several tokens at once after a cached prefix (the sdpa path with an explicit mask)."""
    m = model(impl, n_head, n_kv_head)
    idx = tokens()
    with torch.no_grad():
        full, _ = m(idx)
        cache = KVCache.for_model(m, batch_size=3)
        chunks, start = [], 0
        for size in (3, 4, 1, 2, 2):  # 12 tokens in uneven chunks
            logits, _ = m(idx[:, start : start + size], kv_cache=cache)
            chunks.append(logits)
            start += size
    close(torch.cat(chunks, dim=1), full)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_cached_attention_weights_match_full_forward(impl):
    m = model(impl, 4, 2)
    idx = tokens(T=7)
    with torch.no_grad():
        _, _, full = m.forward_with_attention(idx)
        cache = KVCache.for_model(m, batch_size=3)
        m(idx[:, :4], kv_cache=cache)
        _, _, step = m.forward_with_attention(idx[:, 4:7], kv_cache=cache)
    for a_full, a_step in zip(full, step, strict=True):
        assert a_step.shape == (3, 4, 3, 7)  # (B, H, T new, Tk = pos + T)
        close(a_step, a_full[:, :, 4:7, :7])


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cache_shapes_per_layer(n_kv_head):
    m = model("batched", 4, n_kv_head, n_layer=3)
    cache = KVCache.for_model(m, batch_size=2)
    assert len(cache.k) == len(cache.v) == 3  # one buffer per layer
    for buf in cache.k + cache.v:
        assert buf.shape == (2, n_kv_head, 12, 8)  # (B, n_kv_head, block_size, hd)
        assert buf.dtype == torch.float32
    assert cache.pos == 0 and cache.batch_size == 2 and cache.block_size == 12


def test_position_advances_once_per_forward():
    m = model("sdpa", 4, 2, n_layer=3)
    cache = KVCache.for_model(m, batch_size=2)
    idx = tokens(B=2)
    with torch.no_grad():
        m(idx[:, :5], kv_cache=cache)
        assert cache.pos == 5  # not 5 * n_layer
        m(idx[:, 5:6], kv_cache=cache)
        assert cache.pos == 6
    # the buffers hold this forward's keys at positions < pos and nothing after
    for buf in cache.k:
        assert buf[:, :, :6].abs().sum() > 0
        assert (buf[:, :, 6:] == 0).all()


def test_update_returns_keys_so_far_and_advance_is_explicit():
    cache = KVCache(batch_size=1, n_layer=2, n_kv_head=2, block_size=5, head_dim=3)
    k, v = torch.ones(1, 2, 2, 3), 2 * torch.ones(1, 2, 2, 3)
    for layer in range(2):
        ks, vs = cache.update(layer, k, v)
        assert ks.shape == vs.shape == (1, 2, 2, 3)
    assert cache.pos == 0  # update does not move the position; advance does
    cache.advance(2)
    ks, vs = cache.update(0, 3 * k[:, :, :1], 4 * v[:, :, :1])
    assert ks.shape == (1, 2, 3, 3)
    assert torch.equal(ks[0, 0, :, 0], torch.tensor([1.0, 1.0, 3.0]))
    assert torch.equal(vs[0, 0, :, 0], torch.tensor([2.0, 2.0, 8.0]))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_reset_makes_the_cache_reusable(impl):
    m = model(impl, 4, 2)
    a, b = tokens(seed=1), tokens(seed=2)
    cache = KVCache.for_model(m, batch_size=3)
    buffers = [id(t) for t in cache.k + cache.v]

    def decode(idx):
        out = [m(idx[:, :3], kv_cache=cache)[0]]
        out += [m(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(3, 12)]
        return torch.cat(out, dim=1)

    with torch.no_grad():
        first = decode(a)
        cache.reset()
        assert cache.pos == 0
        other = decode(b)  # reuse for another batch: no stale keys leak in
        cache.reset()
        again = decode(a)
        close(other, m(b)[0])
    assert torch.equal(first, again)
    assert [id(t) for t in cache.k + cache.v] == buffers  # reused, not reallocated


@pytest.mark.parametrize(
    "dtype,size", [(torch.float32, 4), (torch.float64, 8), (torch.bfloat16, 2)]
)
def test_nbytes_formula(dtype, size):
    n_layer, B, Hkv, block, hd = 3, 2, 2, 10, 4
    cache = KVCache(B, n_layer, Hkv, block, hd, dtype=dtype)
    assert cache.nbytes == 2 * n_layer * B * Hkv * block * hd * size  # K and V of every layer
    assert "nbytes=" in repr(cache)


def test_nbytes_for_model():
    m = model("sdpa", 4, 2)  # 2 layers, hd 8, block 12
    assert KVCache.for_model(m, batch_size=5).nbytes == 2 * 2 * 5 * 2 * 12 * 8 * 4


def test_overflow_raises():
    cache = KVCache(batch_size=1, n_layer=1, n_kv_head=1, block_size=4, head_dim=2)
    cache.update(0, torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    cache.advance(3)
    with pytest.raises(
        ValueError, match=r"KV cache is full: position 3 \+ 2 new tokens > block_size 4"
    ):
        cache.update(0, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_sequence_longer_than_block_size_with_cache_raises(impl):
    m = model(impl, 4, 2)
    cache = KVCache.for_model(m, batch_size=3)
    idx = tokens()
    with torch.no_grad():
        m(idx[:, :10], kv_cache=cache)
        with pytest.raises(ValueError, match=r"sequence of 13 tokens is longer than block_size=12"):
            m(idx[:, :3], kv_cache=cache)
    assert cache.pos == 10  # the failed call did not move the cache


def test_cache_batch_size_mismatch_raises():
    m = model("sdpa")
    cache = KVCache.for_model(m, batch_size=2)
    with pytest.raises(ValueError, match="KV cache holds 2 rows but the input has 3"):
        m(tokens(B=3, T=2), kv_cache=cache)
