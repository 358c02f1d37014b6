"""The head measures, each defined once: how it is computed from a HeadReport, its name, format
and help line, and where it shows. Every view iterates MEASURES, in its order:
heads-*.json (a head's row, or its summaries), TensorBoard (`per_head/layer{l}/head{h}/<tag>`,
`heads/<name>`, the custom-scalars charts, the HParams row), compare's columns, the tab's
captions and timeline.

A measure is per head, (L, H) (nan where it does not apply: copying beyond layer 0; None: not
measured, no induction test), or a summary that reads the same whatever the head count: a number
(nan: not measured), or a family {key: number} whose name holds {} for the key: `role/{}`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

PRUNE_TOLERANCE = 0.01  # nats: the loss rise a pruned model may have


@dataclass(frozen=True)
class Measure:
    name: str  # its key in heads-*.json: a head's row, or "heads/<name>" of the summaries
    of: Callable  # HeadReport -> its value (above)
    help: str  # what it measures, in a line: compare's legend, the tab's tooltip, the JSON
    fmt: str = ".2f"  # a value as compare and the tab's caption write it
    per_head: bool = False
    tag: str | None = ""  # per head, TensorBoard's name for it: "" its name; None: not logged
    column: str = ""  # compare's header ({}: the family's key); none: not a column
    main: bool = False  # in compare's short tables (a group: the mean over its seeds), HParams
    charts: tuple[str, ...] = ()  # the custom-scalars charts that draw it
    caption: str | None = None  # per head: on the head's caption in the tab, after this label
    line: str = ""  # a summary (0-1) the tab's timeline draws over the steps, labelled this
    seeds: bool = False  # a family of counts: compare says in how many of a group's runs each > 0

    def summaries(self, report) -> dict[str, float]:
        """{"heads/<name>": value} of a summary, a family's one per key."""
        value = self.of(report)
        values = value if isinstance(value, dict) else {"": value}
        return {f"heads/{self.name.format(k)}": float(v) for k, v in values.items()}

    def pattern(self, prefix: str = "heads/") -> str:
        """A regex of its tags, a family's key a group."""
        return prefix + "([^/]+)".join(map(re.escape, (self.tag or self.name).split("{}")))


def summaries(report) -> dict[str, float]:
    """Every summary measure of a HeadReport, under tags every run shares (nan: not measured)."""
    return {k: v for m in MEASURES if not m.per_head for k, v in m.summaries(report).items()}


def summary_measures(view: str) -> list[Measure]:
    """The summary measures shown in `view`: "column" (compare's columns), "main" (compare's short
    tables, HParams), "line" (the tab's timeline), "seeds" (compare's roles across seeds)."""
    return [m for m in MEASURES if getattr(m, view) and not m.per_head]


def per_head(report) -> list[tuple[Measure, torch.Tensor]]:
    """(measure, (L, H) values) of every per-head measure the report has."""
    return [(m, v) for m in MEASURES if m.per_head and (v := m.of(report)) is not None]


def _layer0(values, n_layer: int):
    """(H,) values of layer 0 as (L, H), nan beyond."""
    return torch.cat([values[None], torch.full((n_layer - 1, len(values)), math.nan).to(values)])


def _layers(field: str, stat: str) -> Callable:
    """A family {layer: that layer's stat ("max", "sum", ...) of the report's (L, H) `field`}."""
    return lambda r: {n: getattr(v, stat)() for n, v in enumerate(getattr(r, field))}


def _test(value: Callable) -> Callable:
    """value(the induction test), nan without one."""
    return lambda r: math.nan if r.induction is None else value(r.induction)


ENTROPY, ENTROPIES = "entropy and importance of each head", "entropy min/mean/max per layer"
SPANS, INDUCTION = "repeated spans: loss on the first copy and the repeat", "induction and copying"
MEASURES = [  # a test may append one
    Measure("score", lambda r: r.scores, "its attention on its role's pattern (mixed: the largest "
            "above-chance mass)", per_head=True, caption=""),
    Measure("entropy", lambda r: r.entropy, "attention entropy (nats), mean over real queries",
            ".3f", per_head=True, charts=(ENTROPY,)),
    Measure("zero_importance", lambda r: r.zero_importance, "its importance: the validation loss's "
            "rise (nats) when it alone is zeroed (python -m microgpt.heads)", "+.2f", per_head=True,
            tag="importance", caption="val", charts=(ENTROPY, "importance of each head (loss "
            "rise, nats)")),
    Measure("position_mean_importance", lambda r: r.position_importance, "the loss rise with its "
            "output replaced by its mean at each position", per_head=True),
    Measure("induction", lambda r: r.induction and r.induction.prefix, "prefix matching: mean "
            "attention of repeats on the key after the earlier occurrence", per_head=True,
            charts=("prefix matching of each head",)),
    Measure("duplicate", lambda r: r.induction and r.induction.duplicate, "mean attention of "
            "repeats on the earlier occurrence itself", per_head=True),
    Measure("copying", lambda r: None if r.copying is None else _layer0(r.copying, r.n_layer),
            "layer 0: sum(l) / sum(|l|) of the OV circuit's eigenvalues l, -1 to 1, 0 for none",
            per_head=True),
    Measure("spread", lambda r: r.spread, "entropy / log(keys seen), 0 one key, 1 uniform",
            per_head=True, tag=None),
    Measure("start", lambda r: r.start, "mean weight on the boundary token at position 0",
            per_head=True, tag=None),
    Measure("mean_importance", lambda r: r.mean_importance, "the loss rise with its output "
            "replaced by its mean", per_head=True, tag=None),
    Measure("repeat_loss_ablated", lambda r: r.induction and r.induction.ablated, "the repeat's "
            "loss with it zeroed", per_head=True, tag=None),
    # the summaries: compare's columns first, in its order
    Measure("layer{}/entropy_mean", _layers("entropy", "mean"), "each layer's mean attention "
            "entropy (nats)", ".3f", column="entropy L{}", charts=(ENTROPIES,)),
    Measure("prunable", lambda r: r.prunable, "heads that can go together for a loss rise < "
            f"{PRUNE_TOLERANCE} nats", ".0f", column="prunable", main=True,
            charts=("prunable heads",)),
    Measure("layer{}/importance_max", _layers("zero_importance", "max"), "each layer's largest "
            "loss rise with one head zeroed", ".4f", column="importance L{}",
            charts=("importance max per layer",)),
    Measure("named", lambda r: r.n_layer * r.n_head - r.role_counts()["mixed"], "heads with a role "
            "(docs/heads.md)", ".0f", column="named", main=True),
    Measure("induction_max", _test(lambda p: p.prefix.max()), "best prefix matching on repeats "
            "(0-1)", column="induction", main=True, charts=(INDUCTION,), line="induction max"),
    Measure("repeat_loss_gain", _test(lambda p: p.gain), "a span's loss on its first copy minus on "
            "its repeat", ".3f", column="repeat gain", charts=(SPANS,)),
    Measure("copying_max", lambda r: math.nan if r.copying is None else r.copying.max(), "the most "
            "copying layer-0 head (-1 to 1)", column="copying", charts=(INDUCTION,)),
    Measure("role/{}", lambda r: r.role_counts(), "the heads of each role", ".0f", column="{}",
            charts=("heads per role",), seeds=True),
    Measure("prunable_fraction", lambda r: r.prunable / (r.n_layer * r.n_head), "prunable heads "
            "over all heads"),
    Measure("duplicate_max", _test(lambda p: p.duplicate.max()), "the largest duplicate "
            "attention", charts=(INDUCTION,)),
    Measure("repeat_loss_first", _test(lambda p: p.loss_first), "a span's loss on its first copy",
            charts=(SPANS,)),
    Measure("repeat_loss", _test(lambda p: p.loss_repeat), "its loss on the repeat",
            charts=(SPANS,)),
    Measure("induction_ablation_max", _test(lambda p: (p.ablated - p.loss_repeat).max()), "the "
            "largest rise of the repeat's loss with one head zeroed"),
    Measure("induction_ablation_all", _test(lambda p: p.induction_zeroed - p.loss_repeat), "its "
            "rise with every induction head zeroed (nan: none)"),
    Measure("layer{}/importance_sum", _layers("zero_importance", "sum"), "each layer's summed "
            "importance"),
    Measure("layer{}/entropy_min", _layers("entropy", "min"), "each layer's least entropy",
            charts=(ENTROPIES,)),
    Measure("layer{}/entropy_max", _layers("entropy", "max"), "each layer's largest entropy",
            charts=(ENTROPIES,)),
]  # fmt: skip
