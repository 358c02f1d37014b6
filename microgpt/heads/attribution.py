"""Direct logit attribution (Elhage et al. 2021): what each part of the model adds, straight
through the final norm and the output head, to one logit at one position.

    run = traced(model, idx)                      # one forward pass, its parts kept
    parts = attribute(model, run, row, position, target)

The stream leaving the last layer is a sum of parts: the embeddings (token + position), each
head's output through its slice of W_O (z_h W_O[:, h]^T), each MLP's output (its biases
included), and each layer's W_O bias. The final norm is linear once its scale is fixed, and the
scale is the one the forward pass computed on the whole stream (TransformerLens' `hook_scale`):
LayerNorm divides by sqrt(var + eps) and centers, so each part loses its own mean over channels
(the parts' means add up to the stream's) and is multiplied by the norm's weight; RMSNorm
divides by sqrt(mean(x^2) + eps) and does not center. A part's attribution is the result dotted
with the target's row of the output head. `rest` holds what no head, MLP or embedding owns: the
W_O biases of every layer and the final norm's bias; the parts then add up to the logit exactly
(up to float rounding).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from microgpt.heads.circuits import hooked_heads


@dataclass
class Trace:
    """One forward pass of rows idx (B, T), with each part the attribution reads kept."""

    logits: Tensor  # (B, T, V)
    attention: list[Tensor]  # each layer's weights (B, H, T, T)
    embed: Tensor  # (B, T, C): token + position embeddings, the stream entering layer 0
    z: list[Tensor]  # each layer's head outputs on their way into W_O (B, T, H, hd)
    mlp: list[Tensor | None]  # each layer's MLP output (B, T, C); None without MLPs
    final: Tensor  # (B, T, C): the stream leaving the last layer, into the final norm


@dataclass
class Attribution:
    """The parts of one logit: logit == embed + heads.sum() + mlps.sum() + rest."""

    logit: float
    embed: float
    heads: Tensor  # (L, H) float64
    mlps: Tensor  # (L,) float64 (zeros without MLPs)
    rest: float  # the W_O biases and the final norm's bias


@torch.no_grad()
def traced(model, idx: Tensor) -> Trace:
    """Run `model` (in eval mode) on idx (B, T), keeping its parts. Heads replaced by an
    intervention opened around this call (circuits.replaced_heads) are kept as replaced."""
    z, mlp = [], [None] * len(model.blocks)
    with contextlib.ExitStack() as hooks:
        hooks.enter_context(hooked_heads(model, lambda layer, out: z.append(out)))
        for layer, block in enumerate(model.blocks):
            if block.mlp is not None:
                keep = lambda _, __, out, layer=layer: mlp.__setitem__(layer, out)  # noqa: E731
                hooks.callback(block.mlp.register_forward_hook(keep).remove)
        embed = model.embed(idx)
        streams, attention = model.run_layers(embed, return_attn=True)
    return Trace(model.unembed(streams[-1]), attention, embed, z, mlp, streams[-1])


@torch.no_grad()
def attribute(model, run: Trace, row: int, position: int, target: int) -> Attribution:
    """The direct attribution of every part of `run` (row `row`) to the logit of token `target`
    at `position`, in float64: see the module's docstring."""
    c, norm = model.config, model.norm_f
    unembed = model.lm_head.weight[target].double()  # (C,): the target's row of the output head
    stream = run.final[row, position].double()  # (C,)
    if isinstance(norm, nn.LayerNorm):
        scale = (stream.var(unbiased=False) + norm.eps).rsqrt()
        weight = norm.weight.double() if norm.weight is not None else 1.0
    else:  # RMSNorm, no gain
        scale = (stream.pow(2).mean() + (norm.eps or torch.finfo(stream.dtype).eps)).rsqrt()
        weight = 1.0

    def logit_of(parts: Tensor) -> Tensor:
        """parts (..., C), each a term of the stream -> (...,) its share of the logit."""
        if isinstance(norm, nn.LayerNorm):
            parts = parts - parts.mean(dim=-1, keepdim=True)
        return (parts * scale * weight) @ unembed

    heads, mlps, biases = [], [], torch.zeros(c.n_embd, dtype=torch.float64)
    for layer, block in enumerate(model.blocks):
        z = run.z[layer][row, position].double()  # (H, hd)
        w_o = block.attn.proj.weight.double().view(c.n_embd, c.n_head, c.head_dim)  # (C, H, hd)
        heads.append(logit_of(torch.einsum("hd,chd->hc", z, w_o)))  # (H, C) -> (H,)
        out = run.mlp[layer]
        mlps.append(logit_of(out[row, position].double()) if out is not None else torch.zeros(()))
        if block.attn.proj.bias is not None:
            biases += block.attn.proj.bias.double()
    rest = logit_of(biases)
    if getattr(norm, "bias", None) is not None:
        rest = rest + norm.bias.double() @ unembed
    return Attribution(
        logit=float(run.logits[row, position, target]),
        embed=float(logit_of(run.embed[row, position].double())),
        heads=torch.stack(heads),
        mlps=torch.stack(mlps),
        rest=float(rest),
    )
