"""Sequences of repeated random spans: the probe of induction and in-context copying, and the
training data of the induction experiment (Elhage et al. 2021, Olsson et al. 2022). A row is the
boundary token, a span of L random characters, then the same span again:

    x = [0, s1, s2, ..., sL, s1, s2, ..., sL, 0...]    # then padding up to the block
    y = [s1, s2, ..., sL, s1, s2, ..., sL, -1, -1...]  # the next token; -1 is ignored

The first copy cannot be predicted; in the repeat, from s2 on, an induction head (attend to the
token after an earlier occurrence of this one, copy it) predicts each character. The loss is
compared on the same targets s2..sL in both copies: the first copy's at positions 1..L-1, the
repeat's at L+1..2L-1. A seeded torch.Generator gives the same rows on any machine. On a text
model the rows are passages of its own text twice, without the boundary token (repeated_passages).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
from torch import Tensor

from microgpt.data.lines import IGNORE_ID, LinesData
from microgpt.errors import DataError
from microgpt.system import check_memory, items_bytes
from microgpt.tokenizer import BOUNDARY_ID


@dataclass
class Repeats:
    """Rows of repeated spans x, y (N, T), and bool masks (N, T) of the comparable targets in the
    first copy and in the repeat."""

    x: Tensor
    y: Tensor
    first: Tensor
    repeat: Tensor
    lengths: Tensor  # (N,) the span length L of each row


def span_for(block_size: int) -> int:
    """The longest span whose two copies and the boundary token fit `block_size` positions."""
    return (block_size - 1) // 2


def repeated_spans(n, vocab_size, span, generator=None, block_size=None, fill=False) -> Repeats:
    """n rows of a boundary token and a random span (L, or a length in (lo, hi)) repeated twice,
    the span's characters all different where L < vocab_size; block_size: the row width (default
    2 * L_max + 1). fill: the copies start after random characters and random characters fill the
    row, so nothing but the content tells where the earlier copy is (training rows)."""
    lo, hi = (span, span) if isinstance(span, int) else span
    chars = vocab_size - 1
    T = block_size if block_size is not None else 2 * hi + 1  # the row width
    if 2 * hi + 1 > T:
        raise ValueError(
            f"span={span!r} does not fit block_size={T}: two copies of {hi} characters and the "
            f"boundary token need {2 * hi + 1}; use a span of at most {span_for(T)}"
        )
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    if hi <= chars:  # distinct characters: the first hi ids of a random permutation, per row
        spans = torch.rand(n, chars, generator=g).argsort(dim=1)[:, :hi] + 1  # (N, hi)
    else:
        spans = torch.randint(1, chars + 1, (n, hi), generator=g)  # (N, hi)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)  # (N,)
    pos = torch.arange(T)  # (T,)
    L = lengths[:, None]  # (N, 1)
    # the span's first copy starts at 1 + P: P = 0, or with fill uniform in 0..T-1-2L
    room = (T - 2 * lengths).clamp(min=1)  # (N,) choices of P
    P = (torch.rand(n, generator=g) * room).long().clamp(max=room - 1)[:, None] if fill else 0
    rel = pos[None, :] - 1 - P  # (N, T) or (1, T): position within the two copies
    # the copies hold span[rel mod L] at 0 <= rel < 2L; position 0 is the boundary token; the
    # rest is padding (boundary) or, with fill, random characters
    k = (rel.clamp(min=0) % L).clamp(max=hi - 1)  # (N, T) index into the span
    copies = (rel >= 0) & (rel < 2 * L)  # (N, T)
    x = torch.where(copies, spans.gather(1, k), BOUNDARY_ID)  # (N, T)
    if fill:
        noise = torch.randint(1, chars + 1, (n, T), generator=g)  # (N, T)
        x = torch.where(copies | (pos == 0), x, noise)
    return _repeats(x, rel, L, pos[None, :] >= 1 if fill else copies)


def repeated_passages(ids: Tensor, n: int, span: int, generator: torch.Generator) -> Repeats:
    """n rows of a passage of `span` consecutive ids of a text (from a random start), then the same
    passage again, no boundary token: the copies' targets s2..sL at positions 0..L-2 and L..2L-2."""
    starts = torch.randint(len(ids) - span + 1, (n,), generator=generator)  # (N,)
    x = ids[starts[:, None] + torch.arange(span)].long().repeat(1, 2)  # (N, 2L)
    L = torch.full((n, 1), span)
    return _repeats(x, torch.arange(2 * span).expand_as(x), L, torch.ones_like(x, dtype=torch.bool))


def _repeats(x: Tensor, rel: Tensor, L: Tensor, real: Tensor) -> Repeats:
    """Rows x (N, T) with two copies of L (N, 1) ids at rel = 0..2L-1; y: the next id where real."""
    y = torch.full_like(x, IGNORE_ID)
    y[:, :-1] = torch.where(real[:, 1:], x[:, 1:], IGNORE_ID)  # the next token, then -1
    first = (rel >= 0) & (rel <= L - 2)  # the queries whose targets are s2..sL, first copy
    repeat = (rel >= L) & (rel <= 2 * L - 2)  # the same targets in the repeat
    return Repeats(x, y, first, repeat, L[:, 0])


def repeat_items(n: int, chars: str, span: tuple[int, int], length: int, seed: int) -> list[str]:
    """The items of `data.format=repeats`: n strings of `length` characters from `chars`, each
    holding a span of distinct characters (length in span = (lo, hi)) twice, amid random ones."""
    g = torch.Generator().manual_seed(seed)
    rows = repeated_spans(n, len(chars) + 1, span, g, block_size=length + 1, fill=True)
    table = [""] + list(chars)  # id -> character; the rows' ids 1..len(chars)
    return ["".join(table[i] for i in row) for row in rows.x[:, 1:].tolist()]


class RepeatsData(LinesData):
    """data.format=repeats: items generated by data.repeats (repeat_items), split and batched as
    lines; nothing is read (data.path is a label)."""

    name, reads_file = "repeats", False

    @classmethod
    def known_block(cls, data) -> int:
        return data.repeats.length + 1  # an item and its boundary token

    @classmethod
    def check_settings(cls, data, block_size: int | None) -> None:
        """data.repeats (a config.RepeatsConfig), before anything is generated: a DataError
        names the setting and why, down to the memory the items would take."""
        r = data.repeats
        chars, span, length, items = r.chars, list(r.span), r.length, r.items
        if not chars or len(set(chars)) != len(chars):
            raise DataError(
                f"data.repeats.chars={chars!r} must be distinct characters, at least one: the "
                f"vocabulary the items are drawn from (default: a to z)"
            )
        if not (len(span) == 2 and 1 <= span[0] <= span[1] and 2 * span[1] <= length):
            raise DataError(
                f"data.repeats.span={span} must be [lo, hi] with 1 <= lo <= hi and two "
                f"copies fitting data.repeats.length={length} (hi <= {max(0, length // 2)})"
            )
        if items < 3:
            raise DataError(
                f"data.repeats.items={items} must be at least 3 (one each for train, val and test)"
            )
        # per item: its characters, and a random order of the whole vocabulary (repeated_spans)
        check_memory(
            items_bytes(items, length + 1 + len(chars)),
            torch.device("cpu"),
            f"data.repeats.items={items:,} of data.repeats.length={length:,} characters",
            "lower data.repeats.items or data.repeats.length",
            DataError,
        )

    @classmethod
    def load(cls, settings, block_size=None, device="cpu", trim=True) -> RepeatsData:
        """The items settings.repeats generates, split by settings.split_seed."""
        r, label = settings.repeats, f"generated repeats (seed {settings.repeats.seed})"
        items = repeat_items(r.items, r.chars, tuple(r.span), r.length, r.seed)
        seed, path = settings.split_seed, settings.path
        return cls.of_items(items, path, seed, block_size, device, trim, label)

    def sha256(self) -> str:
        """No file: the hash of the generated items, as split."""
        return hashlib.sha256(json.dumps(self.split.to_dict()).encode()).hexdigest()
