"""What a head looks at, against chance, and its induction and copying on repeated spans:
vectorised functions on a layer's attention (B, H, T, T) and the rows' ids (microgpt.heads.analyse).

Per head and pattern, over the real queries i >= 1 that see one of its keys: `mass`, the mean
attention on its keys; `lift`, that over uniform causal attention's (1 / (i + 1) a key), 1 = chance.

    self previous two_back three_back  the key 0..3 back, when a character (not position 0)
    start                              position 0, from queries i >= 2
    boundary                           the boundary token but at position 0 (text windows)
    vowel consonant capital            by the base letter ("é" is a vowel); upper case
    space newline punctuation          whitespace but the newline; the newline; Unicode P*
    rare                               the RARE_FRACTION least frequent characters in training
    duplicate induction                an earlier key with the query's character; the key after
                                       one (prefix matching, Olsson et al. 2022)
    line_start word_start              just after the last newline / whitespace before the query

A pattern with no member, or no query that sees one, is left out. Role: the largest mass at mass
>= MIN_MASS and lift >= MIN_LIFT (ties: the first in ROLES), else `mixed`. Score: the role's mass;
for a mixed head the largest mass at lift >= MIN_LIFT (0 if none).
"""

from __future__ import annotations

import math
import unicodedata

import torch
import torch.nn.functional as F
from torch import Tensor

from microgpt.heads.report import CLASSES, MIN_LIFT, MIN_MASS, POSITIONAL, RARE_FRACTION, ROLES
from microgpt.tokenizer import BOUNDARY_ID

OFFSETS = 8  # offsets 0..7 in a profile
VOWELS = set("aeiou")


def class_members(chars: str | None, vocab_size: int, counts: Tensor | None) -> dict[str, Tensor]:
    """{class: (V,) bool over token ids} for the key classes with a member. chars: the characters
    of ids 1..V-1, None when unknown (only `boundary` and `rare`); counts (V,): for `rare`."""
    out = {name: torch.zeros(vocab_size, dtype=torch.bool) for name in CLASSES}
    out["boundary"][BOUNDARY_ID] = True
    for i, c in enumerate(chars or "", start=1):
        base = unicodedata.normalize("NFD", c)[0].lower()
        if c.isalpha():
            out["vowel" if base in VOWELS else "consonant"][i] = True
        out["capital"][i] = c.isupper()
        out["newline"][i] = c == "\n"
        out["space"][i] = c.isspace() and c != "\n"
        out["punctuation"][i] = unicodedata.category(c).startswith("P")
    if counts is not None and vocab_size > 1:
        n = math.ceil(RARE_FRACTION * (vocab_size - 1))
        order = torch.argsort(counts[1:].double(), stable=True)  # least frequent first
        out["rare"][order[:n] + 1] = True
    return {name: m for name, m in out.items() if m.any()}


def relation_masks(x: Tensor, chars: str | None) -> dict[str, Tensor]:
    """{relation: (B, T, T) bool, query i by key j <= i} for the rows x (B, T); line_start and
    word_start only when the vocabulary has a newline / a whitespace character."""
    i = torch.arange(x.shape[1], device=x.device)
    causal = i[None, :] <= i[:, None]  # (T, T): key j <= query i
    same = x[:, :, None] == x[:, None, :]  # (B, T, T): x_i == x_j
    out = {"duplicate": same & (i[None, :] < i[:, None])}
    after = torch.zeros_like(same)
    after[:, :, 1:] = x[:, :, None] == x[:, None, :-1]  # (B, T, T): x_{j-1} == x_i
    out["induction"] = after & causal
    for name, is_break in (("line_start", lambda c: c == "\n"), ("word_start", str.isspace)):
        wanted = [k for k, c in enumerate(chars or "", start=1) if is_break(c)]
        if wanted:
            flags = torch.isin(x, torch.tensor(wanted, device=x.device))  # (B, T)
            last = torch.where(flags, i, -1).cummax(dim=1).values  # (B, T): last break at p <= i
            # (B, T): just after the last break before i; 0 where none, and then it is no start
            start = F.pad(last[:, :-1] + 1, (1, 0))
            out[name] = (i[None, None, :] == start[:, :, None]) & (start[:, :, None] > 0)
    return out


# ----------------------------------------------------------------------------- sums


def pattern_sums(
    att: Tensor, x: Tensor, real: Tensor, members: dict[str, Tensor], chars: str | None
) -> dict[str, Tensor]:
    """One layer's attention att (B, H, T, T) on rows x (B, T), real queries (B, T) -> per pattern
    p, summed over rows and queries: `p` (H,) the weight on its keys, `p_chance` uniform's and
    `p_n` the queries that could see one; likewise `offsets` (H, OFFSETS) on a character key
    (j >= 1) k = 0..OFFSETS-1 back, and `start` from queries i >= 2. `entropy`: the attention's
    entropy in nats summed over the real queries, `spread`: it over log(i + 1) (1 = uniform) over
    those i >= 1, and their query counts `entropy_n`, `spread_n`. members: class_members'."""
    att = att.double()
    i = torch.arange(att.shape[2], device=att.device)
    q = (real & (i >= 1)).to(att.dtype)  # (B, T): the queries that count
    inv = 1.0 / (i + 1.0)  # (T,): uniform weight per visible key
    # positions: offsets and start
    k = torch.arange(OFFSETS, device=att.device)
    w = torch.einsum("bhij,bi->hij", att, q)  # (H, T, T): weight summed over counted queries
    per_query = q.sum(dim=0)  # (T,)
    on = ((i[:, None] - i[None, :])[..., None] == k) & (i[None, :, None] >= 1)  # (T, T, K)
    sees = (i[:, None] - k >= 1).to(w.dtype)  # (T, K): the key k back is a character
    out = {
        "offsets": w.flatten(1) @ on.flatten(0, 1).to(w.dtype),  # (H, T*T) @ (T*T, K) -> (H, K)
        "offsets_n": per_query @ sees,  # (K,)
        "offsets_chance": (per_query * inv) @ sees,  # (K,)
        "start": w[:, 2:, 0].sum(dim=1),  # (H,)
        "start_n": per_query[2:].sum(),
        "start_chance": (per_query[2:] * inv[2:]).sum(),
    }
    for k, name in enumerate(POSITIONAL[:4]):
        for part in ("", "_n", "_chance"):
            out[name + part] = out["offsets" + part][..., k]
    # the key classes (`boundary` always has a member, the boundary token)
    names = list(members)
    table = torch.stack([members[n] for n in names], dim=1).to(x.device)  # (V, C)
    keys = table[x].to(att.dtype)  # (B, T, C): each key's classes
    keys[:, 0, names.index("boundary")] = 0.0  # position 0 is `start`, not a class
    mass = torch.einsum("bhij,bjc,bi->hc", att, keys, q)  # (H, C)
    seen = keys.cumsum(dim=1)  # (B, T, C): class keys among 0..i
    chance = torch.einsum("btc,t,bt->c", seen, inv, q)  # (C,)
    n = torch.einsum("btc,bt->c", (seen > 0).to(att.dtype), q)  # (C,)
    for c, name in enumerate(names):
        out[name], out[name + "_chance"], out[name + "_n"] = mass[:, c], chance[c], n[c]
    # the relations between query and key
    for name, rel in relation_masks(x, chars).items():
        r = rel.to(att.dtype)  # (B, T, T)
        out[name] = torch.einsum("bhij,bij,bi->h", att, r, q)
        related = r.sum(dim=-1)  # (B, T): the keys related to each query
        out[name + "_chance"] = (related * inv * q).sum()
        out[name + "_n"] = ((related > 0).to(att.dtype) * q).sum()
    entropy = -torch.special.xlogy(att, att).sum(dim=-1)  # (B, H, T)
    spread = entropy[..., 1:] / torch.log(i[1:] + 1.0)  # (B, H, T-1)
    real = real.to(att.dtype)
    out["spread"] = torch.einsum("bht,bt->h", spread, real[:, 1:])
    out["entropy"] = torch.einsum("bht,bt->h", entropy, real)
    out["spread_n"], out["entropy_n"] = real[:, 1:].sum(), real.sum()
    return out


def patterns_of(sums: list[dict[str, Tensor]]) -> dict:
    """Per-layer sums (pattern_sums added over batches) -> HeadReport's fields: `mass` and `lift`
    ({pattern: (L, H)}, every pattern some query could see, in ROLES order), `roles`, `scores`,
    and the means `offsets` (L, H, OFFSETS), `start`, `spread`, `entropy` (L, H)."""

    def per_layer(name: str, by: str = "_n", least: float = 1) -> Tensor:
        return torch.stack([s[name] / s[name + by].clamp(min=least) for s in sums])

    seen = [n for n in ROLES[:-1] if n in sums[0] and float(sums[0][n + "_n"]) > 0]
    mass = {name: per_layer(name) for name in seen}
    lift = {name: per_layer(name, "_chance", 1e-300) for name in seen}
    roles, scores = roles_of(mass, lift)
    # no queries for a statistic: 0
    stat = {name: per_layer(name) for name in ("offsets", "start", "spread", "entropy")}
    return {"mass": mass, "lift": lift, "roles": roles, "scores": scores, **stat}


def roles_of(mass: dict[str, Tensor], lift: dict[str, Tensor]) -> tuple[list[list[str]], Tensor]:
    """Each head's role and score (see the module's docstring) from its patterns' mass and lift
    ({pattern: (L, H)}, patterns named as in ROLES)."""
    names = [n for n in ROLES if n in mass]
    m = torch.stack([mass[n] for n in names], dim=-1).double()  # (L, H, P)
    above = torch.stack([lift[n] for n in names], dim=-1) >= MIN_LIFT  # (L, H, P)
    best, which = torch.where(above & (m >= MIN_MASS), m, -1.0).max(dim=-1)  # first of equals
    near = torch.where(above, m, 0.0).max(dim=-1).values  # (L, H)
    roles = [
        [names[w] if b >= 0 else "mixed" for w, b in zip(ws, bs)]
        for ws, bs in zip(which.tolist(), best.tolist())
    ]
    return roles, torch.where(best >= 0, best, near)


# ----------------------------------------------------------------------------- induction test


def induction_scores(attention: list[Tensor], x: Tensor, queries: Tensor) -> tuple[Tensor, Tensor]:
    """Per head (L, H): the mean attention of the induction test's repeat queries (B, T) on the
    key after an earlier occurrence of their character (prefix matching) and on an earlier
    occurrence itself (duplicate)."""
    rel, q = relation_masks(x, None), queries.double()

    def score(name: str) -> Tensor:
        r = rel[name].double()  # (B, T, T)
        per_layer = [torch.einsum("bhij,bij,bi->h", a.double(), r, q) for a in attention]
        return (torch.stack(per_layer) / q.sum().clamp(min=1)).cpu()

    return score("induction"), score("duplicate")
