"""What `python sample.py` does: find and load a checkpoint, sample, mark each item new or found
in a split (names) or measure its longest stretch found verbatim in the training text (passages
of a text run), and write `out` if asked. It prints nothing: sample.py prints the SampleResult.

The decoding itself is microgpt.sample.generate; the settings are microgpt.config.SampleConfig.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from microgpt.config import SampleConfig, load_config
from microgpt.data.dataset import DataError, data_of_checkpoint, resolve_data_path
from microgpt.data.lines import Split
from microgpt.files import STDOUT, OutputRefused, check_new_file, write_text
from microgpt.runs import RUN_ROOTS, RunFolderError, latest_checkpoint, resolve
from microgpt.sample.generate import SamplingError
from microgpt.sample.report import PASSAGE_LENGTH, Samples, sample_names, sample_passages
from microgpt.system import available_memory, gib, pick_device, set_threads
from microgpt.train.checkpoint import Checkpoint

TRAIN_COMMAND = "python train.py heads=4"
PROJECT = Path(__file__).resolve().parent.parent  # where relative data paths are also tried
NAMES, PASSAGES = 20, 3  # num_samples=null: names of a lines run, passages of a text run


@dataclass
class SampleResult:
    """What one sampling run produced; `lines` is what sample.py prints."""

    names: list[str]
    marked: list[tuple[str, str]]  # (name, "new" | "train" | "val" | "test")
    checkpoint: Path
    step: int | None
    val_loss: float | None
    seed: int
    seconds: float  # sampling only, without loading
    header: str = ""
    lines: list[str] = field(default_factory=list)  # header, one line per item, summary
    to_stdout: bool = False  # out=-: the items alone go to standard output, the report to stderr

    @property
    def summary(self) -> str:
        return self.lines[-1] if self.lines else ""

    @property
    def num_new(self) -> int:
        return sum(where == "new" for _, where in self.marked)

    @property
    def num_unique(self) -> int:
        return len(set(self.names) - {""})  # an empty item is not a name


def find_checkpoint(ckpt: str | None = None, run: str | None = None, roots=None) -> Path:
    """The checkpoint to sample from: `ckpt`; else the default checkpoint of the run `run` names
    (microgpt.runs.resolve: a run folder, its checkpoints/ folder or a checkpoint); else that of
    the run written to most recently under `roots` (outputs/, multirun/)."""
    roots = RUN_ROOTS if roots is None else roots
    if ckpt is not None:
        return Path(ckpt).expanduser()  # Checkpoint.load says what is wrong with it, if anything
    if run is not None:
        try:
            return resolve(run)[1]
        except RunFolderError as e:
            raise SamplingError(f"run={run}: {e}") from None
    latest = latest_checkpoint(roots)
    if latest is None:
        where = " or ".join(f"{r}/" for r in roots)
        raise SamplingError(
            f"no checkpoint found: no run under {where} in {Path.cwd()} has checkpoints/best.pt or "
            f"last.pt. Train one first: {TRAIN_COMMAND} (or pass ckpt=PATH or run=FOLDER)"
        )
    return latest


def check_out(
    out: str,
    checkpoint: Path,
    data_path: str | None = None,
    overwrite: bool = False,
    items: set[str] | None = None,
) -> Path | None:
    """The file `out=` may write (microgpt.files.check_new_file: a new file, or an existing one
    with overwrite=true; never a device, a run folder's file or a config file), never the
    checkpoint sampled from nor the run's data file, wherever a relative data path was resolved
    from, nor any file that lists every item of the run's split (`items`): the data, found by
    content. out=- is standard output: None."""
    if out == STDOUT:
        return None
    protected = {checkpoint: "the checkpoint being sampled from"}
    if data_path:
        for candidate in data_candidates(data_path):
            protected[candidate] = "the data file the model was trained on"
    try:
        target = check_new_file(out, "out", overwrite, protected)
    except OutputRefused as e:
        raise SamplingError(str(e)) from None
    if items and target.exists() and _holds_items(target, items):
        raise SamplingError(
            f"out={out} holds every item of the model's train/val/test split: it is the data the "
            f"model was trained on (or a copy); out= never replaces it: write elsewhere"
        )
    return target


def _holds_items(path: Path, items: set[str]) -> bool:
    """Whether the file at `path` lists every one of `items`, one per line (a data file)."""
    if path.stat().st_size > 1 << 30:
        return True  # too big to read for the check: not a file of sampled names either
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    return items <= {line.strip() for line in lines}


def data_candidates(data_path: str) -> list[Path]:
    """Every file a checkpoint's data.path may have meant: as given, from the working directory,
    and from the project (relative paths are tried from both, microgpt.data.resolve_data_path)."""
    p = Path(data_path).expanduser()
    if p.is_absolute():
        return [p]
    return [Path.cwd() / p, resolve_data_path(data_path), PROJECT / p]


def write_lines(path: str | os.PathLike, lines: list[str], overwrite: bool = False) -> Path:
    """Write lines to `path` atomically, as a new file unless overwrite: an error leaves the old
    file."""
    return write_text(path, "".join(line + "\n" for line in lines), replace=overwrite)


# what one sampled item costs in memory until it is printed: the string (about 50 bytes and its
# characters), its place in the lists, its (item, where) mark and its printed line
ITEM_BYTES = 200


def check_items_fit(num_samples: int, length: int) -> None:
    """Refuse, before sampling, a number of items of up to `length` characters that this
    machine's memory cannot hold."""
    need = num_samples * (ITEM_BYTES + 3 * length)
    free = available_memory(torch.device("cpu"))
    if free is not None and need > free // 2:
        fits = max(1, free // 2 // (ITEM_BYTES + 3 * length))
        raise SamplingError(
            f"num_samples={num_samples} would hold about {gib(need)} of items in memory, more "
            f"than half of the {gib(free)} available; sample at most {fits:,} at a time (repeat "
            f"with other seeds for more)"
        )


def sample_from_config(cfg, progress=None) -> SampleResult:
    """Everything `python sample.py` does but printing: validate, find and load the checkpoint,
    sample, mark each item, and write `out` if asked. Returns a SampleResult. `progress(done,
    total)` is called after each batch of names."""
    c = load_config(
        cfg, SampleConfig
    )  # every setting that does not need the model, before any loading
    device = pick_device(c.device, SamplingError)
    set_threads(c.threads)
    path = find_checkpoint(c.ckpt, c.run)
    ckpt = Checkpoint.load(path, map_location="cpu")
    data_path = ckpt.data.get("path")
    text_run = ckpt.data.get("format") == "text"
    try:
        split = Split.from_dict(ckpt.split) if ckpt.split is not None else None
    except DataError:
        split = None
    lists = ("train", "val", "test") if not text_run else ()  # a text run's split: no items
    items = {i for name in lists for i in getattr(split, name, None) or []}
    out = check_out(c.out, path, data_path, c.overwrite, items) if c.out is not None else None
    model, tokenizer = ckpt.build_model(device)
    count = c.num_samples if c.num_samples is not None else (PASSAGES if text_run else NAMES)
    length = (c.max_len or PASSAGE_LENGTH) if text_run else model.config.block_size
    check_items_fit(count, length)
    seed = c.seed if c.seed is not None else int.from_bytes(os.urandom(4), "little")

    start = time.perf_counter()
    try:
        if text_run:
            shown, notes = _passages(ckpt, model, tokenizer, c, seed)
        else:
            shown, notes = _names(model, tokenizer, split, c, seed, progress), []
    except KeyboardInterrupt as e:
        signame = e.args[0] if e.args else "SIGINT"
        where = f"; nothing was written to out={c.out}" if c.out is not None else ""
        raise KeyboardInterrupt(signame, f"sampling stopped, the items were discarded{where}")
    seconds = time.perf_counter() - start
    names, marked = shown.items, shown.marked or []

    metrics = ckpt.metrics
    metrics = metrics if isinstance(metrics, dict) else {}  # a hand-edited one: shown as n/a
    val_loss = metrics.get("val_loss", metrics.get("best_val_loss"))
    step = ckpt.step
    header = (
        f"checkpoint {path} (step {step if step is not None else '?'}, val loss "
        f"{f'{val_loss:.4f}' if isinstance(val_loss, (int, float)) else 'n/a'}), seed {seed}"
    )
    if split is None and not text_run:
        header += " [no data split in this checkpoint: every item is marked new]"
    if out is not None:
        try:
            write_lines(out, shown.lines[:-1] if text_run else names, c.overwrite)
        except FileExistsError:
            raise SamplingError(
                f"out={c.out} was created by something else while sampling; it is kept, and "
                f"nothing was written: name a new file"
            ) from None
        except OSError as e:
            raise SamplingError(f"cannot write out={c.out}: {e.strerror or e}") from None
    return SampleResult(
        names=names,
        marked=marked,
        checkpoint=path,
        step=step,
        val_loss=val_loss,
        seed=seed,
        seconds=seconds,
        header=header,
        lines=[header, *notes, *shown.lines],
        to_stdout=c.out == STDOUT,
    )


def run_sampling(**settings) -> SampleResult:
    """sample_from_config with keyword arguments: run_sampling(ckpt=..., num_samples=5, seed=0)."""
    return sample_from_config(SampleConfig(**settings))


def _names(model, tokenizer, split, c: SampleConfig, seed: int, progress=None) -> Samples:
    return sample_names(
        model,
        tokenizer,
        split,
        c.num_samples if c.num_samples is not None else NAMES,
        seed,
        prefix=c.prefix,
        temperature=c.temperature,
        top_k=c.top_k,
        top_p=c.top_p,
        batch_size=c.batch_size,
        use_cache=c.use_cache,
        max_len=c.max_len,
        progress=progress,
    )


def _passages(ckpt: Checkpoint, model, tokenizer, c: SampleConfig, seed: int):
    """A text run's passages, and notes for the output: the prompt cut to the context, or why the
    longest verbatim stretch is not measured (the run's text file missing or changed)."""
    notes = []
    try:
        index = data_of_checkpoint(ckpt).verbatim_index
    except DataError as e:
        index = None
        notes.append(f"[memorisation not measured: {e}]")
    shown = sample_passages(
        model,
        tokenizer,
        index,
        c.num_samples if c.num_samples is not None else PASSAGES,
        seed,
        prompt=c.prefix,
        max_new=c.max_len,
        temperature=c.temperature,
        top_k=c.top_k,
        top_p=c.top_p,
        use_cache=c.use_cache,
    )
    if shown.note:
        notes.append(f"[{shown.note}]")
    return shown, notes
