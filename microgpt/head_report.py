"""What the head analysis found, as one object: per-head tensors, roles, the pruning curve, the
summaries that read the same whatever the head count, JSON and a markdown table."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

ROLES = ("self", "previous", "two_back", "three_back", "start", "spread")
PRUNE_TOLERANCE = 0.01  # nats: the loss rise a pruned model may have


@dataclass
class HeadReport:
    """What every head of a model does on some rows, and whether it matters. Tensors are (L, H)
    unless said, float64 on the CPU; losses are mean nats per character."""

    n_layer: int
    n_head: int
    items: int  # rows analysed
    tokens: int  # real targets (characters + end tokens) over those rows
    loss: float  # with every head
    zero_importance: Tensor  # zero ablation (its output times 0): loss rise
    mean_importance: Tensor  # mean ablation (its output replaced by its mean): loss rise
    entropy: Tensor  # nats, mean over real queries
    spread: Tensor  # entropy / log(keys seen), in [0, 1]
    offsets: Tensor  # (L, H, K): mean weight on offset 0, 1, ..., K-1
    start: Tensor  # mean weight on the boundary token at position 0
    roles: list[list[str]]  # [layer][head], one of ROLES
    scores: Tensor  # the role's score, in [0, 1]
    pruning_order: list[tuple[int, int]]  # (layer, head), least important first
    pruning_losses: list[float]  # loss with the first k heads removed, k = 0..L*H
    prunable: int  # heads that can go with a loss rise < tolerance
    tolerance: float = PRUNE_TOLERANCE
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def summaries(self) -> dict[str, float]:
        """Numbers that do not depend on the head count, under tags every run shares, the most
        telling first (the HParams tab shows its metric columns in this order)."""
        L = self.n_layer
        out = {
            "heads/prunable": float(self.prunable),
            "heads/prunable_fraction": self.prunable / (L * self.n_head),
        }
        zero = self.zero_importance
        out.update({f"heads/layer{n}/importance_max": float(zero[n].max()) for n in range(L)})
        counts = self.role_counts()
        out.update({f"heads/role/{role}": float(counts[role]) for role in ROLES})
        out.update({f"heads/layer{n}/importance_sum": float(zero[n].sum()) for n in range(L)})
        for n in range(L):
            e = self.entropy[n]
            out[f"heads/layer{n}/entropy_min"] = float(e.min())
            out[f"heads/layer{n}/entropy_mean"] = float(e.mean())
            out[f"heads/layer{n}/entropy_max"] = float(e.max())
        return out

    def role_counts(self) -> dict[str, int]:
        flat = [r for row in self.roles for r in row]
        return {role: flat.count(role) for role in ROLES}

    def to_dict(self) -> dict:
        """Plain lists and numbers (JSON): the fields, the per-head rows and the summaries."""
        heads = [
            {
                "layer": layer,
                "head": h,
                "role": self.roles[layer][h],
                "score": float(self.scores[layer, h]),
                "entropy": float(self.entropy[layer, h]),
                "spread": float(self.spread[layer, h]),
                "start": float(self.start[layer, h]),
                "offsets": self.offsets[layer, h].tolist(),
                "zero_importance": float(self.zero_importance[layer, h]),
                "mean_importance": float(self.mean_importance[layer, h]),
            }
            for layer in range(self.n_layer)
            for h in range(self.n_head)
        ]
        return {
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "items": self.items,
            "tokens": self.tokens,
            "loss": self.loss,
            "roles": list(ROLES),
            "heads": heads,
            "pruning": {
                "order": [list(p) for p in self.pruning_order],
                "losses": list(self.pruning_losses),
                "tolerance": self.tolerance,
                "prunable": self.prunable,
            },
            "summaries": self.summaries(),
            "seconds": self.seconds,
            **self.extra,
        }

    def markdown(self) -> str:
        """A table, one row per head (layer, head, role, score, entropy, importance), and a line
        on pruning."""
        lines = [
            "| layer | head | role | score | entropy (nats) | zero-ablated (nats) | "
            "mean-ablated (nats) |",
            "|---:|---:|:---|---:|---:|---:|---:|",
        ]
        for layer in range(self.n_layer):
            for h in range(self.n_head):
                lines.append(
                    f"| {layer} | {h} | {self.roles[layer][h]} | {self.scores[layer, h]:.2f} | "
                    f"{self.entropy[layer, h]:.3f} | {self.zero_importance[layer, h]:+.4f} | "
                    f"{self.mean_importance[layer, h]:+.4f} |"
                )
        total = self.n_layer * self.n_head
        gone = ", ".join(f"L{a}H{b}" for a, b in self.pruning_order[: self.prunable]) or "none"
        lines.append(
            f"\nLoss {self.loss:.4f} nats/char over {self.items:,} items ({self.tokens:,} "
            f"characters). Prunable: {self.prunable} of {total} heads removed together raise it "
            f"by < {self.tolerance:g} nats ({gone})."
        )
        return "\n".join(lines)
