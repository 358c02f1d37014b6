"""How many heads? A sweep's runs side by side, without opening TensorBoard.

    python -m microgpt.compare multirun/2026-05-01/12-00-00 [--plot val_loss.png]

Finds every run folder under the given folder (a folder holding `config.yaml` and TensorBoard
event files, as `python train.py -m heads=1,2,4,8` writes them), reads its event files, config
and checkpoint, and prints one row per run, sorted by head count:

    run      heads  params  best val  test   tok/s  entropy L0  L1
    heads=1      1  204,544   2.0712  2.0801  91.2k       0.93  1.10

- best val: the lowest `loss/val`; test: `loss/test` (the best checkpoint's weights)
- tok/s: the median of the logged `tokens_per_sec` (training throughput over all ranks)
- entropy: each layer's attention entropy (nats) at the last logged step, the mean over its heads

It also draws the validation loss curves, one per run labelled by head count, into a PNG
(`<folder>/val_loss.png` unless --plot says where), with Pillow.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf


class CompareError(ValueError):
    """Nothing to compare (no such folder, no runs in it); the message says what was expected."""


@dataclass
class RunSummary:
    name: str  # the run folder, relative to the compared folder ("heads=4")
    path: Path
    heads: int | None
    kv_heads: int | None
    params: int | None
    best_val_loss: float = math.nan
    test_loss: float = math.nan
    tokens_per_sec: float = math.nan
    entropy: list[float] = field(default_factory=list)  # per layer, the mean over heads
    val_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, loss/val)

    @property
    def label(self) -> str:
        if self.heads is None:
            return self.name
        kv = f" ({self.kv_heads} kv)" if self.kv_heads not in (None, self.heads) else ""
        return f"{self.heads} head{'s' if self.heads != 1 else ''}{kv}"


# ----------------------------------------------------------------------------- reading


def find_runs(folder: str | Path) -> list[Path]:
    """Every run folder at or under `folder`: one with TensorBoard event files and a config.yaml."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CompareError(
            f"{folder} is not a folder; pass a sweep folder (multirun/<date>/<time>) or a run folder"
        )
    runs = {
        p.parent
        for p in folder.rglob("events.out.tfevents.*")
        if (p.parent / "config.yaml").is_file()
        and not any(part.startswith(".") for part in p.parent.relative_to(folder).parts)
    }  # .submitit, ...
    if not runs:
        raise CompareError(
            f"no runs under {folder}: a run folder holds config.yaml and events.out.tfevents.* files "
            f"(python train.py -m heads=1,2,4,8 writes one per job under multirun/<date>/<time>/)"
        )
    return sorted(runs)


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(
        str(run), size_guidance={"scalars": 0, "images": 1, "tensors": 1, "histograms": 1}
    )
    acc.Reload()
    return {
        tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags().get("scalars", [])
    }


def _params(run: Path) -> int | None:
    """Parameters of the model in the run's checkpoint (tied weights counted once), if there is one."""
    from microgpt.checkpoint import CheckpointError, load_checkpoint

    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        if path.is_file():
            try:
                state = load_checkpoint(path)["model"]
            except CheckpointError:
                continue
            seen, total = set(), 0
            for t in state.values():
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
                if key not in seen:
                    seen.add(key)
                    total += t.numel()
            return total
    return None


def read_run(run: Path, root: Path) -> RunSummary:
    cfg = OmegaConf.load(run / "config.yaml")
    heads = OmegaConf.select(cfg, "model.n_head") or OmegaConf.select(cfg, "heads")
    kv_heads = OmegaConf.select(cfg, "model.n_kv_head")
    scalars = _scalars(run)
    name = str(run.relative_to(root)) if run != root else run.name
    summary = RunSummary(name=name, path=run, heads=heads, kv_heads=kv_heads, params=_params(run))
    summary.val_curve = sorted(scalars.get("loss/val", []))
    if summary.val_curve:
        summary.best_val_loss = min(v for _, v in summary.val_curve)
    if scalars.get("loss/test"):
        summary.test_loss = scalars["loss/test"][-1][1]
    if scalars.get("tokens_per_sec"):
        summary.tokens_per_sec = statistics.median(v for _, v in scalars["tokens_per_sec"])
    layers: dict[int, list[float]] = {}
    for tag, points in scalars.items():  # attention_entropy/layer{l}/head{h}
        parts = tag.split("/")
        if (
            len(parts) == 3
            and parts[0] == "attention_entropy"
            and parts[1].startswith("layer")
            and points
        ):
            layers.setdefault(int(parts[1][5:]), []).append(max(points)[1])  # the last step's value
    summary.entropy = [statistics.fmean(layers[k]) for k in sorted(layers)]
    return summary


def read_runs(folder: str | Path) -> list[RunSummary]:
    """Every run under `folder`, sorted by head count, then name."""
    root = Path(folder)
    runs = [read_run(run, root) for run in find_runs(root)]
    return sorted(runs, key=lambda r: (r.heads if r.heads is not None else math.inf, r.name))


# ----------------------------------------------------------------------------- the table


def _num(x: float, fmt: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _rate(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def format_table(runs: list[RunSummary]) -> str:
    n_layers = max((len(r.entropy) for r in runs), default=0)
    header = ["run", "heads", "params", "best val", "test", "tok/s"]
    header += [f"entropy L{i}" if i == 0 else f"L{i}" for i in range(n_layers)]
    rows = []
    for r in runs:
        heads = (
            "-"
            if r.heads is None
            else f"{r.heads}" + (f"/{r.kv_heads}kv" if r.kv_heads not in (None, r.heads) else "")
        )
        row = [
            r.name,
            heads,
            "-" if r.params is None else f"{r.params:,}",
            _num(r.best_val_loss),
            _num(r.test_loss),
            _rate(r.tokens_per_sec),
        ]
        row += [_num(r.entropy[i], ".3f") if i < len(r.entropy) else "-" for i in range(n_layers)]
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = []
    for row in [header, *rows]:
        cells = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    best = min(
        (r for r in runs if not math.isnan(r.best_val_loss)),
        key=lambda r: r.best_val_loss,
        default=None,
    )
    if best is not None:
        lines.append(
            f"lowest validation loss: {best.name} ({best.label}, {best.best_val_loss:.4f})"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the plot

# Tableau 10, the usual categorical palette: distinct, and readable on white.
PALETTE = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
]


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1: scalable
    except TypeError:
        return ImageFont.load_default()


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0) * 0.1
    raw = (hi - lo) / max(target - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _tick_label(v: float, step: float) -> str:
    if abs(v) >= 1000 and float(v).is_integer():
        return f"{v:,.0f}"
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    if step < 1 and not math.isclose(round(step, decimals), step):
        decimals += 1
    return f"{v:.{decimals}f}"


def plot_val_curves(
    runs: list[RunSummary], path: str | Path, width: int = 900, height: int = 540
) -> Path:
    """Validation loss against step, one coloured line per run, with axes, ticks and a legend."""
    from PIL import Image, ImageDraw

    curves = [r for r in runs if r.val_curve]
    if not curves:
        raise CompareError(
            "no run has validation losses (loss/val) to plot; did the runs reach train.eval_every?"
        )
    font, small = _font(14), _font(12)
    img = Image.new("RGB", (width, height), (255, 255, 255))
    d = ImageDraw.Draw(img)

    labels = [
        r.label if sum(o.label == r.label for o in curves) == 1 else f"{r.label}: {r.name}"
        for r in curves
    ]
    legend_w = max(d.textlength(s, font=small) for s in labels) + 48
    left, right, top, bottom = 80, width - int(legend_w) - 20, 44, height - 60
    steps = [s for r in curves for s, _ in r.val_curve]
    values = [v for r in curves for _, v in r.val_curve if math.isfinite(v)]
    x0, x1 = 0, max(steps) or 1
    y_lo, y_hi = (min(values), max(values)) if values else (0.0, 1.0)
    pad = (y_hi - y_lo) * 0.05 or 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad
    xt, yt = nice_ticks(x0, x1), nice_ticks(y_lo, y_hi)
    y_lo, y_hi = min(y_lo, yt[0]), max(y_hi, yt[-1])

    def px(step: float) -> float:
        return left + (step - x0) / (x1 - x0) * (right - left)

    def py(v: float) -> float:
        return bottom - (v - y_lo) / (y_hi - y_lo) * (bottom - top)

    grid, ink = (228, 228, 228), (40, 40, 40)
    x_step = xt[1] - xt[0] if len(xt) > 1 else 1
    y_step = yt[1] - yt[0] if len(yt) > 1 else 1
    for v in yt:
        y = py(v)
        d.line([(left, y), (right, y)], fill=grid)
        d.line([(left - 5, y), (left, y)], fill=ink)
        d.text((left - 8, y), _tick_label(v, y_step), fill=ink, font=small, anchor="rm")
    for v in xt:
        x = px(v)
        d.line([(x, top), (x, bottom)], fill=grid)
        d.line([(x, bottom), (x, bottom + 5)], fill=ink)
        d.text((x, bottom + 8), _tick_label(v, x_step), fill=ink, font=small, anchor="ma")
    d.rectangle([left, top, right, bottom], outline=ink)
    d.text(
        ((left + right) / 2, 14), "validation loss by head count", fill=ink, font=font, anchor="ma"
    )
    d.text(((left + right) / 2, height - 22), "step", fill=ink, font=font, anchor="ma")
    ylabel = Image.new(
        "RGB",
        (int(d.textlength("validation loss (nats/char)", font=font)) + 4, 20),
        (255, 255, 255),
    )
    ImageDraw.Draw(ylabel).text((2, 2), "validation loss (nats/char)", fill=ink, font=font)
    ylabel = ylabel.rotate(90, expand=True)
    img.paste(ylabel, (12, int((top + bottom) / 2 - ylabel.height / 2)))

    for i, r in enumerate(curves):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(px(s), py(v)) for s, v in r.val_curve if math.isfinite(v)]
        if len(pts) > 1:
            d.line(pts, fill=colour, width=2, joint="curve")
        if len(pts) <= 30:
            for x, y in pts:
                d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)

    lx, ly = right + 16, top + 4
    d.text((lx, ly), "heads", fill=ink, font=font)
    for i, label in enumerate(labels):
        y = ly + 26 + i * 20
        colour = PALETTE[i % len(PALETTE)]
        d.line([(lx, y + 7), (lx + 22, y + 7)], fill=colour, width=3)
        d.text((lx + 30, y), label, fill=ink, font=small)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


# ----------------------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m microgpt.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "folder", help="a sweep folder (multirun/<date>/<time>) or any folder holding runs"
    )
    parser.add_argument(
        "--plot", help="where to write the validation loss PNG (default: FOLDER/val_loss.png)"
    )
    parser.add_argument("--no-plot", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    try:
        runs = read_runs(args.folder)
        print(format_table(runs))
        if not args.no_plot:
            out = plot_val_curves(runs, args.plot or Path(args.folder) / "val_loss.png")
            print(f"validation loss curves: {out}")
    except CompareError as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
