"""What the head analysis found, as one object: per-head tensors, roles, the patterns behind them,
importance three ways, the induction test, layer 0's copying scores, the pruning curve, the
summaries that read the same whatever the head count, JSON and markdown."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from torch import Tensor

from microgpt.heads import measures
from microgpt.heads.measures import PRUNE_TOLERANCE

POSITIONAL = ("self", "previous", "two_back", "three_back", "start")
CLASSES = ("boundary", "vowel", "consonant", "capital", "space", "newline", "punctuation", "rare")
RELATIONS = ("duplicate", "induction", "line_start", "word_start")
ROLES = (*POSITIONAL, *CLASSES, *RELATIONS, "mixed")  # the patterns, in order of precedence
MIN_MASS = 0.5  # a pattern names a head when it holds at least this share of its attention...
MIN_LIFT = 1.5  # ...and at least this many times what uniform attention would put there
RARE_FRACTION = 0.2  # the `rare` class: the least frequent fifth of the characters
THRESHOLDS = {"min_mass": MIN_MASS, "min_lift": MIN_LIFT, "rare_fraction": RARE_FRACTION}


@dataclass
class InductionTest:
    """The induction test on repeated spans (microgpt.data.repeats): rows of a boundary token, a
    random span of `span` characters and the span again, or (text) a passage of the text twice.
    Tensors (L, H)."""

    rows: int
    span: int
    prefix: Tensor  # mean attention of repeat queries on the key after the earlier occurrence
    duplicate: Tensor  # ... on the earlier occurrence itself
    loss_first: float  # on s2..sL of the first copy (unpredictable: about ln of the characters)
    loss_repeat: float  # on the same targets in the repeat
    ablated: Tensor  # the repeat's loss with the head zeroed
    text: bool = False  # passages of the validation text, not random spans
    # the repeat's loss with every induction head (induction_heads) zeroed together; nan: none
    induction_zeroed: float = math.nan

    @property
    def gain(self) -> float:
        return self.loss_first - self.loss_repeat

    @property
    def induction_heads(self) -> Tensor:
        """(L, H) bool: the heads whose prefix matching holds the majority (>= MIN_MASS)."""
        return self.prefix >= MIN_MASS

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("rows", "span", "loss_first", "loss_repeat", "gain")}
        out["induction_heads"] = self.induction_heads.nonzero().tolist()
        return out | {"loss_induction_zeroed": _number(self.induction_zeroed)}


def _number(x) -> float | None:
    """A float for JSON, nan as None."""
    return None if math.isnan(float(x)) else float(x)


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
    mean_importance: Tensor  # mean ablation (one mean per head): loss rise
    position_importance: Tensor  # mean ablation with one mean per position: loss rise
    entropy: Tensor  # nats, mean over real queries
    spread: Tensor  # entropy / log(keys seen), in [0, 1]
    offsets: Tensor  # (L, H, K): mean weight on offset 0, 1, ..., K-1
    start: Tensor  # mean weight on the boundary token at position 0
    mass: dict[str, Tensor]  # pattern -> mean attention weight on its keys (microgpt.heads.roles)
    lift: dict[str, Tensor]  # pattern -> that weight / what uniform attention puts there
    roles: list[list[str]]  # [layer][head], one of ROLES
    scores: Tensor  # the mass of the role's pattern (mixed: the largest above-chance mass)
    pruning_order: list[tuple[int, int]]  # (layer, head), least important first
    pruning_losses: list[float]  # loss with the first k heads removed, k = 0..L*H
    prunable: int  # heads that can go with a loss rise < tolerance
    induction: InductionTest | None = None  # None where the block is too short for a span of 2
    copying: Tensor | None = None  # (H,) layer 0: OV eigenvalues' sum(l) / sum(|l|), -1 to 1
    tolerance: float = PRUNE_TOLERANCE
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def summaries(self) -> dict[str, float]:
        """Numbers that read the same whatever the head count (microgpt.heads.measures)."""
        return measures.summaries(self)

    def role_counts(self) -> dict[str, int]:
        """{role: its heads} of every role, in ROLES' order."""
        counts = Counter(role for row in self.roles for role in row)
        return {role: counts[role] for role in ROLES}

    def to_dict(self) -> dict:
        """Plain lists and numbers (JSON): the fields, the per-head rows and the summaries."""
        L, values = self.n_layer, measures.per_head(self)
        return {
            **{k: getattr(self, k) for k in ("n_layer", "n_head", "items", "tokens", "loss")},
            "roles": list(ROLES),
            "thresholds": THRESHOLDS,
            "heads": [self._row(a, b, values) for a in range(L) for b in range(self.n_head)],
            # "probe": the key heads-*.json files on disk already use
            "probe": self.induction.to_dict() if self.induction is not None else None,
            "pruning": {
                "order": [list(p) for p in self.pruning_order],
                "losses": list(self.pruning_losses),
                "tolerance": self.tolerance,
                "prunable": self.prunable,
            },
            "summaries": {k: _number(v) for k, v in self.summaries().items()},
            "measures": {m.name: m.help for m in measures.MEASURES},
            "seconds": self.seconds,
            **self.extra,
        }

    def _row(self, layer: int, h: int, values: list) -> dict:
        """The head's row in heads-*.json: every per-head measure it has (not nan)."""
        at = (layer, h)
        row = {"layer": layer, "head": h, "role": self.roles[layer][h]}
        row["patterns"] = {
            k: {"mass": float(m[at]), "lift": float(self.lift[k][at])} for k, m in self.mass.items()
        }
        row["offsets"] = self.offsets[at].tolist()
        return row | {m.name: float(v[at]) for m, v in values if not math.isnan(v[at])}

    def markdown(self) -> str:
        """A row per head, then lines on importance, induction and pruning."""
        header = ["layer", "head", "role", "score", "lift", "entropy (nats)", "zero-ablated"]
        header += ["mean-ablated (per position)", "prefix match", "copying"]
        rows = [self._head_cells(a, b) for a in range(self.n_layer) for b in range(self.n_head)]
        return "\n".join(_table(header, "rrl" + "r" * 7, rows) + self._notes())

    def _head_cells(self, layer: int, h: int) -> list[str]:
        at, test, role = (layer, h), self.induction, self.roles[layer][h]
        lift = f"{self.lift[role][at]:.1f}" if role in self.lift else "-"  # mixed: none
        copying = f"{self.copying[h]:.2f}" if layer == 0 and self.copying is not None else "-"
        return [
            *(str(layer), str(h), role, f"{self.scores[at]:.2f}", lift),
            *(f"{self.entropy[at]:.3f}", f"{self.zero_importance[at]:+.4f}"),
            f"{self.position_importance[at]:+.4f}",
            *("-" if test is None else f"{test.prefix[at]:.2f}", copying),
        ]

    def _notes(self) -> list[str]:
        """The lines under the table: loss and pruning, what the columns mean, induction."""
        gone = _heads(self.pruning_order[: self.prunable])
        meaning = {m.name: m.help for m in measures.MEASURES}
        lines = [
            f"\nLoss {self.loss:.4f} nats/char over {self.items:,} items ({self.tokens:,} "
            f"characters). Prunable: {self.prunable} of {self.n_layer * self.n_head} heads "
            f"removed together raise it by < {self.tolerance:g} nats ({gone}).",
            f"Role: a pattern holding mass >= {MIN_MASS} of the attention at lift >= {MIN_LIFT} "
            f"(times uniform attention); score = the role's mass (mixed: the largest above-chance "
            f"mass). Importance = loss rise (nats) when the head is zeroed, or replaced by its "
            f"mean at each position; copying = {meaning['copying']}.",
        ]
        test = self.induction
        if test is not None:
            best = divmod(int(test.prefix.argmax()), self.n_head)
            induction = test.induction_heads.nonzero().tolist()
            together = (
                f"the heads of prefix matching >= {MIN_MASS} ({_heads(induction)}) zeroed "
                f"together, to {test.induction_zeroed:.3f}"
                if induction
                else f"no head reaches prefix matching {MIN_MASS}"
            )
            span = f"{test.span}-character"
            what = f"a {span} passage of the text" if test.text else f"a random {span} span"
            lines.append(
                f"Repeated spans ({test.rows} rows of {what} twice): loss {test.loss_first:.3f} on "
                f"the first copy, {test.loss_repeat:.3f} on the repeat (gain {test.gain:.3f} "
                f"nats); best prefix matching L{best[0]}H{best[1]} {float(test.prefix.max()):.2f}, "
                f"which zeroed brings the repeat's loss to {float(test.ablated[best]):.3f}; "
                f"{together}."
            )
        return lines


def _table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    """A markdown table's lines; align: a letter per column, r(ight), l(eft) or " " (none)."""
    rule = {"r": "---:", "l": ":---", " ": "---"}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _heads(pairs) -> str:
    """(layer, head) pairs -> "L1H0, L1H3", or "none"."""
    return ", ".join(f"L{a}H{b}" for a, b in pairs) or "none"
