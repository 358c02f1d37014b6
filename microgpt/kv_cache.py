"""A preallocated key/value cache for sampling: one (B, n_head, block_size, hd) buffer per layer.
Its position is explicit: `GPT.forward` writes every layer's new keys and values at `pos`, then
calls `advance(T)` once (a prompt prefilled in one forward, then one token a step).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, batch_size, n_layer, n_head, block_size, head_dim, device=None, dtype=None):
        """dtype None: torch's default (float32)."""
        shape = (batch_size, n_head, block_size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        # pos: how many positions are filled, the same for every layer
        self.batch_size, self.block_size, self.pos = batch_size, block_size, 0

    @classmethod
    def for_model(cls, model, batch_size: int) -> KVCache:
        """A cache sized for `model` (a GPT), on the model's device, in its dtype."""
        c, p = model.config, next(model.parameters())
        sizes = (batch_size, c.n_layer, c.n_head, c.block_size, c.head_dim)
        return cls(*sizes, p.device, p.dtype)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, n_head, T, hd) at the current position; return all keys and values so
        far, (B, n_head, pos + T, hd) each."""
        end = self.pos + k.size(2)
        if end > self.block_size:
            full = f"position {self.pos} + {k.size(2)} new tokens > block_size {self.block_size}"
            raise ValueError(f"KV cache is full: {full}")
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, t: int) -> None:
        """After every layer has written its keys and values."""
        self.pos += t

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
