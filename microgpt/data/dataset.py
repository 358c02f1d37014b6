"""The data formats by name (data.format), and the two ways to get a run's data: `load_data` (a
training run's, from its settings) and `data_of_checkpoint` (a finished run's evaluation data, from
what its checkpoint records). A new format is one module with a `Data` subclass, registered here.
"""

from __future__ import annotations

from microgpt.data.format import REPO_ROOT, Data, check_data_file, resolve_data_path
from microgpt.data.lines import LinesData
from microgpt.data.repeats import RepeatsData
from microgpt.data.text import TextData
from microgpt.errors import DataError

# one item per line | one stream | generated items
FORMATS: dict[str, type[Data]] = {f.name: f for f in (LinesData, TextData, RepeatsData)}

__all__ = ["REPO_ROOT", "Data", "DataError", "check_data_file", "resolve_data_path"]


def data_format(name: str) -> type[Data]:
    """The class of data.format=`name`; a DataError naming the known ones."""
    if name not in FORMATS:
        raise DataError(
            f"data.format={name!r} is unknown; choose one of {list(FORMATS)} (lines: one item per "
            f"line, like names; text: one stream, like a play; repeats: generated items where a "
            f"random span repeats)"
        )
    return FORMATS[name]


def load_data(settings, block_size=None, device="cpu", trim=True) -> Data:
    """The data that `settings` (a config.DataConfig: its format reads its own keys) name, on
    `device`. block_size None: the format's (lines: the longest item + 1)."""
    return data_format(settings.format).load(settings, block_size, device, trim)


def checkpoint_format(ckpt) -> type[Data]:
    """The format a checkpoint's run trained on (lines for one that names none)."""
    return data_format(ckpt.data.get("format", "lines"))


def data_of_checkpoint(ckpt, device="cpu") -> Data:
    """The evaluation data of the run that wrote `ckpt` (a loaded Checkpoint); a DataError says
    what is missing or changed, and what to do."""
    return checkpoint_format(ckpt).from_checkpoint(ckpt, device)
