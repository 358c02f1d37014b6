"""Choosing the next token (sample_next), the sampling settings' one check, and decoding items
from a model (generate): with the KV cache the same as without."""

import re

import pytest
import torch

from microgpt.errors import SamplingError
from microgpt.model import ATTN_IMPLS, GPT, GPTConfig
from microgpt.sample import generate as generate_module
from microgpt.sample.generate import check_sampling_args, decoding_threads, generate, sample_next
from microgpt.tokenizer import BOUNDARY_ID, CharTokenizer

# ---------------------------------------------------------------- sample_next

# A hand-made distribution over 6 tokens, in a shuffled order so that "most likely" is not "first".
PROBS = torch.tensor([0.05, 0.30, 0.02, 0.50, 0.10, 0.03])
ORDER = [3, 1, 4, 0, 5, 2]  # tokens from most to least likely


DYADIC = torch.tensor([0.5, 0.25, 0.125, 0.125])  # exact through log -> softmax in fp32


def draws(n=4000, seed=0, probs=PROBS, **kw):
    logits = probs.log().repeat(n, 1)  # (n, V): n independent rows
    return sample_next(logits, generator=torch.Generator().manual_seed(seed), **kw)


def test_temperature_zero_and_a_tiny_one_are_argmax():
    logits = torch.randn(5, 9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next(logits, 0, top_k=3, top_p=0.5), logits.argmax(-1))
    tiny = sample_next(logits, 1e-40, generator=torch.Generator().manual_seed(0))  # no overflow
    assert torch.equal(tiny, logits.argmax(-1))


NUCLEI = [(0.3, 1), (0.45, 1), (0.7, 2), (0.85, 3), (0.93, 4), (0.97, 5), (1.0, 6)]


@pytest.mark.parametrize(
    "probs, settings, kept",
    [*((PROBS, {"top_k": k}, ORDER[:k]) for k in (1, 2, 3, 5, 6, 100)),
     # top_p: the smallest set of most likely tokens whose probability reaches it
     *((PROBS, {"top_p": p}, ORDER[:n]) for p, n in NUCLEI),
     # a set whose probability equals top_p exactly is enough: the next token is not added
     *((DYADIC, {"top_p": p}, range(n)) for p, n in ((0.5, 1), (0.75, 2), (0.875, 3))),
     # top_k=3 keeps {3, 1, 4} renormalised to {0.556, 0.333, 0.111}; top_p=0.6 then {3, 1}
     (PROBS, {"top_k": 3, "top_p": 0.6}, [3, 1])],
)  # fmt: skip
def test_top_k_and_top_p_keep_only_their_tokens(probs, settings, kept):
    assert set(draws(probs=probs, **settings).tolist()) == set(kept)  # each shows up, no other


def test_top_p_renormalises_within_the_nucleus():
    out = draws(n=20000, top_p=0.7)  # nucleus {3: 0.5, 1: 0.3}
    freq3 = (out == 3).float().mean().item()
    assert abs(freq3 - 0.5 / 0.8) < 0.02


@pytest.mark.parametrize("t", [0.25, 1.0, 4.0])
def test_temperature_sharpens_and_flattens_the_distribution(t):
    """Logits divided by the temperature: p_i^(1/t), renormalised."""
    freq = torch.bincount(draws(n=20000, temperature=t), minlength=6).float() / 20000
    tempered = PROBS ** (1 / t)
    torch.testing.assert_close(freq, tempered / tempered.sum(), atol=0.015, rtol=0)


def test_rows_are_cut_independently():
    logits = torch.stack([PROBS.log(), PROBS.flip(0).log()]).repeat(2000, 1)  # alternating rows
    out = sample_next(logits, top_k=1, generator=torch.Generator().manual_seed(0))
    assert set(out[0::2].tolist()) == {3} and set(out[1::2].tolist()) == {2}


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"temperature": -0.5}, "temperature=-0.5 must be >= 0"),
        ({"top_k": 2.5}, "top_k=2.5 must be an integer"),
        ({"top_k": True}, "top_k=True must be an integer"),
        ({"top_p": 0.0}, "top_p=0.0 must be in (0, 1]"),
        ({"num_samples": "3"}, "num_samples='3' must be an integer"),
        ({"seed": 2**63}, "seed=9223372036854775808 must be below 2**63"),
        ({"prefix": 3}, "prefix=3 must be a string"),
    ],
)
def test_bad_sampling_settings_are_named_by_the_one_check(kw, msg):
    """tests/test_config.py's "sample:" rows reach it through SampleConfig: the rest here."""
    with pytest.raises(SamplingError, match=re.escape(msg)):
        check_sampling_args(**kw)


# ---------------------------------------------------------------- GPT.generate

TOK = CharTokenizer("abcdefghij")  # vocab 11: boundary + 10 characters


def model(impl="sdpa", seed=0, block_size=10):
    sizes = {"block_size": block_size, "n_layer": 2, "n_embd": 32, "n_head": 4}
    m = GPT(GPTConfig(vocab_size=TOK.vocab_size, attn_impl=impl, **sizes)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # peaky distributions, so rows differ in length and some end early
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def gen(m, seed=0, **kw):
    return generate(m, generator=torch.Generator().manual_seed(seed), **kw)


SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 3},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 0.9, "top_k": 5, "top_p": 0.9},
    {"temperature": 0},
]


@pytest.mark.parametrize("prefix", [None, "ab"])
@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
@pytest.mark.parametrize("impl", ATTN_IMPLS)
def test_same_items_with_and_without_cache(impl, settings, prefix):
    m = model(impl)
    pre = TOK.encode(prefix) if prefix else None
    cached = gen(m, num_samples=16, prefix=pre, use_cache=True, **settings)
    uncached = gen(m, num_samples=16, prefix=pre, use_cache=False, **settings)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("prefix", ["", "jih", "abcdefghi"])
def test_items_start_with_the_prefix_vary_in_length_and_end_in_boundary_tokens(prefix):
    out = gen(model(), num_samples=32, prefix=TOK.encode(prefix))
    assert out.dtype == torch.long and out.shape[0] == 32 and out.shape[1] <= 9
    assert all(TOK.decode(row).startswith(prefix) for row in out)
    for row in out.tolist():  # after a row's first boundary token, only boundary tokens
        ended = row[row.index(BOUNDARY_ID) :] if BOUNDARY_ID in row else []
        assert set(ended) <= {BOUNDARY_ID}
    # the cache test is not trivial: rows end at different steps
    assert prefix == "abcdefghi" or len({len(TOK.decode(row)) for row in out}) >= 3


def test_greedy_follows_the_full_forward_argmax_and_top_k_one_is_greedy():
    m = model()
    greedy = generate(m, num_samples=3, temperature=0)  # no generator needed
    assert (greedy == greedy[0]).all()  # every row is the same argmax path
    context = [BOUNDARY_ID]
    for token in greedy[0].tolist():
        assert token == m(torch.tensor([context]))[0][0, -1].argmax().item()
        if token == BOUNDARY_ID:
            break
        context.append(token)
    for seed in range(2):
        assert torch.equal(gen(m, seed=seed, num_samples=3, temperature=2.0, top_k=1), greedy)


def biased(m, boundary_logit):
    """Add boundary_logit to the boundary token's logit at every position."""

    def hook(module, inputs, out):
        out = out.clone()
        out[..., BOUNDARY_ID] += boundary_logit
        return out

    m.lm_head.register_forward_hook(hook)
    return m


@pytest.mark.parametrize("use_cache", [True, False])
def test_rows_stop_at_block_size(use_cache):
    m = biased(model(block_size=7), -1e4)  # the boundary token is never sampled
    out = gen(m, num_samples=5, use_cache=use_cache)
    # training items hold at most block_size - 1 = 6 characters: so do sampled ones, which can
    # then be encoded into a block again (boundary + 6 characters = 7 positions)
    assert out.shape == (5, 6)
    assert (out != BOUNDARY_ID).all()
    out = gen(m, num_samples=5, prefix=TOK.encode("abc"), use_cache=use_cache)
    assert out.shape == (5, 6)
    out = gen(m, num_samples=5, max_new_tokens=2, use_cache=use_cache)
    assert out.shape == (5, 2)


@pytest.mark.parametrize("use_cache", [True, False])
def test_rows_stop_at_boundary(use_cache):
    m = biased(model(), 1e4)  # the boundary token is always sampled
    out = gen(m, num_samples=4, use_cache=use_cache)
    assert out.shape == (4, 1) and (out == BOUNDARY_ID).all()  # empty items; sampling stops
    pre = TOK.encode("cab")
    out = gen(m, num_samples=4, prefix=pre, use_cache=use_cache)
    assert out.tolist() == [[*pre, BOUNDARY_ID]] * 4
    assert TOK.decode(out[0]) == "cab"


def test_generate_in_training_mode_is_deterministic_and_keeps_the_mode():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_embd=16, n_head=2, dropout=0.5))
    model.train()
    rows = [generate(model, 6, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(rows[0], rows[1])  # dropout is off while sampling
    assert model.training


def test_small_decoding_steps_take_one_thread_then_the_threads_come_back(monkeypatch):
    """decoding_threads, around sample_items and a text's passages: one thread for small steps."""
    counts = []
    monkeypatch.setattr(torch, "set_num_threads", counts.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with decoding_threads(model(), batch_size=8):
        assert counts == [1]
    assert counts == [1, 2]
    monkeypatch.setattr(generate_module, "SINGLE_THREAD_WORK", 1)  # every step counts as big
    with decoding_threads(model(), batch_size=8):
        assert counts[2:] == [2]
