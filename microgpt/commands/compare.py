"""How many heads? A sweep's runs side by side, without opening TensorBoard.

    python -m microgpt.compare multirun/2026-05-01/12-00-00 [--wide | --csv | --json]

One row per run under the folder, by head count: best val, test, tok/s (the median), then the head
summaries of `python -m microgpt.heads`'s analysis of its checkpoint, else the last logged
`heads/...` scalars (`*` where they are of an older step); the `analysis` column says which. Under
100 columns with a legend; --wide adds each layer's entropy and importance and the roles; --csv
and --json print every column for scripts. It writes nothing (TensorBoard draws the curves).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from microgpt import entry, runs
from microgpt.checkpoint import Checkpoint
from microgpt.errors import UserError, first_line
from microgpt.files import read_json
from microgpt.heads.report import PRUNE_TOLERANCE, ROLES
from microgpt.runs import RunFolder
from microgpt.viz.tensorboard import METRICS_FILE, VAL_LOSS, read_metrics

# head summaries shown as columns: header -> (tag under heads/, format)
SUMMARY_COLUMNS = {
    "named": ("named", ".0f"),
    "induction": ("induction_max", ".2f"),
    "repeat gain": ("repeat_loss_gain", ".3f"),
    "copying": ("copying_max", ".2f"),
}
# the columns without --wide: under 100 characters for a sweep's runs
NARROW = ("run", "heads", "params", "best val", "test", "tok/s", "prunable", "named", "induction",
          "analysis")  # fmt: skip
LEGEND = f"""\
best val: lowest validation loss; test: best.pt's test loss (nats per character); tok/s: median
  training speed; prunable: heads that can go together for a loss rise < {PRUNE_TOLERANCE} nats;
  named: heads with a role (docs/heads.md); induction: best prefix matching on repeated spans (0-1)
analysis: where the head columns come from: "best.pt 3500": python -m microgpt.heads on best.pt
  (step 3500); "log 3500": the analysis the run logged at step 3500 (on log.head_items items)"""
WIDE_LEGEND = """\
entropy: each layer's mean attention entropy (nats); importance: each layer's largest loss rise
  with one head zeroed; repeat gain: a span's loss on its first copy minus on its repeat; copying:
  the most copying layer-0 head (-1 to 1); then the heads of each role"""


@dataclass
class RunSummary:
    name: str  # the run folder, relative to the compared folder ("heads=4")
    path: Path
    heads: int
    params: int | None = None  # None: no checkpoint yet
    best_val_loss: float = math.nan
    test_loss: float = math.nan
    tokens_per_sec: float = math.nan
    entropy: list[float] = field(default_factory=list)  # per layer, the mean over heads
    heads_summary: dict[str, float] = field(default_factory=dict)  # HeadReport.summaries()
    data: str = "?"  # the data it was trained on: path and a hash of its split's items
    heads_step: int | None = None  # the step the head columns were measured at
    latest_step: int | None = None  # the step they should be of (the checkpoint's, else last)
    heads_from: str = "log"  # "best.pt" (python -m microgpt.heads on it), or "log" (training's)

    def summary(self, name: str) -> float:
        """A head summary (`heads/<name>`), nan when the run has none."""
        value = self.heads_summary.get(f"heads/{name}")
        return math.nan if value is None else value

    @property
    def importance_max(self) -> list[float]:
        layers = []
        while f"heads/layer{len(layers)}/importance_max" in self.heads_summary:
            layers.append(self.summary(f"layer{len(layers)}/importance_max"))
        return layers

    @property
    def role_counts(self) -> dict[str, float]:
        return {role: self.summary(f"role/{role}") for role in ROLES}

    @property
    def label(self) -> str:
        return f"{self.heads} head{'s' if self.heads != 1 else ''}"


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the run's metrics.jsonl (every run writes one)."""
    out: dict[str, list[tuple[int, float]]] = {}
    skipped: list[str] = []  # bad lines: named, the rest read
    for line in read_metrics(run / METRICS_FILE, skipped):
        for tag, value in line.items():
            if tag not in ("step", "time"):
                out.setdefault(tag, []).append((line["step"], value))
    for said in skipped[:3]:
        print(f"microgpt: note: {said}: left out", file=sys.stderr)
    return out


def read_run(folder: RunFolder, root: Path) -> RunSummary:
    run = folder.path
    # config.yaml is the validated Config: model.n_head is the head count, whatever heads= said
    heads = OmegaConf.load(run / "config.yaml").model.n_head  # none: an OmegaConf error
    scalars = _scalars(run)
    r, step = RunSummary(folder.name_under(root), run, heads), None
    checkpoint, kept = folder.default_checkpoint(), {}  # best.pt, else last.pt
    if checkpoint is not None:  # a CheckpointError makes the run unreadable (read_sweep)
        ckpt = Checkpoint.load(checkpoint)
        kept = ckpt.metrics  # best.pt's: its exact validation loss and its test loss
        r.params, step = ckpt.build_model()[0].num_params(), ckpt.step  # as training counts them
        split = hashlib.sha256(json.dumps(ckpt.split, sort_keys=True).encode()).hexdigest()[:8]
        r.data = f"{ckpt.data.get('path', '?')} #{split}"  # the data: its path and split's hash
    values = {tag: [value for _, value in points] for tag, points in scalars.items()}
    r.best_val_loss = kept.get("best_val_loss", min(values.get(VAL_LOSS, []), default=math.nan))
    r.test_loss = kept.get("test_loss", math.nan)
    r.tokens_per_sec = statistics.median(values.get("tokens_per_sec", [math.nan]))
    layers: dict[int, list[float]] = {}
    for tag, points in scalars.items():  # each tag has a point (_scalars)
        layer = re.fullmatch(r"per_head/layer(\d+)/head\d+/entropy", tag)
        if layer:  # the last step's value
            layers.setdefault(int(layer[1]), []).append(max(points)[1])
    r.entropy = [statistics.fmean(layers[k]) for k in sorted(layers)]
    r.heads_summary, r.heads_step, r.latest_step, r.heads_from = _heads_summary(
        checkpoint, folder, scalars, step
    )
    return r


def _heads_summary(checkpoint: Path | None, folder: RunFolder, scalars: dict, checkpoint_step):
    """(summaries, the step they are of, the step they should be of, where they come from): the
    analysis of the row's checkpoint (best.pt, else last.pt), else each logged summary's last
    value (of the last step)."""
    if checkpoint is not None:
        # the JSON python -m microgpt.heads wrote (HeadReport.to_dict, with the checkpoint's step)
        try:
            data = read_json(folder.analysis(checkpoint))  # bounded in size and depth
            return dict(data["summaries"]), data.get("step"), checkpoint_step, checkpoint.name
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # none, or unreadable: the logged scalars below
    logged = {t: max(points) for t, points in scalars.items() if t.startswith("heads/") and points}
    step = max((s for s, _ in logged.values()), default=None)
    last = max((s for points in scalars.values() for s, _ in points), default=None)
    return {tag: value for tag, (_, value) in logged.items()}, step, last, "log"


def read_sweep(folder: str | Path) -> tuple[list[RunSummary], list[tuple[str, str]]]:
    """(the runs under `folder` that can be read, by head count then name; (name, why) for the
    others: what a damaged run raises makes it unreadable, not compare)."""
    root = Path(folder)
    found, unreadable = [], []
    config = (OmegaConfBaseException, yaml.YAMLError)
    for run in runs.find_runs(root):
        try:
            found.append(read_run(run, root))
        except (ValueError, KeyError, TypeError, AttributeError, OSError, *config) as e:
            why = first_line(e)  # a UserError (a CheckpointError, ...) is a ValueError
            if isinstance(e, config):
                why = f"config.yaml: {why}"
            elif isinstance(e, UnicodeDecodeError):
                why = f"{METRICS_FILE} is not UTF-8 text"
            unreadable.append((run.name_under(root), why))
    found.sort(key=lambda r: (r.heads, r.name))
    return found, unreadable


def _num(x: float, fmt: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _rate(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _per_layer(values: list[float], n: int, fmt: str) -> list[str]:
    """A cell per layer of the widest run, "-" where this run has fewer layers."""
    return [_num(x, fmt) for x in values + [None] * (n - len(values))]


def table(runs: list[RunSummary], plain: bool = False) -> tuple[list[str], list[list[str]]]:
    """Every column: the header ("entropy L0", "entropy L1", ...) and a row of cells per run;
    plain: params and tok/s as plain numbers (CSV)."""
    n_layers = max((len(r.entropy) for r in runs), default=0)
    n_imp = max((len(r.importance_max) for r in runs), default=0)
    # the roles some run has (mixed always; nan > 0 is False), not 18 columns mostly of zeros
    roles = [x for x in ROLES if x == "mixed" or any(r.role_counts[x] > 0 for r in runs)]
    header = ["run", "heads", "params", "best val", "test", "tok/s"]
    header += [f"entropy L{n}" for n in range(n_layers)] + ["prunable"]
    header += [f"importance L{n}" for n in range(n_imp)] + [*SUMMARY_COLUMNS, *roles, "analysis"]
    return header, [_row(r, n_layers, n_imp, roles, plain) for r in runs]


def format_table(runs: list[RunSummary], wide: bool = False) -> str:
    """One row per run, columns aligned (NARROW, or every one), the legend; then the lowest
    validation loss (per data set)."""
    header, rows = table(runs)
    keep = [i for i, name in enumerate(header) if wide or name in NARROW]
    # a layer's columns after the first: "L1", "L2", ... under "entropy L0"
    shown = [
        h.split()[-1] if i > 0 and h[:-1] == header[i - 1][:-1] else h for i, h in enumerate(header)
    ]
    columns = [[shown[i], *(row[i] for row in rows)] for i in keep]
    widths = [max(map(len, col)) for col in columns]
    lines = []
    for first, *rest in zip(*columns):
        cells = [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:]))]
        lines.append("  ".join(cells).rstrip())
    stale = [line for line in map(_stale, runs) if line]
    legend = (
        [LEGEND, WIDE_LEGEND]
        if wide
        else [LEGEND, "--wide: every column; --csv, --json: for scripts"]
    )
    return "\n".join(lines + stale + legend + _lowest_val_loss(runs))


def _row(r: RunSummary, n_layers: int, n_imp: int, roles: list[str], plain=False) -> list[str]:
    params = "-" if r.params is None else f"{r.params:{'' if plain else ','}}"
    rate = _num(r.tokens_per_sec, ".0f") if plain else _rate(r.tokens_per_sec)
    stale = "*" if _stale(r) else ""
    analysis = "-" if r.heads_step is None else f"{r.heads_from} {r.heads_step}{stale}"
    row = [r.name, str(r.heads), params, _num(r.best_val_loss), _num(r.test_loss)]
    row += [rate, *_per_layer(r.entropy, n_layers, ".3f")]
    row += [_num(r.summary("prunable"), ".0f"), *_per_layer(r.importance_max, n_imp, ".4f")]
    row += [_num(r.summary(tag), fmt) for tag, fmt in SUMMARY_COLUMNS.values()]
    return row + [_num(r.role_counts[role], ".0f") for role in roles] + [analysis]


def to_json(runs: list[RunSummary]) -> str:
    """Every run's figures as JSON (nan: null)."""
    keys = ("name", "heads", "params", "best_val_loss", "test_loss", "tokens_per_sec", "entropy")
    keys += ("heads_summary", "heads_from", "heads_step", "latest_step", "data")
    records = [{k: getattr(r, k) for k in keys} for r in runs]
    return json.dumps(_no_nan(records), indent=1)


def _no_nan(x):
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def _stale(r: RunSummary) -> str:
    if None in (r.heads_step, r.latest_step) or r.heads_step == r.latest_step:
        return ""
    return (
        f"* {r.name}: its head columns are of step {r.heads_step}, not {r.latest_step} "
        f"(python -m microgpt.heads {r.path} measures them again)"
    )


def _lowest_val_loss(runs: list[RunSummary]) -> list[str]:
    # per data set: losses on different data do not compare
    groups: dict[str, list[RunSummary]] = {}
    for r in runs:
        groups.setdefault(r.data, []).append(r)
    lines = []
    if len(groups) > 1:
        lines.append(
            f"these runs were trained on {len(groups)} different data sets (path or items differ); "
            f"their losses compare only within a group:"
        )
    for data, group in groups.items():
        best = min(group, key=lambda r: (math.isnan(r.best_val_loss), r.best_val_loss))
        if not math.isnan(best.best_val_loss):
            where = f" on {data}: {', '.join(r.name for r in group)}" if len(groups) > 1 else ""
            label = f"{best.name} ({best.label}, {best.best_val_loss:.4f})"
            lines.append(f"lowest validation loss{where}: {label}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command behind the front door: its exit status (0; 2 after one error line)."""
    return entry.run(lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = entry.ArgumentParser(
        prog="python -m microgpt.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", help="a sweep folder (multirun/<date>/<time>) or runs")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--wide", action="store_true", help="every column, wider than 100")
    how.add_argument("--csv", action="store_true", help="every column as CSV, no legend")
    how.add_argument("--json", action="store_true", help="every run's figures as JSON")
    args = parser.parse_args(argv)
    runs, unreadable = read_sweep(args.folder)
    if not runs:
        why = "; ".join(f"{name}: {reason}" for name, reason in unreadable)
        raise UserError(f"no run under {args.folder} can be read ({why})")
    if args.csv:
        header, rows = table(runs, plain=True)
        csv.writer(sys.stdout, lineterminator="\n").writerows([header, *rows])
    else:
        print(to_json(runs) if args.json else format_table(runs, args.wide))
    for name, why in unreadable:  # on stderr where stdout is for a script
        print(
            f"unreadable: {name} ({why})", file=sys.stderr if args.csv or args.json else sys.stdout
        )
