"""Decoding: choosing the next token, sampling many items at once, and marking them new or known.

- `sample_next`: logits -> one token per row (temperature, top-k, top-p); knows nothing of models.
- `generate(model, ...)`: token rows from a GPT, all rows at once, with the KV cache by default.
- `sample_items(model, tokenizer, ...)`: strings, in batches, from a seed.
- `continue_text(model, prompt, ...)`: a passage continuing a prompt, sliding past the context.
- `mark_items` / `format_marked`: each item "new" or found in a split, makemore style.

Sampling settings are checked once, where they enter (`generate`, `sample_items`, or the sample
command's config), never on every decoding step.
"""

from __future__ import annotations

import contextlib
import os

import torch

from microgpt.errors import SamplingError
from microgpt.kv_cache import KVCache
from microgpt.system import available_memory, eval_mode
from microgpt.tokenizer import BOUNDARY_ID

DEFAULT_BATCH = 1024  # items sampled at once when batch_size is None, at most
CACHE_BUDGET = 256 * 2**20  # bytes: the default batch shrinks so that its KV cache fits in this


def cache_bytes_per_row(model) -> int:
    """The KV cache's bytes for one sampled item: keys and values of every layer, full block."""
    c = model.config
    itemsize = next(model.parameters()).element_size()
    return 2 * c.n_layer * c.n_kv_head * c.block_size * c.head_dim * itemsize


def default_batch(model, num_samples: int) -> int:
    """Items sampled at once when no batch size is given: up to DEFAULT_BATCH, and no more than
    the KV cache of CACHE_BUDGET bytes holds (a model with a long block_size samples fewer)."""
    return max(1, min(num_samples, DEFAULT_BATCH, CACHE_BUDGET // cache_bytes_per_row(model)))


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise a SamplingError naming the setting and its valid range."""
    if temperature is None or not temperature >= 0 or temperature == float("inf"):
        raise SamplingError(
            f"temperature={temperature!r} must be >= 0 and finite "
            f"(0 = greedy, 1 = the model's own distribution)"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise SamplingError(
            f"top_k={top_k!r} must be an integer >= 1 (or null to keep every token)"
        )
    if top_p is not None and not 0 < top_p <= 1:
        raise SamplingError(f"top_p={top_p!r} must be in (0, 1] (1 keeps every token)")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits (B, V) -> one token id per row (B,). The arguments are taken as checked.

    temperature 0 is greedy (argmax). Otherwise the logits are divided by the temperature, cut to
    the top_k most likely tokens and then to the smallest set whose probability reaches top_p,
    and a token is drawn with `generator`.
    """
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


def _check_prefix_ids(prefix: list[int], vocab_size: int, block_size: int) -> None:
    if len(prefix) > block_size - 1:
        raise SamplingError(
            f"prefix of {len(prefix)} characters is longer than this model's items: block_size is "
            f"{block_size} (1 boundary token + at most {block_size - 1} characters)"
        )
    if any(not 0 < t < vocab_size for t in prefix):
        raise SamplingError(f"prefix ids must be characters, in 1..{vocab_size - 1}: {prefix}")


def generate(
    model,
    num_samples: int = 1,
    prefix=None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    max_new_tokens: int | None = None,
    stop_at_boundary: bool = True,
) -> torch.Tensor:
    """Sample num_samples rows at once from `model` (a GPT), each starting with `prefix` (ids).

    Returns (num_samples, n) ids: the prefix, then the sampled tokens. A row ends at its first
    boundary token (later positions hold boundary tokens too) or at block_size - 1 characters,
    the longest item the model was trained on. The same generator state gives the same rows with
    and without the cache. stop_at_boundary=False fills every row to its full length (benchmarks).
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise SamplingError(f"num_samples={num_samples!r} must be an integer >= 1")
    check_sampling_args(temperature, top_k, top_p)
    prefix = [int(t) for t in (prefix if prefix is not None else [])]
    _check_prefix_ids(prefix, model.config.vocab_size, model.config.block_size)
    return _generate(
        model,
        num_samples,
        prefix,
        temperature,
        top_k,
        top_p,
        generator,
        use_cache,
        max_new_tokens,
        stop_at_boundary,
    )


@torch.inference_mode()  # no autograd graph: sampling is 25% faster for it on small models
def _generate(
    model, num_samples, prefix, temperature, top_k, top_p, generator, use_cache, max_new, stop
):
    """generate() with its arguments taken as checked."""
    steps = model.config.block_size - 1 - len(prefix)  # items hold at most block_size - 1 chars
    if max_new is not None:
        steps = min(steps, max_new)
    device = model.wte.weight.device
    start = len(prefix) + 1  # the boundary token, then the prefix
    # One preallocated buffer (B, start + steps), filled in place: no per-step torch.cat.
    idx = torch.full((num_samples, start + steps), BOUNDARY_ID, dtype=torch.long, device=device)
    if prefix:
        idx[:, 1:start] = torch.tensor(prefix, dtype=torch.long, device=device)
    with eval_mode(model):  # no dropout while sampling: the same generator state, the same rows
        cache = KVCache.for_model(model, num_samples) if use_cache and steps > 0 else None
        done = torch.zeros(num_samples, dtype=torch.bool, device=device)
        end = start  # columns filled so far
        for step in range(steps):
            if cache is None:
                # the whole context, every step
                logits, _ = model(idx[:, :end])
            else:
                # the prompt in one forward (prefill), then one token per step
                new = idx[:, :end] if step == 0 else idx[:, end - 1 : end]
                logits, _ = model(new, kv_cache=cache)
            nxt = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)  # (B,)
            if stop:
                nxt.masked_fill_(done, BOUNDARY_ID)
            idx[:, end] = nxt
            end += 1
            if stop:
                done |= nxt == BOUNDARY_ID
                if bool(done.all()):  # one host sync per step: cheap next to a forward pass
                    break
        return idx[:, 1:end]


def continue_text(
    model,
    prompt: list[int],
    max_new_tokens: int,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """Continue `prompt` (ids, at least one) by `max_new_tokens` sampled tokens in each of
    num_samples rows: (num_samples, len(prompt) + max_new_tokens) ids. Beyond the model's context
    the window slides: each token is drawn from the block_size tokens before it (recomputed; the
    KV cache serves while everything fits). No token ends a row (text has no boundary token)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise SamplingError(f"num_samples={num_samples!r} must be an integer >= 1")
    if not prompt:
        raise SamplingError("a continuation needs a prompt of at least one character")
    if any(not 0 <= int(t) < model.config.vocab_size for t in prompt):
        raise SamplingError(f"prompt ids must be in 0..{model.config.vocab_size - 1}")
    check_sampling_args(temperature, top_k, top_p)
    return _continue(
        model, [int(t) for t in prompt], max_new_tokens, num_samples,
        temperature, top_k, top_p, generator, use_cache,
    )  # fmt: skip


@torch.inference_mode()
def _continue(model, prompt, max_new, n, temperature, top_k, top_p, generator, use_cache):
    """continue_text() with its arguments taken as checked."""
    T, device = model.config.block_size, model.wte.weight.device
    idx = torch.empty((n, len(prompt) + max_new), dtype=torch.long, device=device)  # (B, P + new)
    idx[:, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    cache = KVCache.for_model(model, n) if use_cache and len(prompt) < T else None
    with eval_mode(model):
        # columns filled; of them, columns in the cache
        end, cached = len(prompt), 0
        for _ in range(max_new):
            if cache is not None and end <= T:
                # the prompt at once, then one token a step
                logits, _ = model(idx[:, cached:end], kv_cache=cache)
                cached = end
            else:
                # the last T tokens, recomputed
                logits, _ = model(idx[:, max(0, end - T) : end])
            idx[:, end] = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)
            end += 1
        return idx


def sample_items(
    model,
    tokenizer,
    num_samples: int,
    prefix: str = "",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    use_cache: bool = True,
    max_len: int | None = None,
    progress=None,
) -> list[str]:
    """Sample `num_samples` items (strings) from `model`, `batch_size` at a time, each starting with
    `prefix`. The same seed gives the same items, with or without the cache. max_len caps an item's
    length (prefix included); by default it is what the block size allows. `progress(done,
    total)`, if given, is called after each batch."""
    for name, value in (("num_samples", num_samples), ("batch_size", batch_size)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise SamplingError(f"{name}={value!r} must be an integer >= 1")
    if max_len is not None and max_len <= len(prefix):
        raise SamplingError(
            f"max_len={max_len} must be longer than the prefix ({len(prefix)} characters)"
        )
    check_sampling_args(temperature, top_k, top_p)
    prefix_ids = _prefix_ids(model, tokenizer, prefix)
    device = next(model.parameters()).device
    batch_size = min(batch_size or default_batch(model, num_samples), num_samples)
    if use_cache:
        _check_cache_fits(model, batch_size, device)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(7), "little"))
    max_new = None if max_len is None else max_len - len(prefix)
    items: list[str] = []
    with _num_threads(_sampling_threads(model, min(batch_size, num_samples), device)):
        while len(items) < num_samples:
            n = min(batch_size, num_samples - len(items))
            rows = _generate(
                model, n, prefix_ids, temperature, top_k, top_p, generator, use_cache, max_new, True
            )
            items.extend(tokenizer.decode(row) for row in rows.tolist())
            if progress is not None:
                progress(len(items), num_samples)
    return items


def _prefix_ids(model, tokenizer, prefix: str) -> list[int]:
    """The prefix's ids; a SamplingError if the tokenizer or the model cannot take it."""
    try:
        tokenizer.check(prefix, what="prefix")
    except ValueError as e:
        raise SamplingError(str(e)) from None
    prefix_ids = tokenizer.encode(prefix)
    _check_prefix_ids(prefix_ids, model.config.vocab_size, model.config.block_size)
    return prefix_ids


def _check_cache_fits(model, batch_size: int, device: torch.device) -> None:
    """Refuse a batch whose KV cache the device's free memory cannot hold."""
    free = available_memory(device)
    if free is not None and batch_size * cache_bytes_per_row(model) > free:
        raise SamplingError(
            f"batch_size={batch_size} needs a KV cache of "
            f"{batch_size * cache_bytes_per_row(model) / 2**30:.1f} GiB but {device} has "
            f"{free / 2**30:.1f} GiB free; lower batch_size (or leave it null)"
        )


# Below this much work per decoding step (batch x n_layer x n_embd^2), a CPU forward pass is a few
# hundred small ops, and handing each to a pool of threads costs more than it saves. Measured on 2
# busy cores with the small preset (4 layers, n_embd 64): 1,000 names 5-40x faster on one thread
# than on two, 10,000 names 3-4x faster. Bigger work keeps PyTorch's thread count.
SINGLE_THREAD_WORK = 2**30


def _sampling_threads(model, batch: int, device: torch.device) -> int | None:
    """1 for small CPU work, None (leave PyTorch's setting alone) otherwise."""
    c = model.config
    if device.type != "cpu":
        return None
    return 1 if batch * c.n_layer * c.n_embd**2 < SINGLE_THREAD_WORK else None


@contextlib.contextmanager
def _num_threads(n: int | None):
    """Run with n intra-op CPU threads, then restore the previous setting."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def mark_items(items: list[str], split) -> list[tuple[str, str]]:
    """Each item with where it was found: "train", "val", "test", "new", or "empty" (an item that
    ended at once). split: a data.Split, or None (every non-empty item is then "new")."""
    return [
        (
            item,
            "empty" if item == "" else (split.where(item) if split is not None else None) or "new",
        )
        for item in items
    ]


def format_marked(marked: list[tuple[str, str]]) -> list[str]:
    """Printable lines, makemore style: each item with its mark, then a summary line."""
    width = max((len(item) for item, _ in marked), default=0)
    lines = [
        f"{item:<{width}}  {f'({where})' if where in ('new', 'empty') else f'(in {where})'}"
        for item, where in marked
    ]
    n_new = sum(where == "new" for _, where in marked)
    n_empty = sum(where == "empty" for _, where in marked)
    n_unique = len({item for item, where in marked if where != "empty"})
    empty = f", {n_empty} empty" if n_empty else ""
    lines.append(f"{n_new} of {len(marked)} new, {n_unique} unique{empty}")
    return lines
