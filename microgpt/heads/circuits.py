"""Whether a head matters (importance) and whether a layer-0 head copies what it reads.

Functions on a GPT and batches of rows (x, y); losses are mean nats per real target (y >= 0). Every
intervention is a forward hook on the one hook point before W_O, `attn.hook_z`. A head's
importance is the loss rise when it alone is zeroed, or replaced by its mean output (over every
real position, or at each position: fair to a positional head). Layer 0's OV circuit through the
embeddings (Elhage et al. 2021), e_a = norm1(wte[a]): OV[b, c] = lm_head(W_O (e_b W_V))[c], the
rise of c's logit when attending to b; copying = sum(l) / sum(|l|) over OV's eigenvalues, 1
raising the token read, -1 lowering it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor


def single_heads(model) -> Tensor:
    """(L*H, L, H) bool: drop k holds head k alone, (layer k // H, head k % H)."""
    L, H = model.config.n_layer, model.config.n_head
    return torch.eye(L * H, dtype=torch.bool).view(L * H, L, H)


def token_losses(logits: Tensor, y: Tensor) -> Tensor:
    """(B, T, V), (B, T) -> (B, T) cross-entropy per position (0 where y = -1)."""
    logits = logits.flatten(0, 1).float()  # (B, T, V) -> (B*T, V)
    return F.cross_entropy(logits, y.flatten(), ignore_index=-1, reduction="none").view_as(y)


# ----------------------------------------------------------------------------- interventions


@contextlib.contextmanager
def hooked_heads(model, hook) -> Iterator[None]:
    """While open, each layer's head outputs z (B, T, H, hd) become hook(layer, z), unless None."""
    handles = [
        block.attn.hook_z.register_forward_hook(lambda _, __, z, layer=layer: hook(layer, z))
        for layer, block in enumerate(model.blocks)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def replaced_heads(model, drop: Tensor, value: Tensor | None = None):
    """While open, the heads drop (L, H) bool (or (B, L, H): one set per row of the batch) output
    `value` instead of their own: (L, H, hd) at every position, or (L, H, T, hd) one per position
    (a batch of width T' <= T takes the first T'); None: zero."""

    def hook(layer: int, z: Tensor) -> Tensor:
        # z (B, T', H, hd); v broadcasts over it: 0, (H, hd) or (T', H, hd)
        v = z.new_zeros(()) if value is None else value[layer]
        if v.dim() == 3:  # (H, T, hd) -> (T', H, hd): the first T' positions
            v = v[:, : z.shape[1]].transpose(0, 1)
        # (H,) -> (H, 1), or (B, H) -> (B, 1, H, 1): over z's positions and channels
        where = drop[layer, :, None] if drop.dim() == 2 else drop[:, layer, None, :, None]
        return torch.where(where.to(z.device), v.to(z), z)

    return hooked_heads(model, hook)


def output_sums(model, batches, width: int, each=None) -> tuple[Tensor, Tensor]:
    """One pass over the batches: each head's output z (W_O's input) summed over the rows' real
    positions (y >= 0), at each position, (L, width, C) float64 on the CPU (head h at channels
    [h*hd, (h+1)*hd)), and the real queries at each position (width,); `each(layer, attention
    (B, H, T, T), x, real)` sees every layer's attention on the way."""
    L, C = model.config.n_layer, model.config.n_embd
    sums = torch.zeros(L, width, C, dtype=torch.float64)
    per_position = torch.zeros(width, dtype=torch.float64)
    # each layer's head outputs z (B, T, H, hd) in the pass; the hook returns None (append's):
    # the model's output is unchanged
    outputs: list[Tensor] = []
    with hooked_heads(model, lambda layer, z: outputs.append(z)):
        for x, y in batches:
            real = y >= 0  # (B, T)
            outputs.clear()
            _, _, attention = model.forward_with_attention(x)
            per_position[: x.shape[1]] += real.sum(dim=0).double().cpu()
            for layer, (z, att) in enumerate(zip(outputs, attention)):
                # (B, T, H, hd) -> (B, T, C), real positions
                z = z.reshape(*z.shape[:2], C) * real.to(z.dtype)[..., None]
                sums[layer, : z.shape[1]] += z.sum(dim=0).double().cpu()  # (T, C)
                if each is not None:
                    each(layer, att, x, real)
    return sums, per_position


@torch.no_grad()
def mean_outputs(model, batches, width: int | None = None, each=None) -> tuple[Tensor, Tensor]:
    """Each head's mean output z over every real position (y >= 0) of the batches (L, H, hd), the
    value of mean ablation, and at each of `width` positions (L, H, width, hd), the value of
    per-position mean ablation (output_sums; `each` as there)."""
    L, H, hd = model.config.n_layer, model.config.n_head, model.config.head_dim
    width = width or max(x.shape[1] for x, _ in batches)
    sums, per_position = output_sums(model, batches, width, each)
    means = sums.sum(dim=1) / per_position.sum().clamp(min=1)  # (L, C)
    at = sums / per_position.clamp(min=1)[None, :, None]  # (L, T, C)
    at = at.view(L, width, H, hd).transpose(1, 2)  # (L, T, C) -> (L, H, T, hd)
    return means.view(L, H, hd).float(), at.float()


# ----------------------------------------------------------------------------- importance


@torch.no_grad()
def ablated_losses(model, batches, ablations: list[tuple[Tensor, Tensor | None]]) -> Tensor:
    """(1 + K,) float64: the mean loss per real target over every batch, then with each of the K
    ablations (drop, value) of replaced_heads. Per batch, each run takes the streams of the run
    before it (the plain pass for the first) up to the first layer where their ablations differ,
    and runs only the layers from there."""
    totals, count = torch.zeros(1 + len(ablations), dtype=torch.float64), 0
    for x, y in batches:
        # the stream entering each layer, then leaving the last: (B, T, C) each
        first = model.embed(x)
        streams = [first] + model.run_layers(first)[0]
        sums = [token_losses(model.unembed(streams[-1]), y).sum()]
        last, last_value = False, None  # the plain pass: no head dropped
        for drop, value in ablations:
            # the heads whose output may differ from the last run's
            changed = drop ^ last if value is last_value else drop | last
            start = int(changed.any(dim=1).int().argmax())
            with replaced_heads(model, drop, value):
                streams = streams[: start + 1] + model.run_layers(streams[start], start)[0]
            sums.append(token_losses(model.unembed(streams[-1]), y).sum())
            last, last_value = drop, value
        totals += torch.stack(sums).double().cpu()
        count += int((y >= 0).sum())
    return totals / max(count, 1)


def pruning(model, batches, importance: Tensor, tolerance: float):
    """Heads removed one at a time, least important first: (order, the losses with the first k
    removed, k = 0..L*H, prunable = how many go before the loss has risen by `tolerance`)."""
    L, H = importance.shape
    order = sorted(range(L * H), key=lambda k: (float(importance.flatten()[k]), k))
    # drop k: the first k + 1 heads of the order
    drops = torch.eye(L * H, dtype=torch.int)[order].cumsum(0).bool().view(L * H, L, H)
    losses = ablated_losses(model, batches, [(drop, None) for drop in drops]).tolist()
    rises = [loss - losses[0] for loss in losses[1:]]
    prunable = next((n for n, rise in enumerate(rises) if rise >= tolerance), len(rises))
    return [(k // H, k % H) for k in order], losses, prunable


# ----------------------------------------------------------------------------- copying


def copying_score(matrix: Tensor) -> Tensor:
    """sum(l) / sum(|l|) over the square matrix's eigenvalues l (real part of the sum): -1 to 1,
    0 where every eigenvalue is 0."""
    eig = torch.linalg.eigvals(matrix.double())  # complex; conjugate pairs: the sum is real
    mass = eig.abs().sum()
    return eig.sum().real / mass if mass > 0 else torch.zeros((), dtype=torch.float64)


@torch.no_grad()
def copying(model) -> Tensor:
    """(H,) float64 on the CPU: each layer-0 head's copying score, of its OV table (V, V) [key
    token, output token]: see the module's docstring."""
    H, hd, block = model.config.n_head, model.config.head_dim, model.blocks[0]
    e = block.norm1(model.wte.weight)  # (V, C): the attention's input for each token
    v = block.attn.qkv(e).split(model.config.n_embd, dim=1)[2]  # (V, C)
    wo = block.attn.proj.weight  # (C, C): column block h is head h's W_O
    scores = []
    for h in range(H):
        mine = slice(h * hd, (h + 1) * hd)  # the head's channels
        # what attending to each token writes, then its logits: (V, hd) @ (hd, C) @ (C, V)
        ov = v[:, mine] @ wo[:, mine].T @ model.lm_head.weight.T  # (V, V)
        scores.append(copying_score(ov.cpu()))
    return torch.stack(scores)
