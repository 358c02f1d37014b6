"""All drawing, with numpy and Pillow only: labelled heatmaps of attention (a head's map, rows =
queries, columns = keys; a layer's heads in a grid; offset profiles; tables over the vocabulary) as
uint8 (H, W, 3) images."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# Viridis at 9 evenly spaced points (matplotlib's values, rounded); linear between them.
_HEX = "440154 472d7b 3b528b 2c728e 21918c 28ae80 5ec962 addc30 fde725"
_VIRIDIS = np.array([list(bytes.fromhex(c)) for c in _HEX.split()], dtype=np.float64)
BACKGROUND = (255, 255, 255)
TEXT = (20, 20, 20)
LIGHT_TEXT = (250, 250, 250)  # values written on dark cells
MASKED = (222, 222, 222)  # cells a query may not attend to (the causal mask)
FONT_SIZE = 12
HEADS_PER_ROW = 2  # a layer's maps side by side: two read at card size in TensorBoard, four do not


def colormap(values) -> np.ndarray:
    """Values in [0, 1] (any shape, clipped) -> uint8 RGB, shape (..., 3); 0 dark, 1 bright."""
    v = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64)), 0.0, 1.0)
    x = v * (len(_VIRIDIS) - 1)
    lo = np.minimum(np.floor(x).astype(int), len(_VIRIDIS) - 2)
    frac = (x - lo)[..., None]
    return np.round(_VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac).astype(np.uint8)


def text_size(text: str, fnt) -> tuple[int, int]:
    left, top, right, bottom = fnt.getbbox(text)
    return right - left, bottom - top


def draw_text(draw, xy, text: str, fnt, fill=TEXT) -> None:
    """Text centred on xy."""
    draw.text(xy, text, fill=fill, font=fnt, anchor="mm")


def _heatmap(values, row_labels, col_labels, title, cell_w, cell_h, mask=None, annotate=False):
    """(R, C) values in [0, 1] -> labelled cells, grey where `mask` is False, values written."""
    values = np.asarray(values, dtype=np.float64)
    R, C = values.shape
    fnt = ImageFont.load_default(size=min(FONT_SIZE, max(8, cell_w - 1)))
    pad = 4
    label_h = text_size("Mgy", fnt)[1]  # the same for every label set: a stable layout
    label_w = max([text_size(s, fnt)[0] for s in row_labels] + [cell_w // 2])
    title_w, title_h = (n + 2 * pad for n in text_size(title, fnt)) if title else (0, 0)
    left, top = pad + label_w + pad, title_h + pad + label_h + pad
    grid_w, grid_h = C * cell_w, R * cell_h
    width = max(left + grid_w + pad, title_w)
    canvas = np.full((top + grid_h + pad, width, 3), BACKGROUND, dtype=np.uint8)
    colors = colormap(values)
    if mask is not None:
        colors[~np.asarray(mask, dtype=bool)] = MASKED
    # each value fills its cell but for a 1-pixel white seam, which draws the grid
    block = np.repeat(np.repeat(colors, cell_h, axis=0), cell_w, axis=1)
    block[cell_h - 1 :: cell_h, :] = BACKGROUND
    block[:, cell_w - 1 :: cell_w] = BACKGROUND
    canvas[top : top + grid_h, left : left + grid_w] = block
    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    if title:
        # centred over the grid, or over the image when the title is the wider
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
        # light on dark cells, dark on light
        dark = colors.astype(np.float64) @ [0.2126, 0.7152, 0.0722] < 128
        for i, y in enumerate(row_y):
            for j, x in enumerate(col_x):
                ink = LIGHT_TEXT if dark[i, j] else TEXT
                draw_text(draw, (x, y), f"{values[i, j]:.2f}", fnt, fill=ink)
    return np.asarray(img)


def render_attention(weights, query_labels, key_labels, title=None, cell=18, mask=None):
    """One head's weights (T, Tk) -> a map, rows = queries; grey where `mask` hides the key."""
    return _heatmap(weights, query_labels, key_labels, title, cell, cell, mask)


def colorbar(length: int = 80, thickness: int = 10) -> np.ndarray:
    """A small "0 [dark .. bright] 1" legend."""
    fnt = ImageFont.load_default(size=FONT_SIZE)
    (w0, _), (w1, th) = text_size("0", fnt), text_size("1", fnt)
    height = max(thickness, th) + 4
    out = np.full((height, w0 + 4 + length + 4 + w1 + 2, 3), BACKGROUND, np.uint8)
    y0 = (height - thickness) // 2
    out[y0 : y0 + thickness, w0 + 4 : w0 + 4 + length] = colormap(np.linspace(0, 1, length))[None]
    img = Image.fromarray(out)
    draw = ImageDraw.Draw(img)
    draw_text(draw, (w0 / 2, height / 2), "0", fnt)
    draw_text(draw, (w0 + 8 + length + w1 / 2, height / 2), "1", fnt)
    return np.asarray(img)


def compose_layer(images: Sequence[np.ndarray], layer: int, gap: int = 16) -> np.ndarray:
    """Per-head images in equal cells, HEADS_PER_ROW to a row, under "layer l" and a legend."""
    cell_h, cell_w = max(im.shape[0] for im in images), max(im.shape[1] for im in images)
    columns = min(HEADS_PER_ROW, len(images))
    rows = math.ceil(len(images) / columns)
    grid_w = columns * cell_w + gap * (columns - 1)
    fnt = ImageFont.load_default(size=FONT_SIZE + 2)
    tw, th = text_size(f"layer {layer}", fnt)
    bar = colorbar()
    head_h = max(th, bar.shape[0]) + 8
    width = max(grid_w, 4 + tw + 16 + bar.shape[1] + 4)
    out = np.full((head_h + rows * cell_h + gap * (rows - 1), width, 3), BACKGROUND, np.uint8)
    for k, im in enumerate(images):
        y, x = head_h + (k // columns) * (cell_h + gap), (k % columns) * (cell_w + gap)
        out[y : y + im.shape[0], x : x + im.shape[1]] = im
    by = (head_h - bar.shape[0]) // 2
    out[by : by + bar.shape[0], width - bar.shape[1] - 4 : width - 4] = bar
    img = Image.fromarray(out)
    draw_text(ImageDraw.Draw(img), (4 + tw / 2, head_h / 2), f"layer {layer}", fnt)
    return np.asarray(img)


def render_offset_profile(profile, start, title: str = "layer 0", cell=(36, 20)) -> np.ndarray:
    """Each head's weight (H, K) on offsets 0, -1, ... and (H,) on the boundary token -> a table."""
    p, s = np.asarray(profile, dtype=np.float64), np.asarray(start, dtype=np.float64)
    heads = [f"head {h}" for h in range(p.shape[0])]
    offsets = [str(-k) for k in range(p.shape[1])] + ["start"]
    return _heatmap(np.column_stack([p, s]), heads, offsets, title, *cell, annotate=True)
