"""What each attention head does (its role) and whether it matters (its importance).

    report = analyse(model, x, y, tokenizer)   # a HeadReport; the model's mode is left as it was
    print(report.markdown())                   # one row per head

On validation rows x, y (N, T) (y = -1 at padding), batched by length: one pass with the
attention for the patterns (microgpt.heads.roles) and the heads' mean outputs, the ablations and
pruning (microgpt.heads.circuits), the induction test on repeated spans, layer 0's copying scores.
`spread`: the attention's entropy over log(i + 1), 0 one key, 1 uniform; `entropy` in nats.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from microgpt.data.repeats import repeated_passages, repeated_spans, span_for
from microgpt.errors import UserError
from microgpt.heads import circuits, roles
from microgpt.heads.circuits import ablated_losses, single_heads, token_losses
from microgpt.heads.report import PRUNE_TOLERANCE, HeadReport, InductionTest
from microgpt.system import eval_mode

BATCH_SIZE = 256  # rows per forward pass
INDUCTION_ROWS = 200  # rows of repeated spans in the induction test
TEXT_INDUCTION_ROWS = 32  # rows of a text's passages twice (a block each: the tokens of 270 spans)
INDUCTION_SEED = 1234  # the induction test's own seed: every run and step sees the same rows
LIGHT_SHARE = 8  # analyse(light=True), during training: an eighth of the rows and test rows


def length_batches(
    x: Tensor, y: Tensor, batch_size: int = BATCH_SIZE
) -> list[tuple[Tensor, Tensor]]:
    """Rows sorted by length, in batches trimmed to their longest row's real targets: the same
    losses and attention as the whole rows (attention is causal), with about half the tokens."""
    real = (y >= 0).sum(dim=1)  # (N,) real targets per row
    order = torch.argsort(real, stable=True)
    out = []
    for rows in order.split(batch_size):
        width = max(int(real[rows].max()), 1)
        out.append((x[rows, :width], y[rows, :width]))  # (B, width) each
    return out


@torch.no_grad()
def probe_attention(model, ids: Sequence[int]) -> list[Tensor]:
    """One row's attention per layer, (H, T, T) float32 on the CPU, in eval mode (then restored)."""
    device = next(model.parameters()).device
    with eval_mode(model):
        _, _, attention = model.forward_with_attention(torch.tensor([list(ids)], device=device))
    return [a[0].float().cpu() for a in attention]  # (1, H, T, T) -> (H, T, T) per layer


def _first_pass(model, batches, members, chars, width: int):
    """One pass: each head's mean output (W_O's input) over the real positions (L, H, hd) and at
    each position (L, H, width, hd), and the pattern sums per layer (roles.pattern_sums)."""
    sums: list[dict[str, Tensor]] = [{} for _ in range(model.config.n_layer)]

    def add_patterns(layer: int, att: Tensor, x: Tensor, real: Tensor) -> None:
        for key, value in roles.pattern_sums(att, x, real, members, chars).items():
            sums[layer][key] = sums[layer].get(key, 0) + value.cpu()

    return *circuits.mean_outputs(model, batches, width, add_patterns), sums


@torch.no_grad()
def induction_test(model, text: Tensor | None = None, share: int = 1) -> InductionTest | None:
    """The induction test on repeated spans (microgpt.data.repeats) of `model` in eval mode:
    random spans, or passages of half the block from `text` (ids), 1/share of the rows; None where
    the span would be < 2."""
    T, V = model.config.block_size, model.config.vocab_size
    device = next(model.parameters()).device
    span = span_for(T) if text is None else min(T // 2, len(text))
    if span < 2 or V < 3:
        return None
    g = torch.Generator().manual_seed(INDUCTION_SEED)
    if text is None:
        rows = repeated_spans(max(1, INDUCTION_ROWS // share), V, span, g)
    else:
        rows = repeated_passages(text.cpu(), max(1, TEXT_INDUCTION_ROWS // share), span, g)
    x, y, repeat = rows.x.to(device), rows.y.to(device), rows.repeat.to(device)
    logits, _, attention = model.forward_with_attention(x)
    per_token = token_losses(logits, y)  # (B, T)
    prefix, duplicate = roles.induction_scores(attention, x, repeat)

    # the repeat's targets alone: the losses on them, the head zeroed
    on_repeat = [(x, torch.where(repeat, y, -1))]
    ablated = ablated_losses(model, on_repeat, [(drop, None) for drop in single_heads(model)])
    found = InductionTest(
        rows=int(x.shape[0]),
        span=int(rows.lengths.max()),
        prefix=prefix,
        duplicate=duplicate,
        loss_first=float(per_token[rows.first.to(device)].mean()),
        loss_repeat=float(per_token[repeat].mean()),
        ablated=ablated[1:].view(prefix.shape),
        text=text is not None,
    )
    if found.induction_heads.any():
        zeroed = ablated_losses(model, on_repeat, [(found.induction_heads, None)])
        found.induction_zeroed = float(zeroed[1])
    return found


def analyse(
    model,
    x: Tensor,
    y: Tensor,
    tokenizer=None,
    counts: Tensor | None = None,
    tolerance: float = PRUNE_TOLERANCE,
    induction: bool = True,
    light: bool = False,
    boundary: bool = True,
) -> HeadReport:
    """The HeadReport of `model` on rows x, y (N, T). tokenizer: for the key classes of characters
    (else only `boundary` and `rare`); counts (V,): each token's training
    frequency, for `rare` (default: in these rows); induction: run the induction test; boundary:
    whether rows start with the boundary token (the data format's; False: text windows); light: on
    1/LIGHT_SHARE of the rows and of the test's (a run's analyses while it trains). The model's
    mode is kept."""
    if x.shape[0] == 0:
        raise UserError("no rows to analyse")
    share = LIGHT_SHARE if light else 1
    keep = max(1, x.shape[0] // share)
    x, y = x[:keep], y[:keep]
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    L, H, V = model.config.n_layer, model.config.n_head, model.config.vocab_size
    chars = "".join(tokenizer.chars) if tokenizer is not None else None
    if counts is None:
        counts = torch.bincount(y[y >= 0].flatten().cpu(), minlength=V)[:V]
    batches = length_batches(x.to(device), y.to(device))
    members = roles.class_members(chars, V, counts)
    with eval_mode(model), torch.inference_mode():
        means, at, sums = _first_pass(model, batches, members, chars, x.shape[1])
        # text windows (no boundary token at their start): the test repeats passages of them
        text = x[y >= 0] if not boundary else None
        found = induction_test(model, text, share) if induction else None
        copying = circuits.copying(model)
        # importance: the loss rise by zero, mean and per-position mean ablation of each head
        ablations = [(drop, value) for value in (None, means, at) for drop in single_heads(model)]
        losses = ablated_losses(model, batches, ablations)
        zero, mean, position = (losses[1:] - losses[0]).view(3, L, H)
        order, curve, prunable = circuits.pruning(model, batches, zero, tolerance)
    return HeadReport(
        n_layer=L,
        n_head=H,
        items=int(x.shape[0]),
        tokens=int((y >= 0).sum()),
        loss=float(losses[0]),
        zero_importance=zero,
        mean_importance=mean,
        position_importance=position,
        pruning_order=order,
        pruning_losses=curve,
        prunable=prunable,
        **roles.patterns_of(sums),
        induction=found,
        copying=copying,
        tolerance=tolerance,
        seconds=time.perf_counter() - t0,
    )
