"""What `python sample.py` does but printing: find and load a checkpoint, sample names (marked new
or found in a split) or passages (with their longest stretch found verbatim in the training
text), and write `out` if asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from microgpt.checkpoint import Checkpoint
from microgpt.config import SampleConfig, load_config
from microgpt.data.dataset import (
    REPO_ROOT,
    Data,
    DataError,
    checkpoint_format,
    data_of_checkpoint,
    resolve_data_path,
)
from microgpt.files import STDOUT, check_new_file, write_text
from microgpt.runs import RUN_ROOTS, RunFolderError, latest_checkpoint, resolve
from microgpt.sample.generate import SamplingError
from microgpt.sample.report import PASSAGE_LENGTH, sample_for_run
from microgpt.system import check_memory, items_bytes, pick_device, set_threads

NAMES, PASSAGES = 20, 3  # num_samples=null: names of a lines run, passages of a text run


@dataclass
class SampleResult:
    """What one sampling run produced; `lines` is what sample.py prints."""

    names: list[str]
    marked: list[tuple[str, str]]  # (name, "new" | "train" | "val" | "test" | "empty")
    step: int | None  # the checkpoint's
    lines: list[str]  # the header, notes, one line per item, a summary
    stdout: list[str] | None = None  # out=-: what goes to standard output (what out= would write)


def find_checkpoint(ckpt: str | None = None, run: str | None = None, roots=RUN_ROOTS) -> Path:
    """`ckpt` (Checkpoint.load says what is wrong with it, if anything); else the default
    checkpoint of the run `run` names; else that of the newest run under `roots`."""
    if ckpt is not None:
        return Path(ckpt).expanduser()
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
            f"last.pt. Train one first: python train.py heads=4 (or pass ckpt=PATH or run=FOLDER)"
        )
    return latest


def check_out(out, checkpoint: Path, data_path, overwrite: bool, items: set[str]) -> Path | None:
    """The file `out=` may write (files.check_new_file), never the checkpoint sampled from, nor the
    run's data file (a relative path from wherever it was resolved), nor any file that lists every
    item of the run's split (the data, found by content). None: no out=, or out=- (stdout)."""
    if out is None or out == STDOUT:
        return None
    protected = {checkpoint: "the checkpoint being sampled from"}
    if data_path:
        p = Path(data_path).expanduser()
        tried = [Path.cwd() / p, resolve_data_path(data_path), REPO_ROOT / p]
        protected |= dict.fromkeys(tried, "the data file the model was trained on")
    target = check_new_file(out, "out", overwrite, protected)  # an OutputRefused names out=
    if items and target.exists() and _holds_items(target, items):
        raise SamplingError(
            f"out={out} holds every item of the model's train/val/test split: it is the data the "
            f"model was trained on (or a copy); out= never replaces it: write elsewhere"
        )
    return target


def _holds_items(path: Path, items: set[str]) -> bool:
    """Whether the file at `path` lists every one of `items`, one per line (a data file)."""
    if path.stat().st_size > 1 << 30:  # too big to read: no file of sampled names either
        return True
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    return items <= {line.strip() for line in lines}


def sample_from_config(cfg, progress=None) -> SampleResult:
    """Everything `python sample.py` does but printing; `progress(done, total)` follows each batch
    of names."""
    # every setting that does not need the model, before any loading
    c = load_config(cfg, SampleConfig)
    device = pick_device(c.device, SamplingError)
    set_threads(c.threads)
    path = find_checkpoint(c.ckpt, c.run)
    ckpt = Checkpoint.load(path, map_location="cpu")
    model, tokenizer = ckpt.build_model(device)
    data, notes = _data(ckpt, tokenizer)
    split = data.split if data.boundary else None  # the items of a run: names, not passages
    items = {*split.train, *split.val, *split.test} if split is not None else set()
    out = check_out(c.out, path, ckpt.data.get("path"), c.overwrite, items)
    count = c.num_samples if c.num_samples is not None else (NAMES if data.boundary else PASSAGES)
    length = model.config.block_size if data.boundary else (c.max_len or PASSAGE_LENGTH)
    what = f"num_samples={count:,} of up to {length:,} characters"  # this machine's memory
    fix = "sample fewer at a time (repeat with other seeds for more)"
    check_memory(items_bytes(count, length), torch.device("cpu"), what, fix, SamplingError)
    seed = c.seed if c.seed is not None else int.from_bytes(os.urandom(4), "little")
    names = ("prefix", "max_len", "use_cache", "temperature", "top_k", "top_p", "batch_size")
    settings = {name: getattr(c, name) for name in names}
    try:
        shown = sample_for_run(model, data, count, seed, progress=progress, **settings)
    except KeyboardInterrupt as e:  # Ctrl-C says that nothing was written
        signame = e.args[0] if e.args else "SIGINT"
        where = f"; nothing was written to out={c.out}" if c.out is not None else ""
        raise KeyboardInterrupt(signame, f"sampling stopped, the items were discarded{where}")
    metrics = ckpt.metrics  # names -> numbers (Checkpoint.load checks it); none: n/a
    val_loss = metrics.get("val_loss", metrics.get("best_val_loss"))
    loss = "n/a" if val_loss is None else f"{val_loss:.4f}"
    step = "?" if ckpt.step is None else ckpt.step
    header = f"checkpoint {path} (step {step}, val loss {loss}), seed {seed}"
    if out is not None:  # atomically, as a new file unless overwrite: an error (a file made
        try:  # there by something else while sampling: File exists) leaves it, and names out=
            write_text(out, "".join(line + "\n" for line in shown.written), replace=c.overwrite)
        except OSError as e:
            raise SamplingError(f"cannot write out={c.out}: {e.strerror or e}") from None
    lines = [header, *notes, *([f"[{shown.note}]"] if shown.note else []), *shown.lines]
    stdout = shown.written if c.out == STDOUT else None  # the report then goes to stderr
    return SampleResult(shown.items, shown.marked or [], ckpt.step, lines, stdout)


def _data(ckpt, tokenizer) -> tuple[Data, list[str]]:
    """The run's data, for the marks of names or the memorisation of passages; without it (a
    DataError), its format with the tokenizer alone, and a note that says why."""
    try:
        return data_of_checkpoint(ckpt), []
    except DataError as e:
        fmt = checkpoint_format(ckpt)
        lost = "every item is marked new" if fmt.boundary else "memorisation not measured"
        block_size = int(ckpt.model_config["block_size"])
        return fmt(ckpt.data.get("path") or "", tokenizer, None, block_size, {}), [f"[{lost}: {e}]"]


def run_sampling(**settings) -> SampleResult:
    """sample_from_config with keyword arguments: run_sampling(ckpt=..., num_samples=5, seed=0)."""
    return sample_from_config(SampleConfig(**settings))
