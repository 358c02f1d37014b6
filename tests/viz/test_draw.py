"""microgpt.viz.draw: heatmaps, a layer's grid of heads, offset profiles."""

import itertools

import numpy as np
import torch

from microgpt.viz.draw import colormap, compose_layer, render_attention, render_offset_profile


def render_layer(weights, labels, layer):
    """A layer's head maps in a grid, as the logger draws `attention/layer{l}`."""
    heads = [render_attention(w, labels, labels, f"head {h}") for h, w in enumerate(weights)]
    return compose_layer(heads, layer)


def luminance(rgb) -> float:
    return float(np.dot(np.asarray(rgb, dtype=float), [0.2126, 0.7152, 0.0722]))


def test_colormap_is_dark_to_bright():
    lum = [luminance(c) for c in colormap(np.linspace(0, 1, 11))]
    assert all(a < b for a, b in itertools.pairwise(lum))
    assert colormap([[0.3]]).shape == (1, 1, 3) and colormap(0.3).dtype == np.uint8


# ----------------------------------------------------------------------------- attention maps


def test_render_attention_shape_dtype_and_brightness():
    w = np.array([[0.1, 0.9], [0.5, 0.5]])
    img = render_attention(w, [".", "a"], [".", "a"], title="head 0")
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert img.shape[0] >= 2 * 18 and img.shape[1] >= 2 * 18

    def where(value):  # pixel coordinates painted with the colour of `value`
        ys, xs = np.nonzero((img == colormap(value)).all(axis=-1))
        assert len(xs) > 100, f"no cell drawn for weight {value}"
        return ys.mean(), xs.mean()

    (y_lo, x_lo), (y_hi, x_hi), (y_mid, _) = where(0.1), where(0.9), where(0.5)
    assert abs(y_lo - y_hi) < 1 and x_hi > x_lo  # row 0: the 0.9 cell is the right one
    assert y_mid > y_lo  # row 1 is below row 0
    assert luminance(colormap(0.9)) > luminance(colormap(0.1))  # the brighter cell weighs more


def test_render_attention_accepts_a_tensor_draws_labels_and_greys_masked_cells():
    w = torch.full((3, 3), 1 / 3)
    plain = render_attention(w, [" "] * 3, [" "] * 3)  # blank labels: the margins stay blank
    labelled = render_attention(w, [".", "x", "y"], [".", "x", "y"])
    assert plain.shape == labelled.shape
    grid = (labelled == colormap(1 / 3)).all(axis=-1)
    ys, xs = np.nonzero(grid)
    top, left = ys.min(), xs.min()
    left_margin = labelled[top:, :left]  # row labels
    top_margin = labelled[:top, left:]  # column labels
    assert len(np.unique(left_margin.reshape(-1, 3), axis=0)) > 1
    assert len(np.unique(top_margin.reshape(-1, 3), axis=0)) > 1
    assert len(np.unique(plain[top:, :left].reshape(-1, 3), axis=0)) == 1
    w = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]  # causal: the upper triangle masked
    img = render_attention(w, list("abc"), list("abc"), mask=np.tri(3, dtype=bool))
    assert not (img == colormap(0.0)).all(axis=-1).any()  # masked cells are grey, not "weight 0"


def test_a_layer_puts_two_heads_in_a_row_then_the_rest_below():
    labels = list(".emma")
    w = torch.softmax(torch.randn(16, 5, 5), dim=-1)
    layers = {n: render_layer(w[:n], labels, layer=0) for n in (1, 2, 3, 4, 8, 16)}
    head = render_attention(w[0], labels, labels, "head 0")
    # one head of a short item may be narrower than the heading and legend; the second head adds
    # its width: two to a row read at TensorBoard's card size, four do not
    assert layers[1].shape[1] <= layers[2].shape[1] and layers[2].shape[1] >= 2 * head.shape[1]
    assert layers[2].shape[0] == layers[1].shape[0]
    for n in (3, 4, 8, 16):  # at most 2 to a row, and the rest below
        assert layers[n].shape[1] == layers[2].shape[1] and layers[n].dtype == np.uint8
        assert layers[n].shape[0] >= (n // 2) * head.shape[0]


# ----------------------------------------------------------------------------- offset profiles


def test_render_offset_profile_shape_colours_and_values():
    H, K = 3, 5
    profile = np.full((H, K), 0.5)
    start = np.full(H, 0.5)
    img = render_offset_profile(profile, start, "layer 2")
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert img.shape[1] >= (K + 1) * 36 and img.shape[0] >= H * 20
    taller = render_offset_profile(np.full((H + 1, K), 0.5), np.full(H + 1, 0.5))
    assert taller.shape[0] == img.shape[0] + 20 and taller.shape[1] == img.shape[1]

    def grid_box(im):  # the pixels between the first and last cell of colour 0.5
        ys, xs = np.nonzero((im == colormap(0.5)).all(axis=-1))
        box = im[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1].reshape(-1, 3)
        return {tuple(c) for c in box}

    cell, seam = tuple(colormap(0.5)), (255, 255, 255)
    assert grid_box(img) - {cell, seam}  # each value is written in its cell
    small = render_offset_profile(profile, start, cell=(12, 8))  # too small to write in
    assert grid_box(small) == {cell, seam}
    assert small.shape[1] < img.shape[1]
