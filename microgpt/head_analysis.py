"""What each attention head does (its role) and whether it matters (its importance).

Plain functions over a GPT and validation rows x, y (N, T) from microgpt.data (y = -1 at padding);
nothing here knows checkpoints, files, Hydra, TensorBoard or the terminal (the command
`python -m microgpt.heads`, which analyses a run's checkpoint, is microgpt/heads.py).

    report = analyse(model, x, y)     # a HeadReport: one forward pass with the attention, then
    print(report.markdown())          # one per ablation; the model's mode is left as it was
    report.summaries()                # {"heads/layer0/entropy_min": ..., "heads/prunable": ...}

**Importance** of a head is the rise in mean loss per character (nats) when it is ablated: *zero*
ablation multiplies its output by 0 before W_O (`GPT.forward(head_mask=...)`); *mean* ablation
replaces its output by its mean over the real positions of the rows (a forward pre-hook on W_O,
`attn.proj`, that works for every attention implementation). The *pruning curve* removes heads
one at a time (zero ablation, cumulative), least important first by their single-head zero
importance, computed once and not recomputed as heads go; `prunable` is how many go before the
loss has risen by PRUNE_TOLERANCE (0.01 nats) or more.

**Roles** come from the attention of every row, over its real queries (y >= 0), as the mean
weight a head puts on:

- offset k (0 = itself, 1 = the previous character, 2 = two back, ...): measured on the queries
  where the key k back is a character (query position i > k; for k = 0, i >= 1);
- `start`, the boundary token at position 0: measured on the queries i >= 2. Position 0 is never
  an offset: at i = 1 it is both the previous token and the start, so that query counts for
  neither; the query at i = 0, which can only see itself, counts for no role;
- `spread`: the attention's entropy over the i + 1 keys it may see divided by log(i + 1), so 0 is
  one key and 1 is uniform (queries i >= 1).

A head's role is the positional pattern that holds the majority of its attention: the largest of
its `self`, `previous`, `two_back`, `three_back` (offsets 0..3) and `start` weights (ties go to the
first in ROLES) when it is above DOMINANT (0.5), with that weight as its score. A head where no
pattern holds the majority is `spread`, scored by its spread (near 1: uniform over what it sees;
low: focused, but on different positions for different names, i.e. on content). Scores are in
[0, 1]. `entropy` is the plain mean entropy in nats over every real query (as the
attention_entropy/* scalars). Everything is vectorised: no Python loop over rows or positions.

"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from microgpt.head_report import PRUNE_TOLERANCE, ROLES, HeadReport
from microgpt.loss import TokenMean
from microgpt.model import eval_mode

OFFSET_ROLES = ROLES[:4]  # the role of a head that looks at offset k = 0, 1, 2, 3
DOMINANT = 0.5  # a positional pattern is a head's role when it holds more than this weight
OFFSETS = 8  # offsets 0..7 in a profile
BATCH_SIZE = 256  # rows per forward pass


class HeadsError(ValueError):
    """Nothing to analyse (no checkpoint, no validation split); the message says what to pass."""


# ----------------------------------------------------------------------------- batches


def length_batches(
    x: Tensor, y: Tensor, batch_size: int = BATCH_SIZE
) -> list[tuple[Tensor, Tensor]]:
    """Rows sorted by length, in batches trimmed to their longest row's real targets: the same
    losses and attention as the whole rows (attention is causal), with about half the tokens."""
    real = (y >= 0).sum(dim=1)  # (N,) real targets per row
    order = torch.argsort(real, stable=True)
    out = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(int(real[rows].max()), 1)
        out.append((x[rows, :width], y[rows, :width]))  # (B, width) each
    return out


def model_batches(model, x: Tensor, y: Tensor, batch_size: int = BATCH_SIZE):
    """length_batches of rows x, y (N, T), on the model's device wherever the rows are."""
    device = next(model.parameters()).device
    return length_batches(x.to(device), y.to(device), batch_size)


@contextlib.contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    with eval_mode(model), torch.inference_mode():
        yield


def _heads(model) -> tuple[int, int, int]:
    c = model.config
    return c.n_layer, c.n_head, c.head_dim


# ----------------------------------------------------------------------------- attention


def attention_entropy(attention: Sequence[Tensor], query_mask: Tensor) -> Tensor:
    """Each head's mean attention entropy in nats over the real queries -> (L, H) float tensor.

    attention: per layer (B, H, T, Tk) weights (rows sum to 1); query_mask: (B, T) bool, True at
    real query positions (for a batch (x, y) from microgpt.data, `y >= 0`). A uniform head over n
    keys scores log(n), a head that looks at one key scores 0. With no real queries: zeros.
    """
    mask = query_mask.to(dtype=torch.float32)  # (B, T)
    count = mask.sum().clamp(min=1.0)
    rows = []
    for att in attention:
        p = att.detach().float()  # (B, H, T, Tk)
        ent = -torch.special.xlogy(p, p).sum(dim=-1)  # (B, H, T); 0 * log 0 = 0
        m = mask.to(ent.device)[:, None, :]  # (B, T) -> (B, 1, T)
        rows.append((ent * m).sum(dim=(0, 2)) / count.to(ent.device))  # (H,)
    return torch.stack(rows).cpu()  # (L, H)


def _role_sums(att: Tensor, real: Tensor, offsets: int) -> dict[str, Tensor]:
    """One layer's attention att (B, H, T, T) over real queries (B, T) -> the sums and counts
    of the role statistics (see the module's docstring), each summed over rows and positions."""
    att = att.double()
    T = att.shape[-1]
    q = real.to(att.dtype)  # (B, T)
    i = torch.arange(T, device=att.device)  # query (and key) positions
    k = torch.arange(offsets, device=att.device)
    w = torch.einsum("bhij,bi->hij", att, q)  # (H, T, T): weights summed over real queries
    per_query = q.sum(dim=0)  # (T,) real queries at each position
    # key j is k back from query i and is a character, not the boundary token at position 0
    on_offset = ((i[:, None] - i[None, :])[..., None] == k) & (i[None, :, None] >= 1)  # (T, T, K)
    offset_sum = w.flatten(1) @ on_offset.flatten(0, 1).to(w.dtype)  # (H, T*T) @ (T*T, K) -> (H, K)
    offset_count = per_query @ (i[:, None] - k >= 1).to(w.dtype)  # (T,) @ (T, K) -> (K,)
    ent = -torch.special.xlogy(att, att).sum(dim=-1)  # (B, H, T) nats
    spread = ent[..., 1:] / torch.log(i[1:] + 1.0)  # (B, H, T-1): 1 = uniform over i + 1 keys
    return {
        "offsets": offset_sum,
        "offsets_n": offset_count,
        "start": w[:, 2:, 0].sum(dim=1),  # (H,) weight on position 0 from queries i >= 2
        "start_n": per_query[2:].sum(),
        "spread": torch.einsum("bht,bt->h", spread, q[:, 1:]),
        "spread_n": per_query[1:].sum(),
        "entropy": torch.einsum("bht,bt->h", ent, q),
        "entropy_n": per_query.sum(),
    }


def _ratio(total: Tensor, count: Tensor) -> Tensor:
    return total / count.clamp(min=1)  # no queries for a statistic (rows too short): 0


def _first_pass(model, batches, offsets: int):
    """One forward pass over the batches: the loss, each head's mean output (L, H, hd) over the
    real positions (W_O's input), and the role statistics per layer."""
    L, H, hd = _heads(model)
    state: dict = {}
    out_sums = torch.zeros(L, model.config.n_embd, dtype=torch.float64)

    def capture(layer):
        def hook(module, args):
            z = args[0]  # (B, T, C): the heads' outputs, head h at channels [h*hd, (h+1)*hd)
            real = state["real"].to(z.dtype)[..., None]  # (B, T, 1)
            out_sums[layer] += (z * real).sum(dim=(0, 1)).double().cpu()

        return hook

    hooks = [
        b.attn.proj.register_forward_pre_hook(capture(layer))
        for layer, b in enumerate(model.blocks)
    ]
    sums: list[dict[str, Tensor]] = [{} for _ in range(L)]
    mean = TokenMean()
    try:
        for x, y in batches:
            state["real"] = real = y >= 0  # (B, T)
            _, loss, attention = model(x, y, return_attn=True)
            mean.add(loss, y)
            for layer, att in enumerate(attention):
                for key, value in _role_sums(att, real, offsets).items():
                    sums[layer][key] = sums[layer].get(key, 0) + value.cpu()
    finally:
        for h in hooks:
            h.remove()
    means = (out_sums / max(mean.count, 1)).view(L, H, hd)  # (L, C) -> (L, H, hd)
    stats = {
        name: torch.stack([_ratio(s[name], s[name + "_n"]) for s in sums])  # (L, H[, K])
        for name in ("offsets", "start", "spread", "entropy")
    }
    return mean.value, means.float(), stats


def roles_of(offsets: Tensor, start: Tensor, spread: Tensor) -> tuple[list[list[str]], Tensor]:
    """The role of each head and its score: offsets (L, H, K >= 4), start and spread (L, H)."""
    patterns = torch.cat(
        [offsets[..., : len(OFFSET_ROLES)], start[..., None]], dim=-1
    )  # (L, H, 5): self, previous, two_back, three_back, start
    best, which = patterns.max(dim=-1)  # the first of equal weights wins
    dominant = best > DOMINANT
    which = torch.where(dominant, which, ROLES.index("spread"))
    roles = [[ROLES[r] for r in row] for row in which.tolist()]
    return roles, torch.where(dominant, best, spread)


@torch.no_grad()
def probe_attention(model, ids: Sequence[int]) -> list[Tensor]:
    """One row's attention, per layer (H, T, T) float32 on the CPU: ids (T,) on the model's
    device, in eval mode (the model is put back in its mode)."""
    device = next(model.parameters()).device
    with eval_mode(model):
        _, _, attention = model(torch.tensor([list(ids)], device=device), return_attn=True)
    return [a[0].float().cpu() for a in attention]  # (1, H, T, T) -> (H, T, T) per layer


# ----------------------------------------------------------------------------- ablation


@contextlib.contextmanager
def replaced_heads(model, replace: Tensor, values: Tensor) -> Iterator[None]:
    """While open, each head where `replace` (L, H) is True outputs values[l, h] (hd,) at every
    position instead of its own output: forward pre-hooks on each layer's W_O (`attn.proj`)."""
    _, H, hd = _heads(model)
    hooks = []
    for layer, block in enumerate(model.blocks):
        heads = replace[layer].nonzero().flatten().tolist()
        if not heads:
            continue

        def hook(module, args, heads=heads, value=values[layer, heads]):
            z = args[0].clone()  # (B, T, C)
            z.view(*z.shape[:-1], H, hd)[..., heads, :] = value.to(z)  # (B, T, C) -> (B, T, H, hd)
            return (z, *args[1:])

        hooks.append(block.attn.proj.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def batches_loss(model, batches, head_mask: Tensor | None = None) -> float:
    """Mean cross-entropy per real target over every batch (each batch weighted by its targets)."""
    mean = TokenMean()
    for x, y in batches:
        mean.add(model(x, y, head_mask=head_mask)[1], y)
    return mean.value


def _keep_all(model, device) -> Tensor:
    L, H, _ = _heads(model)
    return torch.ones(L, H, device=device)


def _zero_importance(model, batches, base: float) -> Tensor:
    keep = _keep_all(model, batches[0][0].device)
    L, H = keep.shape
    out = torch.zeros(L, H, dtype=torch.float64)
    for layer, h in ((a, b) for a in range(L) for b in range(H)):
        mask = keep.clone()
        mask[layer, h] = 0.0
        out[layer, h] = batches_loss(model, batches, mask) - base
    return out


def _mean_importance(model, batches, base: float, means: Tensor) -> Tensor:
    L, H, _ = _heads(model)
    out = torch.zeros(L, H, dtype=torch.float64)
    device = batches[0][0].device
    for layer, h in ((a, b) for a in range(L) for b in range(H)):
        replace = torch.zeros(L, H, dtype=torch.bool)
        replace[layer, h] = True
        with replaced_heads(model, replace, means.to(device)):
            out[layer, h] = batches_loss(model, batches) - base
    return out


def _pruning(model, batches, base: float, importance: Tensor, tolerance: float):
    """Heads removed one at a time in order of importance (computed once): (order, losses)."""
    L, H = importance.shape
    order = sorted(range(L * H), key=lambda k: (float(importance.flatten()[k]), k))
    mask = _keep_all(model, batches[0][0].device)
    losses = [base]
    for k in order:
        mask[k // H, k % H] = 0.0
        losses.append(batches_loss(model, batches, mask))
    rises = [loss - base for loss in losses[1:]]
    prunable = next((n for n, rise in enumerate(rises) if rise >= tolerance), len(rises))
    return [(k // H, k % H) for k in order], losses, prunable


def importance(model, x: Tensor, y: Tensor, mode: str = "zero") -> Tensor:
    """(L, H) float64: the rise in mean loss per character when each head alone is ablated,
    "zero" (its output times 0) or "mean" (its output replaced by its mean over the rows)."""
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode={mode!r}: choose 'zero' or 'mean'")
    batches = model_batches(model, x, y)
    with _eval(model):
        base = batches_loss(model, batches, _keep_all(model, batches[0][0].device))
        if mode == "zero":
            return _zero_importance(model, batches, base)
        _, means, _ = _first_pass(model, batches, OFFSETS)
        return _mean_importance(model, batches, base, means)


def analyse(
    model,
    x: Tensor,
    y: Tensor,
    offsets: int = OFFSETS,
    tolerance: float = PRUNE_TOLERANCE,
    batch_size: int = BATCH_SIZE,
) -> HeadReport:
    """Roles, importance (zero and mean ablation) and the pruning curve of every head of `model`
    on rows x, y (N, T). The model is run in eval mode and put back in the mode it was in."""
    if offsets < len(OFFSET_ROLES):
        raise ValueError(f"offsets={offsets}: the roles need at least {len(OFFSET_ROLES)}")
    if x.shape[0] == 0:
        raise HeadsError("no rows to analyse")
    t0 = time.perf_counter()
    batches = model_batches(model, x, y, batch_size)
    device = batches[0][0].device
    with _eval(model):
        _, means, stats = _first_pass(model, batches, offsets)
        # the baseline with an all-ones mask: the exact arithmetic of every ablated pass
        base = batches_loss(model, batches, _keep_all(model, device))
        zero = _zero_importance(model, batches, base)
        mean = _mean_importance(model, batches, base, means)
        order, losses, prunable = _pruning(model, batches, base, zero, tolerance)
    roles, scores = roles_of(stats["offsets"], stats["start"], stats["spread"])
    L, H, _ = _heads(model)
    return HeadReport(
        n_layer=L,
        n_head=H,
        items=int(x.shape[0]),
        tokens=int((y >= 0).sum()),
        loss=base,
        zero_importance=zero,
        mean_importance=mean,
        entropy=stats["entropy"],
        spread=stats["spread"],
        offsets=stats["offsets"],
        start=stats["start"],
        roles=roles,
        scores=scores,
        pruning_order=order,
        pruning_losses=losses,
        prunable=prunable,
        tolerance=tolerance,
        seconds=time.perf_counter() - t0,
    )
