"""Line plots with Pillow only: curves against step, with axes, round ticks and a legend, saved
as a PNG (compare's validation loss curves)."""

from __future__ import annotations

import math
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
    ticks, t = [], math.ceil(lo / step - 1e-9) * step
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def tick_label(v: float, ticks: list[float]) -> str:
    """`v` with as many decimals as `ticks`' spacing needs; thousands separated."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1
    if abs(v) >= 1000 and float(v).is_integer():
        return f"{v:,.0f}"
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    if step < 1 and not math.isclose(round(step, decimals), step):
        decimals += 1
    return f"{v:.{decimals}f}"


def plot_lines(
    curves, path, title="", xlabel="step", ylabel="", legend_title="", width=900, height=540
) -> Path:
    """[(label, [(x, y), ...]), ...] -> one coloured line per curve, with axes, ticks and a legend,
    saved as a PNG at `path` (folders made). Non-finite y values are left out."""
    if not any(points for _, points in curves):
        raise ValueError("no points to plot")
    big, small = font(14), font(12)
    img = Image.new("RGB", (width, height), BACKGROUND)
    d = ImageDraw.Draw(img)
    legend_w = max(d.textlength(label, font=small) for label, _ in curves) + 48
    x1 = max(x for _, points in curves for x, _ in points) or 1
    ys = [y for _, points in curves for _, y in points if math.isfinite(y)]
    y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (y_hi - y_lo) * 0.05 or 0.05
    xt, yt = nice_ticks(0, x1), nice_ticks(y_lo - pad, y_hi + pad)
    y_lo, y_hi = min(y_lo - pad, yt[0]), max(y_hi + pad, yt[-1])
    # the plot area in pixels
    left, right, top, bottom = 80, width - int(legend_w) - 20, 44, height - 60

    def px(x: float) -> float:
        return left + x / x1 * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top)

    for v in yt:
        d.line([(left, py(v)), (right, py(v))], fill=GRID)
        d.line([(left - 5, py(v)), (left, py(v))], fill=TEXT)
        draw_text(d, (left - 8, py(v)), tick_label(v, yt), small, anchor="rm")
    for v in xt:
        d.line([(px(v), top), (px(v), bottom)], fill=GRID)
        d.line([(px(v), bottom), (px(v), bottom + 5)], fill=TEXT)
        draw_text(d, (px(v), bottom + 8), tick_label(v, xt), small, anchor="ma")
    d.rectangle([left, top, right, bottom], outline=TEXT)
    draw_text(d, ((left + right) / 2, 14), title, big, anchor="ma")
    draw_text(d, ((left + right) / 2, height - 22), xlabel, big, anchor="ma")
    if ylabel:
        # written sideways, reading upwards
        label = Image.new("RGB", (int(d.textlength(ylabel, font=big)) + 4, 20), BACKGROUND)
        ImageDraw.Draw(label).text((2, 2), ylabel, fill=TEXT, font=big)
        label = label.rotate(90, expand=True)
        img.paste(label, (12, int((top + bottom) / 2 - label.height / 2)))
    d.text((right + 16, top + 4), legend_title, fill=TEXT, font=big)
    for i, (label, points) in enumerate(curves):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(px(x), py(y)) for x, y in points if math.isfinite(y)]
        if len(pts) > 1:
            d.line(pts, fill=colour, width=2, joint="curve")
        if len(pts) <= 30:
            for x, y in pts:
                d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        y = top + 30 + i * 20
        d.line([(right + 16, y + 7), (right + 38, y + 7)], fill=colour, width=3)
        d.text((right + 46, y), label, fill=TEXT, font=small)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        # stopped halfway, it leaves no half a PNG
        img.save(f, format="PNG")
    return path
