"""What a head looks at: positions, classes of keys and query-key relations, each against chance;
and the repeated-span probe of induction and copying. Plain, vectorised functions on a layer's
attention weights (B, H, T, T) and the rows' token ids; microgpt.heads puts them together.

**Patterns.** For every head and pattern, over the real queries i >= 1 (y >= 0; the query at 0
sees only itself and counts for none) that can see at least one key of the pattern:

- `mass`: the mean attention weight the query puts on the pattern's keys;
- `lift`: that mass divided by the mass uniform causal attention (1 / (i + 1) on each key the
  query may see) would put there, summed over the same queries: 1 is chance, exactly so for a
  uniform head.

The patterns:

- positional: `self`, `previous`, `two_back`, `three_back` (the key 0..3 back, when it is a
  character: position 0, the boundary token, is never an offset) and `start` (position 0, from
  queries i >= 2: at i = 1 it is also the previous key and counts for neither);
- key classes, from the vocabulary: `boundary` (the boundary token anywhere but position 0, as in
  text windows that cross items), `vowel`, `consonant` (letters; the base letter decides, so "é"
  is a vowel), `capital`, `space` (whitespace but the newline), `newline`, `punctuation` (Unicode
  category P*), `rare` (the least frequent RARE_FRACTION of the characters by their count in the
  training data, or in the rows analysed when no counts are given);
- query-key relations: `duplicate` (an earlier key with the query's character), `induction` (the
  key right after an earlier occurrence of the query's character: the prefix-matching pattern of
  Olsson et al. 2022), `line_start` (the first character of the query's line: just after the last
  newline before it) and `word_start` (the first character of its word: just after the last
  whitespace before it).

A class or relation that no vocabulary character belongs to (no newline in names), or that no
query could see, is left out, not an error.

**Role.** A pattern qualifies when its mass >= MIN_MASS (0.5: the majority of the attention) and
its lift >= MIN_LIFT (1.5: half as much again as chance). The head's role is the qualifying
pattern with the largest mass (ties: the first in ROLES, positional first), else `mixed`. Its
`score` is always the mass of one pattern: the role's, or for a mixed head the largest mass of any
pattern with lift >= MIN_LIFT (0 if none), i.e. how near it came to a role.
"""

from __future__ import annotations

import math
import unicodedata

import torch
from torch import Tensor

from microgpt.data.repeats import repeated_spans, span_for
from microgpt.heads.report import (
    CLASSES,
    MIN_LIFT,
    MIN_MASS,
    POSITIONAL,
    RARE_FRACTION,
    ROLES,
)
from microgpt.tokenizer import BOUNDARY_ID

OFFSETS = 8  # offsets 0..7 in a profile
VOWELS = set("aeiou")
PROBE_ROWS = 200  # rows of repeated spans in the induction probe
PROBE_SEED = 1234  # the probe's own seed: every run and step sees the same rows


# ----------------------------------------------------------------------------- classes


def class_members(chars: str | None, vocab_size: int, counts: Tensor | None) -> dict[str, Tensor]:
    """{class: (V,) bool over token ids} for the key classes with at least one member. chars: the
    vocabulary's characters in id order (ids 1..V-1), None when unknown (only `boundary` and
    `rare` then); counts: (V,) each id's count in the training data, for `rare`."""
    V = vocab_size
    out = {name: torch.zeros(V, dtype=torch.bool) for name in CLASSES}
    out["boundary"][BOUNDARY_ID] = True
    for i, c in enumerate(chars or "", start=1):
        base = unicodedata.normalize("NFD", c)[0].lower()
        if c.isalpha():
            out["vowel" if base in VOWELS else "consonant"][i] = True
        out["capital"][i] = c.isupper()
        out["newline"][i] = c == "\n"
        out["space"][i] = c.isspace() and c != "\n"
        out["punctuation"][i] = unicodedata.category(c).startswith("P")
    if counts is not None and V > 1:
        n = math.ceil(RARE_FRACTION * (V - 1))
        order = torch.argsort(counts[1:].double(), stable=True)  # least frequent first
        out["rare"][order[:n] + 1] = True
    return {name: m for name, m in out.items() if m.any()}


def _last_before(flags: Tensor) -> Tensor:
    """flags (B, T) bool -> (B, T) the last position p < i where flags[p], -1 if none."""
    B, T = flags.shape
    pos = torch.arange(T, device=flags.device).expand(B, T)
    last = torch.where(flags, pos, -1).cummax(dim=1).values  # (B, T): last p <= i
    return torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=1)  # p < i


def relation_masks(x: Tensor, chars: str | None) -> dict[str, Tensor]:
    """{relation: (B, T, T) bool, query i by key j <= i} for the rows x (B, T); line_start and
    word_start only when the vocabulary has a newline / a whitespace character."""
    B, T = x.shape
    i = torch.arange(T, device=x.device)
    causal = i[None, :] <= i[:, None]  # (T, T): key j <= query i
    same = x[:, :, None] == x[:, None, :]  # (B, T, T): x_i == x_j
    out = {"duplicate": same & (i[None, :] < i[:, None])}
    after = torch.zeros_like(same)
    after[:, :, 1:] = x[:, :, None] == x[:, None, :-1]  # (B, T, T): x_{j-1} == x_i
    out["induction"] = after & causal
    ids = {c: k for k, c in enumerate(chars or "", start=1)}
    whitespace = [k for c, k in ids.items() if c.isspace()]
    for name, wanted in (
        ("line_start", [ids["\n"]] if "\n" in ids else []),
        ("word_start", whitespace),
    ):
        if not wanted:
            continue
        flags = torch.isin(x, torch.tensor(wanted, device=x.device))  # (B, T)
        start = _last_before(flags) + 1  # (B, T): 0 where none; then it is no start
        out[name] = (i[None, None, :] == start[:, :, None]) & (start[:, :, None] > 0)
    return out


# ----------------------------------------------------------------------------- sums


def pattern_sums(
    att: Tensor, x: Tensor, real: Tensor, members: dict[str, Tensor], chars: str | None
) -> dict[str, Tensor]:
    """One layer's attention att (B, H, T, T) on rows x (B, T) with real queries (B, T) -> for each
    pattern, summed over rows and queries: `{p}` (H,) the weight on its keys, `{p}_chance` the
    uniform weight there and `{p}_n` the queries that could see one of its keys; plus `offsets`
    (H, OFFSETS) and their chance and counts, and `spread` / `entropy` (see microgpt.heads)."""
    att = att.double()
    T = att.shape[2]
    i = torch.arange(T, device=att.device)
    q = (real & (i >= 1)).to(att.dtype)  # (B, T): the queries that count
    inv = 1.0 / (i + 1.0)  # (T,): uniform weight per visible key
    out = _positional_sums(att, q, inv)
    if members:
        out.update(_class_sums(att, x, q, inv, members))
    for name, rel in relation_masks(x, chars).items():
        r = rel.to(att.dtype)  # (B, T, T)
        out[name] = torch.einsum("bhij,bij,bi->h", att, r, q)
        keys = r.sum(dim=-1)  # (B, T)
        out[name + "_chance"] = (keys * inv * q).sum()
        out[name + "_n"] = ((keys > 0).to(att.dtype) * q).sum()
    out.update(_spread_sums(att, real))
    return out


def _positional_sums(att: Tensor, q: Tensor, inv: Tensor) -> dict[str, Tensor]:
    """Offsets k = 0..OFFSETS-1 on a character key (j >= 1), and `start` from queries i >= 2."""
    T = att.shape[2]
    i = torch.arange(T, device=att.device)
    k = torch.arange(OFFSETS, device=att.device)
    w = torch.einsum("bhij,bi->hij", att, q)  # (H, T, T): weight summed over counted queries
    per_query = q.sum(dim=0)  # (T,)
    on = ((i[:, None] - i[None, :])[..., None] == k) & (i[None, :, None] >= 1)  # (T, T, K)
    out = {"offsets": w.flatten(1) @ on.flatten(0, 1).to(w.dtype)}  # (H, T*T) @ (T*T, K) -> (H, K)
    sees = (i[:, None] - k >= 1).to(w.dtype)  # (T, K): the key k back is a character
    out["offsets_n"] = per_query @ sees  # (K,)
    out["offsets_chance"] = (per_query * inv) @ sees  # (K,)
    out["start"] = w[:, 2:, 0].sum(dim=1)  # (H,)
    out["start_n"] = per_query[2:].sum()
    out["start_chance"] = (per_query[2:] * inv[2:]).sum()
    return out


def _class_sums(att, x, q, inv, members: dict[str, Tensor]) -> dict[str, Tensor]:
    """The key classes: the weight on keys of each class, its chance and counts."""
    names = list(members)
    table = torch.stack([members[n] for n in names], dim=1).to(x.device)  # (V, C)
    # membership of each key (B, T, C)
    keys = table[x].to(att.dtype)
    if "boundary" in members:
        # position 0 is `start`, not a class
        keys[:, 0, names.index("boundary")] = 0.0
    mass = torch.einsum("bhij,bjc,bi->hc", att, keys, q)  # (H, C)
    seen = keys.cumsum(dim=1)  # (B, T, C): class keys among 0..i
    chance = torch.einsum("btc,t,bt->c", seen, inv, q)  # (C,)
    n = torch.einsum("btc,bt->c", (seen > 0).to(att.dtype), q)  # (C,)
    out = {}
    for c, name in enumerate(names):
        out[name], out[name + "_chance"], out[name + "_n"] = mass[:, c], chance[c], n[c]
    return out


def _spread_sums(att: Tensor, real: Tensor) -> dict[str, Tensor]:
    """Attention entropy in nats over every real query, and spread: it divided by log(i + 1)."""
    i = torch.arange(att.shape[2], device=att.device)
    ent = -torch.special.xlogy(att, att).sum(dim=-1)  # (B, H, T) nats
    spread = ent[..., 1:] / torch.log(i[1:] + 1.0)  # (B, H, T-1): 1 = uniform over i + 1 keys
    qr = real.to(att.dtype)
    out = {"spread": torch.einsum("bht,bt->h", spread, qr[:, 1:]), "spread_n": qr[:, 1:].sum()}
    out["entropy"] = torch.einsum("bht,bt->h", ent, qr)
    out["entropy_n"] = qr.sum()
    return out


def add_sums(total: dict[str, Tensor], more: dict[str, Tensor]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value.detach().cpu()


def _ratio(total: Tensor, count: Tensor) -> Tensor:
    return total / torch.as_tensor(count).clamp(min=1)  # no queries for a statistic: 0


def patterns_of(sums: list[dict[str, Tensor]]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per-layer sums (pattern_sums added over batches) -> ({pattern: mass (L, H)}, {pattern:
    lift (L, H)}) for every pattern some query could see, in ROLES order."""
    mass, lift = {}, {}
    for name in ROLES[:-1]:
        if name in POSITIONAL[:4]:
            k = POSITIONAL.index(name)
            total = [s["offsets"][:, k] for s in sums]
            chance = [s["offsets_chance"][k] for s in sums]
            n = [s["offsets_n"][k] for s in sums]
        elif name in sums[0]:
            total = [s[name] for s in sums]
            chance = [s[name + "_chance"] for s in sums]
            n = [s[name + "_n"] for s in sums]
        else:
            continue
        if float(n[0]) == 0:  # no query could see such a key: left out
            continue
        mass[name] = torch.stack([_ratio(t, c) for t, c in zip(total, n)])  # (L, H)
        lift[name] = torch.stack(
            [t / torch.as_tensor(c).clamp(min=1e-300) for t, c in zip(total, chance)]
        )
    return mass, lift


def roles_of(mass: dict[str, Tensor], lift: dict[str, Tensor]) -> tuple[list[list[str]], Tensor]:
    """Each head's role and score (see the module's docstring) from its patterns' mass and lift
    ({pattern: (L, H)}, patterns named as in ROLES)."""
    names = [n for n in ROLES if n in mass]
    m = torch.stack([mass[n] for n in names], dim=-1).double()  # (L, H, P)
    above = torch.stack([lift[n] for n in names], dim=-1) >= MIN_LIFT  # (L, H, P)
    qualifies = above & (m >= MIN_MASS)
    best, which = torch.where(qualifies, m, -1.0).max(dim=-1)  # the first of equal masses wins
    near = torch.where(above, m, 0.0).max(dim=-1).values  # (L, H)
    roles = [
        [names[w] if b >= 0 else "mixed" for w, b in zip(ws, bs)]
        for ws, bs in zip(which.tolist(), best.tolist())
    ]
    return roles, torch.where(best >= 0, best, near)


# ----------------------------------------------------------------------------- the probe


def probe_rows(vocab_size: int, block_size: int, n: int = PROBE_ROWS, seed: int = PROBE_SEED):
    """The probe's rows (microgpt.data.repeats.Repeats): a boundary token, a span of distinct random
    characters as long as the block allows, the span again; None where the span would be < 2."""
    span = span_for(block_size)
    if span < 2 or vocab_size < 3:
        return None
    return repeated_spans(n, vocab_size, span, torch.Generator().manual_seed(seed))


def token_losses(logits: Tensor, y: Tensor) -> Tensor:
    """(B, T, V), (B, T) -> (B, T) cross-entropy per position (0 where y = -1)."""
    B, T, V = logits.shape
    # (B, T, V) -> (B*T, V) and (B, T) -> (B*T,): one loss per position
    flat = torch.nn.functional.cross_entropy(
        logits.reshape(B * T, V).float(), y.reshape(B * T), ignore_index=-1, reduction="none"
    )
    # (B*T,) -> (B, T)
    return flat.view(B, T)


def probe_scores(attention: list[Tensor], x: Tensor, queries: Tensor) -> tuple[Tensor, Tensor]:
    """Per head (L, H): the mean attention of the probe's repeat queries (B, T) on the key after
    an earlier occurrence of their character (prefix matching) and on an earlier occurrence itself
    (duplicate)."""
    rel = relation_masks(x, None)
    q = queries.double()
    count = q.sum().clamp(min=1)
    out = []
    for name in ("induction", "duplicate"):
        r = rel[name].double()  # (B, T, T)
        out.append(
            torch.stack(
                [torch.einsum("bhij,bij,bi->h", a.double(), r, q) / count for a in attention]
            )
        )
    return out[0].cpu(), out[1].cpu()
