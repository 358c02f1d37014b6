"""The TensorBoard logger of a training run: scalars (also to metrics.jsonl), per-head attention
maps, samples, the final figures (Text and one HParams row) and head analyses, all in the run's own
folder, under the same tags in every run (`attention/layer0/head1`, ...) so that runs line up side
by side.

TensorBoard groups tags by their prefix before the first '/' and sorts the groups by their ASCII
codes, capitals first; the Scalars tab opens the first two. So the losses are `Loss/train` and
`Loss/val` (a capital: first in Scalars and Time Series), then `heads/` (the summaries, alike for
any head count), `lr`, `per_head/layer{l}/head{h}/...`, `result/` (one point each: the HParams
tab reads its metrics from scalars), `tokens_per_sec`, `train/grad_norm`. An undefined value (nan)
is not logged: no chart of nothing."""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summaries
from torch.utils.tensorboard.summary import text as text_summary

from microgpt.config import flatten
from microgpt.heads import measures
from microgpt.heads.measures import MEASURES
from microgpt.heads.report import HeadReport
from microgpt.runs import RunFolder
from microgpt.viz.draw import compose_layer, render_attention, render_offset_profile

TRAIN_LOSS, VAL_LOSS = "Loss/train", "Loss/val"  # the tags, and the keys in metrics.jsonl


def sanitize_hparams(hparams: Mapping) -> dict[str, int | float | str]:
    """Dotted keys -> numbers, "true"/"false" (not torch's 1/0), "none", or else str(value)."""

    def value(v) -> int | float | str:
        if v is None or isinstance(v, bool):
            return {None: "none", True: "true", False: "false"}[v]
        return v if isinstance(v, (int, float)) else str(v)

    return {str(k): value(v) for k, v in flatten(hparams).items()}


class TensorBoardLogger:
    """A SummaryWriter on one run's folder, with one method for each thing the trainer logs."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        # purge_step (a resume): points at steps >= purge_step are dropped, to be written again
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)  # makes the folder
        # every scalar also goes, one JSON object per call, to metrics.jsonl: written as it goes,
        # so a crash loses at most the last line; a resume drops the lines it will write again
        self.metrics_file = RunFolder(log_dir).append_metrics(purge_step)
        # the last head summaries: HParams metrics too (see hparams)
        self.last_head_summary: dict[str, float] = {}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """{tag: value}, None and nan skipped: to TensorBoard and a line of metrics.jsonl."""
        line = {"step": step, "time": time.time()}
        for tag, value in values.items():
            if value is not None and not math.isnan(value):
                line[tag] = float(value)
                self.writer.add_scalar(tag, line[tag], step)
        self.metrics_file.write(json.dumps(line) + "\n")
        self.metrics_file.flush()

    def attention_maps(self, step: int, attention: Sequence, labels: Sequence[str]) -> None:
        """Each layer's (H, T, Tk) maps: `attention/layer{l}[/head{h}]`."""
        for layer, att in enumerate(attention):
            w = np.asarray(att, dtype=np.float64)  # (H, T, Tk), on the CPU
            T, Tk = w.shape[1:]
            # True where query i sees key j; with Tk > T (a cached prefix) queries are the last keys
            mask = np.tri(T, Tk, k=Tk - T, dtype=bool)
            # 18-pixel cells, down to 8 for long probes: a 128-character passage fits one screen
            cell = max(8, min(18, 720 // max(Tk, 1)))
            heads = [
                render_attention(w[h], labels[Tk - T :], labels, f"head {h}", cell, mask)
                for h in range(len(w))
            ]
            for h, img in enumerate(heads):
                self._image(f"attention/layer{layer}/head{h}", img, step)
            self._image(f"attention/layer{layer}", compose_layer(heads, layer), step)

    def heads(self, step: int, report: HeadReport) -> None:
        """A head report: its measures (microgpt.heads.measures), the summaries under `heads/`
        (the same tags for any head count) and `per_head/layer{l}/head{h}/<tag>`, offset profiles
        (`heads/offsets/layer{l}`), `heads/table` and, the first time, the layout."""
        if not self.last_head_summary:
            self.writer.add_custom_scalars(heads_layout(report.n_layer))
        self.last_head_summary = report.summaries()
        self.scalars(step, self.last_head_summary)
        per_head = {
            f"per_head/layer{a}/head{b}/{m.tag or m.name}": float(v)  # nan: not logged
            for m, values in measures.per_head(report)
            if m.tag is not None
            for (a, b), v in np.ndenumerate(np.asarray(values))
        }
        self.scalars(step, per_head)
        for layer, (profile, start) in enumerate(zip(report.offsets, report.start)):
            img = render_offset_profile(profile, start, f"layer {layer}")
            self._image(f"heads/offsets/layer{layer}", img, step)
        self._text("heads/table", report.markdown(), step)

    def _image(self, tag: str, img: np.ndarray, step: int) -> None:
        """A uint8 (H, W, 3) image as PNG at zlib level 1: several times faster than add_image's
        default level, for files a little larger."""
        png = io.BytesIO()
        Image.fromarray(img).save(png, format="PNG", compress_level=1)
        h, w, c = img.shape
        image = Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=png.getvalue())
        self.writer.file_writer.add_summary(
            Summary(value=[Summary.Value(tag=tag, image=image)]), step
        )

    def _text(self, tag: str, body: str, step: int) -> None:
        summary = text_summary(tag, body)
        summary.value[0].tag = tag  # add_text would name it "<tag>/text_summary"
        self.writer.file_writer.add_summary(summary, step)

    def samples(self, step: int, lines: Sequence[str]) -> None:
        """The text "samples", as a Markdown code block: lines never merge, nothing is markup."""
        body = "\n".join("    " + line for line in lines) if lines else "(no samples)"
        self._text("samples", body, step)

    def hparams(self, hparams: Mapping, results: Mapping[str, float], step: int) -> None:
        """The final figures ({name: nats}): the Text `result` (a table) and one HParams row in the
        run's own folder (not add_hparams's subfolder), whose metrics are scalars: `result/{name}`
        and the last summaries of the main head measures."""
        values = {f"result/{k}": v for k, v in results.items() if v is not None}
        self.scalars(step, values)
        main = [f"heads/{m.name}" for m in measures.summary_measures("main")]
        heads = {t: self.last_head_summary.get(t, math.nan) for t in main}
        metrics = {t: v for t, v in {**values, **heads}.items() if not math.isnan(v)}
        # the experiment, session start and session end
        for summary in hparams_summaries(sanitize_hparams(hparams), metrics):
            self.writer.file_writer.add_summary(summary)
        table = ["| | nats/char | bits/char |", "|---|---|---|"]
        table += [
            f"| {k.replace('_', ' ')} | {v:.4f} | {v / math.log(2):.4f} |"
            for k, v in results.items()
        ]
        self._text("result", "\n".join(table), step)
        self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        self.metrics_file.close()


def heads_layout(n_layer: int) -> dict:
    """The custom-scalars layout of the measures' charts: a per-head measure's one per layer, in a
    category of its own, each head a line; the summaries' in `head summaries`. Regexes, not head
    numbers: one layout serves every head count, and a sweep's layouts merge."""
    layout: dict[str, dict] = {}
    for m in MEASURES:
        for chart, n in [(c, n) for c in m.charts for n in range(n_layer if m.per_head else 1)]:
            category, title = (
                (chart, f"layer {n}: {chart}") if m.per_head else ("head summaries", chart)
            )
            regex = m.pattern(rf"per_head/layer{n}/head\d+/" if m.per_head else "heads/") + "$"
            layout.setdefault(category, {}).setdefault(title, ["Multiline", []])[1].append(regex)
    return layout
