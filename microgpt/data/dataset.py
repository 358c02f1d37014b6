"""The data of a run, one interface whatever the format (`lines`, `text`, `repeats`: generated
items, split and batched as lines): `load_data` gives a `Data`, which gives the training batches
(`train_batches(...).next(rank, batch_size)`) and evaluation sets (`datasets["val"]`, `["test"]`).
`data_of_checkpoint(ckpt)` rebuilds a finished run's evaluation data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from torch import Tensor

from microgpt.data import lines, text
from microgpt.data.lines import CharDataset, Split
from microgpt.data.repeats import repeat_items
from microgpt.data.text import TextSplit, TextWindows
from microgpt.errors import DataError
from microgpt.files import sha256_file
from microgpt.tokenizer import CharTokenizer

FORMATS = ("lines", "text", "repeats")  # one item per line | one stream | generated items

# the repository: microgpt/data/dataset.py -> microgpt/data -> microgpt -> the root
REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_data_path(path: str) -> Path:
    """A relative path is tried from the working directory, then from the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return REPO_ROOT / p if (REPO_ROOT / p).exists() else p


def check_data_file(path: str, prepare: str | None = None) -> Path:
    """The file data.path=`path` names, else a DataError: missing (`prepare` builds it), a folder,
    a FIFO or a device."""
    resolved = resolve_data_path(str(path))
    where, fix = resolved.absolute(), "point data.path=... at a text file"
    if not resolved.exists():
        fix = f"build it first: {prepare}" if prepare else fix
        raise DataError(f"no data file at {where} (data.path={path}); {fix}")
    if not resolved.is_file():
        what = "a folder" if resolved.is_dir() else "not a regular file (a device or FIFO)"
        raise DataError(f"data.path={path}: {where} is {what}; {fix}")
    return resolved


@dataclass
class Data:
    """What a run trains on, whatever the format: the file, its tokenizer, its split, the
    evaluation sets ("val", "test") and, through `train_batches`, the training batches."""

    path: Path
    format: str
    tokenizer: CharTokenizer
    split: Split | TextSplit
    block_size: int
    datasets: dict[str, CharDataset | TextWindows]
    train_ids: Tensor | None = None  # text: the training slice, for batches and memorisation
    label: str = ""  # what messages and the log call generated data (no file)

    @property
    def source(self) -> str:
        """e.g. "data/names.txt", or "generated repeats (seed 0)"."""
        return self.label or str(self.path)

    def train_batches(
        self, global_batch: int, seed: int, group_by_length: int = 0, pack: int = 0
    ) -> lines.ItemBatches | text.WindowBatches:
        if self.format == "text":
            device = self.datasets["val"].device
            return text.WindowBatches(self.train_ids, self.block_size, global_batch, seed, device)
        return lines.ItemBatches(self.datasets["train"], global_batch, seed, group_by_length, pack)

    @cached_property
    def verbatim_index(self) -> text.VerbatimIndex | None:
        """text: an index of the training text, for memorisation (built on first use)."""
        if self.train_ids is None:
            return None
        return text.VerbatimIndex(self.train_ids, self.tokenizer.vocab_size)

    def sha256(self) -> str:
        """The content's hash, kept in checkpoints: the file's, or (repeats, no file) the items'."""
        if self.format == "repeats":
            return hashlib.sha256(json.dumps(self.split.to_dict()).encode()).hexdigest()
        return sha256_file(self.path)

    def probe_ids(self, probe: str | None) -> list[int]:
        """The ids whose attention is drawn: `probe` (log.probe), else the first validation item
        or (text) a validation passage."""
        if probe is None and self.format == "text":
            # from the start of a line, where one fits
            ids, length = self.datasets["val"].ids, min(text.PROBE_LENGTH, self.block_size)
            newline = self.tokenizer.stoi.get("\n")
            hits = (ids[: max(len(ids) - length, 0)] == newline).nonzero() if newline else []
            start = int(hits[0]) + 1 if len(hits) else 0
            return ids[start : start + length].tolist()
        probe = probe if probe is not None else self.split.val[0]
        if unknown := self.tokenizer.unknown_chars(probe):
            raise DataError(
                f"log.probe={probe!r} has characters the vocabulary does not know: "
                f"{''.join(unknown)!r}; use characters of the data or log.probe=null"
            )
        start = [] if self.format == "text" else [self.tokenizer.boundary_id]
        ids = start + self.tokenizer.encode(probe)
        if len(ids) > self.block_size:
            raise DataError(
                f"log.probe={probe!r} has {len(probe)} characters but the model reads at most "
                f"{self.block_size - len(start)}; shorten it or set log.probe=null"
            )
        return ids


def load_data(
    path, seed, block_size=None, device="cpu", trim=True, format="lines", prepare=None, repeats=None
) -> Data:
    """The data in `format` on `device`. block_size None: the longest item + 1 (lines), or
    text.DEFAULT_BLOCK_SIZE. repeats: generated by `repeats` (config.RepeatsConfig; `path` is a
    label). `prepare`: the command that builds a missing file, named in the error."""
    if format == "repeats":
        r = repeats
        items = repeat_items(r.items, r.chars, tuple(r.span), r.length, r.seed)
        path, label = Path(path), f"generated repeats (seed {r.seed})"
    else:
        path = check_data_file(path, prepare)
        if format == "text":
            return _load_text(path, block_size or text.DEFAULT_BLOCK_SIZE, device)
        items = lines.read_items(path)
        label = str(path)
    block_size = block_size or lines.block_size_for(items)
    lines.check_fits(items, block_size, label)
    tokenizer = CharTokenizer.from_items(items)
    split = lines.split_items(items, seed)
    datasets = {
        name: CharDataset.from_items(getattr(split, name), tokenizer, block_size, device, trim)
        for name in lines.SPLIT_NAMES
    }
    return Data(path, format, tokenizer, split, block_size, datasets, label=label)


def _load_text(path: Path, block_size: int, device) -> Data:
    content = text.read_text(path)
    # a short hash of the normalised text: a resume or a later analysis checks it
    digest = hashlib.sha256(content.encode("utf-8")).hexdigest()[:16]
    split = TextSplit.of(len(content), digest, block_size, str(path))
    tokenizer = CharTokenizer.from_items([content])
    ids = text.encode_text(content, tokenizer)
    del content
    datasets = {
        name: TextWindows(split.part(ids, name), block_size, device) for name in ("val", "test")
    }
    return Data(path, "text", tokenizer, split, block_size, datasets, split.part(ids, "train"))


def data_of_checkpoint(ckpt, device: str | torch.device = "cpu") -> Data:
    """The evaluation data of the run that wrote `ckpt` (a loaded Checkpoint): lines from the split
    stored in it; text re-read from the run's data file and checked against the stored digest (a
    DataError says the file is missing or changed, and what to do)."""
    from_ckpt = CharTokenizer.from_dict(ckpt.tokenizer)
    block_size, path = int(ckpt.model_config["block_size"]), ckpt.data.get("path")
    if ckpt.data.get("format", "lines") != "text":
        split = Split.from_dict(ckpt.split)
        datasets = {
            name: CharDataset.from_items(getattr(split, name), from_ckpt, block_size, device)
            for name in ("val", "test")
        }
        return Data(Path(path or ""), "lines", from_ckpt, split, block_size, datasets)
    where = resolve_data_path(str(path))
    if not where.is_file():
        raise DataError(
            f"the run's text file {where.resolve()} is missing (a checkpoint keeps only its "
            f"digest); put the file the run was trained on back at that path"
        )
    try:
        data = load_data(where, 0, block_size, device, format="text")
    except DataError:
        data = None
    if data is None or data.split.to_dict() != ckpt.split or data.tokenizer != from_ckpt:
        raise DataError(
            f"{where} no longer holds the text this run was trained on (its content differs); "
            f"restore the file the run used"
        )
    return data
