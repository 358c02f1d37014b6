"""Choosing the next token (temperature, top-k, top-p), and sampling named items from a model.

The part that picks a token from logits knows nothing of models, so `GPT.generate` uses it and
tests can check it alone.
"""

from __future__ import annotations

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
