"""What the microgpt tab shows, as JSON: the runs under a log directory, and every head's
attention of one run's checkpoint on a typed input.

    store = RunStore("multirun/2026-11-23/21-25-00")
    store.runs()                    # [{"name": "heads=1", "checkpoints": [...], ...}, ...]
    store.attention("heads=2", "best.pt", "emma")
    # {"tokens": ["<s>", "e", "m", "m", "a"], "layers": [[head 0's (T, T) map, ...], ...],
    #  "heads": [[{"role": "previous", "score": 0.59, "importance": 0.25}, ...], ...], ...}

Every question about run folders and checkpoints goes through the four small functions under
"runs and checkpoints" below (microgpt.runs finds them, microgpt.train.checkpoint loads them
safely, with `weights_only=True` and its checksum). Models are loaded lazily on the CPU and kept
in `ModelCache`, an LRU bounded by count and by bytes. A user's mistake (an unknown character, an
input longer than the context, a run with no checkpoint, a damaged one) is an `InputError` whose
message the page shows as it is.

Boundary handling follows the run's data format: a names run (lines) reads an item after the
boundary token, as it was trained (`<s>emma`); a text run reads the characters alone.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from microgpt.runs import RunFolder, RunFolderError, find_runs
from microgpt.tokenizer import CharTokenizer
from microgpt.train.checkpoint import Checkpoint, CheckpointError
from microgpt.viz.tensorboard import labels_for

MAX_MODELS = 8  # models kept loaded at once
MAX_BYTES = 512 * 2**20  # and their weights' bytes at most
DIGITS = 3  # attention weights are sent rounded to this many decimals


class InputError(ValueError):
    """Something the page shows its user as it is: a bad input, a missing or damaged checkpoint."""


# ----------------------------------------------------------------------------- runs and checkpoints


@dataclass
class Loaded:
    """A checkpoint's model, ready to run, and what the tab needs to know of it."""

    model: torch.nn.Module
    tokenizer: CharTokenizer
    format: str  # "lines" (names), "text" or "repeats"
    step: int
    example: str | None  # the first validation item, for a names run

    @property
    def nbytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)


def runs_under(logdir: str | os.PathLike) -> dict[str, RunFolder]:
    """{name: run} for every microgpt run under `logdir`, named by its path from there
    ("heads=2"; the folder's own name when `logdir` is the run); {} when there are none."""
    root = Path(logdir).expanduser()
    try:
        found = [run for run in find_runs(root) if run.holds_run()]
    except RunFolderError:
        return {}
    return {_name(run.path, root): run for run in found}


def _name(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path != root else root.name


def checkpoints_of(run: RunFolder) -> list[str]:
    """The checkpoint files of `run`, its default (best.pt, else last.pt) first, then the other
    of the two, then step-N.pt in step order."""
    default = run.default_checkpoint()
    names = [p.name for p in (run.best, run.last) if p.is_file()]
    names += sorted(p.name for p in run.checkpoints.glob("step-*.pt") if p.is_file())
    if default is not None:
        names.remove(default.name)
        names.insert(0, default.name)
    return names


def checkpoint_file(run: RunFolder, checkpoint: str) -> Path:
    return run.checkpoints / checkpoint


def analysis_file(run: RunFolder, checkpoint: str) -> Path:
    """Where the head analysis of `checkpoint` lies (heads-<name>.json, written by python -m
    microgpt.heads)."""
    return run.analysis(checkpoint)


def analysis_of(run: RunFolder, checkpoint: str) -> dict | None:
    """The head analysis of `checkpoint`, or None when there is none or it cannot be read."""
    try:
        return json.loads(analysis_file(run, checkpoint).read_text())
    except (OSError, ValueError):
        return None


def load_model(path: Path) -> Loaded:
    """Load a checkpoint safely onto the CPU; an InputError saying what is wrong with it."""
    try:
        ckpt = Checkpoint.load(path, map_location="cpu")
        model, tokenizer = ckpt.build_model("cpu")
    except CheckpointError as e:
        raise InputError(str(e)) from None
    data = ckpt.data
    val = ckpt.split.get("val") if isinstance(ckpt.split, dict) else None
    return Loaded(
        model=model,
        tokenizer=tokenizer,
        format=data.get("format", "lines"),
        step=int(ckpt.step or 0),
        example=val[0] if isinstance(val, list) and val else None,
    )


# ----------------------------------------------------------------------------- the model cache


class ModelCache:
    """Loaded checkpoints, least recently used dropped first once more than `max_models` are
    held or their weights take more than `max_bytes`. A checkpoint rewritten since it was loaded
    (another size or time) is loaded again. Safe to share between the server's threads."""

    def __init__(self, max_models: int = MAX_MODELS, max_bytes: int = MAX_BYTES):
        self.max_models, self.max_bytes = max_models, max_bytes
        self._items: OrderedDict[tuple, Loaded] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> Loaded:
        try:
            stat = path.stat()
        except OSError:
            raise InputError(f"checkpoint {path} does not exist") from None
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            loaded = load_model(path)
            self._items[key] = loaded
            while len(self._items) > 1 and (
                len(self._items) > self.max_models or self.nbytes > self.max_bytes
            ):
                self._items.popitem(last=False)
            return loaded

    @property
    def nbytes(self) -> int:
        return sum(item.nbytes for item in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


# ----------------------------------------------------------------------------- inputs and maps


def encode_input(loaded: Loaded, text: str, run: str) -> list[int]:
    """The ids the model reads for `text`: after the boundary token for a names run (as it was
    trained), the characters alone for a text run. An InputError for an empty input, characters
    outside the vocabulary, or more characters than the model's context."""
    tok, block = loaded.tokenizer, loaded.model.config.block_size
    if not text:
        kind = "a name" if loaded.format != "text" else "a line of text"
        raise InputError(f"type {kind} to see {run}'s heads at work")
    unknown = tok.unknown_chars(text)
    if unknown:
        shown = ", ".join(repr(c) for c in unknown)
        raise InputError(
            f"{run} does not know {shown}: it was trained on these characters only: "
            f"{''.join(tok.chars)!r}"
        )
    start = [] if loaded.format == "text" else [tok.boundary_id]
    most = block - len(start)
    if len(text) > most:
        after = " after the boundary token" if start else ""
        raise InputError(
            f"{len(text)} characters are more than {run} reads: its context is {block} tokens, "
            f"so at most {most} characters{after}; shorten the input"
        )
    return start + tok.encode(text)


@torch.no_grad()
def attention_maps(model, ids: list[int]) -> list[list[list[list[float]]]]:
    """Every head's attention on `ids`: [layer][head] -> (T, T) rows of weights, query by key,
    rounded to DIGITS decimals."""
    idx = torch.tensor([ids], dtype=torch.long)  # (1, T)
    _, _, attention = model.forward_with_attention(idx)
    # each layer's (1, H, T, T) -> (H, T, T)
    return [att[0].double().round(decimals=DIGITS).tolist() for att in attention]


def head_labels(analysis: dict | None, n_layer: int, n_head: int) -> list[list[dict | None]]:
    """[layer][head] -> {"role", "score", "importance"} from a head analysis (importance: the
    loss rise when the head is zeroed), or None where the analysis is missing or is of another
    model."""
    labels = [[None] * n_head for _ in range(n_layer)]
    if not analysis or (analysis.get("n_layer"), analysis.get("n_head")) != (n_layer, n_head):
        return labels
    for row in analysis.get("heads", []):
        layer, head = row.get("layer"), row.get("head")
        if isinstance(layer, int) and isinstance(head, int) and layer < n_layer and head < n_head:
            labels[layer][head] = {
                "role": row.get("role"),
                "score": row.get("score"),
                "importance": row.get("zero_importance"),
            }
    return labels


# ----------------------------------------------------------------------------- the store


class RunStore:
    """The runs under one log directory and their models, as the tab asks for them."""

    def __init__(self, logdir: str | os.PathLike, cache: ModelCache | None = None):
        self.logdir = Path(logdir).expanduser()
        self.cache = cache or ModelCache()

    def runs(self) -> list[dict]:
        """Every run: its name, its checkpoints (the default first) and whether each is
        analysed."""
        out = []
        for name, run in runs_under(self.logdir).items():
            checkpoints = checkpoints_of(run)
            analysed = [c for c in checkpoints if analysis_file(run, c).is_file()]
            out.append({"name": name, "checkpoints": checkpoints, "analysed": analysed})
        return out

    def example(self) -> str | None:
        """An input to start with: the first validation name of the first run that has one."""
        for name, run in runs_under(self.logdir).items():
            checkpoints = checkpoints_of(run)
            try:
                loaded = self._load(name, run, checkpoints[0]) if checkpoints else None
            except InputError:
                continue
            if loaded is not None and loaded.example:
                return loaded.example
        return None

    def attention(self, name: str, checkpoint: str | None, text: str) -> dict:
        """What one run's panel shows for `text`; an InputError the page shows instead."""
        run = runs_under(self.logdir).get(name)
        if run is None:
            raise InputError(f"no run {name!r} under {self.logdir}")
        checkpoints = checkpoints_of(run)
        if not checkpoints:
            raise InputError(
                f"{name} has no checkpoint yet (checkpoints/best.pt or last.pt): it is still "
                f"training or it stopped before its first evaluation"
            )
        checkpoint = checkpoint or checkpoints[0]
        if checkpoint not in checkpoints:
            raise InputError(f"{name} has no checkpoint {checkpoint!r}; it has {checkpoints}")
        loaded = self._load(name, run, checkpoint)
        ids = encode_input(loaded, text, name)
        config = loaded.model.config
        analysis = analysis_of(run, checkpoint)
        return {
            "run": name,
            "checkpoint": checkpoint,
            "step": loaded.step,
            "format": loaded.format,
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "tokens": labels_for(ids, loaded.tokenizer),
            "layers": attention_maps(loaded.model, ids),
            "analysis": analysis_file(run, checkpoint).name if analysis else None,
            "heads": head_labels(analysis, config.n_layer, config.n_head),
        }

    def _load(self, name: str, run: RunFolder, checkpoint: str) -> Loaded:
        try:
            return self.cache.get(checkpoint_file(run, checkpoint))
        except InputError as e:
            raise InputError(f"{name}: {e}") from None
