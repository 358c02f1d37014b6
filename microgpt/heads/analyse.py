"""What each attention head does (its role) and whether it matters (its importance).

Plain functions over a GPT and validation rows x, y (N, T) from microgpt.data (y = -1 at padding);
nothing here knows Hydra, TensorBoard or the terminal (the command is microgpt.heads).

    report = analyse(model, x, y, tokenizer)   # a HeadReport; the model's mode is left as it was
    print(report.markdown())                   # one row per head
    report.summaries()                         # {"heads/induction_max": ..., "heads/prunable": ...}

`analyse` runs, on the rows batched by length (padding skipped): one forward pass with the
attention, for the patterns each head attends to and their lift over chance
(microgpt.heads.roles: positions, key classes, query-key relations; the role and score), and each
head's mean output; a gradient pass (gradient importance); one pass per head and ablation (zero,
mean, per-position mean: microgpt.heads.circuits) and along the pruning curve, least important
first by zero ablation (`prunable`: how many heads go before the loss has risen by
PRUNE_TOLERANCE = 0.01 nats); the repeated-span probe of induction and copying on rows drawn
from the model's own vocabulary (microgpt.data.repeats, with its own seed: the same rows at every
step and in every run), with each head zeroed once more there; and the layer-0 QK/OV circuits
through the embeddings, with their copying scores. Everything is vectorised: no Python loop
over rows or positions.

**spread**: a head's attention entropy over the i + 1 keys it may see divided by log(i + 1),
so 0 is one key and 1 is uniform (queries i >= 1); `entropy` is the plain mean entropy in nats
over every real query (as the attention_entropy/* scalars).

`python -m microgpt.heads RUN_FOLDER_OR_CHECKPOINT` (microgpt/heads.py) prints the table for the
run's validation split and writes it beside the checkpoint's other analyses.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from microgpt.heads.circuits import (
    batches_loss,
    gradient_importance,
    hooked_heads,
    keep_all,
    layer0_circuits,
    mean_importance,
    model_heads,
    pruning,
    rank_correlation,
    replaced_heads,
    scaled_heads,
    zero_importance,
)
from microgpt.heads.report import PRUNE_TOLERANCE, ROLES, HeadReport, Probe
from microgpt.heads.roles import (
    add_sums,
    class_members,
    pattern_sums,
    patterns_of,
    probe_rows,
    probe_scores,
    roles_of,
    token_losses,
)
from microgpt.system import eval_mode

__all__ = [
    "ROLES",
    "HeadReport",
    "HeadsError",
    "analyse",
    "attention_entropy",
    "batches_loss",
    "importance",
    "length_batches",
    "model_batches",
    "probe_attention",
    "replaced_heads",
    "roles_of",
    "scaled_heads",
]

BATCH_SIZE = 256  # rows per forward pass
BOUNDARY_LABEL = "<s>"  # the boundary token in the circuit tables


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
def _eval(model: nn.Module, inference: bool = True) -> Iterator[None]:
    with eval_mode(model), torch.inference_mode() if inference else contextlib.nullcontext():
        yield


@torch.no_grad()
def probe_attention(model, ids: Sequence[int]) -> list[Tensor]:
    """One row's attention, per layer (H, T, T) float32 on the CPU: ids (T,) on the model's
    device, in eval mode (the model is put back in its mode)."""
    device = next(model.parameters()).device
    with eval_mode(model):
        _, _, attention = model.forward_with_attention(torch.tensor([list(ids)], device=device))
    return [a[0].float().cpu() for a in attention]  # (1, H, T, T) -> (H, T, T) per layer


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


def _first_pass(model, batches, members, chars, width: int):
    """One forward pass over the batches: the loss, each head's mean output (L, H, hd) over the
    real positions (W_O's input) and at each position (L, H, width, hd), and the pattern sums
    per layer (microgpt.heads.roles.pattern_sums)."""
    L, H, hd = model_heads(model)
    C = model.config.n_embd
    state: dict = {}
    out_sums = torch.zeros(L, width, C, dtype=torch.float64)  # per position
    per_position = torch.zeros(width, dtype=torch.float64)  # real queries at each position

    def capture(layer, z):
        # (B, T, H, hd) -> (B, T, C): the heads' outputs, head h at channels [h*hd, (h+1)*hd)
        z = z.reshape(*z.shape[:2], C)
        real = state["real"].to(z.dtype)[..., None]  # (B, T, 1)
        out_sums[layer, : z.shape[1]] += (z * real).sum(dim=0).double().cpu()  # (T, C)

    sums: list[dict[str, Tensor]] = [{} for _ in range(L)]
    total, count = 0.0, 0
    with hooked_heads(model, capture):
        for x, y in batches:
            state["real"] = real = y >= 0  # (B, T)
            _, loss, attention = model.forward_with_attention(x, y)
            n = int(real.sum())
            total, count = total + float(loss) * n, count + n
            per_position[: x.shape[1]] += real.sum(dim=0).double().cpu()
            for layer, att in enumerate(attention):
                add_sums(sums[layer], pattern_sums(att, x, real, members, chars))
    means = (out_sums.sum(dim=1) / max(count, 1)).view(L, H, hd)  # (L, C) -> (L, H, hd)
    at = out_sums / per_position.clamp(min=1)[None, :, None]  # (L, T, C)
    at = at.view(L, width, H, hd).transpose(1, 2)  # (L, T, C) -> (L, H, T, hd)
    return total / max(count, 1), means.float(), at.float(), sums


def _ratio(total: Tensor, count: Tensor) -> Tensor:
    return total / torch.as_tensor(count).clamp(min=1)  # no queries for a statistic: 0


@torch.no_grad()
def run_probe(model, device) -> Probe | None:
    """The repeated-span probe on `model` (in eval mode, under no_grad): per-head prefix matching
    and duplicate scores, the loss on the first copy and the repeat, and the repeat's loss with
    each head zeroed. None where the model's block is too short for a span of 2."""
    c = model.config
    rows = probe_rows(c.vocab_size, c.block_size)
    if rows is None:
        return None
    x, y = rows.x.to(device), rows.y.to(device)
    first, repeat = rows.first.to(device), rows.repeat.to(device)

    def losses(head_mask=None) -> Tensor:
        with scaled_heads(model, head_mask):
            logits, _ = model(x)
        return token_losses(logits, y)  # (B, T)

    logits, _, attention = model.forward_with_attention(x)
    per_token = token_losses(logits, y)
    prefix, duplicate = probe_scores(attention, x, repeat)
    L, H, _ = model_heads(model)
    keep = keep_all(model, device)
    ablated = torch.zeros(L, H, dtype=torch.float64)
    for layer, h in ((a, b) for a in range(L) for b in range(H)):
        mask = keep.clone()
        mask[layer, h] = 0.0
        ablated[layer, h] = float(losses(mask)[repeat].mean())
    return Probe(
        rows=int(x.shape[0]),
        span=int(rows.lengths.max()),
        prefix=prefix,
        duplicate=duplicate,
        loss_first=float(per_token[first].mean()),
        loss_repeat=float(per_token[repeat].mean()),
        ablated=ablated,
    )


def char_counts(x: Tensor, y: Tensor, vocab_size: int) -> Tensor:
    """(V,) how often each token id is a real target in the rows: their character frequencies."""
    return torch.bincount(y[y >= 0].flatten().cpu(), minlength=vocab_size)[:vocab_size]


def importance(model, x: Tensor, y: Tensor, mode: str = "zero") -> Tensor:
    """(L, H) float64: the rise in mean loss per character when each head alone is ablated,
    "zero" (its output times 0), "mean" (its output replaced by its mean over the rows),
    "position" (by its mean at each position); or "gradient": the mean over the rows of
    |d loss(row) / d head_mask| (Michel et al. 2019), a sensitivity, not a rise."""
    if mode not in ("zero", "mean", "position", "gradient"):
        raise ValueError(f"mode={mode!r}: choose 'zero', 'mean', 'position' or 'gradient'")
    batches = model_batches(model, x, y)
    if mode == "gradient":
        with _eval(model, inference=False):
            return gradient_importance(model, batches)
    with _eval(model):
        base = batches_loss(model, batches, keep_all(model, batches[0][0].device))
        if mode == "zero":
            return zero_importance(model, batches, base)
        _, means, at, _ = _first_pass(model, batches, {}, None, x.shape[1])
        return mean_importance(model, batches, base, means if mode == "mean" else at)


def analyse(
    model,
    x: Tensor,
    y: Tensor,
    tokenizer=None,
    counts: Tensor | None = None,
    tolerance: float = PRUNE_TOLERANCE,
    batch_size: int = BATCH_SIZE,
    probe: bool = True,
) -> HeadReport:
    """Roles, importance and the pruning curve of every head of `model` on rows x, y (N, T), the
    repeated-span probe (probe=False skips it) and the layer-0 circuits. tokenizer: for the key
    classes that need the characters (vowels, whitespace...; without it only `boundary` and
    `rare`) and the circuit tables' labels; counts (V,): each token's training frequency, for
    `rare` (default: its frequency in these rows). The model is run in eval mode and put back in
    the mode it was in."""
    if x.shape[0] == 0:
        raise HeadsError("no rows to analyse")
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    V = model.config.vocab_size
    chars = "".join(tokenizer.chars) if tokenizer is not None else None
    members = class_members(chars, V, counts if counts is not None else char_counts(x, y, V))
    batches = length_batches(x.to(device), y.to(device), batch_size)
    with _eval(model):
        _, means, at, sums = _first_pass(model, batches, members, chars, x.shape[1])
        # the baseline with an all-ones mask: the exact arithmetic of every ablated pass
        base = batches_loss(model, batches, keep_all(model, device))
        ablations = _ablations(model, batches, base, means, at, tolerance)
        found = run_probe(model, device) if probe else None
        qk, ov, copying = layer0_circuits(model)
    with _eval(model, inference=False):
        gradient = gradient_importance(model, batches)
    L, H, _ = model_heads(model)
    labels = [BOUNDARY_LABEL] + (
        list(chars) if chars is not None else [str(i) for i in range(1, V)]
    )
    return HeadReport(
        n_layer=L,
        n_head=H,
        items=int(x.shape[0]),
        tokens=int((y >= 0).sum()),
        loss=base,
        gradient=gradient,
        **ablations,
        **_patterns(sums),
        probe=found,
        qk=qk,
        ov=ov,
        copying=copying,
        labels=labels,
        correlations=_correlations(gradient, ablations),
        tolerance=tolerance,
        seconds=time.perf_counter() - t0,
    )


def _ablations(model, batches, base: float, means: Tensor, at: Tensor, tolerance: float) -> dict:
    """Each head's importance by zero, mean and per-position mean ablation, and the pruning
    curve (by zero ablation): HeadReport's fields."""
    zero = zero_importance(model, batches, base)
    mean = mean_importance(model, batches, base, means)
    position = mean_importance(model, batches, base, at)
    order, losses, prunable = pruning(model, batches, base, zero, tolerance)
    return {
        "zero_importance": zero,
        "mean_importance": mean,
        "position_importance": position,
        "pruning_order": order,
        "pruning_losses": losses,
        "prunable": prunable,
    }


def _patterns(sums: list[dict[str, Tensor]]) -> dict:
    """The pattern sums of every layer -> each head's mass, lift, role and statistics."""
    mass, lift = patterns_of(sums)
    roles, scores = roles_of(mass, lift)
    stat = {
        name: torch.stack([_ratio(s[name], s[name + "_n"]) for s in sums])  # (L, H[, K])
        for name in ("offsets", "start", "spread", "entropy")
    }
    return {"mass": mass, "lift": lift, "roles": roles, "scores": scores, **stat}


def _correlations(gradient: Tensor, ablations: dict) -> dict[str, float]:
    zero, mean = ablations["zero_importance"], ablations["mean_importance"]
    return {
        "gradient_vs_zero": rank_correlation(gradient, zero),
        "gradient_vs_mean": rank_correlation(gradient, mean),
        "zero_vs_mean": rank_correlation(zero, mean),
        "zero_vs_position_mean": rank_correlation(zero, ablations["position_importance"]),
    }
