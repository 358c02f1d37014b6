"""Everything a training run logs to TensorBoard, as plain functions taking plain arguments.

- `render_attention` / `render_layer`: attention weights -> labelled heatmap images (uint8 HWC),
  rows = query characters, columns = key characters, drawn with Pillow and a hand-made
  viridis-like colormap (dark = 0, bright = 1; cells a causal mask hides are light grey).
- `attention_entropy`: (L, H) mean entropy of each head's attention over the real queries.
- `TensorBoardLogger`: scalars, per-head and per-layer attention images, entropy, sampled names
  and one HParams row per run, written into the run's own folder.

Tags are the same in every run (`attention/layer0/head1`, ...) so runs line up side by side. The
image tab keeps 10 images per tag unless TensorBoard starts with `--samples_per_plugin images=N`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summaries
from torch.utils.tensorboard.summary import text as text_summary

from microgpt.tokenizer import BOUNDARY, BOUNDARY_ID

# ----------------------------------------------------------------------------- colours

# Viridis at 9 evenly spaced points (matplotlib's values, rounded); linear between them.
_VIRIDIS = np.array(
    [
        [68, 1, 84],
        [71, 45, 123],
        [59, 82, 139],
        [44, 114, 142],
        [33, 145, 140],
        [40, 174, 128],
        [94, 201, 98],
        [173, 220, 48],
        [253, 231, 37],
    ],
    dtype=np.float64,
)
BACKGROUND = (255, 255, 255)
TEXT = (20, 20, 20)
MASKED = (222, 222, 222)  # cells a query may not attend to (the causal mask)
FONT_SIZE = 12


def colormap(values) -> np.ndarray:
    """Values in [0, 1] (any shape, clipped) -> uint8 RGB colours, shape (..., 3); 0 dark, 1 bright."""
    v = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64)), 0.0, 1.0)
    x = v * (len(_VIRIDIS) - 1)
    lo = np.minimum(np.floor(x).astype(int), len(_VIRIDIS) - 2)
    frac = (x - lo)[..., None]
    rgb = _VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac
    return np.round(rgb).astype(np.uint8)


# ----------------------------------------------------------------------------- drawing


def _font(size: int = FONT_SIZE):
    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 with FreeType: scalable
    except TypeError:  # older Pillow: the fixed bitmap font
        return ImageFont.load_default()


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[int, int]:
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    return right - left, bottom - top


def _draw_centered(draw: ImageDraw.ImageDraw, cx: float, cy: float, text: str, font) -> None:
    """Draw `text` centred on (cx, cy): by the font's line metrics where the font has them, so
    "p" and "h" share a baseline; else (the old bitmap font) by the ink box."""
    try:
        draw.text((cx, cy), text, fill=TEXT, font=font, anchor="mm")
        return
    except ValueError:  # bitmap fonts take no anchor
        pass
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    x = cx - (left + right) / 2
    y = cy - (top + bottom) / 2
    draw.text((round(x), round(y)), text, fill=TEXT, font=font)


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def render_attention(
    weights,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    title: str | None = None,
    cell: int = 18,
    mask=None,
) -> np.ndarray:
    """One head's attention weights (T, Tk) in [0, 1] -> an (H, W, 3) uint8 image.

    A grid of `cell`-pixel squares, row i = query i (labelled on the left with its character),
    column j = key j (labelled on top), coloured dark (0) to bright (1). `mask` (T, Tk) bool,
    optional: cells where it is False (keys the query may not see) are drawn light grey.
    """
    w = _as_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be (T, Tk), got shape {w.shape}")
    T, Tk = w.shape
    if len(query_labels) != T or len(key_labels) != Tk:
        raise ValueError(
            f"weights are {T}x{Tk} but got {len(query_labels)} query and "
            f"{len(key_labels)} key labels"
        )
    font = _font()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    label_h = _text_size(probe, "Mgy", font)[1]  # the same for every label set: stable layout
    label_w = max([_text_size(probe, s, font)[0] for s in query_labels] + [cell // 2])
    pad = 4
    title_h = _text_size(probe, title, font)[1] + 2 * pad if title else 0
    left = pad + label_w + pad  # where the grid starts
    top = title_h + pad + label_h + pad
    grid_w, grid_h = Tk * cell, T * cell
    width = max(left + grid_w + pad, (_text_size(probe, title, font)[0] + 2 * pad) if title else 0)
    height = top + grid_h + pad

    canvas = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
    colors = colormap(w)  # (T, Tk, 3)
    if mask is not None:
        colors[~np.asarray(_as_numpy(mask), dtype=bool)] = MASKED
    # each weight fills a cell-1 square; the 1-pixel white seam between cells draws the grid
    block = np.repeat(np.repeat(colors, cell, axis=0), cell, axis=1)  # (T*cell, Tk*cell, 3)
    seam = np.zeros((T * cell, Tk * cell), dtype=bool)
    seam[cell - 1 :: cell, :] = True
    seam[:, cell - 1 :: cell] = True
    block[seam] = BACKGROUND
    canvas[top : top + grid_h, left : left + grid_w] = block

    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    if title:  # centred over the grid, or over the image when the title is the wider
        cx = left + grid_w / 2 if width == left + grid_w + pad else width / 2
        _draw_centered(draw, cx, title_h / 2, title, font)
    for j, s in enumerate(key_labels):  # key characters across the top
        _draw_centered(draw, left + j * cell + (cell - 1) / 2, top - pad - label_h / 2, s, font)
    for i, s in enumerate(query_labels):  # query characters down the left
        _draw_centered(draw, pad + label_w / 2, top + i * cell + (cell - 1) / 2, s, font)
    return np.asarray(img)


def _hstack(images: Sequence[np.ndarray], gap: int) -> np.ndarray:
    """Images side by side, top-aligned, on the background colour, `gap` pixels apart."""
    height = max(im.shape[0] for im in images)
    width = sum(im.shape[1] for im in images) + gap * (len(images) - 1)
    out = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
    x = 0
    for im in images:
        out[: im.shape[0], x : x + im.shape[1]] = im
        x += im.shape[1] + gap
    return out


def _colorbar(length: int = 80, thickness: int = 10) -> np.ndarray:
    """A small "0 [dark .. bright] 1" legend, (h, w, 3) uint8."""
    font = _font()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    w0, _ = _text_size(probe, "0", font)
    w1, th = _text_size(probe, "1", font)
    height = max(thickness, th) + 4
    width = w0 + 4 + length + 4 + w1 + 2
    out = np.full((height, width, 3), BACKGROUND, np.uint8)
    y0 = (height - thickness) // 2
    out[y0 : y0 + thickness, w0 + 4 : w0 + 4 + length] = colormap(np.linspace(0, 1, length))[None]
    img = Image.fromarray(out)
    draw = ImageDraw.Draw(img)
    _draw_centered(draw, w0 / 2, height / 2, "0", font)
    _draw_centered(draw, w0 + 8 + length + w1 / 2, height / 2, "1", font)
    return np.asarray(img)


def _compose_layer(head_images: Sequence[np.ndarray], layer: int, gap: int = 16) -> np.ndarray:
    """Per-head images -> one image: a "layer l" heading (left) and a colour legend (right),
    then the heads side by side."""
    row = _hstack(head_images, gap)
    font = _font(FONT_SIZE + 2)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    heading = f"layer {layer}"
    tw, th = _text_size(probe, heading, font)
    bar = _colorbar()
    head_h = max(th, bar.shape[0]) + 8
    width = max(row.shape[1], 4 + tw + 16 + bar.shape[1] + 4)
    out = np.full((head_h + row.shape[0], width, 3), BACKGROUND, np.uint8)
    out[head_h:, : row.shape[1]] = row
    by = (head_h - bar.shape[0]) // 2
    out[by : by + bar.shape[0], width - bar.shape[1] - 4 : width - 4] = bar
    img = Image.fromarray(out)
    _draw_centered(ImageDraw.Draw(img), 4 + tw / 2, head_h / 2, heading, font)
    return np.asarray(img)


def render_layer(
    weights_per_head,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    layer: int,
    cell: int = 18,
    mask=None,
) -> np.ndarray:
    """One layer's attention (H, T, Tk) -> every head's map side by side, each titled "head h"."""
    w = _as_numpy(weights_per_head)
    if w.ndim != 3:
        raise ValueError(f"weights_per_head must be (H, T, Tk), got shape {w.shape}")
    heads = [
        render_attention(w[h], query_labels, key_labels, f"head {h}", cell, mask)
        for h in range(w.shape[0])
    ]
    return _compose_layer(heads, layer)


def labels_for(ids: Sequence[int], tokenizer) -> list[str]:
    """Token ids -> the characters to label a map with; the boundary token is shown as '.'."""
    return [BOUNDARY if int(i) == BOUNDARY_ID else tokenizer.itos[int(i)] for i in ids]


def _causal_mask(T: int, Tk: int) -> np.ndarray:
    """(T, Tk) True where query i (the last T of Tk positions) may see key j."""
    return np.tri(T, Tk, k=Tk - T, dtype=bool)


# ----------------------------------------------------------------------------- statistics


def attention_entropy(attention: Sequence[torch.Tensor], query_mask: torch.Tensor) -> torch.Tensor:
    """Each head's mean attention entropy in nats over the real queries -> (L, H) float tensor.

    attention: per layer (B, H, T, Tk) weights (rows sum to 1); query_mask: (B, T) bool, True at
    real query positions (for a batch (x, y) from microgpt.data, `y >= 0`). A uniform head over n
    keys scores log(n), a head that looks at one key scores 0. With no real queries: zeros.
    """
    mask = query_mask.to(dtype=torch.float32)  # (B, T)
    count = mask.sum().clamp(min=1.0)
    rows = []
    for att in attention:
        p = att.detach().float()  # (B, H, T, Tk)
        ent = -torch.special.xlogy(p, p).sum(dim=-1)  # (B, H, T); 0 * log 0 = 0
        m = mask.to(ent.device)[:, None, :]  # (B, T) -> (B, 1, T)
        rows.append((ent * m).sum(dim=(0, 2)) / count.to(ent.device))  # (H,)
    return torch.stack(rows).cpu()  # (L, H)


# ----------------------------------------------------------------------------- hparams


def _flatten(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def sanitize_hparams(hparams: Mapping) -> dict[str, int | float | str]:
    """Nested dicts flattened to dotted keys; values made types the HParams tab shows:
    numbers stay numbers, bools become "true"/"false", None "none", anything else its str()."""
    out = {}
    for k, v in _flatten(hparams).items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, np.generic):
            v = v.item()
        if v is None:
            v = "none"
        elif isinstance(v, bool):
            v = "true" if v else "false"  # torch's hparams() would store a bool as the number 1/0
        elif isinstance(v, numbers.Integral):
            v = int(v)
        elif isinstance(v, numbers.Real):
            v = float(v)
        elif not isinstance(v, str):
            v = str(v)
        out[str(k)] = v
    return out


def _metric_value(v) -> float:
    if isinstance(v, torch.Tensor):
        return float(v.item())
    return float("nan") if v is None else float(v)


# ----------------------------------------------------------------------------- the logger


class TensorBoardLogger:
    """A SummaryWriter on one run's folder, with one method for each thing the trainer logs."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        """purge_step: a resumed run passes its step, and TensorBoard drops the earlier run's
        points at steps >= purge_step (they are replaced by the resumed run's)."""
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """{tag: value}, e.g. {"loss/train": 2.1, "lr": 1e-3}; None values are skipped."""
        for tag, value in values.items():
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                value = value.item()
            self.writer.add_scalar(tag, float(value), step)

    def attention_maps(
        self, step: int, attention: Sequence[torch.Tensor], labels: Sequence[str]
    ) -> None:
        """One probe item's attention, per layer (H, T, T) (a leading batch dim of 1 is dropped),
        with the T input tokens as characters. Writes `attention/layer{l}/head{h}` for each head
        and `attention/layer{l}` with the layer's heads side by side."""
        for layer, att in enumerate(attention):
            w = _as_numpy(att)
            if w.ndim == 4 and w.shape[0] == 1:
                w = w[0]
            if w.ndim != 3:
                raise ValueError(f"layer {layer} attention must be (H, T, Tk), got {w.shape}")
            H, T, Tk = w.shape
            # with Tk > T (a cached prefix) the queries are the last T keys
            mask = _causal_mask(T, Tk)
            heads = []
            for h in range(H):
                img = render_attention(w[h], labels[Tk - T :], labels, f"head {h}", mask=mask)
                self.writer.add_image(
                    f"attention/layer{layer}/head{h}", img, step, dataformats="HWC"
                )
                heads.append(img)
            self.writer.add_image(
                f"attention/layer{layer}", _compose_layer(heads, layer), step, dataformats="HWC"
            )

    def attention_entropy(self, step: int, entropy: torch.Tensor) -> None:
        """(L, H) entropies -> scalars `attention_entropy/layer{l}/head{h}`."""
        e = _as_numpy(entropy)
        for layer in range(e.shape[0]):
            for h in range(e.shape[1]):
                self.writer.add_scalar(
                    f"attention_entropy/layer{layer}/head{h}", float(e[layer, h]), step
                )

    def samples(self, step: int, lines: Sequence[str]) -> None:
        """Sampled items, one per line, as the text summary "samples". Each line is indented
        four spaces: a Markdown code block, so lines never merge and nothing is read as markup."""
        body = "\n".join("    " + line for line in lines) if lines else "(no samples)"
        summary = text_summary("samples", body)
        summary.value[0].tag = "samples"  # add_text would name it "samples/text_summary"
        self.writer.file_writer.add_summary(summary, step)

    def hparams(
        self, hparams: Mapping, metrics: Mapping[str, float], step: int | None = None
    ) -> None:
        """One row in the HParams tab for this run: written into the run's own folder (not the
        subfolder `SummaryWriter.add_hparams` makes). `metrics` ({"hparams/best_val_loss": 1.9})
        are also written as scalars, which is where the HParams tab reads their values."""
        hp = sanitize_hparams(hparams)
        metric_values = {str(k): _metric_value(v) for k, v in metrics.items()}
        for summary in hparams_summaries(hp, metric_values):  # experiment, session start, end
            self.writer.file_writer.add_summary(summary)
        for tag, value in metric_values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
