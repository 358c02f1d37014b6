"""AdamW with weight decay on matrices only, and the learning-rate schedule: warmup, then decay."""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
from torch import nn

from microgpt.config import Config


def make_optimizer(model: nn.Module, config: Config, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (Linear weights, embeddings) only, never biases or gains."""
    o = config.optim
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # fused: one kernel for all parameters
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=fused)


def fit_warmup(config: Config) -> tuple[Config, str | None]:
    """(the config to train with, the line that says so): a warmup longer than the run (the
    default 100 steps in `train.max_steps=40`) is cut to a tenth of the run."""
    o, steps = config.optim, config.train.max_steps
    if o.warmup_steps <= steps:
        return config, None
    fitted = steps // 10
    line = f"optim.warmup_steps={o.warmup_steps} is longer than the run (train.max_steps={steps})"
    fitted_config = dataclasses.replace(config, optim=dataclasses.replace(o, warmup_steps=fitted))
    return fitted_config, f"{line}: using {fitted}"


def lr_at(step: int, config: Config) -> float:
    """Linear warmup over warmup_steps, then cosine / linear decay to min_lr_ratio * lr."""
    o, total = config.optim, config.train.max_steps
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
