"""KVCache, and cached decoding equal to a full forward at every position (litgpt test_kv_cache)."""

import pytest
import torch

from microgpt.kv_cache import KVCache
from microgpt.model import ATTN_IMPLS, GPT, GPTConfig
from tests.conftest import close


def model(impl="sdpa", seed=0, **kw):
    cfg = {"vocab_size": 11, "block_size": 12, "n_layer": 2, "n_embd": 32, "n_head": 4}
    m = GPT(GPTConfig(**{**cfg, "attn_impl": impl, "bias": True, **kw})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m


def tokens(B=3, T=12, seed=1):
    return torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("impl", ATTN_IMPLS)
@pytest.mark.parametrize(
    "chunks",
    [(1,) * 12, (4,) + (1,) * 8, (3, 4, 1, 2, 2)],
    ids=["one-token-steps", "prefill-then-steps", "uneven-chunks"],
)
def test_cached_decoding_equals_full_forward(impl, chunks):
    """A prompt prefilled in one forward, then one token a step, or several new tokens after a
    cached prefix (sdpa's explicit-mask path): the logits of one full forward."""
    m = model(impl)
    idx = tokens()
    with torch.no_grad():
        full, _ = m(idx)  # (B, T, vocab)
        cache = KVCache.for_model(m, batch_size=3)
        out, start = [], 0
        for size in chunks:
            assert cache.pos == start  # advanced once per forward, not once per layer
            out.append(m(idx[:, start : start + size], kv_cache=cache)[0])
            start += size
    assert cache.pos == 12
    close(torch.cat(out, dim=1), full)
    # the buffers hold keys at every position written, (B, H, block_size, hd) each
    assert all(buf.shape == (3, 4, 12, 8) and buf.abs().sum(-1).all() for buf in cache.k)


@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_cached_attention_weights_match_full_forward(impl):
    m = model(impl)
    idx = tokens(T=7)
    with torch.no_grad():
        _, _, full = m.forward_with_attention(idx)
        cache = KVCache.for_model(m, batch_size=3)
        m(idx[:, :4], kv_cache=cache)
        _, _, step = m.forward_with_attention(idx[:, 4:7], kv_cache=cache)
    for a_full, a_step in zip(full, step, strict=True):
        assert a_step.shape == (3, 4, 3, 7)  # (B, H, T new, Tk = pos + T)
        close(a_step, a_full[:, :, 4:7, :7])


def test_nbytes_is_keys_and_values_of_every_layer():
    m = model(n_layer=3)  # 4 heads of 8 channels, block 12
    assert KVCache.for_model(m, batch_size=5).nbytes == 2 * 3 * 5 * 4 * 12 * 8 * 4  # float32
    cache = KVCache(2, 3, 4, 12, 8, dtype=torch.bfloat16)  # batch, layers, heads, block, hd
    assert cache.nbytes == 2 * 3 * 2 * 4 * 12 * 8 * 2


def test_refusals_leave_the_cache_where_it_was():
    m = model()
    cache = KVCache.for_model(m, batch_size=3)
    idx = tokens()
    with torch.no_grad():
        m(idx[:, :10], kv_cache=cache)
        with pytest.raises(ValueError, match=r"sequence of 13 tokens is longer than block_size=12"):
            m(idx[:, :3], kv_cache=cache)
        with pytest.raises(ValueError, match="KV cache holds 3 rows but the input has 2"):
            m(idx[:2, 10:11], kv_cache=cache)
        with pytest.raises(ValueError, match=r"KV cache is full: position 10 \+ 3 new tokens > b"):
            cache.update(0, *[torch.zeros(3, 4, 3, 8)] * 2)  # k, v (B, H, T, hd)
    assert cache.pos == 10
