"""Which side of layer 1's induction heads reads layer 0: Q- or K-composition (Elhage et al. 2021).

    python bench/composition.py RUN [RUN ...]     # run folders of 2-layer attention-only models

For each run's best.pt, layer 1's prefix matching on the repeated-span probe three ways: as the
model computes it; with its queries computed from the embeddings alone (layer 0's output removed
from the query side); with its keys computed so. A head whose prefix matching dies without layer 0
on the key side reads a previous-token head through its keys (K-composition, Olsson et al.'s
two-head circuit); one whose matching dies on the query side reads where the earlier copy is
through its queries (Q-composition: a duplicate-token head copies the earlier occurrence's
position). See docs/heads.md, "Induction heads: the experiment".
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from microgpt.data.repeats import repeated_spans, span_for
from microgpt.heads import roles
from microgpt.heads.analyse import PROBE_ROWS, PROBE_SEED
from microgpt.train.checkpoint import Checkpoint


def layer1_attention(block, x_query, x_key):
    """Layer 1's attention (B, H, T, T) with queries read from x_query and keys from x_key."""
    attn, C = block.attn, x_query.shape[-1]
    q = attn.qkv(block.norm1(x_query)).split([C, attn.kv_dim, attn.kv_dim], dim=2)[0]
    k = attn.qkv(block.norm1(x_key)).split([C, attn.kv_dim, attn.kv_dim], dim=2)[1]
    B, T, _ = q.shape
    # (B, T, C) -> (B, H, T, hd)
    q = q.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)
    k = k.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)


@torch.no_grad()
def composition(run: Path) -> dict[str, list[float]]:
    """Layer 1's prefix matching per head: in full, and without layer 0 on either side."""
    model, _ = Checkpoint.load(run / "checkpoints" / "best.pt", map_location="cpu").build_model(
        "cpu"
    )
    model.eval()
    c = model.config
    if c.n_layer != 2 or c.mlp:
        raise SystemExit(f"{run}: a 2-layer attention-only model is needed (experiment=induction)")
    g = torch.Generator().manual_seed(PROBE_SEED)
    rows = repeated_spans(PROBE_ROWS, c.vocab_size, span_for(c.block_size), g)
    x = rows.x
    embedded = model.wte(x) + model.wpe(torch.arange(x.shape[1]))
    first, second = model.blocks
    written, att0 = first.attn(first.norm1(embedded), return_attn=True)
    after0 = embedded + written
    sides = {
        "full": (after0, after0),
        "queries without layer 0": (embedded, after0),
        "keys without layer 0": (after0, embedded),
    }
    out = {}
    for name, (xq, xk) in sides.items():
        prefix, _ = roles.probe_scores([att0, layer1_attention(second, xq, xk)], x, rows.repeat)
        out[name] = [round(v, 2) for v in prefix[1].tolist()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    for run in parser.parse_args().runs:
        for name, values in composition(run).items():
            print(f"{run.name}: layer 1 prefix matching, {name}: {values}")


if __name__ == "__main__":
    main()
