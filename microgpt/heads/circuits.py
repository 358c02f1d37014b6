"""Whether a head matters (importance) and what it reads and writes (its layer-0 circuits).

Plain functions on a GPT and batches of rows (x, y) (microgpt.heads.analyse.length_batches);
losses are mean nats per real target (y >= 0), each batch weighted by its targets.

**Importance** of a head is the rise in loss when it alone is ablated:

- zero: its output times 0 before W_O (`scaled_heads`, a head_mask of ones with a 0 there);
- mean: its output replaced by its mean over every real position of the rows;
- position mean: its output at position t replaced by its mean at t over the rows with a real
  query there (the ablation that is fair to a positional head, whose output depends on t);
- gradient (Michel et al. 2019): the mean over the rows (examples) of |d loss(row) / d mask_h|
  at all ones, with loss(row) the row's mean nats per real target; per-row masks (B, L, H) give
  every row's gradient of every head in one backward pass per batch. Unsigned: how sensitive each
  row's loss is to the head, not the sign of a mean derivative that training drives to zero.

Every intervention (scaling, replacing or capturing the heads' outputs) is a forward hook on the
model's one hook point before W_O, `attn.hook_z` (`hooked_heads`), which every attention
implementation passes.

**Circuits at layer 0**, through the embeddings (Elhage et al. 2021), for each layer-0 head h
with e_a = norm1(wte[a]) the attention's input for token a (position embeddings left out):

- QK[a, b] = (e_a W_Q^h) . (e_b W_K^h) / sqrt(hd): the score a query token a gives a key token b;
- OV[b, c] = lm_head(W_O^h (e_b W_V^h))[c]: how much attending to token b raises the logit of
  token c, on the direct path to the output (the final norm and later layers left out);
- copying: the OV matrix's eigenvalues l as sum(l) / sum(|l|) (its real part; Elhage et al.'s
  measure), from -1 to 1: 1 for a head that raises the token it reads (copying), -1 for one
  lowering it, 0 for none (a random matrix's eigenvalues: mean 0, their sum is its trace).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor


def model_heads(model) -> tuple[int, int, int]:
    c = model.config
    return c.n_layer, c.n_head, c.head_dim


def keep_all(model, device) -> Tensor:
    L, H, _ = model_heads(model)
    return torch.ones(L, H, device=device)


# ----------------------------------------------------------------------------- interventions


@contextlib.contextmanager
def hooked_heads(model, hook) -> Iterator[None]:
    """While open, each layer's head outputs z (B, T, H, hd) are replaced by hook(layer, z) where
    it returns a tensor."""
    handles = [
        block.attn.hook_z.register_forward_hook(lambda _, __, z, layer=layer: hook(layer, z))
        for layer, block in enumerate(model.blocks)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def scaled_heads(model, head_mask: Tensor | None):
    """While open, head h of layer l outputs head_mask[l, h] times its output (1 keeps it, 0 is
    the zero ablation; a mask that requires grad gives d loss / d mask). A mask (B, L, H) scales
    each row of a batch of B rows by its own (L, H). None: no intervention."""
    if head_mask is None:
        return contextlib.nullcontext()
    L, H, _ = model_heads(model)
    if tuple(head_mask.shape[-2:]) != (L, H) or head_mask.dim() not in (2, 3):
        raise ValueError(
            f"head_mask has shape {tuple(head_mask.shape)}; it must be ({L}, {H}) or (B, {L}, {H})"
        )
    if head_mask.dim() == 2:
        # (L, H) -> (L, H, 1): layer l's row broadcasts over z (B, T, H, hd)
        scale = head_mask[..., None]
    else:
        # (B, L, H) -> (L, B, 1, H, 1): layer l's (B, 1, H, 1) broadcasts over z (B, T, H, hd)
        scale = head_mask.transpose(0, 1)[:, :, None, :, None]
    return hooked_heads(model, lambda layer, z: z * scale[layer].to(z.dtype))


def replaced_heads(model, replace: Tensor, values: Tensor):
    """While open, each head where `replace` (L, H) is True outputs values[l, h] instead of its
    own output: (L, H, hd) the same at every position, or (L, H, T, hd) one per position (a batch
    of width T' <= T takes the first T')."""
    heads = [replace[layer].nonzero().flatten().tolist() for layer in range(len(model.blocks))]
    # per layer: (k, hd) or (k, T, hd) for its k replaced heads
    chosen = [values[layer, h] for layer, h in enumerate(heads)]

    def hook(layer, z):
        if not heads[layer]:
            return None
        v = chosen[layer]
        if v.dim() == 3:
            # (k, T, hd) -> (k, T', hd) -> (T', k, hd)
            v = v[:, : z.shape[1]].transpose(0, 1)
        z = z.clone()
        z[..., heads[layer], :] = v.to(z)
        return z

    return hooked_heads(model, hook)


@torch.no_grad()
def batches_loss(model, batches, head_mask: Tensor | None = None) -> float:
    """Mean cross-entropy per real target over every batch (each batch weighted by its targets)."""
    total, count = 0.0, 0
    with scaled_heads(model, head_mask):
        for x, y in batches:
            _, loss = model(x, y)
            n = int((y >= 0).sum())
            total, count = total + float(loss) * n, count + n
    return total / max(count, 1)


def zero_importance(model, batches, base: float) -> Tensor:
    keep = keep_all(model, batches[0][0].device)
    L, H = keep.shape
    out = torch.zeros(L, H, dtype=torch.float64)
    for layer, h in itertools.product(range(L), range(H)):
        mask = keep.clone()
        mask[layer, h] = 0.0
        out[layer, h] = batches_loss(model, batches, mask) - base
    return out


def mean_importance(model, batches, base: float, means: Tensor) -> Tensor:
    """means: (L, H, hd) for the mean ablation, (L, H, T, hd) for the per-position one."""
    L, H, _ = model_heads(model)
    out = torch.zeros(L, H, dtype=torch.float64)
    device = batches[0][0].device
    for layer, h in itertools.product(range(L), range(H)):
        replace = torch.zeros(L, H, dtype=torch.bool)
        replace[layer, h] = True
        with replaced_heads(model, replace, means.to(device)):
            out[layer, h] = batches_loss(model, batches) - base
    return out


def gradient_importance(model, batches) -> Tensor:
    """(L, H) the mean over the rows with a real target of |d loss(row) / d head_mask| at all
    ones (Michel et al. 2019), loss(row) its mean nats per real target: one backward pass per
    batch through per-row masks (B, L, H). The parameters' .grad are left untouched. Call outside
    torch.inference_mode."""
    L, H, _ = model_heads(model)
    total = torch.zeros(L, H, dtype=torch.float64)
    rows = 0
    with torch.enable_grad():
        for x, y in batches:
            mask = torch.ones(x.shape[0], L, H, device=x.device, requires_grad=True)
            with scaled_heads(model, mask):
                logits, _ = model(x)
            B, T, V = logits.shape
            # (B*T, V), (B*T,) -> (B, T): each position's loss, 0 at padding
            per_token = F.cross_entropy(
                logits.reshape(B * T, V).float(),
                y.reshape(B * T),
                ignore_index=-1,
                reduction="none",
            ).view(B, T)
            real = (y >= 0).sum(dim=1)  # (B,)
            # row i's loss depends on mask[i] alone: the sum's gradient is every row's own
            row_loss = per_token.sum(dim=1) / real.clamp(min=1)
            grad = torch.autograd.grad(row_loss.sum(), mask)[0]  # (B, L, H)
            total += grad[real > 0].abs().sum(dim=0).double().cpu()
            rows += int((real > 0).sum())
    return total / max(rows, 1)


def pruning(model, batches, base: float, importance: Tensor, tolerance: float):
    """Heads removed one at a time, least important first: (order, losses, prunable = how many go
    before the loss has risen by `tolerance`)."""
    L, H = importance.shape
    order = sorted(range(L * H), key=lambda k: (float(importance.flatten()[k]), k))
    mask = keep_all(model, batches[0][0].device)
    losses = [base]
    for k in order:
        mask[k // H, k % H] = 0.0
        losses.append(batches_loss(model, batches, mask))
    rises = [loss - base for loss in losses[1:]]
    prunable = next((n for n, rise in enumerate(rises) if rise >= tolerance), len(rises))
    return [(k // H, k % H) for k in order], losses, prunable


def rank_correlation(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two equal-size tensors (ties get their mean rank); nan when
    either is constant or has fewer than 2 values."""
    a, b = a.flatten().double(), b.flatten().double()
    if a.numel() < 2:
        return math.nan

    def ranks(v: Tensor) -> Tensor:
        order = torch.argsort(v, stable=True)
        r = torch.empty_like(v)
        r[order] = torch.arange(len(v), dtype=v.dtype)
        for value in v.unique():  # ties: their mean rank
            same = v == value
            r[same] = r[same].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denom if denom > 0 else math.nan


# ----------------------------------------------------------------------------- circuits


def copying_score(matrix: Tensor) -> Tensor:
    """sum(l) / sum(|l|) over the square matrix's eigenvalues l (real part of the sum): -1 to 1,
    0 where every eigenvalue is 0."""
    eig = torch.linalg.eigvals(matrix.double())  # complex; conjugate pairs: the sum is real
    mass = eig.abs().sum()
    return eig.sum().real / mass if mass > 0 else torch.zeros((), dtype=torch.float64)


@torch.no_grad()
def layer0_circuits(model) -> tuple[Tensor, Tensor, Tensor]:
    """The layer-0 heads' QK (H, V, V) [query, key token] and OV (H, V, V) [key, output token]
    tables and their copying scores (H,), float64 on the CPU: see the module's docstring."""
    _, H, hd = model_heads(model)
    block, C = model.blocks[0], model.config.n_embd
    kv_dim, group = block.attn.kv_dim, block.attn.group
    e = block.norm1(model.wte.weight)  # (V, C): the attention's input for each token
    q, k, v = block.attn.qkv(e).split([C, kv_dim, kv_dim], dim=1)  # (V, C), 2 x (V, kv_dim)
    wo = block.attn.proj.weight  # (C, C): column block h is head h's W_O
    wu = model.lm_head.weight  # (V, C)
    qk, ov, copying = [], [], []
    for h in range(H):
        g = h // group  # the key/value head it reads
        q_h = q[:, h * hd : (h + 1) * hd]  # (V, hd)
        k_h = k[:, g * hd : (g + 1) * hd]  # (V, hd)
        v_h = v[:, g * hd : (g + 1) * hd]  # (V, hd)
        qk.append(q_h @ k_h.T / math.sqrt(hd))  # (V, V)
        written = v_h @ wo[:, h * hd : (h + 1) * hd].T  # (V, hd) @ (hd, C) -> (V, C)
        table = (written @ wu.T).double()  # (V, C) @ (C, V) -> (V, V): [key token, output token]
        ov.append(table)
        copying.append(copying_score(table))
    return tuple(torch.stack(t).double().cpu() for t in (qk, ov, copying))
