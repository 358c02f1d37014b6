"""What the microgpt tab shows, as JSON (`RunStore`): the runs under a log directory, and every
head's attention of one run's checkpoint on a typed input, loaded lazily and safely onto the CPU
into a bounded cache (cached_model). A user's mistake is an `InputError`, which the page shows."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tensorboard.backend.event_processing.data_ingester import _parse_event_files_spec

from microgpt.checkpoint import Checkpoint, CheckpointError
from microgpt.data.dataset import Data, DataError, checkpoint_format
from microgpt.files import read_regular
from microgpt.runs import RunFolder, RunFolderError, find_runs
from microgpt.tokenizer import CharTokenizer

MAX_MODELS = 8  # models kept loaded at once
DIGITS = 3  # attention weights are sent rounded to this many decimals


class InputError(ValueError):
    """Something the page shows its user as it is: a bad input, a missing or damaged checkpoint."""


@dataclass
class Loaded:
    """A checkpoint's model, ready to run, and what the tab needs to know of it."""

    model: torch.nn.Module
    tokenizer: CharTokenizer
    format: type[Data]
    step: int
    example: str | None  # the first validation item, for a names run


def log_dirs(logdir: str | None, logdir_spec: str | None = None) -> dict[str, Path]:
    """{group name ("" for none): folder} from TensorBoard's --logdir, else its --logdir_spec
    (`name:/path,/other/path`, parsed by TensorBoard's own parser); {} without either."""
    if logdir:
        return {"": Path(logdir).expanduser()}
    paths = _parse_event_files_spec(logdir_spec or None)  # {path: group name, or None}
    return {name or "": Path(path) for path, name in paths.items()}


def runs_under(roots: dict[str, Path]) -> dict[str, RunFolder]:
    """{name: run} for every run (runs.find_runs) under the log dirs, named by its path from its
    log dir ("heads=2"; the run's own name when the log dir is the run), after the dir's group."""
    found = {}
    for group, root in roots.items():
        with contextlib.suppress(RunFolderError, OSError):  # no runs there, or unreadable
            for run in find_runs(root):
                found["/".join(filter(None, (group, run.name_under(root))))] = run
    return found


def checkpoints_of(run: RunFolder) -> list[str]:
    """`run`'s checkpoints: best.pt (the default), last.pt, then step-N.pt in step order."""
    names = [p.name for p in (run.best, run.last) if p.is_file()]
    names += sorted(p.name for p in run.checkpoints.glob("step-*.pt") if p.is_file())
    return names


@functools.lru_cache(maxsize=MAX_MODELS)  # thread-safe; the file's size and time in the key
def load_model(path: Path, size: int, mtime_ns: int) -> Loaded:
    """Load a checkpoint safely onto the CPU (cached_model: once per size and time); an InputError
    saying what is wrong with it."""
    try:
        ckpt = Checkpoint.load(path, map_location="cpu")
        model, tokenizer = ckpt.build_model("cpu")
        # the schema's split: lists of items (names), or a text's bounds (no "val")
        example = next(iter((ckpt.split or {}).get("val") or []), None)
        return Loaded(model, tokenizer, checkpoint_format(ckpt), ckpt.step or 0, example)
    except (CheckpointError, DataError) as e:
        raise InputError(str(e)) from None
    except Exception as e:  # anything else (a model that cannot be built): this run only
        raise InputError(f"{path} cannot be read ({type(e).__name__}: {e})") from None


def cached_model(path: Path) -> Loaded:
    """load_model, through a cache of the MAX_MODELS checkpoints used last; a checkpoint rewritten
    since (another size or time) is loaded again."""
    try:
        stat = path.stat()
    except OSError:
        raise InputError(f"checkpoint {path} does not exist") from None
    return load_model(path, stat.st_size, stat.st_mtime_ns)


def read_analysis(path: Path) -> tuple[dict | None, str | None]:
    """(the head analysis at `path`, None) if it can be read; (None, why not) if it is there but
    is not one (a FIFO, not JSON, another shape); (None, None) if there is none."""
    if not os.path.lexists(path):
        return None, None
    try:
        analysis = json.loads(read_regular(path))
    except (OSError, ValueError) as e:
        return None, f"{path.name} cannot be read: {getattr(e, 'strerror', None) or e}"
    heads = analysis.get("heads") if isinstance(analysis, dict) else None
    if not isinstance(heads, list) or not all(isinstance(row, dict) for row in heads):
        return None, f"{path.name} is not a head analysis (no list of heads)"
    return analysis, None


def head_labels(analysis: dict | None, n_layer: int, n_head: int) -> list[list[dict | None]]:
    """[layer][head] -> {"role", "score", "importance"} (a field of another type: None); None
    without this model's analysis."""
    labels = [[None] * n_head for _ in range(n_layer)]
    if not analysis or (analysis.get("n_layer"), analysis.get("n_head")) != (n_layer, n_head):
        return labels
    for row in analysis["heads"]:
        layer, head = row.get("layer"), row.get("head")
        if isinstance(layer, int) and isinstance(head, int) and layer < n_layer and head < n_head:
            role = row.get("role")
            labels[layer][head] = {
                "role": role if isinstance(role, str) else "?",
                "score": _number(row.get("score")),
                "importance": _number(row.get("zero_importance")),
            }
    return labels


def _number(x) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return x if ok else None


class RunStore:
    """The runs under the log dirs (log_dirs) and their models, as the tab asks for them."""

    def __init__(self, roots: dict[str, Path]):
        self.roots = roots  # {} when TensorBoard was started without --logdir: no runs

    def runs(self) -> list[dict]:
        """Every run: its name, its checkpoints (the default first) and those analysed; a run
        whose folder cannot be listed, with why."""
        out = []
        for name, run in runs_under(self.roots).items():
            try:
                checkpoints = checkpoints_of(run)
                analysed = [c for c in checkpoints if run.analysis(c).is_file()]
                out.append({"name": name, "checkpoints": checkpoints, "analysed": analysed})
            except OSError as e:
                error = f"{name} cannot be read: {e.strerror or e}"
                out.append({"name": name, "checkpoints": [], "analysed": [], "error": error})
        return out

    def example(self) -> str | None:
        """An input to start with: the first validation name of the first run that has one."""
        for run in runs_under(self.roots).values():
            with contextlib.suppress(InputError, OSError):  # an unreadable folder: the next run
                default = run.default_checkpoint()  # None: no checkpoint yet
                if default is not None and (example := cached_model(default).example):
                    return example
        return None

    @torch.no_grad()
    def attention(self, name: str, checkpoint: str | None, text: str) -> dict:
        """What one run's panel shows for `text`; an InputError the page shows instead."""
        if not self.roots:
            raise InputError("TensorBoard was started without --logdir")
        run = runs_under(self.roots).get(name)
        if run is None:
            raise InputError(f"no run {name!r} under {', '.join(map(str, self.roots.values()))}")
        checkpoints = checkpoints_of(run)
        if not checkpoints:
            raise InputError(
                f"{name} has no checkpoint yet (checkpoints/best.pt or last.pt): it is still "
                f"training or it stopped before its first evaluation"
            )
        checkpoint = checkpoint or checkpoints[0]
        if checkpoint not in checkpoints:
            raise InputError(f"{name} has no checkpoint {checkpoint!r}; it has {checkpoints}")
        try:
            loaded = cached_model(run.checkpoints / checkpoint)
        except InputError as e:
            raise InputError(f"{name}: {e}") from None
        config = loaded.model.config
        if not text:
            raise InputError(f"type {loaded.format.user_input} to see {name}'s heads at work")
        try:  # the format's input ids: after the boundary token as trained (<s>emma), but for text
            ids = loaded.format.input_ids(loaded.tokenizer, text, config.block_size, "input")
        except DataError as e:  # unknown characters, or too many
            raise InputError(f"{name}: {e}") from None
        # the head analysis (python -m microgpt.heads), where there is one that can be read
        analysis, unreadable = read_analysis(run.analysis(checkpoint))
        _, _, attention = loaded.model.forward_with_attention(torch.tensor([ids]))
        return {
            "run": name,
            "checkpoint": checkpoint,
            "step": loaded.step,
            "format": loaded.format.name,
            "boundary": loaded.format.boundary,  # the tokens start with the boundary token
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "tokens": loaded.tokenizer.labels(ids),
            # [layer][head] -> (T, T) rows of weights, query by key
            "layers": [att[0].double().round(decimals=DIGITS).tolist() for att in attention],
            "analysis": run.analysis(checkpoint).name if analysis else unreadable,
            "heads": head_labels(analysis, config.n_layer, config.n_head),
        }
