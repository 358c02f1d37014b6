"""Does the head count matter? A sweep's runs side by side, and how sure each difference is.

    python -m microgpt.compare multirun/2026-05-01/12-00-00 [--runs] [--wide | --csv | --json]

One row per group, by head count: the runs that differ only by seed (microgpt.groups; `python
train.py -m heads=1,2,4,8 seed=1,2,3` makes four groups of three). Best val and test are the mean
over the seeds ± half its interval (the t-based 95% CI of the mean for 3 or more seeds, min-max for
2); tok/s the median; the head summaries of `python -m microgpt.heads`'s analysis of each run's
checkpoint (else its last logged `heads/...` scalars) as means. Under the table: the roles each
group's runs have (k of n seeds), then a verdict for each group against the one above it: the
difference of their losses with its 95% CI and p, paired by seed where both groups have the same
seeds (else Welch's t-test), significant or within noise after Holm's correction over the
comparisons. One seed per group cannot tell a difference from noise, and says so.

Under 100 columns with a legend, and a note where a run's head columns are of an older step than
its checkpoint; --runs adds a row per run; --wide: the runs with every column (each layer's
entropy and importance, the roles); --csv and --json: everything, for scripts. It writes nothing
(TensorBoard draws the curves).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import statistics
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from microgpt import entry, runs
from microgpt.checkpoint import Checkpoint
from microgpt.config import flatten
from microgpt.errors import UserError, first_line
from microgpt.groups import Group, group_runs
from microgpt.heads.measures import summary_measures
from microgpt.runs import RunFolder
from microgpt.stats import MIN_MAX, T_CI, TTest, holm, interval, paired_t, welch_t
from microgpt.viz.tensorboard import VAL_LOSS

RUN_COLUMNS = ("run", "heads", "params", "best val", "test", "tok/s")  # then the head measures'
LOSSES = {"test": "test_loss", "best val": "best_val_loss"}  # the figures groups are compared on
NO_DATA = "?"  # a run's data before its first checkpoint (which names it)
ALPHA = 0.05  # a difference is significant when its Holm-corrected p is below
SWEEP_SEEDS = "python train.py -m heads=1,2,4,8 seed=1,2,3"
LEGEND = "best val: lowest validation loss; test: best.pt's test loss (nats per character); tok/s: "
LEGEND += "median training speed"
GROUP_LEGEND = f"""\
group: runs that differ only by seed; seeds: how many; each figure the mean over its seeds, best
  val and test ± half their interval: the {T_CI} of the mean (3+ seeds), {MIN_MAX} (2 seeds)"""


@dataclass
class RunSummary:
    name: str  # the run folder, relative to the compared folder ("heads=4")
    path: Path
    heads: int
    params: int | None = None  # None: no checkpoint yet
    best_val_loss: float = math.nan
    test_loss: float = math.nan
    tokens_per_sec: float = math.nan
    heads_summary: dict[str, float] = field(default_factory=dict)  # HeadReport.summaries()
    data: str = NO_DATA  # the data it was trained on: path and a hash of its split's items
    heads_step: int | None = None  # the step the head columns were measured at
    latest_step: int | None = None  # the step they should be of (the checkpoint's, else last)
    seed: int | None = None
    config: dict = field(default_factory=dict, repr=False)  # config.yaml: what groups the runs

    def summary(self, name: str) -> float:
        """A head summary (`heads/<name>`), nan when the run has none."""
        value = self.heads_summary.get(f"heads/{name}")
        return math.nan if value is None else value


def _scalars(run: RunFolder) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the run's metrics.jsonl (every run writes one)."""
    out: dict[str, list[tuple[int, float]]] = {}
    skipped: list[str] = []  # bad lines: named, the rest read
    for line in run.metrics(skipped):
        for tag, value in line.items():
            if tag not in ("step", "time"):
                out.setdefault(tag, []).append((line["step"], value))
    for said in skipped[:3]:
        print(f"microgpt: note: {said}: left out", file=sys.stderr)
    return out


def read_run(folder: RunFolder, root: Path) -> RunSummary:
    # config.yaml is the validated Config (runs.TYPED: its fields read here typed; a
    # RunFolderError: the run is unreadable): model.n_head the head count until a checkpoint's
    config = folder.config()
    r = RunSummary(folder.name_under(root), folder.path, config["model"]["n_head"])
    r.config, r.seed = config, config.get("seed")
    scalars, step = _scalars(folder), None
    checkpoint, kept = folder.default_checkpoint(), {}  # best.pt, else last.pt
    if checkpoint is not None:  # a CheckpointError makes the run unreadable (read_sweep)
        ckpt = Checkpoint.load(checkpoint)
        kept = ckpt.metrics  # best.pt's: its exact validation loss and its test loss
        model, step = ckpt.build_model()[0], ckpt.step
        r.params, r.heads = model.num_params(), model.config.n_head  # as trained, whatever said
        split = hashlib.sha256(json.dumps(ckpt.split, sort_keys=True).encode()).hexdigest()[:8]
        r.data = f"{ckpt.data.get('path', '?')} #{split}"  # the data: its path and split's hash
    values = {tag: [value for _, value in points] for tag, points in scalars.items()}
    best = kept.get("best_val_loss", min(values.get(VAL_LOSS, []), default=math.nan))
    r.best_val_loss, r.test_loss = _loss(best), _loss(kept.get("test_loss"))
    r.tokens_per_sec = statistics.median(values.get("tokens_per_sec", [math.nan]))
    heads = _heads_summary(checkpoint, folder, scalars, step)
    r.heads_summary, r.heads_step, r.latest_step = heads
    return r


def _loss(value) -> float:
    """A loss as read: a finite number, else nan (absent: left out of every mean and test)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def _heads_summary(checkpoint: Path | None, folder: RunFolder, scalars: dict, checkpoint_step):
    """(summaries, the step they are of, the step they should be of): the analysis of the row's
    checkpoint (best.pt, else last.pt), else each logged summary's last value (of the last
    step)."""
    if checkpoint is not None:
        # the JSON python -m microgpt.heads wrote (HeadReport.to_dict, with the checkpoint's step)
        try:
            data = folder.read_analysis(checkpoint)[0]  # bounded in size and depth
            return dict(data["summaries"]), data.get("step"), checkpoint_step
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # none, or unreadable: the logged scalars below
    logged = {t: max(points) for t, points in scalars.items() if t.startswith("heads/") and points}
    step = max((s for s, _ in logged.values()), default=None)
    last = max((s for points in scalars.values() for s, _ in points), default=None)
    return {tag: value for tag, (_, value) in logged.items()}, step, last


def read_sweep(folder: str | Path) -> tuple[list[RunSummary], list[tuple[str, str]]]:
    """(the runs under `folder` that can be read, by head count then name; (name, why) for the
    others: what a damaged run raises makes it unreadable, not compare)."""
    root = Path(folder)
    found, unreadable = [], []
    for run in runs.find_runs(root):
        try:
            found.append(read_run(run, root))
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
            why = first_line(e)  # a UserError (a CheckpointError, ...) is a ValueError
            why = f"config.yaml has no {e}" if isinstance(e, KeyError) else why
            unreadable.append((run.name_under(root), why))
    found.sort(key=lambda r: (r.heads, r.name))
    return found, unreadable


def _num(x: float, fmt: str = ".4f") -> str:
    return "-" if math.isnan(x) else format(x, fmt)


def _rate(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _family(m, summary: dict[str, float]) -> dict[str, float]:
    """{key: value} of the family measure `m` in a run's head summaries (`heads/role/{}`)."""
    return {k[1]: v for t, v in summary.items() if (k := re.fullmatch(m.pattern(), t))}


def head_columns(runs: list[RunSummary]) -> list[tuple[str, str, str]]:
    """(header, summary name, format) of each summary measure with a column; a family's once per
    key some run has other than 0 ("importance L0", "importance L1"; the roles some head has)."""
    out = []
    for m in summary_measures("column"):
        keys = [""]
        if "{}" in m.name:
            found = (_family(m, r.heads_summary).items() for r in runs)
            keys = list(dict.fromkeys(k for f in found for k, v in f if abs(v or 0) > 0))
        out += [(m.column.format(k), m.name.format(k), m.fmt) for k in keys]
    return out


def _legend(measures: list, first: str = "") -> list[str]:
    """`first`, then each measure's header (a family's without its key) and help, wrapped."""
    headers = [re.sub(r" ?\S*\{\}", "", m.column) for m in measures]  # "importance L{}", "{}"
    said = [f"{h}: {m.help}" if h else m.help for h, m in zip(headers, measures)]
    return _wrapped("; ".join(([first] if first else []) + said))


def table(runs: list[RunSummary]) -> tuple[list[str], list[list[str]]]:
    """Every column: the header ("entropy L0", "entropy L1", ...) and a row of cells per run."""
    columns = head_columns(runs)
    rows = []
    for r in runs:
        params = "-" if r.params is None else f"{r.params:,}"
        cells = (_num(r.best_val_loss), _num(r.test_loss), _rate(r.tokens_per_sec))
        row = [r.name, str(r.heads), params, *cells]
        rows.append(row + [_num(r.summary(name), fmt) for _, name, fmt in columns])
    return [*RUN_COLUMNS, *(c[0] for c in columns)], rows


def _aligned(columns: list[list[str]], left: int = 1) -> list[str]:
    """Columns (header first) as lines: the first `left` left-aligned, the others right-aligned."""
    widths = [max(map(len, col)) for col in columns]
    pads = [str.ljust] * left + [str.rjust] * (len(columns) - left)
    lines = (zip(pads, cells, widths) for cells in zip(*columns))
    return ["  ".join(pad(c, w) for pad, c, w in line).rstrip() for line in lines]


def format_table(runs: list[RunSummary], wide: bool = False) -> str:
    """One row per run, columns aligned (the main measures', or every one), the legend of the wide
    columns."""
    header, rows = table(runs)
    narrow = {*RUN_COLUMNS, *(m.column for m in summary_measures("main"))}
    keep = [i for i, name in enumerate(header) if wide or name in narrow]
    # a layer's columns after the first: "L1", "L2", ... under "entropy L0"
    shown = [
        h.split()[-1] if i > 0 and h[:-1] == header[i - 1][:-1] else h for i, h in enumerate(header)
    ]
    lines = _aligned([[shown[i], *(row[i] for row in rows)] for i in keep])
    wide_legend = _legend([m for m in summary_measures("column") if not m.main]) if wide else []
    return "\n".join(lines + wide_legend)


def groups_of(runs: list[RunSummary]) -> list[Group[RunSummary]]:
    """The runs that differ only by seed, as groups in the runs' order (by head count)."""
    return group_runs(runs, lambda r: r.config, lambda r: r.name)


def _finite(values) -> list[float]:
    return [x for x in values if not math.isnan(x)]


def roles_across_seeds(group: Group[RunSummary]) -> tuple[dict[str, int], int]:
    """({role: how many runs have it (a head with it in their analysis)}, how many runs have an
    analysis), the roles most runs have first: the keys of the registry's `seeds` families."""
    families = summary_measures("seeds")
    counts = [{k: v for m in families for k, v in _family(m, r.heads_summary).items()}
              for r in group.runs]  # fmt: skip
    analysed = [c for c in counts if any(not math.isnan(x) for x in c.values())]
    keys = dict.fromkeys(k for c in analysed for k in c)
    have = {k: sum(c.get(k, 0) > 0 for c in analysed) for k in keys}
    have = dict(sorted(((k, v) for k, v in have.items() if v), key=lambda kv: -kv[1]))
    return have, len(analysed)


@dataclass
class Comparison:
    """One loss of a group against the group above it in the table: later minus earlier."""

    earlier: str
    later: str
    loss: str  # a key of LOSSES
    difference: float  # of the means (nan: a group has none)
    result: TTest | None = None  # None: why says why
    why: str = ""  # "under 2 seeds", "different data"
    p_holm: float = math.nan  # p corrected for the comparisons of this loss (holm)
    seeds: list[int] = field(default_factory=list)  # the seeds paired (paired t)

    @property
    def verdict(self) -> str:
        if self.result is None:
            return "cannot tell"
        return "significant" if self.p_holm < ALPHA else "within noise"


def compare_groups(groups: list[Group[RunSummary]]) -> list[Comparison]:
    """Each group against the one above it, on each loss, with Holm's correction over the
    comparisons of a loss that have a test."""
    comparisons = [_compare(a, b, loss) for a, b in zip(groups, groups[1:]) for loss in LOSSES]
    for loss in LOSSES:
        tested = [c for c in comparisons if c.loss == loss and c.result is not None]
        for c, p in zip(tested, holm([c.result.p for c in tested])):
            c.p_holm = p
    return comparisons


def _compare(a: Group[RunSummary], b: Group[RunSummary], loss: str) -> Comparison:
    figure = LOSSES[loss]
    x, y = (_finite(getattr(r, figure) for r in g.runs) for g in (b, a))
    difference = statistics.fmean(x) - statistics.fmean(y) if x and y else math.nan
    if len({r.data for r in a.runs + b.runs} - {NO_DATA}) > 1:  # a run with no checkpoint: any
        return Comparison(a.name, b.name, loss, difference, why="different data")
    c = Comparison(a.name, b.name, loss, difference, why="under 2 seeds")
    if a.seeds == b.seeds and len(set(a.seeds)) == a.n:  # the same seeds: pairs
        pairs = [(getattr(q, figure), getattr(p, figure), q.seed) for p, q in zip(a.runs, b.runs)]
        pairs = [pair for pair in pairs if not math.isnan(pair[0] - pair[1])]
        if len(pairs) >= 2:
            later, earlier, c.seeds = map(list, zip(*pairs))
            c.result, c.why = paired_t(later, earlier), ""
    elif len(x) >= 2 and len(y) >= 2:
        c.result, c.why = welch_t(x, y), ""
    return c


def group_record(g: Group[RunSummary]) -> dict:
    """A group's figures: its losses' intervals over its seeds, the median tok/s, the mean of each
    main measure, the roles across its seeds."""
    out = {"name": g.name, "heads": g.runs[0].heads, "n": g.n, "seeds": g.seeds}
    out["runs"] = [r.name for r in g.runs]
    for figure in LOSSES.values():
        i = interval(values) if (values := _finite(getattr(r, figure) for r in g.runs)) else None
        out[figure] = i and {"mean": i.mean, "low": i.low, "high": i.high, "interval": i.kind,
                             "n": i.n}  # fmt: skip
    out["tokens_per_sec"] = statistics.median([r.tokens_per_sec for r in g.runs])
    for m in summary_measures("main"):
        values = _finite(r.summary(m.name) for r in g.runs)
        out[m.name] = statistics.fmean(values) if values else math.nan
    have, analysed = roles_across_seeds(g)
    return out | {"roles": {role: {"seeds": k, "of": analysed} for role, k in have.items()}}


def _interval_cell(i: dict | None) -> str:
    if i is None:
        return "-"
    half = (i["high"] - i["low"]) / 2  # Interval.half_width
    return f"{i['mean']:.4f}" if i["n"] == 1 else f"{i['mean']:.4f} ± {half:.4f}"


def _seeds(g: dict) -> str:
    """How many seeds the group's means used: "3", or "2 of 3" (a run's loss not finite)."""
    used = min(i["n"] if (i := g[figure]) else 0 for figure in LOSSES.values())
    return str(g["n"]) if used == g["n"] else f"{used} of {g['n']}"


def format_groups(runs: list[RunSummary]) -> str:
    """A row per group, its legend, the roles across seeds, the verdicts."""
    groups, main = groups_of(runs), summary_measures("main")
    records = [group_record(g) for g in groups]
    rows = [
        [g["name"], str(g["heads"]), _seeds(g), _interval_cell(g["best_val_loss"])]
        + [_interval_cell(g["test_loss"]), _rate(g["tokens_per_sec"])]
        + [_num(g[m.name], ".1f" if m.fmt == ".0f" else m.fmt) for m in main]  # counts: means
        for g in records
    ]
    header = ["group", "heads", "seeds", "best val", "test", "tok/s", *(m.column for m in main)]
    lines = _aligned([list(col) for col in zip(header, *rows)])
    lines += [line for line in map(_stale, runs) if line]
    lines += [GROUP_LEGEND, *_legend(main, LEGEND)]
    lines.append("--runs: a row per run too; --wide: every column; --csv, --json")
    data = {r.data for r in runs} - {NO_DATA}
    if len(data) > 1:
        lines.append(
            f"these runs were trained on {len(data)} different data sets (path or items differ): "
            f"groups on different data are not compared"
        )
    lines += _roles_lines(records) + _verdict_lines(groups, compare_groups(groups))
    return "\n".join(lines)


def _wrapped(text: str, indent: str = "") -> list[str]:
    """`text` in lines of 100 characters, each after the first indented 2 more."""
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent + "  ")


def _roles_lines(records: list[dict]) -> list[str]:
    lines = []
    for g in (g for g in records if g["roles"]):
        analysed = next(iter(g["roles"].values()))["of"]
        of = f"of {analysed} seed{'s' * (analysed > 1)}"
        of = of if analysed == g["n"] else f"of {analysed} analysed"
        roles = ", ".join(f"{role} {have['seeds']} {of}" for role, have in g["roles"].items())
        lines += _wrapped(f"{g['name']}: {roles}", "  ")
    title = "roles across seeds (k of n: the runs whose analysis has a head with the role):"
    return [title, *lines] if lines else []


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _verdict_lines(groups: list[Group[RunSummary]], comparisons: list[Comparison]) -> list[str]:
    if len(groups) < 2:
        return []
    if all(g.n == 1 for g in groups):
        return _wrapped(
            "verdicts: none. With one seed per group this sweep cannot tell a difference between "
            "groups from seed noise (a run's test loss moves by a few hundredths of a nat with its "
            f"seed); sweep seeds too, e.g. {SWEEP_SEEDS}"
        )
    tested = [c for c in comparisons if c.loss == "test" and c.result is not None]
    rows = []
    for c in comparisons:
        r, pair = c.result, f"{c.later} - {c.earlier}" if c.loss == next(iter(LOSSES)) else ""
        if r is None:
            rows.append([pair, c.loss, _num(c.difference, "+.4f"), "", "", c.verdict, c.why])
        else:
            half = f"{r.difference:+.4f} ± {(r.high - r.low) / 2:.4f}"
            rows.append([pair, c.loss, half, _p(r.p), _p(c.p_holm), c.verdict, r.test])
    header = ["difference", "loss", "later - earlier", "p", "Holm p", "verdict", "test"]
    lines = [
        "verdicts: each group against the one above it (negative: the later has the lower loss),",
        f"  the 95% CI of the difference; significant: Holm's p < {ALPHA} over {len(tested)} "
        "comparisons; paired t:",
        "  by seed (both groups have the same seeds), else Welch t; p: two-sided",
        *_aligned([list(col) for col in zip(header, *rows)], left=2),
    ]
    found = [f"{c.later} vs {c.earlier}" for c in tested if c.verdict == "significant"]
    if tested:
        which = f" ({', '.join(found)})" if found else ": the order of the means is not a finding"
        lines.append(
            f"differences in test loss beyond the noise: {len(found)} of {len(tested)}{which}"
        )
    return lines


def to_json(runs: list[RunSummary]) -> str:
    """Everything as JSON (nan: null): the runs, the groups, the comparisons."""
    return json.dumps(records(runs), indent=1)


def records(runs: list[RunSummary]) -> dict[str, list[dict]]:
    """{"runs": each run's figures, "groups": each group's, "comparisons": the verdicts}, as
    plain JSON values (nan: None)."""
    groups = groups_of(runs)
    group_of = {id(r): g.name for g in groups for r in g.runs}
    keys = ("name", "heads", "seed", "params", "best_val_loss", "test_loss", "tokens_per_sec")
    keys += ("heads_summary", "heads_step", "latest_step", "data")
    out = {"runs": [{k: getattr(r, k) for k in keys} | {"group": group_of[id(r)]} for r in runs]}
    out["groups"] = [group_record(g) for g in groups]
    out["comparisons"] = [_comparison_record(c) for c in compare_groups(groups)]
    return json.loads(json.dumps(out), parse_constant=lambda nan: None)


def _comparison_record(c: Comparison) -> dict:
    r = c.result  # None: every figure of the test is None
    out = {"name": f"{c.later} - {c.earlier}", "earlier": c.earlier, "later": c.later}
    out |= {"loss": LOSSES[c.loss], "difference": c.difference, "t_test": r and r.test}
    out |= {"seeds": c.seeds} | {k: r and getattr(r, k) for k in ("low", "high", "df", "p")}
    return out | {"p_holm": c.p_holm if r else None, "verdict": c.verdict, "why": c.why}


def to_csv(runs: list[RunSummary]) -> list[list[str]]:
    """Everything as one table: `record` says what a row is (run, group, comparison), its columns
    its JSON keys (nested: `test_loss.low`, `roles.previous.seeds`, `heads_summary.heads/named`);
    a cell that does not apply is empty."""
    data = records(runs)
    kinds = {"run": "runs", "group": "groups", "comparison": "comparisons"}
    rows = [{"record": kind, **flatten(r)} for kind, key in kinds.items() for r in data[key]]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return [columns] + [[_cell(row.get(k)) for k in columns] for row in rows]


def _cell(x) -> str:
    return " ".join(map(str, x)) if isinstance(x, list) else "" if x is None else str(x)


def _stale(r: RunSummary) -> str:
    if None in (r.heads_step, r.latest_step) or r.heads_step == r.latest_step:
        return ""
    again = f"python -m microgpt.heads {r.path} measures them again"
    return f"* {r.name}: its head columns are of step {r.heads_step}, not {r.latest_step} ({again})"


def main(argv: list[str] | None = None) -> int:
    """The command behind the front door: its exit status (0; 2 after one error line)."""
    return entry.run(lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = entry.ArgumentParser(
        prog="python -m microgpt.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", help="a sweep folder (multirun/<date>/<time>) or runs")
    parser.add_argument("--runs", action="store_true", help="a row per run too, above the groups")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--wide", action="store_true", help="the runs with every column, wider")
    how.add_argument("--csv", action="store_true", help="runs, groups and verdicts as CSV")
    how.add_argument("--json", action="store_true", help="runs, groups and verdicts as JSON")
    args = parser.parse_args(argv)
    runs, unreadable = read_sweep(args.folder)
    if not runs:
        why = "; ".join(f"{name}: {reason}" for name, reason in unreadable)
        raise UserError(f"no run under {args.folder} can be read ({why})")
    if args.csv:
        csv.writer(sys.stdout, lineterminator="\n").writerows(to_csv(runs))
    elif args.json:
        print(to_json(runs))
    else:
        if args.runs or args.wide:
            print(format_table(runs, args.wide) + "\n")
        print(format_groups(runs))
    for name, why in unreadable:  # on stderr where stdout is for a script
        print(f"unreadable: {name} ({why})", file=sys.stderr if args.csv or args.json else None)
