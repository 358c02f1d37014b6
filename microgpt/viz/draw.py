"""All drawing, with numpy and Pillow only: every function returns a uint8 (H, W, 3) image or
writes a PNG. Arrays may be numpy arrays, lists or CPU tensors (read with np.asarray).

- `colormap`: values in [0, 1] -> a viridis-like colour (dark = 0, bright = 1).
- `render_attention` / `render_layer`: attention weights -> labelled heatmaps, rows = queries,
  columns = keys; a layer's heads in a grid of at most 4 per row, under a heading and a legend.
- `render_offset_profile`: one layer's attention by relative offset, one row per head.
- `render_table`: a table over the vocabulary (a layer-0 head's QK or OV circuit).

Line plots (curves against step) are microgpt.viz.plot's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# ----------------------------------------------------------------------------- colours and text

# Viridis at 9 evenly spaced points (matplotlib's values, rounded); linear between them.
_HEX = "440154 472d7b 3b528b 2c728e 21918c 28ae80 5ec962 addc30 fde725"
_VIRIDIS = np.array([list(bytes.fromhex(c)) for c in _HEX.split()], dtype=np.float64)
BACKGROUND = (255, 255, 255)
TEXT = (20, 20, 20)
LIGHT_TEXT = (250, 250, 250)  # values written on dark cells
MASKED = (222, 222, 222)  # cells a query may not attend to (the causal mask)
FONT_SIZE = 12
MIN_FONT_SIZE = 8
MAP_WIDTH = 720  # pixels a head's attention map aims at: 18-pixel cells up to 40 positions


def map_cell(positions: int) -> int:
    """18-pixel cells, down to 8 for long probes: a 128-character passage stays on one screen."""
    return max(8, min(18, MAP_WIDTH // max(positions, 1)))


HEADS_PER_ROW = 4  # a layer's head maps: at most this many side by side, then a new row


def colormap(values) -> np.ndarray:
    """Values in [0, 1] (any shape, clipped) -> uint8 RGB, shape (..., 3); 0 dark, 1 bright."""
    v = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64)), 0.0, 1.0)
    x = v * (len(_VIRIDIS) - 1)
    lo = np.minimum(np.floor(x).astype(int), len(_VIRIDIS) - 2)
    frac = (x - lo)[..., None]
    rgb = _VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac
    return np.round(rgb).astype(np.uint8)


def font(size: int = FONT_SIZE):
    # Pillow >= 10.1 scales its default font; older Pillow has a fixed bitmap one
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


_PROBE = ImageDraw.Draw(Image.new("RGB", (1, 1)))  # measures text before a canvas exists


def text_size(text: str, fnt) -> tuple[int, int]:
    left, top, right, bottom = _PROBE.textbbox((0, 0), text, font=fnt)
    return right - left, bottom - top


def draw_text(draw, xy, text: str, fnt, anchor: str = "mm", fill=TEXT) -> None:
    """Text placed by a Pillow anchor ("mm" centred, "rm" right-middle, "ma" top-centre): by the
    font's line metrics, so "p" and "h" share a baseline; the old bitmap font: by the ink box."""
    try:
        draw.text(xy, text, fill=fill, font=fnt, anchor=anchor)
        return
    except ValueError:  # bitmap fonts take no anchor
        pass
    left, top, right, bottom = draw.textbbox((0, 0), text, font=fnt)
    fx = {"l": 0.0, "m": 0.5, "r": 1.0}[anchor[0]]
    fy = {"a": 0.0, "t": 0.0, "m": 0.5}.get(anchor[1], 1.0)
    x = xy[0] - left - fx * (right - left)
    y = xy[1] - top - fy * (bottom - top)
    draw.text((round(x), round(y)), text, fill=fill, font=fnt)


# ----------------------------------------------------------------------------- heatmaps


def _heatmap(values, row_labels, col_labels, title, cell_w, cell_h, mask=None, annotate=False):
    """(R, C) values in [0, 1] -> labelled coloured cells, grey where `mask` is False;
    `annotate` writes each value in its cell where it fits."""
    R, C = values.shape
    fnt = font(min(FONT_SIZE, max(MIN_FONT_SIZE, cell_w - 1)))  # smaller cells, smaller labels
    pad = 4
    label_h = text_size("Mgy", fnt)[1]  # the same for every label set: stable layout
    label_w = max([text_size(s, fnt)[0] for s in row_labels] + [cell_w // 2])
    title_w, title_h = (n + 2 * pad for n in text_size(title, fnt)) if title else (0, 0)
    left = pad + label_w + pad  # where the grid starts
    top = title_h + pad + label_h + pad
    grid_w, grid_h = C * cell_w, R * cell_h
    width = max(left + grid_w + pad, title_w)
    height = top + grid_h + pad

    canvas = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
    colors = colormap(values)  # (R, C, 3)
    if mask is not None:
        colors[~np.asarray(mask, dtype=bool)] = MASKED
    # each value fills its cell but for a 1-pixel white seam, which draws the grid
    block = np.repeat(np.repeat(colors, cell_h, axis=0), cell_w, axis=1)  # (R*cell_h, C*cell_w, 3)
    block[cell_h - 1 :: cell_h, :] = BACKGROUND
    block[:, cell_w - 1 :: cell_w] = BACKGROUND
    canvas[top : top + grid_h, left : left + grid_w] = block

    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    if title:  # centred over the grid, or over the image when the title is the wider
        cx = left + grid_w / 2 if width == left + grid_w + pad else width / 2
        draw_text(draw, (cx, title_h / 2), title, fnt)
    col_x = [left + j * cell_w + (cell_w - 1) / 2 for j in range(C)]
    row_y = [top + i * cell_h + (cell_h - 1) / 2 for i in range(R)]
    for x, s in zip(col_x, col_labels):
        draw_text(draw, (x, top - pad - label_h / 2), s, fnt)
    for y, s in zip(row_y, row_labels):
        draw_text(draw, (pad + label_w / 2, y), s, fnt)
    text_w, text_h = text_size("0.00", fnt)
    if annotate and text_w + 4 <= cell_w and text_h + 2 <= cell_h:
        _write_values(draw, values, colors, row_y, col_x, fnt)
    return np.asarray(img)


def _write_values(draw, values: np.ndarray, colors: np.ndarray, row_y, col_x, fnt) -> None:
    """Each value (2 decimals) in its cell, light on dark cells and dark on light."""
    dark = colors.astype(np.float64) @ [0.2126, 0.7152, 0.0722] < 128  # (R, C)
    for i, y in enumerate(row_y):
        for j, x in enumerate(col_x):
            ink = LIGHT_TEXT if dark[i, j] else TEXT
            draw_text(draw, (x, y), f"{values[i, j]:.2f}", fnt, fill=ink)


def render_attention(weights, query_labels, key_labels, title=None, cell=18, mask=None):
    """One head's weights (T, Tk) -> an image: row i = query i, column j = key j, dark (0) to
    bright (1); cells where `mask` (T, Tk) is False (keys the query may not see) light grey."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"weights must be (T, Tk), got shape {w.shape}")
    T, Tk = w.shape
    if len(query_labels) != T or len(key_labels) != Tk:
        raise ValueError(
            f"weights are {T}x{Tk} but got {len(query_labels)} query and "
            f"{len(key_labels)} key labels"
        )
    return _heatmap(w, query_labels, key_labels, title, cell, cell, mask)


def render_heads(weights_per_head, query_labels, key_labels, cell=18, mask=None) -> list:
    """(H, T, Tk) -> H images, each titled "head h"."""
    w = np.asarray(weights_per_head, dtype=np.float64)
    if w.ndim != 3:
        raise ValueError(f"weights_per_head must be (H, T, Tk), got shape {w.shape}")
    return [
        render_attention(w[h], query_labels, key_labels, f"head {h}", cell, mask)
        for h in range(w.shape[0])
    ]


def tile(images: Sequence[np.ndarray], columns: int, gap: int = 16) -> np.ndarray:
    """Images in a grid, `columns` per row, top-left aligned in equal cells."""
    cell_h = max(im.shape[0] for im in images)
    cell_w = max(im.shape[1] for im in images)
    columns = min(columns, len(images))
    rows = math.ceil(len(images) / columns)
    shape = (rows * cell_h + gap * (rows - 1), columns * cell_w + gap * (columns - 1), 3)
    out = np.full(shape, BACKGROUND, dtype=np.uint8)
    for k, im in enumerate(images):
        y, x = (k // columns) * (cell_h + gap), (k % columns) * (cell_w + gap)
        out[y : y + im.shape[0], x : x + im.shape[1]] = im
    return out


def colorbar(length: int = 80, thickness: int = 10) -> np.ndarray:
    """A small "0 [dark .. bright] 1" legend."""
    fnt = font()
    w0, _ = text_size("0", fnt)
    w1, th = text_size("1", fnt)
    height = max(thickness, th) + 4
    width = w0 + 4 + length + 4 + w1 + 2
    out = np.full((height, width, 3), BACKGROUND, np.uint8)
    y0 = (height - thickness) // 2
    out[y0 : y0 + thickness, w0 + 4 : w0 + 4 + length] = colormap(np.linspace(0, 1, length))[None]
    img = Image.fromarray(out)
    draw = ImageDraw.Draw(img)
    draw_text(draw, (w0 / 2, height / 2), "0", fnt)
    draw_text(draw, (w0 + 8 + length + w1 / 2, height / 2), "1", fnt)
    return np.asarray(img)


def compose_layer(head_images: Sequence[np.ndarray], layer: int, gap: int = 16) -> np.ndarray:
    """Per-head images under a "layer l" heading and a colour legend, HEADS_PER_ROW to a row."""
    grid = tile(head_images, HEADS_PER_ROW, gap)
    fnt = font(FONT_SIZE + 2)
    heading = f"layer {layer}"
    tw, th = text_size(heading, fnt)
    bar = colorbar()
    head_h = max(th, bar.shape[0]) + 8
    width = max(grid.shape[1], 4 + tw + 16 + bar.shape[1] + 4)
    out = np.full((head_h + grid.shape[0], width, 3), BACKGROUND, np.uint8)
    out[head_h:, : grid.shape[1]] = grid
    by = (head_h - bar.shape[0]) // 2
    out[by : by + bar.shape[0], width - bar.shape[1] - 4 : width - 4] = bar
    img = Image.fromarray(out)
    draw_text(ImageDraw.Draw(img), (4 + tw / 2, head_h / 2), heading, fnt)
    return np.asarray(img)


def render_layer(weights_per_head, query_labels, key_labels, layer: int, cell=18, mask=None):
    """(H, T, Tk) -> every head's map, titled "head h", in a grid."""
    heads = render_heads(weights_per_head, query_labels, key_labels, cell, mask)
    return compose_layer(heads, layer)


def render_offset_profile(profile, start, title: str = "layer 0", cell=(36, 20)) -> np.ndarray:
    """profile (H, K): each head's weight on offset 0, -1, ..., -(K-1); start (H,): on the
    boundary token -> one row per head, a column per offset and a last "start", values written."""
    p = np.asarray(profile, dtype=np.float64)
    s = np.asarray(start, dtype=np.float64)
    if p.ndim != 2 or s.shape != (p.shape[0],):
        raise ValueError(f"profile must be (H, K) and start (H,), got {p.shape} and {s.shape}")
    values = np.column_stack([p, s])  # (H, K + 1)
    heads = [f"head {h}" for h in range(p.shape[0])]
    offsets = [str(-k) for k in range(p.shape[1])] + ["start"]
    return _heatmap(values, heads, offsets, title, cell[0], cell[1], annotate=True)


def visible(label: str) -> str:
    """A token as a readable label: whitespace and control characters spelled out."""
    return {" ": "sp", "\n": "\\n", "\t": "\\t"}.get(label, label if label.isprintable() else "?")


def render_table(values, labels: Sequence[str], title: str | None = None, cell: int = 14):
    """A (V, V) table over the vocabulary in [0, 1] (a layer-0 head's QK or OV circuit, rows
    softmaxed) -> a heatmap labelled by the tokens."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape != (len(labels), len(labels)):
        raise ValueError(f"values must be ({len(labels)}, {len(labels)}), got shape {v.shape}")
    names = [visible(label) for label in labels]
    return _heatmap(v, names, names, title, cell, cell)
