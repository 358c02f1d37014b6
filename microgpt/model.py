"""A character-level GPT in plain PyTorch, in reading order: config, attention, MLP, block, GPT.

Notable features (what differs from GPT-2):
- attention two ways, proven equal in tests: "loop" (a head at a time: the reference) and
  "sdpa" (PyTorch's fused kernel: training); an explicit KV cache for sampling;
- one hook point before W_O, `attn.hook_z` (each head's output), for every head intervention;
- attention weights on request only (`GPT.forward_with_attention`), from the loop's per-head
  computation whatever the implementation, never in the training step;
- the forward in three public steps, `embed`, `run_layers`, `unembed`: an analysis can start
  from a cached layer's stream;
- packed documents (`doc_starts`): positions restart and attention stays inside each document;
- no biases by default, LayerNorm or RMSNorm, GELU or ReLU, tied embeddings, `mlp=False`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from microgpt.kv_cache import KVCache

ATTN_IMPLS = ("loop", "sdpa")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "relu")


@dataclass
class GPTConfig:
    """The architecture, checked on construction (check_gpt_settings, at the end of the file)."""

    vocab_size: int | None = 27  # characters + the boundary token (None: from the data)
    block_size: int | None = 16  # the longest sequence: longest item + 1 (None: from the data)
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    dropout: float = 0.0
    bias: bool = False  # biases in every Linear and LayerNorm
    norm: str = "layernorm"  # "layernorm" | "rmsnorm" (no learned gain, as microgpt.py)
    activation: str = "gelu"  # "gelu" | "relu"
    attn_impl: str = "sdpa"  # "loop" | "sdpa"
    tie_weights: bool = False  # share the token embedding with the output head
    mlp_ratio: int = 4  # the MLP's hidden width is mlp_ratio * n_embd
    mlp: bool = True  # false: attention-only blocks (no MLP, no second norm), as Elhage et al.
    name: str = "custom"  # a label only: the preset it came from (small, micro, base)

    def __post_init__(self):
        check_gpt_settings(asdict(self))

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)


class MultiHeadAttention(nn.Module):
    """Causal multi-head attention: head h reads channels [h*hd, (h+1)*hd) of Q, K and V; the
    heads' outputs z, concatenated in head order, are mixed by W_O."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.impl, self.dropout = config.attn_impl, config.dropout
        # Q, K and V in one matmul: columns [0, C) are Q, then [C, 2C) K, then [2C, 3C) V
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        # W_O: mixes the heads
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_drop = nn.Dropout(config.dropout)
        self.resid_drop = nn.Dropout(config.dropout)
        # the hook point: z (B, T, H, hd), each head's output on its way into W_O
        self.hook_z = nn.Identity()

    def forward(self, x, kv_cache: KVCache | None = None, layer=0, mask=None, return_attn=False):
        """x (B, T, C) -> (y (B, T, C), weights (B, H, T, Tk) if return_attn else None); mask
        (T, Tk): the keys each query may see (built here if None)."""
        B, T, C = x.shape
        # the absolute position of x[:, 0]
        pos = kv_cache.pos if kv_cache is not None else 0
        # (B, T, 3C) -> 3 x (B, T, C) -> (B, T, H, hd) -> (B, H, T, hd)
        q, k, v = (
            t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            for t in self.qkv(x).split(C, dim=2)
        )
        if kv_cache is not None:
            # (B, H, Tk, hd): every key and value so far, Tk = pos + T
            k, v = kv_cache.update(layer, k, v)
        if mask is None:
            mask = causal_mask(self.impl, return_attn, pos, T, x.device)
        if self.impl == "loop":
            att = self._weights(q, k, mask)  # (B, H, T, Tk)
            # a head at a time: H x (B, T, Tk) @ (B, Tk, hd) -> (B, H, T, hd)
            y = torch.stack([self.attn_drop(att[:, h]) @ v[:, h] for h in range(self.n_head)], 1)
        else:
            y, att = self._sdpa(q, k, v, mask, pos), None
            if return_attn:
                # sdpa returns no weights: the loop's, on a side path, for looking at only
                with torch.no_grad():
                    att = self._weights(q, k, mask)
        # (B, H, T, hd) -> (B, T, H, hd)
        z = self.hook_z(y.transpose(1, 2))
        # (B, T, H, hd) -> (B, T, C): head h at channels [h*hd, (h+1)*hd)
        y = z.contiguous().view(B, T, C)
        y = self.resid_drop(self.proj(y))
        return y, (att if return_attn else None)

    def _weights(self, q, k, mask):
        """The textbook softmax(q k^T / sqrt(hd)) over the visible keys, a head at a time:
        q (B, H, T, hd), k (B, H, Tk, hd) -> (B, H, T, Tk)."""
        # a (B, 1, T, Tk) mask of packed documents -> (B, T, Tk)
        visible = mask[:, 0] if mask.dim() == 4 else mask
        weights = []
        for h in range(self.n_head):
            scores = q[:, h] @ k[:, h].transpose(1, 2) / math.sqrt(self.head_dim)  # (B, T, Tk)
            weights.append(scores.masked_fill(~visible, float("-inf")).softmax(dim=-1))
        return torch.stack(weights, dim=1)  # H x (B, T, Tk) -> (B, H, T, Tk)

    def _sdpa(self, q, k, v, mask, pos):
        """PyTorch's fused attention, q, k, v (B, H, T or Tk, hd) -> (B, H, T, hd)."""
        T = q.size(2)
        # packed documents, or several new tokens after a cached prefix: the explicit mask; else
        # no cached prefix is plain causal attention (the flash path), and one new token after
        # a cached prefix sees every cached key
        packed = mask is not None and mask.dim() == 4
        attn_mask = mask if packed or (pos > 0 and T > 1) else None
        is_causal = not packed and pos == 0 and T > 1
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal
        )


def causal_mask(impl: str, return_attn: bool, pos: int, T: int, device=None):
    """(T, pos + T) booleans, query i sees key j <= pos + i; None where sdpa's own causal flag
    serves (no cached prefix, or one new token after it) and no weights are asked for."""
    if impl == "sdpa" and not return_attn and (pos == 0 or T == 1):
        return None
    return torch.ones(T, pos + T, dtype=torch.bool, device=device).tril(diagonal=pos)


def document_positions(doc_starts):
    """For rows of packed documents, doc_starts (B, T) True where one begins: (each token's
    position in its document (B, T), the (B, 1, T, T) mask of the earlier keys of its document)."""
    B, T = doc_starts.shape
    index = torch.arange(T, device=doc_starts.device).expand(B, T)  # (B, T)
    starts = doc_starts.clone()
    starts[:, 0] = True
    # (B, T): the index where each token's document begins, and the document's number
    first = torch.cummax(torch.where(starts, index, 0), dim=1).values
    document = starts.cumsum(dim=1)
    # (B, T, T): the same document, and not in the future
    same = document[:, :, None] == document[:, None, :]
    mask = same & torch.ones(T, T, dtype=torch.bool, device=doc_starts.device).tril()
    # (B, T, T) -> (B, 1, T, T): one mask for every head
    return index - first, mask.unsqueeze(1)


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


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        # x / rms(x), with no learned gain (as in microgpt.py)
        return nn.RMSNorm(config.n_embd, eps=1e-5, elementwise_affine=False)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x)); with
    config.mlp false, the attention alone (an attention-only transformer)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = MultiHeadAttention(config)
        self.norm2 = make_norm(config) if config.mlp else None
        self.mlp = MLP(config) if config.mlp else None

    def forward(self, x, kv_cache=None, layer=0, mask=None, return_attn=False):
        # x (B, T, C) -> (x (B, T, C), the attention weights or None)
        a, att = self.attn(self.norm1(x), kv_cache, layer, mask, return_attn)
        x = x + a
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x, att


class GPT(nn.Module):
    """Token and position embeddings, n_layer blocks, a final norm and the output head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.vocab_size is None or config.block_size is None:
            raise ValueError("GPTConfig.vocab_size and block_size must be set to build a GPT")
        self.config = config
        # token and position embeddings
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # a scaled init of the projections into the residual stream
        for name, p in self.named_parameters():
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

    def forward(self, idx, targets=None, kv_cache: KVCache | None = None, doc_starts=None):
        """idx (B, T) -> (logits (B, T, vocab), the mean cross-entropy over targets != -1 or None);
        idx follows kv_cache's position, if any. doc_starts (B, T): True where a packed document
        starts (positions restart, attention stays inside it; T may exceed block_size)."""
        logits, loss, _ = self._run(idx, targets, kv_cache, False, doc_starts)
        return logits, loss

    def forward_with_attention(self, idx, targets=None, kv_cache: KVCache | None = None):
        """(logits, loss, each layer's attention weights [(B, H, T, Tk)] * n_layer)."""
        return self._run(idx, targets, kv_cache, return_attn=True)

    def embed(self, idx, positions: torch.Tensor | int = 0):
        """idx (B, T) -> the residual stream entering layer 0, (B, T, C); positions: each token's
        (B, T), or where idx[:, 0] is (an int: the positions run on from there)."""
        if isinstance(positions, int):
            positions = torch.arange(positions, positions + idx.shape[1], device=idx.device)  # (T,)
        return self.drop(self.wte(idx) + self.wpe(positions))

    def run_layers(self, x, start=0, kv_cache=None, mask=None, return_attn=False):
        """The stream x (B, T, C) entering layer `start` -> (the stream leaving it and each later
        layer [(B, T, C)], their attention weights [(B, H, T, Tk) or None])."""
        streams, attention = [], []
        for layer in range(start, len(self.blocks)):
            x, att = self.blocks[layer](x, kv_cache, layer, mask, return_attn)
            streams.append(x)
            attention.append(att)
        return streams, attention

    def unembed(self, x):
        """The last layer's stream x (B, T, C) -> logits (B, T, vocab): the final norm, the head."""
        return self.lm_head(self.norm_f(x))

    def _run(self, idx, targets, kv_cache, return_attn, doc_starts=None):
        B, T = idx.shape
        pos = kv_cache.pos if kv_cache is not None else 0
        if doc_starts is None and pos + T > self.config.block_size:
            raise ValueError(
                f"sequence of {pos + T} tokens is longer than block_size={self.config.block_size}: "
                f"shorten the input, or train a model with a larger model.block_size"
            )
        if kv_cache is not None and kv_cache.batch_size != B:
            raise ValueError(f"KV cache holds {kv_cache.batch_size} rows but the input has {B}")
        if doc_starts is not None:
            positions, mask = document_positions(doc_starts)
        else:
            # positions from the cache's on; one causal mask for every layer, built only where the
            # implementation needs it
            positions = pos
            mask = causal_mask(self.config.attn_impl, return_attn, pos, T, idx.device)
        x = self.embed(idx, positions)
        streams, attention = self.run_layers(x, 0, kv_cache, mask, return_attn)
        if kv_cache is not None:
            kv_cache.advance(T)
        logits = self.unembed(streams[-1])  # (B, T, vocab)
        loss = None
        if targets is not None:
            # (B, T, V) -> (B*T, V) and (B, T) -> (B*T,): one row per position
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        return logits, loss, attention


def check_gpt_settings(values: dict, name=lambda field: field) -> None:
    """A ValueError naming the fix for the first bad setting in `values` (GPTConfig's fields), each
    named by `name(field)` (the config layer: `model.n_head`)."""
    v = values
    for f in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "mlp_ratio"):
        # vocab_size and block_size may come from the data
        if v.get(f) is None and f in ("vocab_size", "block_size"):
            continue
        if isinstance(v.get(f), bool) or not isinstance(v.get(f), int) or v[f] < 1:
            raise ValueError(f"{name(f)}={v.get(f)!r} must be a positive integer (1 or more)")
    C, H = v["n_embd"], v["n_head"]
    if C % H != 0:
        divisors = [d for d in range(1, C + 1) if C % d == 0]
        raise ValueError(
            f"{name('n_embd')}={C} is not divisible by {name('n_head')}={H}: each head owns "
            f"n_embd/n_head channels. Use {name('n_head')} in {divisors} or change "
            f"{name('n_embd')}."
        )
    if not isinstance(v.get("mlp", True), bool):
        raise ValueError(f"{name('mlp')}={v['mlp']!r} must be true or false")
    if not 0.0 <= v.get("dropout", 0.0) < 1.0:
        raise ValueError(f"{name('dropout')}={v['dropout']!r} must be in [0, 1)")
    for f, choices in (("attn_impl", ATTN_IMPLS), ("norm", NORMS), ("activation", ACTIVATIONS)):
        if f in v and v[f] not in choices:
            raise ValueError(f"{name(f)}={v[f]!r} is unknown; choose one of {list(choices)}")
