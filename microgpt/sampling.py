"""What `python sample.py` does: find and load a checkpoint, sample, mark each item new or found
in a split (names) or measure its longest stretch found verbatim in the training text (passages
of a text run), and write `out` if asked. It prints nothing: sample.py prints the SampleResult.

The decoding itself is microgpt.generate; the settings are microgpt.config.SampleConfig.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from microgpt.checkpoint import load_checkpoint, model_from_checkpoint
from microgpt.config import SampleConfig, load_config
from microgpt.data import DataError, data_of_checkpoint
from microgpt.distributed import pick_device
from microgpt.files import write_text
from microgpt.generate import SamplingError
from microgpt.lines import Split
from microgpt.runs import RUN_ROOTS, RunFolderError, latest_checkpoint, resolve
from microgpt.samples import Samples, sample_names, sample_passages
from microgpt.threads import set_threads

TRAIN_COMMAND = "python train.py heads=4"
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
        return Path(ckpt).expanduser()  # load_checkpoint says what is wrong with it, if anything
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


def check_out(out: str, checkpoint: Path, data_path: str | None = None) -> Path:
    """The file `out=` may write: a new path, or an existing regular text file that is not part of
    a run. Refused: the checkpoint itself, anything in a run's checkpoints/ or a run folder's own
    files, the run's data file, a device, FIFO or other non-regular file, and a file that is not
    UTF-8 text (a checkpoint, an image...). A symlink is followed: its target is what is checked
    and written. Returns the path to write."""
    target = Path(os.path.realpath(Path(out).expanduser()))
    if target == Path(os.path.realpath(checkpoint)):
        raise SamplingError(f"out={out} is the checkpoint being sampled from; write elsewhere")
    if target.parent.name == "checkpoints":
        raise SamplingError(f"out={out} is inside a run's checkpoints/ folder; write elsewhere")
    if data_path and target == Path(os.path.realpath(Path(data_path).expanduser())):
        raise SamplingError(f"out={out} is the data file the model was trained on; write elsewhere")
    if not target.exists():
        return target
    if not target.is_file():
        raise SamplingError(
            f"out={out} is not a regular file (a device, FIFO or socket); out= writes only to "
            f"regular files or new paths"
        )
    if (target.parent / "checkpoints").is_dir():
        raise SamplingError(
            f"out={out} is a file of the run folder {target.parent}; write elsewhere"
        )
    with open(target, "rb") as f:
        head = f.read(1 << 16)
    try:
        head.decode("utf-8")
        text = b"\0" not in head
    except UnicodeDecodeError as e:
        text = e.start > len(head) - 4  # a character cut at the end of what was read
    if not text:
        raise SamplingError(
            f"out={out} exists and is not a text file of names; refusing to overwrite it "
            f"(remove it first, or write elsewhere)"
        )
    return target


def write_lines(path: str | os.PathLike, lines: list[str]) -> Path:
    """Write lines to `path` atomically: an error leaves the old file."""
    return write_text(Path(path).expanduser(), "".join(line + "\n" for line in lines))


def sample_from_config(cfg) -> SampleResult:
    """Everything `python sample.py` does but printing: validate, find and load the checkpoint,
    sample, mark each item, and write `out` if asked. Returns a SampleResult."""
    c = load_config(
        cfg, SampleConfig
    )  # every setting that does not need the model, before any loading
    device = pick_device(c.device, SamplingError)
    set_threads(c.threads)
    path = find_checkpoint(c.ckpt, c.run)
    ckpt = load_checkpoint(path, map_location="cpu")
    data_path = (ckpt.get("train_config") or {}).get("data", {}).get("path")
    out = check_out(c.out, path, data_path) if c.out is not None else None
    model, tokenizer = model_from_checkpoint(ckpt, device=device, path=path)
    try:
        split = Split.from_dict(ckpt["split"]) if "split" in ckpt else None
    except DataError:
        split = None
    seed = c.seed if c.seed is not None else int.from_bytes(os.urandom(4), "little")
    text_run = ((ckpt.get("train_config") or {}).get("data") or {}).get("format") == "text"

    start = time.perf_counter()
    try:
        if text_run:
            shown, notes = _passages(ckpt, model, tokenizer, c, seed)
        else:
            shown, notes = _names(model, tokenizer, split, c, seed), []
    except KeyboardInterrupt:
        where = f"; nothing was written to out={c.out}" if c.out is not None else ""
        raise KeyboardInterrupt("SIGINT", f"sampling stopped, the items were discarded{where}")
    seconds = time.perf_counter() - start
    names, marked = shown.items, shown.marked or []

    metrics = ckpt.get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}  # a hand-edited one: shown as n/a
    val_loss = metrics.get("val_loss", metrics.get("best_val_loss"))
    step = ckpt.get("step")
    header = (
        f"checkpoint {path} (step {step if step is not None else '?'}, val loss "
        f"{f'{val_loss:.4f}' if isinstance(val_loss, (int, float)) else 'n/a'}), seed {seed}"
    )
    if split is None and not text_run:
        header += " [no data split in this checkpoint: every item is marked new]"
    if c.out is not None:
        try:
            write_lines(out, shown.lines[:-1] if text_run else names)
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
    )


def run_sampling(**settings) -> SampleResult:
    """sample_from_config with keyword arguments: run_sampling(ckpt=..., num_samples=5, seed=0)."""
    return sample_from_config(SampleConfig(**settings))


def _names(model, tokenizer, split, c: SampleConfig, seed: int) -> Samples:
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
    )


def _passages(ckpt: dict, model, tokenizer, c: SampleConfig, seed: int):
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
