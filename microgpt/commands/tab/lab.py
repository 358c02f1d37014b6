"""The head lab of the microgpt tab: one run's model on a typed input with some heads switched
off, as JSON: what it predicts at each position and the loss, what each head adds to the pinned
position's next character (microgpt.heads.attribution) and a line per head saying so.

One batched forward pass answers a request: row 0 with the heads `off`, row 1 with none, then
one row per head of `off` with that head alone off (its own loss change). Heads are switched off
through the model's one hook point (circuits.replaced_heads): zeroed, or replaced by their mean
output over the run's validation split (circuits.mean_outputs, on the head analysis' rows).
"""

from __future__ import annotations

import base64
import math
import re

import torch
from torch import Tensor

from microgpt.heads.attribution import attribute, traced
from microgpt.heads.circuits import replaced_heads, token_losses
from microgpt.tokenizer import BOUNDARY_ID

ABLATIONS = ("zero", "mean")
NUMBER = re.compile(r"[0-9]{1,6}")  # a layer, head or position: ASCII digits, a few
TOP = 5  # predictions shown per position
DIGITS = 4  # probabilities and losses are sent rounded to this many decimals
LOGIT_DIGITS = 6  # and the attribution's logits: their parts add up to 1e-4


class LabError(ValueError):
    """A parameter of the request that cannot be used; its message names it and the fix."""


def parse_off(text: str, n_layer: int, n_head: int) -> list[tuple[int, int]]:
    """ "0.1,1.3" -> [(0, 1), (1, 3)]: the heads to switch off, in order, each once (a head named
    twice is one head: at most n_layer * n_head)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    heads = []
    for part in parts:
        layer, _, head = part.partition(".")
        ok = NUMBER.fullmatch(layer) and NUMBER.fullmatch(head)
        if not ok or int(layer) >= n_layer or int(head) >= n_head:
            span = lambda n: "0" if n == 1 else f"0 to {n - 1}"  # noqa: E731
            raise LabError(
                f"off={text!r}: {part!r} is not a head of this run; give layer.head, "
                f"comma-separated (as 0.1,0.0), layer {span(n_layer)} and head {span(n_head)}"
            )
        heads.append((int(layer), int(head)))
    return list(dict.fromkeys(heads))


def parse_pin(text: str | None, length: int) -> int | None:
    """The pinned position; None (nothing pinned) by default."""
    if text is None or text == "":
        return None
    if not NUMBER.fullmatch(text) or not int(text) < length:
        raise LabError(f"pin={text!r} is not a position of the input; give 0 to {length - 1}")
    return int(text)


def parse_ablation(text: str | None) -> str:
    ablation = text or "zero"
    if ablation not in ABLATIONS:
        raise LabError(f"ablation={ablation!r} is unknown; give {' or '.join(ABLATIONS)}")
    return ablation


@torch.no_grad()
def lab(model, labels, ids, boundary, off, means: Tensor | None, pin: int) -> dict:
    """The lab's fields for input `ids` (attention "layers" included): `labels` turns ids into
    the page's labels, `boundary`: the input is a name (its end is predicted), `off`: heads
    (layer, head), `means` (L, H, hd): their value, None: zero; `pin`: the position attributed
    (None: none)."""
    L, H = model.config.n_layer, model.config.n_head
    rows = [off, []] + [[head] for head in off] if off else [[]]
    drop = torch.zeros(len(rows), L, H, dtype=torch.bool)  # (B, L, H): each row's heads off
    for row, heads in enumerate(rows):
        for layer, head in heads:
            drop[row, layer, head] = True
    idx = torch.tensor([ids]).expand(len(rows), -1)  # (1, T) -> (B, T)
    # (1, T): the character that follows each position, -1 where none does: a name's last
    # position is followed by the end of the name (the boundary token), a text's by nothing known
    targets = torch.tensor([ids[1:] + [BOUNDARY_ID if boundary else -1]])
    with replaced_heads(model, drop, means):
        run = traced(model, idx)
    count = int((targets >= 0).sum())  # positions with a next character
    sums = token_losses(run.logits, targets.expand_as(idx)).sum(dim=1).tolist()  # (B, T) -> (B,)

    def mean(total: float) -> float | None:
        return round(total / count, DIGITS) if count else None

    shown = {
        "layers": [[causal_bytes(head) for head in att[0]] for att in run.attention],
        "predictions": predictions(run.logits[0], targets[0], labels),
        "loss": mean(sums[0]),
        "base_loss": mean(sums[1 if off else 0]),
        # each head of `off` alone: its row's loss over row 1's (no head off)
        "off_loss": [[layer, head, mean(x - sums[1])] for (layer, head), x in zip(off, sums[2:])],
    }
    target = int(targets[0, pin]) if pin is not None else -1
    parts = attribute(model, run, 0, pin, target) if target >= 0 else None
    shown["attribution"] = parts and {
        "position": pin,
        "target": labels([target])[0],
        **{k: round(getattr(parts, k), LOGIT_DIGITS) for k in ("logit", "embed", "rest")},
        "heads": parts.heads.round(decimals=LOGIT_DIGITS).tolist(),
        # an attention-only model (model.mlp false) has no MLP to list
        "mlps": parts.mlps.round(decimals=LOGIT_DIGITS).tolist() if model.config.mlp else [],
    }
    shown["reading"] = readings(run.attention, ids, pin, labels, off, shown["attribution"])
    return shown


def causal_bytes(weights: Tensor) -> str:
    """A head's (T, T) attention as the page draws it: each query's keys 0..q, query by query, a
    byte each (the weight times 255, rounded: the canvas's shades), in base64."""
    T = weights.shape[0]
    q, k = torch.tril_indices(T, T)  # row-major: (0, 0), (1, 0), (1, 1), (2, 0), ...
    shades = (weights[q, k].float() * 255).round().to(torch.uint8)  # (T (T + 1) / 2,)
    return base64.b64encode(shades.numpy().tobytes()).decode("ascii")


def predictions(logits: Tensor, targets: Tensor, labels) -> list[dict]:
    """Per position of logits (T, V): the TOP likeliest next tokens, and the true next one's
    probability and loss (None where there is none)."""
    probs = logits.double().softmax(dim=-1)  # (T, V)
    best = probs.topk(min(TOP, probs.shape[-1]), dim=-1)  # (T, TOP) each
    out = []
    for t, target in enumerate(targets.tolist()):
        top = zip(labels(best.indices[t]), best.values[t].tolist())
        p = float(probs[t, target]) if target >= 0 else None
        row = {"top": [[label, round(q, DIGITS)] for label, q in top]}
        row["next"] = labels([target])[0] if target >= 0 else None
        row["p"] = round(p, DIGITS) if p is not None else None
        row["loss"] = round(-math.log(p), DIGITS) if p else None
        out.append(row)
    return out


def readings(attention, ids, pin, labels, off, parts) -> list[list[str]] | None:
    """Per head, a line on the pinned position: where it looks most, what it adds to the next
    character ("L0H2 looks 1 back at 'h' and adds +1.3 to 'i'"); None with nothing pinned."""
    if pin is None:
        return None
    out = []
    for layer, att in enumerate(attention):
        line = []
        for head in range(att.shape[1]):
            name = f"L{layer}H{head}"
            key = int(att[0, head, pin].argmax())  # the key it weighs most, <= pin
            where = "at its own" if key == pin else f"{pin - key} back at"
            text = f"{name} looks {where} {labels([ids[key]])[0]!r}"
            if (layer, head) in off:
                text = f"{name} is off"
            elif parts is not None:
                text += f" and adds {parts['heads'][layer][head]:+.2f} to {parts['target']!r}"
            line.append(text)
        out.append(line)
    return out
