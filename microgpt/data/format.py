"""What every data format shares: the one data-file check (`read_data_file`) and `Data`, the base
class of the formats (`LinesData`, `TextData`, `RepeatsData`; registered in data/dataset.py). A
format owns what differs: reading, splits, batches, the probe, how a user's input is encoded, what
a checkpoint records of it and how the data come back from one.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import ClassVar

from torch import Tensor

from microgpt.errors import DataError, decode_utf8
from microgpt.files import sha256_file
from microgpt.tokenizer import BOUNDARY_ID, CharTokenizer, quoted

# the repository: microgpt/data/format.py -> microgpt/data -> microgpt -> the root
REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_data_path(path: str) -> Path:
    """A relative path is tried from the working directory, then from the repository root."""
    p = Path(path).expanduser()
    in_repo = not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists()
    return REPO_ROOT / p if in_repo else p


def check_data_file(path: str, prepare: str | None = None) -> Path:
    """The file data.path=`path` names, else a DataError naming it and the fix: `prepare`, where
    that command builds this very file; else pointing data.path at a text file."""
    resolved = resolve_data_path(str(path))
    where = resolved.absolute()
    builds = any(resolve_data_path(word).absolute() == where for word in (prepare or "").split())
    fix = f"build it first: {prepare}" if builds else "point data.path=... at a UTF-8 text file"
    if not resolved.exists():
        raise DataError(f"no data file at {where} (data.path={path}); {fix}")
    if not resolved.is_file():
        what = "a folder" if resolved.is_dir() else "not a regular file (a device or FIFO)"
        raise DataError(f"data.path={path}: {where} is {what}; {fix}")
    return resolved


def read_data_file(path: str | Path, prepare: str | None = None) -> tuple[str, Path]:
    """(the text of a data file, NFC, with \\n line ends and no byte-order mark, its path as
    found); a DataError for a missing, binary, non-UTF-8 or empty file (check_data_file)."""
    found = check_data_file(str(path), prepare)
    where, raw = found.absolute(), found.read_bytes()
    if b"\0" in raw:
        raise DataError(f"data file {where} holds NUL bytes: it looks binary; use a text file")
    text = decode_utf8(raw, where)
    del raw
    # NFC: the composed and decomposed spellings of "zoë" are one character, one item
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    if not text.strip():
        raise DataError(f"data file {where} is empty (or only blank lines); put some text in it")
    return text, found


class Data:
    """What a run trains on, whatever the format: the file, its tokenizer, its split, the
    evaluation sets (`datasets["val"]`, `["test"]`) and, through `train_batches`, the training
    batches. A subclass is one format (data.format=`name`, registered in data/dataset.py): it
    defines `load(settings, block_size, device, trim)` (reading its own keys of the data settings,
    a config.DataConfig) and `from_checkpoint` (classmethods), `train_batches`, `default_probe` and
    `training_counts`, and overrides what else differs below."""

    name: ClassVar[str]
    boundary: ClassVar[bool] = True  # items start (and end) with the boundary token
    reads_file: ClassVar[bool] = True  # data.path names a file (not a label)
    analysis_targets: ClassVar[int]  # targets of the validation split the head analysis reads
    user_input: ClassVar[str] = "a name"  # what the tab asks its user to type
    packs: ClassVar[bool] = True  # train.pack puts its items end to end in rows

    def __init__(self, path, tokenizer, split, block_size, datasets, label="", train_ids=None):
        self.path, self.tokenizer, self.split = Path(path), tokenizer, split
        self.block_size, self.datasets = block_size, datasets
        self.source = label or str(path)  # e.g. "data/names.txt", "generated repeats (seed 0)"
        self.train_ids: Tensor | None = train_ids  # text: the training slice

    @classmethod
    def known_block(cls, data) -> int | None:
        """The block size with model.block_size=null, if known before the data is read."""
        return None

    @classmethod
    def check_settings(cls, data, block_size: int | None) -> None:
        """The schema's check of data (a config.DataConfig) and model.block_size: a DataError."""

    def sha256(self) -> str:
        """The content's hash, kept in checkpoints."""
        return sha256_file(self.path)

    def record(self) -> dict:
        """What a checkpoint records of the data (its `split`), read back by `from_checkpoint`."""
        return self.split.to_dict()

    @classmethod
    def input_ids(cls, tokenizer: CharTokenizer, text: str, block_size: int, what: str) -> list:
        """The ids the model reads for a user's `text` (log.probe, the tab's input): after the
        boundary token where items carry one; a DataError if it does not fit or is unknown."""
        tokenizer.check(text, what)
        start = [BOUNDARY_ID] if cls.boundary else []
        if len(start) + len(text) > block_size:
            after = " after the boundary token" if start else ""
            raise DataError(
                f"{what}={quoted(text)} has {len(text)} characters but the model reads at most "
                f"{block_size - len(start)}{after}; shorten it"
            )
        return start + tokenizer.encode(text)

    def prompt(self, prefix: str) -> tuple[list[int], str]:
        """What sampling continues for a user's `prefix` (sample.py's prefix=): the ids the model
        reads first, and a note of what was done to it; a DataError where it cannot."""
        return self.input_ids(self.tokenizer, prefix, self.block_size, "prefix"), ""

    def probe_ids(self, probe: str | None) -> list[int]:
        """The ids whose attention is drawn: `probe` (log.probe), else `default_probe()`."""
        if probe is None:
            return self.default_probe()
        return self.input_ids(self.tokenizer, probe, self.block_size, "log.probe")
