"""The optimizers (AdamW with weight decay on matrices only; Muon for the blocks' matrices) and
the learning-rate schedule: warmup, then decay."""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
from torch import nn

from microgpt import system
from microgpt.config import Config

FLOAT32_MAX = torch.finfo(torch.float32).max


def make_optimizer(model: nn.Module, config: Config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (or Muon), with weight decay on matrices only, never biases or gains."""
    o = config.optim
    if o.name == "muon":
        precision = system.Precision.resolve(o.muon_precision, device, fp16=False)
        return Muon(model, o, precision.dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # fused: one kernel for all parameters
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=fused)


class Muon(torch.optim.Optimizer):
    """Muon (K. Jordan, 2024) for the 2-D weights in the blocks: SGD with Nesterov momentum whose
    update is replaced by the nearest semi-orthogonal matrix (`o.muon_ortho`: ORTHOGONALISERS),
    scaled by sqrt(max(1, rows / cols)); AdamW for everything else. The trainer sets each group's
    lr as the schedule's lr times the group's `lr_ratio` (muon_lr / lr for Muon's group). The
    iteration runs in `ns_dtype` (bf16, as the reference does, where the device has it natively)."""

    def __init__(self, model: nn.Module, o, ns_dtype: torch.dtype = torch.float32):
        self.ns_dtype, self.ortho = ns_dtype, ORTHOGONALISERS[o.muon_ortho]
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # named_parameters() names a tied weight once
        hidden = [p for n, p in named if p.dim() == 2 and n.startswith("blocks.")]
        rest = [p for n, p in named if not (p.dim() == 2 and n.startswith("blocks."))]
        groups = [
            {"params": hidden, "muon": True, "lr_ratio": o.muon_lr / o.lr},
            {"params": [p for p in rest if p.dim() >= 2], "muon": False},
            {"params": [p for p in rest if p.dim() < 2], "muon": False, "weight_decay": 0.0},
        ]
        defaults = dict(lr=o.lr, lr_ratio=1.0, weight_decay=o.weight_decay, betas=tuple(o.betas))
        super().__init__(groups, {**defaults, "eps": o.eps, "momentum": 0.95})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            # decoupled weight decay, then the group's update
            torch._foreach_mul_(params, fp32(1 - group["lr"] * group["weight_decay"]))
            (self._muon if group["muon"] else self._adamw)(params, group)

    def _muon(self, params, group):
        beta, grads = group["momentum"], [p.grad for p in params]
        for p in params:
            if "momentum" not in self.state[p]:
                self.state[p]["momentum"] = torch.zeros_like(p)
        momenta = [self.state[p]["momentum"] for p in params]
        torch._foreach_lerp_(momenta, grads, 1 - beta)
        # the updates stacked by shape, (n, rows, cols) each; Nesterov: the gradient moved
        # towards the new momentum, written into its stack
        shapes = list(dict.fromkeys(p.shape for p in params))
        same = [[i for i, p in enumerate(params) if p.shape == shape] for shape in shapes]
        stacks = [params[ids[0]].new_empty(len(ids), *shape) for ids, shape in zip(same, shapes)]
        for ids, stack in zip(same, stacks):
            for i, row in zip(ids, stack):
                torch.lerp(grads[i], momenta[i], beta, out=row)
        orthos = orthogonalise(stacks, *self.ortho, self.ns_dtype)
        for shape, ids, ortho in zip(shapes, same, orthos):
            step = fp32(-group["lr"] * max(1.0, shape[0] / shape[1]) ** 0.5)
            torch._foreach_add_([params[i] for i in ids], list(ortho), alpha=step)

    def _adamw(self, params, group):
        (b1, b2), grads = group["betas"], [p.grad for p in params]
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
        t = float(self.state[params[0]]["step"])
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
        denom = torch._foreach_sqrt(torch._foreach_div(v, 1 - b2**t))
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_addcdiv_(params, m, denom, value=fp32(-group["lr"] / (1 - b1**t)))


def fp32(x: float) -> float:
    """x clipped to float32's range: an absurd lr (1e300) makes the weights infinite, and the
    loss then non-finite (a clear stop), rather than failing inside the optimizer."""
    return max(-FLOAT32_MAX, min(FLOAT32_MAX, x))


# Each iteration's odd quintic x -> a x + b x^3 + c x^5, applied to the singular values.
# Newton-Schulz as Muon's reference: one quintic five times (singular values from about 0.002 end
# in [0.68, 1.2], never converging).
NEWTON_SCHULZ = ((3.4445, -4.7750, 2.0315),) * 5
# Polar Express (Amsel et al. 2025, arXiv 2505.16932): each iteration the minimax quintic (nearest
# 1 at worst) on the interval the last one left, from [0.01, 1]: [0.01, 1] -> [0.081, 1.92] ->
# [0.29, 1.71] -> [0.73, 1.27]; found by Remez exchange (the minimax error equioscillates at 4
# points), each divided by 1.01 at x / 1.01 against bf16's rounding.
POLAR_EXPRESS = (
    (8.013236160283673, -22.92575699446705, 16.599414788732823),
    (3.6005797587167274, -2.6418752876167533, 0.5105053840872436),
    (2.6349504800860997, -1.9190066995354877, 0.4306489809873331),
)
# optim.muon_ortho: (the quintics, iterate on the Gram side)
ORTHOGONALISERS = {"newton-schulz": (NEWTON_SCHULZ, False), "polar-express": (POLAR_EXPRESS, True)}


def orthogonalise(gs, quintics=NEWTON_SCHULZ, gram=False, dtype=None) -> list[torch.Tensor]:
    """The semi-orthogonal matrices nearest gs (singular values pushed towards 1) by `quintics`,
    computed and returned in `dtype` (None: g's); each (n, rows, cols) -> (n, rows, cols).
    On the wide orientation (m <= n columns); `gram`: the iteration on the m x m Gram matrices."""
    tall = [g.size(-2) > g.size(-1) for g in gs]
    xs = [(g / (g.norm(dim=(-2, -1), keepdim=True) + 1e-7)).to(dtype or g.dtype) for g in gs]
    xs = [x.mT if t else x for x, t in zip(xs, tall)]
    ys = gram_side(xs, quintics) if gram else [direct(x, quintics) for x in xs]
    return [y.mT if t else y for y, t in zip(ys, tall)]


def direct(x: torch.Tensor, quintics) -> torch.Tensor:
    """The iteration on x (n, m, cols): each step three matmuls, two of them m x m x cols."""
    for a, b, c in quintics:
        gram = x @ x.mT
        # x <- a x + (b gram + c gram gram) x, the scaled sums inside the matmuls (baddbmm)
        poly = torch.baddbmm(gram, c * gram, gram, beta=b)
        x = torch.baddbmm(x, poly, x, beta=a)
    return x


def gram_side(xs: list[torch.Tensor], quintics) -> list[torch.Tensor]:
    """The iteration of `direct` carried by an m x m matrix Q (x_k = Q_k x): Q <- p(A) Q with
    A = Q G Q^T the current Gram matrix, G = x x^T; each step four m x m x m matmuls, batched
    over every x of one m, then one m x m x cols a matrix. A comes from G each step, not from
    the last A: rounding does not pile up."""
    ys = list(xs)
    for m in dict.fromkeys(x.size(-2) for x in xs):  # (n, m, cols): the stacks of one m at once
        ids = [i for i, x in enumerate(xs) if x.size(-2) == m]
        sizes = [len(xs[i]) for i in ids]
        grams = xs[ids[0]].new_empty(sum(sizes), m, m)  # (N, m, m)
        for i, gram in zip(ids, grams.split(sizes)):
            torch.bmm(xs[i], xs[i].mT, out=gram)
        eye, q = torch.eye(m, dtype=grams.dtype), None
        for a, b, c in quintics:
            now = grams if q is None else q @ grams @ q.mT
            poly = torch.add(a * eye, now, alpha=b).baddbmm_(now, now, alpha=c)
            q = poly if q is None else poly @ q
        for i, qi in zip(ids, q.split(sizes)):
            # in x's memory order: y = x^T q^T, transposed, where x is a transposed view
            ys[i] = (xs[i].mT @ qi.mT).mT if xs[i].mT.is_contiguous() else qi @ xs[i]
    return ys


def fit_warmup(config: Config) -> tuple[Config, str | None]:
    """(the config to train with, the line that says so): a warmup longer than the run (the
    default 100 steps in `train.max_steps=40`) is cut to a tenth of the run."""
    o, steps = config.optim, config.train.max_steps
    if o.warmup_steps <= steps:
        return config, None
    line = f"optim.warmup_steps={o.warmup_steps} is longer than the run (train.max_steps={steps})"
    fitted = dataclasses.replace(o, warmup_steps=steps // 10)
    return dataclasses.replace(config, optim=fitted), f"{line}: using {steps // 10}"


def lr_at(step: int, config: Config, max_steps: int | None = None) -> float:
    """Linear warmup over warmup_steps, then cosine / linear decay to min_lr_ratio * lr at
    `max_steps` (None: train.max_steps)."""
    o, total = config.optim, max_steps or config.train.max_steps
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.decay == "constant" or total <= o.warmup_steps:
        return o.lr
    progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if o.decay == "cosine" else 1 - progress
    return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * shape)


class WeightAverage:
    """An exponential moving average of a model's weights: after step t, each weight moves
    towards the trained one by 1 - min(decay, (1 + t) / (10 + t)) (a short memory early on)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.state_dict, self.load_state_dict = self.model.state_dict, self.model.load_state_dict

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        torch._foreach_lerp_(list(self.model.parameters()), list(model.parameters()), 1 - decay)
