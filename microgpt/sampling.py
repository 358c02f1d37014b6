"""Choosing the next token (temperature, top-k, top-p), and sampling named items from a model.

The part that picks a token from logits knows nothing of models, so `GPT.generate` uses it and
tests can check it alone.
"""

from __future__ import annotations

import os

import torch


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise a ValueError naming the setting and its valid range."""
    if temperature is None or not temperature >= 0:
        raise ValueError(f"temperature={temperature!r} must be >= 0 (0 = greedy, 1 = the model's own distribution)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} must be an integer >= 1 (or null to keep every token)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} must be in (0, 1] (1 keeps every token)")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits (B, V) -> one token id per row (B,).

    temperature 0 is greedy (argmax). Otherwise the logits are divided by the temperature, cut to
    the top_k most likely tokens and then to the smallest set whose probability reaches top_p,
    and a token is drawn with `generator`.
    """
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the tokens ranked above
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)


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
) -> list[str]:
    """Sample `num_samples` items (strings) from `model`, `batch_size` at a time, each starting with `prefix`.

    The same seed gives the same items, with or without the cache. max_len caps the length of an
    item (prefix included); by default it is what the block size allows.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be at least 1")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    if max_len is not None and max_len <= len(prefix):
        raise ValueError(f"max_len={max_len} must be longer than the prefix ({len(prefix)} characters)")
    check_sampling_args(temperature, top_k, top_p)
    tokenizer.check(prefix, what="prefix")
    prefix_ids = tokenizer.encode(prefix)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(7), "little"))
    max_new = None if max_len is None else max_len - len(prefix)
    batch_size = batch_size or num_samples
    was_training = model.training
    model.eval()
    items: list[str] = []
    try:
        while len(items) < num_samples:
            n = min(batch_size, num_samples - len(items))
            rows = model.generate(n, prefix=prefix_ids, temperature=temperature, top_k=top_k, top_p=top_p,
                                  generator=generator, use_cache=use_cache, max_new_tokens=max_new)
            items.extend(tokenizer.decode(row) for row in rows.tolist())
    finally:
        model.train(was_training)
    return items


def mark_items(items: list[str], split) -> list[tuple[str, str]]:
    """Each item with where it was found: "train", "val", "test", or "new" (split: data.Split or None)."""
    return [(item, (split.where(item) if split is not None else None) or "new") for item in items]


def format_marked(marked: list[tuple[str, str]]) -> list[str]:
    """Printable lines, makemore style: each item with its mark, then a summary line."""
    width = max((len(item) for item, _ in marked), default=0)
    lines = [f"{item:<{width}}  {'(new)' if where == 'new' else f'(in {where})'}" for item, where in marked]
    n_new = sum(where == "new" for _, where in marked)
    n_unique = len({item for item, _ in marked})
    lines.append(f"{n_new} of {len(marked)} new, {n_unique} unique")
    return lines
