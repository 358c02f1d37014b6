"""A character-level GPT in plain PyTorch, in reading order: config, attention, MLP, block, model.

Multi-head attention slices its projections per head: head h owns channels [h*hd, (h+1)*hd) of
Q, and of K and V for its key/value group; the heads' outputs are concatenated in head order and
mixed by the output projection W_O. Three implementations of that one function are selectable
with `attn_impl` and proven equal in tests/test_attention.py:

- "loop":    one head at a time, slicing its channels explicitly (the readable reference);
- "batched": one reshape to (B, H, T, hd) and batched matmuls;
- "sdpa":    torch.nn.functional.scaled_dot_product_attention (flash kernels on GPU).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from microgpt.kv_cache import KVCache

ATTN_IMPLS = ("loop", "batched", "sdpa")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "relu")


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode (no dropout) while open, then back in the mode it was in: every
    evaluation, analysis and sampling loop runs inside one."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_gpt_settings(values: dict, name=lambda field: field) -> None:
    """Raise a ValueError for the first bad architecture setting in `values` (GPTConfig's fields).

    `name(field)` is how the message names a field: the field itself for library users;
    the config layer passes `model.n_head` (or `heads`), the settings a user types.
    """
    for field in (
        "vocab_size",
        "block_size",
        "n_layer",
        "n_embd",
        "n_head",
        "n_kv_head",
        "mlp_ratio",
    ):
        value = values.get(field)
        if value is None and field in ("vocab_size", "block_size", "n_kv_head"):
            continue  # from the data (vocab_size, block_size) or n_head (n_kv_head)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name(field)}={value!r} must be a positive integer (1 or more)")
    n_embd, n_head = values["n_embd"], values["n_head"]
    n_kv_head = values.get("n_kv_head") or n_head
    if n_embd % n_head != 0:
        raise ValueError(
            f"{name('n_embd')}={n_embd} is not divisible by {name('n_head')}={n_head}: each head "
            f"owns n_embd/n_head channels. Use {name('n_head')} in {_divisors(n_embd)} or change "
            f"{name('n_embd')}."
        )
    if n_head % n_kv_head != 0:
        raise ValueError(
            f"{name('n_head')}={n_head} is not divisible by {name('n_kv_head')}={n_kv_head}: each "
            f"key/value head is shared by n_head/n_kv_head query heads. Use {name('n_kv_head')} in "
            f"{_divisors(n_head)} (n_head = multi-head, 1 = multi-query)."
        )
    if not isinstance(values.get("mlp", True), bool):
        raise ValueError(f"{name('mlp')}={values['mlp']!r} must be true or false")
    dropout = values.get("dropout", 0.0)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{name('dropout')}={dropout!r} must be in [0, 1)")
    for field, choices in (("attn_impl", ATTN_IMPLS), ("norm", NORMS), ("activation", ACTIVATIONS)):
        if field in values and values[field] not in choices:
            raise ValueError(
                f"{name(field)}={values[field]!r} is unknown; choose one of {list(choices)}"
            )


@dataclass
class GPTConfig:
    """The architecture. Validated on construction; every error names the values and the fix.

    The training config's `model` group is this dataclass: conf/model/*.yaml set its fields, and
    vocab_size / block_size left at null are taken from the data.
    """

    vocab_size: int | None = 27  # characters + the boundary token
    block_size: int | None = 16  # the longest sequence the model sees: longest item + 1 boundary
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_kv_head: int | None = None  # key/value heads (GQA); None = n_head (MHA), 1 = multi-query
    dropout: float = 0.0
    bias: bool = False  # biases in every Linear and LayerNorm
    norm: str = (
        "layernorm"  # "layernorm" (learned gain) | "rmsnorm" (no learned gain, as microgpt.py)
    )
    activation: str = "gelu"  # "gelu" | "relu"
    attn_impl: str = "sdpa"  # "loop" | "batched" | "sdpa"
    tie_weights: bool = False  # share the token embedding with the output head
    mlp_ratio: int = 4  # the MLP's hidden width is mlp_ratio * n_embd
    mlp: bool = True  # false: attention-only blocks (no MLP, no second norm), as Elhage et al.
    name: str = "custom"  # a label only: the preset it came from (small, micro, base)

    def __post_init__(self):
        check_gpt_settings(asdict(self))
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)


def training_bytes(config: GPTConfig, batch_size: int) -> int:
    """A rough upper estimate of the memory one training step takes: weights, gradients and
    AdamW's two moments, plus the activations kept for the backward pass of a full block
    (float32; attention weights counted as if materialised)."""
    C, T, L, H = config.n_embd, config.block_size, config.n_layer, config.n_head
    params = config.vocab_size * C * (1 if config.tie_weights else 2) + T * C
    ratio = config.mlp_ratio if config.mlp else 0
    params += L * (4 * C * C + 2 * ratio * C * C)
    per_layer = batch_size * T * ((8 + 2 * ratio) * C + 2 * H * T)
    logits = 3 * batch_size * T * config.vocab_size
    return 4 * (4 * params + L * per_layer + logits)


def causal_mask(T: int, pos: int = 0, device=None) -> torch.Tensor:
    """(T, pos + T) booleans, T queries after `pos` cached keys: query i sees key j <= pos + i."""
    return torch.ones(T, pos + T, dtype=torch.bool, device=device).tril(diagonal=pos)


def needs_mask(impl: str, return_attn: bool, pos: int, T: int) -> bool:
    """Whether attention needs an explicit causal mask: loop and batched always; sdpa only for the
    weights it does not return, or several new tokens after a cached prefix."""
    return impl != "sdpa" or return_attn or (pos > 0 and T > 1)


class MultiHeadAttention(nn.Module):
    """Causal multi-head attention with per-head channel slices, optional GQA and a KV cache."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = (
            config.n_head,
            config.n_kv_head,
            config.head_dim,
        )
        self.group = config.n_head // config.n_kv_head  # query heads per key/value head
        self.kv_dim = config.n_kv_head * config.head_dim
        self.impl = config.attn_impl
        self.dropout = config.dropout
        # Q, K and V in one matmul: columns [0, C) are Q, then kv_dim of K, then kv_dim of V.
        self.qkv = nn.Linear(config.n_embd, config.n_embd + 2 * self.kv_dim, bias=config.bias)
        self.proj = nn.Linear(
            config.n_embd, config.n_embd, bias=config.bias
        )  # W_O: mixes the heads
        self.attn_drop = nn.Dropout(config.dropout)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(
        self,
        x,
        kv_cache: KVCache | None = None,
        layer: int = 0,
        return_attn: bool = False,
        mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
    ):
        """x (B, T, C) -> y (B, T, C), and the attention weights (B, H, T, Tk) if return_attn.

        mask (T, Tk): the keys each query may see (built here if None). head_mask (H,): each head's
        output is scaled by it before W_O (1 keeps a head, 0 ablates it).
        """
        B, T, C = x.shape
        pos = kv_cache.pos if kv_cache is not None else 0  # absolute position of x[:, 0]
        q, k, v = self.qkv(x).split(
            [C, self.kv_dim, self.kv_dim], dim=2
        )  # (B, T, C), 2 x (B, T, kv_dim)
        if mask is None and needs_mask(self.impl, return_attn, pos, T):
            mask = causal_mask(T, pos, device=x.device)  # (T, Tk)
        if self.impl == "loop":
            y, att = self._loop(q, k, v, mask, kv_cache, layer, head_mask)
        else:
            q = q.view(B, T, self.n_head, self.head_dim).transpose(
                1, 2
            )  # (B, T, C) -> (B, H, T, hd)
            k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # -> (B, Hkv, T, hd)
            v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # -> (B, Hkv, T, hd)
            if kv_cache is not None:
                k, v = kv_cache.update(layer, k, v)  # (B, Hkv, Tk, hd), Tk = pos + T
            if self.impl == "batched":
                y, att = self._batched(q, k, v, mask)
            else:
                y, att = self._sdpa(q, k, v, mask, pos, return_attn)
            if head_mask is not None:
                y = y * head_mask.to(y.dtype).view(1, self.n_head, 1, 1)  # (B, H, T, hd), per head
            y = (
                y.transpose(1, 2).contiguous().view(B, T, C)
            )  # (B, H, T, hd) -> (B, T, C), heads in order
        y = self.resid_drop(self.proj(y))
        return y, (att if return_attn else None)

    def _loop(self, q, k, v, mask, kv_cache, layer, head_mask=None):
        """The textbook version: each head slices its channels and attends.
        q (B, T, C), k/v (B, T, kv_dim)."""
        B, T, _ = q.shape
        hd = self.head_dim
        if (
            kv_cache is not None
        ):  # the cache holds heads: (B, Hkv, T, hd); write, then read back all positions
            k_heads = k.view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, Hkv, T, hd)
            v_heads = v.view(B, T, self.n_kv_head, hd).transpose(1, 2)  # (B, Hkv, T, hd)
            k_heads, v_heads = kv_cache.update(layer, k_heads, v_heads)  # (B, Hkv, Tk, hd)
            Tk = k_heads.size(2)
            k = k_heads.transpose(1, 2).reshape(B, Tk, self.kv_dim)  # (B, Tk, kv_dim)
            v = v_heads.transpose(1, 2).reshape(B, Tk, self.kv_dim)  # (B, Tk, kv_dim)
        outputs, weights = [], []
        for h in range(self.n_head):
            g = h // self.group  # this head's key/value group
            q_h = q[:, :, h * hd : (h + 1) * hd]  # (B, T, hd)
            k_h = k[:, :, g * hd : (g + 1) * hd]  # (B, Tk, hd)
            v_h = v[:, :, g * hd : (g + 1) * hd]  # (B, Tk, hd)
            scores = q_h @ k_h.transpose(1, 2) / math.sqrt(hd)  # (B, T, Tk)
            att = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # (B, T, Tk)
            weights.append(att)
            out = self.attn_drop(att) @ v_h  # (B, T, hd)
            outputs.append(out if head_mask is None else out * head_mask[h].to(out.dtype))
        y = torch.cat(
            outputs, dim=2
        )  # H x (B, T, hd) -> (B, T, C), head h at channels [h*hd, (h+1)*hd)
        return y, torch.stack(weights, dim=1)  # (B, H, T, Tk)

    def _attention_weights(self, q, k, mask):
        """softmax(q k^T / sqrt(hd)) over the keys each query may see.
        q (B, H, T, hd), k (B, Hkv, Tk, hd)."""
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)  # (B, Hkv, Tk, hd) -> (B, H, Tk, hd)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, Tk)
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)

    def _batched(self, q, k, v, mask):
        att = self._attention_weights(q, k, mask)  # (B, H, T, Tk)
        if self.group > 1:
            v = v.repeat_interleave(self.group, dim=1)  # (B, Hkv, Tk, hd) -> (B, H, Tk, hd)
        return self.attn_drop(att) @ v, att  # (B, H, T, hd)

    def _sdpa(self, q, k, v, mask, pos, return_attn):
        T = q.size(2)
        if pos == 0:  # no cached prefix: plain causal attention (the flash path)
            attn_mask, is_causal = None, T > 1
        elif T == 1:  # one new token sees every cached key
            attn_mask, is_causal = None, False
        else:  # several new tokens after a cached prefix
            attn_mask, is_causal = mask, False
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.group > 1,
        )  # (B, H, T, hd)
        att = None
        if return_attn:  # sdpa returns no weights: compute them on a side path, for looking at only
            with torch.no_grad():
                att = self._attention_weights(q, k, mask)
        return y, att


class RMSNorm(nn.Module):
    """x / rms(x), with no learned gain (as in microgpt.py)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), eps=self.eps)


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.act = nn.GELU() if config.activation == "gelu" else nn.ReLU()
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x)); with
    config.mlp false, the attention alone (an attention-only transformer)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = MultiHeadAttention(config)
        if config.mlp:
            self.norm2 = make_norm(config)
            self.mlp = MLP(config)
        else:
            self.norm2 = self.mlp = None

    def forward(self, x, kv_cache=None, layer=0, return_attn=False, mask=None, head_mask=None):
        a, att = self.attn(self.norm1(x), kv_cache, layer, return_attn, mask, head_mask)
        x = x + a
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x, att


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.vocab_size is None or config.block_size is None:
            raise ValueError("GPTConfig.vocab_size and block_size must be set to build a GPT")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embedding
        self.wpe = nn.Embedding(config.block_size, config.n_embd)  # position embedding
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for (
            name,
            p,
        ) in self.named_parameters():  # scaled init of the projections into the residual stream
            if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx,
        targets=None,
        kv_cache: KVCache | None = None,
        return_attn: bool = False,
        head_mask: torch.Tensor | None = None,
    ):
        """idx (B, T) token ids -> (logits (B, T, vocab), loss or None[, attention per layer]).

        loss is the mean cross-entropy over the targets that are not -1. With a kv_cache, idx holds
        the tokens after the cache's position; the cache advances by T. With return_attn, the third
        item is a list of each layer's attention weights, (B, H, T, Tk). head_mask (n_layer,
        n_head) scales each head's output before W_O: 1 keeps it, 0 ablates it.
        """
        B, T = idx.shape
        pos = kv_cache.pos if kv_cache is not None else 0
        if pos + T > self.config.block_size:
            raise ValueError(
                f"sequence of {pos + T} tokens is longer than block_size={self.config.block_size}: "
                f"shorten the input, or train a model with a larger model.block_size"
            )
        if kv_cache is not None and kv_cache.batch_size != B:
            raise ValueError(f"KV cache holds {kv_cache.batch_size} rows but the input has {B}")
        positions = torch.arange(pos, pos + T, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(positions))  # (B, T, C)
        if head_mask is not None and tuple(head_mask.shape) != (
            self.config.n_layer,
            self.config.n_head,
        ):
            raise ValueError(
                f"head_mask has shape {tuple(head_mask.shape)}; it must be (n_layer, n_head) = "
                f"({self.config.n_layer}, {self.config.n_head})"
            )
        mask = None  # one causal mask for every layer, built only where an implementation needs it
        if needs_mask(self.config.attn_impl, return_attn, pos, T):
            mask = causal_mask(T, pos, device=idx.device)  # (T, pos + T)
        attention = []
        for layer, block in enumerate(self.blocks):
            layer_mask = head_mask[layer] if head_mask is not None else None
            x, att = block(x, kv_cache, layer, return_attn, mask, layer_mask)
            attention.append(att)
        if kv_cache is not None:
            kv_cache.advance(T)
        logits = self.lm_head(self.norm_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            # (B, T, V) -> (B*T, V) and (B, T) -> (B*T,): one row per position
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        return (logits, loss, attention) if return_attn else (logits, loss)
