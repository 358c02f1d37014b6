"""Line plots with Pillow only: curves against step, with axes, round ticks and a legend, saved
as a PNG (`plot_lines`; compare's validation loss curves). The fonts and text placement are
microgpt.viz.draw's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from microgpt.files import atomic_write
from microgpt.viz.draw import BACKGROUND, TEXT, draw_text, font

GRID = (228, 228, 228)
# Tableau 10, the usual categorical palette: distinct, and readable on white.
_HEX = "1f77b4 ff7f0e 2ca02c d62728 9467bd 8c564b e377c2 7f7f7f bcbd22 17becf"
PALETTE = [tuple(bytes.fromhex(c)) for c in _HEX.split()]


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0) * 0.1
    raw = (hi - lo) / max(target - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def tick_label(v: float, step: float) -> str:
    """`v` with as many decimals as ticks `step` apart need; thousands separated."""
    if abs(v) >= 1000 and float(v).is_integer():
        return f"{v:,.0f}"
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    if step < 1 and not math.isclose(round(step, decimals), step):
        decimals += 1
    return f"{v:.{decimals}f}"


Curves = Sequence[tuple[str, Sequence[tuple[float, float]]]]


@dataclass
class Axes:
    """The plot area in pixels (left, right, top, bottom) and the data ranges it shows."""

    left: int
    right: int
    top: int
    bottom: int
    x0: float
    x1: float
    y_lo: float
    y_hi: float

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y_lo) / (self.y_hi - self.y_lo) * (self.bottom - self.top)


def plot_lines(
    curves: Curves, path, title="", xlabel="step", ylabel="", legend_title="", width=900, height=540
) -> Path:
    """[(label, [(x, y), ...]), ...] -> one coloured line per curve, with axes, ticks and a legend,
    saved as a PNG at `path` (folders made). Non-finite y values are left out."""
    if not any(points for _, points in curves):
        raise ValueError("no points to plot")
    big, small = font(14), font(12)
    img = Image.new("RGB", (width, height), BACKGROUND)
    d = ImageDraw.Draw(img)
    legend_w = max(d.textlength(label, font=small) for label, _ in curves) + 48
    xs = [x for _, points in curves for x, _ in points]
    ys = [y for _, points in curves for _, y in points if math.isfinite(y)]
    y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (y_hi - y_lo) * 0.05 or 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad
    xt, yt = nice_ticks(0, max(xs) or 1), nice_ticks(y_lo, y_hi)
    y_lo, y_hi = min(y_lo, yt[0]), max(y_hi, yt[-1])
    ax = Axes(80, width - int(legend_w) - 20, 44, height - 60, 0, max(xs) or 1, y_lo, y_hi)
    _draw_axes(img, d, ax, xt, yt, (title, xlabel, ylabel), big, small)
    for i, (_, points) in enumerate(curves):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(ax.px(x), ax.py(y)) for x, y in points if math.isfinite(y)]
        if len(pts) > 1:
            d.line(pts, fill=colour, width=2, joint="curve")
        if len(pts) <= 30:
            for x, y in pts:
                d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
    lx, ly = ax.right + 16, ax.top + 4
    d.text((lx, ly), legend_title, fill=TEXT, font=big)
    for i, (label, _) in enumerate(curves):
        y = ly + 26 + i * 20
        d.line([(lx, y + 7), (lx + 22, y + 7)], fill=PALETTE[i % len(PALETTE)], width=3)
        d.text((lx + 30, y), label, fill=TEXT, font=small)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:  # stopped halfway, it leaves no half a PNG
        img.save(f, format="PNG")
    return path


def _draw_axes(img, d, ax: Axes, xt: list, yt: list, labels: tuple, big, small) -> None:
    """The grid lines and ticks at `xt`, `yt`, the frame, the title and the axis labels."""
    title, xlabel, ylabel = labels
    left, right, top, bottom = ax.left, ax.right, ax.top, ax.bottom
    x_step = xt[1] - xt[0] if len(xt) > 1 else 1
    y_step = yt[1] - yt[0] if len(yt) > 1 else 1
    for v in yt:
        y = ax.py(v)
        d.line([(left, y), (right, y)], fill=GRID)
        d.line([(left - 5, y), (left, y)], fill=TEXT)
        draw_text(d, (left - 8, y), tick_label(v, y_step), small, anchor="rm")
    for v in xt:
        x = ax.px(v)
        d.line([(x, top), (x, bottom)], fill=GRID)
        d.line([(x, bottom), (x, bottom + 5)], fill=TEXT)
        draw_text(d, (x, bottom + 8), tick_label(v, x_step), small, anchor="ma")
    d.rectangle([left, top, right, bottom], outline=TEXT)
    draw_text(d, ((left + right) / 2, 14), title, big, anchor="ma")
    draw_text(d, ((left + right) / 2, img.height - 22), xlabel, big, anchor="ma")
    if ylabel:  # written sideways, reading upwards
        label = Image.new("RGB", (int(d.textlength(ylabel, font=big)) + 4, 20), BACKGROUND)
        ImageDraw.Draw(label).text((2, 2), ylabel, fill=TEXT, font=big)
        label = label.rotate(90, expand=True)
        img.paste(label, (12, int((top + bottom) / 2 - label.height / 2)))
