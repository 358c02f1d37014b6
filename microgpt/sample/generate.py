"""Decoding: `sample_next` (logits -> one token per row: temperature, top-k, top-p); `decode`,
the loop that continues a prompt with a GPT and its KV cache, sliding past the context; `generate`
(item rows) and `sample_items` (strings, in batches). Sampling settings are checked where they
enter (`check_sampling_args`, by SampleConfig); what needs the model, where it is known.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from microgpt.errors import SamplingError
from microgpt.kv_cache import KVCache
from microgpt.system import check_memory, decoding_seconds, eval_mode
from microgpt.tokenizer import BOUNDARY_ID

DEFAULT_BATCH = 1024  # items sampled at once when batch_size is None, at most
CACHE_BUDGET = 256 * 2**20  # bytes: the default batch shrinks so that its KV cache fits in this
# Below this much work per decoding step (batch x n_layer x n_embd^2), a CPU forward pass is small
# ops that a thread pool slows down: on 2 busy cores with the small preset, 1,000 names 5-40x and
# 10,000 names 3-4x faster on one thread than on two. Bigger work keeps PyTorch's thread count.
SINGLE_THREAD_WORK = 2**30
MAX_NEW_CHARS = 100_000  # the most max_len: one step of the model per character


def cache_bytes_per_row(model) -> int:
    """The KV cache's bytes for one sampled item: keys and values of every layer, full block."""
    c, itemsize = model.config, next(model.parameters()).element_size()
    return 2 * c.n_layer * c.block_size * c.n_embd * itemsize


def default_batch(model, num_samples: int) -> int:
    """Items sampled at once by default: up to DEFAULT_BATCH, as many as CACHE_BUDGET holds."""
    return max(1, min(num_samples, DEFAULT_BATCH, CACHE_BUDGET // cache_bytes_per_row(model)))


def check_sampling_args(temperature=1.0, top_k=None, top_p=None, prefix="", **whole) -> None:
    """Every sampling setting that needs no model, checked once: by SampleConfig, or by a library
    caller that bypasses it. whole: num_samples, batch_size, seed, max_len (None: not set). A
    SamplingError names the setting and its valid range."""
    for name, v in dict(whole, top_k=top_k).items():
        least = 0 if name == "seed" else 1
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SamplingError(f"{name}={v!r} must be an integer")
        if v is not None and v < least:
            raise SamplingError(f"{name}={v} must be at least {least} (or null)")
    if (whole.get("seed") or 0) >= 2**63:
        raise SamplingError(f"seed={whole['seed']} must be below 2**63 (or null = random)")
    if (whole.get("max_len") or 0) > MAX_NEW_CHARS:
        n = whole["max_len"]
        raise SamplingError(
            f"max_len={n:,} would take {n:,} steps of the model, one per character (about "
            f"{decoding_seconds(1, n) / 60:,.0f} minutes for a tiny model on a CPU, more for a "
            f"larger one) before anything is printed; at most {MAX_NEW_CHARS:,} here (a names run "
            f"never needs more than its block size)"
        )
    if temperature is None or not temperature >= 0 or temperature == float("inf"):
        raise SamplingError(
            f"temperature={temperature!r} must be >= 0 and finite "
            f"(0 = greedy, 1 = the model's own distribution)"
        )
    if top_p is not None and not 0 < top_p <= 1:
        raise SamplingError(f"top_p={top_p!r} must be in (0, 1] (1 keeps every token)")
    if not isinstance(prefix, str):
        raise SamplingError(f"prefix={prefix!r} must be a string")


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None) -> torch.Tensor:
    """logits (B, V) -> one token id per row (B,): argmax at temperature 0, else drawn from the
    tempered logits cut to the top_k tokens, then to the smallest set reaching probability top_p."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    # subtracting the max first keeps a tiny temperature from overflowing to inf (and NaN later)
    logits = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability ranked above each token
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)


@torch.inference_mode()  # no autograd graph: sampling is 25% faster for it on small models
def decode(model, prompt, n, new, stop=True, use_cache=True, **sampling) -> torch.Tensor:
    """(n, len(prompt) + new) rows: the ids `prompt`, then `new` tokens, each drawn (sample_next)
    from the block_size before it: cached while they all fit, then a sliding window, recomputed.
    stop: a row ends at its first boundary token (boundary tokens follow); all ended, the rows
    are cut. sampling: sample_next's temperature, top_k, top_p and generator."""
    device, T, start = next(model.parameters()).device, model.config.block_size, len(prompt)
    idx = torch.full((n, start + new), BOUNDARY_ID, device=device)  # (n, len(prompt) + new)
    idx[:, :start] = torch.tensor(prompt, dtype=torch.long, device=device)
    cache = KVCache.for_model(model, n) if use_cache and start < min(T, idx.size(1)) else None
    done = torch.zeros(n, dtype=torch.bool, device=device)
    with eval_mode(model):  # no dropout while sampling: the same generator state, the same rows
        for end in range(start, idx.size(1)):
            if cache is not None and end <= T:
                # the prompt in one forward (prefill), then one token per step
                logits, _ = model(idx[:, cache.pos : end], kv_cache=cache)
            else:
                # the last T tokens, recomputed
                logits, _ = model(idx[:, max(0, end - T) : end])
            nxt = sample_next(logits[:, -1, :], **sampling)  # (B,)
            if stop:
                nxt.masked_fill_(done, BOUNDARY_ID)
                done |= nxt == BOUNDARY_ID
            idx[:, end] = nxt
            if stop and bool(done.all()):  # one host sync a step: cheap next to a forward pass
                return idx[:, : end + 1]
    return idx


def generate(
    model, num_samples=1, prefix=(), max_new_tokens=None, stop_at_boundary=True, **sampling
) -> torch.Tensor:
    """(num_samples, len(prefix) + new) ids: items decoded after the boundary token and `prefix`
    (character ids, checked by the caller: Data.prompt), of at most max_new_tokens new tokens and
    block_size - 1 characters (the longest item trained on); the same with and without the cache
    for the same generator state. sampling: decode's (use_cache, temperature, generator...).
    stop_at_boundary=False fills every row to its full length (benchmarks)."""
    prompt = [BOUNDARY_ID, *map(int, prefix or ())]
    new = model.config.block_size - len(prompt)  # an item holds block_size - 1 characters at most
    new = new if max_new_tokens is None else min(new, max_new_tokens)
    return decode(model, prompt, num_samples, new, stop_at_boundary, **sampling)[:, 1:]


def seeded(device: torch.device, seed: int | None) -> torch.Generator:
    """A generator on `device` seeded with `seed` (None: a random seed)."""
    seed = seed if seed is not None else int.from_bytes(os.urandom(7), "little")
    return torch.Generator(device=device).manual_seed(seed)


def sample_items(
    model, tok, n, prefix="", seed=None, batch_size=None, max_len=None, progress=None, **sampling
) -> list[str]:
    """`n` items (strings, decoded by the tokenizer `tok`) sampled `batch_size` at a time, each
    starting with `prefix` and at most `max_len` characters long (default: what the block size
    allows); sampling: decode's (use_cache, temperature, top_k, top_p). The same seed gives the
    same items, with or without the cache. `progress(done, total)` follows each batch."""
    if max_len is not None and max_len <= len(prefix):
        raise SamplingError(f"max_len={max_len} must be longer than the prefix ({len(prefix)})")
    prefix_ids = tok.encode(prefix)
    device = next(model.parameters()).device
    batch_size = min(batch_size or default_batch(model, n), n)
    if sampling.get("use_cache", True):
        need = batch_size * cache_bytes_per_row(model)
        what = f"batch_size={batch_size} with the KV cache"
        check_memory(need, device, what, "lower batch_size (or leave it null)", SamplingError)
    max_new = None if max_len is None else max_len - len(prefix)
    sampling["generator"] = seeded(device, seed)  # one stream across the batches
    items: list[str] = []
    with decoding_threads(model, batch_size):
        while len(items) < n:
            rows = generate(model, min(batch_size, n - len(items)), prefix_ids, max_new, **sampling)
            items.extend(tok.decode(row) for row in rows.tolist())
            if progress is not None:
                progress(len(items), n)
    return items


@contextlib.contextmanager
def decoding_threads(model, batch_size: int) -> Iterator[None]:
    """While open, one CPU thread where a decoding step is small (SINGLE_THREAD_WORK)."""
    c, threads = model.config, torch.get_num_threads()
    cpu = next(model.parameters()).device.type == "cpu"
    small = cpu and batch_size * c.n_layer * c.n_embd**2 < SINGLE_THREAD_WORK
    torch.set_num_threads(1 if small else threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
