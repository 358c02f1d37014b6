"""What the microgpt tab shows, as JSON (`RunStore`): the runs under a log directory; every
head's attention of one run's checkpoint on a typed input, with the head lab's fields
(microgpt/commands/tab/lab.py); a run's timeline. Checkpoints load lazily and safely onto the
CPU (Checkpoint.load) into a bounded cache (ModelCache); only what lies under the log dirs is
read (`inside`). Runs whose config.yaml differ only by seed form a group (microgpt.groups),
which the page shows seed by seed. A user's mistake is an `InputError`, which the page shows."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tensorboard.backend.event_processing.data_ingester import _parse_event_files_spec

from microgpt.checkpoint import Checkpoint, CheckpointError
from microgpt.commands.heads import analysis_rows, run_checkpoints
from microgpt.commands.tab.lab import LabError, lab, parse_ablation, parse_off, parse_pin
from microgpt.data.dataset import Data, DataError, checkpoint_format, data_of_checkpoint
from microgpt.files import read_json
from microgpt.groups import Group, group_name, group_runs
from microgpt.heads.analyse import length_batches
from microgpt.heads.circuits import mean_outputs
from microgpt.heads.measures import MEASURES
from microgpt.runs import RunFolder, RunFolderError, find_runs
from microgpt.tokenizer import CharTokenizer
from microgpt.viz.tensorboard import METRICS_FILE, VAL_LOSS, read_metrics

MAX_MODELS = 32  # models kept loaded at once: the slider's checkpoints of a sweep
MAX_BYTES = 512 * 2**20  # and their parameters' bytes at most (the last one loaded is kept)
STEP = re.compile(r"step-(\d+)\.pt")


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
    checkpoint: Checkpoint  # its settings and split (the weights are in `model`), for `means`
    lock: threading.RLock = field(default_factory=threading.RLock)  # one request at a time
    _means: torch.Tensor | None = None

    def means(self) -> torch.Tensor:
        """(L, H, hd) each head's mean output over the run's validation split, computed once, as
        the head analysis computes it (its rows, circuits.mean_outputs). A text run reads its text
        file again, at the path its checkpoint holds (a request names no path)."""
        with self.lock:
            if self._means is None:
                try:
                    rows = analysis_rows(data_of_checkpoint(self.checkpoint))
                except DataError as e:
                    raise InputError(f"ablation=mean needs the validation split: {e}") from None
                self._means = mean_outputs(self.model, length_batches(*rows))
            return self._means


def log_dirs(logdir: str | None, logdir_spec: str | None = None) -> dict[str, Path]:
    """{group name ("" for none): folder} from TensorBoard's --logdir, else its --logdir_spec
    (`name:/path,/other/path`, parsed by TensorBoard's own parser); {} without either."""
    if logdir:
        return {"": Path(logdir).expanduser()}
    paths = _parse_event_files_spec(logdir_spec or None)  # {path: group name, or None}
    return {name or "": Path(path) for path, name in paths.items()}


def runs_under(roots: dict[str, Path]) -> dict[str, RunFolder]:
    """{name: run} for every run (runs.find_runs) under the log dirs, named by its path from its
    log dir ("heads=2"; the run's own name when the log dir is the run), after the dir's group;
    not a folder reached through a link leading out of its log dir."""
    found = {}
    for group, root in roots.items():
        with contextlib.suppress(RunFolderError, OSError):  # no runs there, or unreadable
            for run in find_runs(root):
                if inside(root, run.path):
                    found["/".join(filter(None, (group, run.name_under(root))))] = run
    return found


def inside(folder: Path, path: Path) -> bool:
    """Whether `path`, its links followed, lies in `folder` (its links followed too)."""
    return path.resolve().is_relative_to(folder.resolve())


def checkpoints_of(run: RunFolder) -> list[str]:
    """`run`'s checkpoints: best.pt (the default), last.pt, then step-N.pt in step order."""
    return [p.name for p in run_checkpoints(run)]


def step_of(name: str, loaded: Loaded | None) -> int | None:
    """A checkpoint's step: from its name (step-000100.pt), else its model's, if loaded."""
    match = STEP.fullmatch(name)
    return int(match.group(1)) if match else loaded.step if loaded else None


def load_model(path: Path) -> Loaded:
    """Load a checkpoint safely onto the CPU; an InputError saying what is wrong with it."""
    try:
        ckpt = Checkpoint.load(path, map_location="cpu")
        model, tokenizer = ckpt.build_model("cpu")
        ckpt.model = {}  # the weights live in the model now
        # the schema's split: lists of items (names), or a text's bounds (no "val")
        example = next(iter((ckpt.split or {}).get("val") or []), None)
        return Loaded(model, tokenizer, checkpoint_format(ckpt), ckpt.step or 0, example, ckpt)
    except (CheckpointError, DataError) as e:
        raise InputError(str(e)) from None
    except Exception as e:  # anything else (a model that cannot be built): this run only
        raise InputError(f"{path} cannot be read ({type(e).__name__}: {e})") from None


class ModelCache:
    """The models of the checkpoints used last, at most MAX_MODELS of them and MAX_BYTES of
    parameters (the one loaded last is kept whatever its size); a checkpoint rewritten since
    (another size or time) is loaded again. Thread-safe; a load holds no lock, so other models
    are served meanwhile. `prefetch` loads checkpoints ahead in one background thread, only
    while they fit (it never pushes a model out): a slider's next step is then ready."""

    def __init__(self):
        self.models: OrderedDict[tuple, tuple[Loaded, int]] = OrderedDict()  # key: (loaded, bytes)
        self.lock = threading.Lock()
        self.pending: list[Path] = []  # checkpoints to prefetch, in order
        self.worker: threading.Thread | None = None  # the prefetching thread, while it runs

    def get(self, path: Path, load: bool = True) -> Loaded | None:
        """The model of checkpoint `path`, loaded if it is not here and `load` (else None)."""
        try:
            stat = path.stat()
        except OSError:
            raise InputError(f"checkpoint {path} does not exist") from None
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self.lock:
            if key in self.models:
                self.models.move_to_end(key)
                return self.models[key][0]
        if not load:
            return None
        loaded = load_model(path)  # (two threads may load one checkpoint at once: the last kept)
        size = sum(t.numel() * t.element_size() for t in loaded.model.state_dict().values())
        with self.lock:
            self.models[key] = (loaded, size)
            while len(self.models) > 1 and self._over():
                self.models.popitem(last=False)  # the one used longest ago
        return loaded

    def _over(self, count: int = 0, size: int = 0) -> bool:
        """Whether the models here, with `count` more of `size` bytes, pass a bound."""
        total = sum(n for _, n in self.models.values())
        return len(self.models) + count > MAX_MODELS or total + size > MAX_BYTES

    def prefetch(self, paths: list[Path]) -> None:
        """Load `paths` in the background, in order, until one would not fit."""
        with self.lock:
            self.pending += [p for p in paths if p not in self.pending]
            if self.worker is None:
                self.worker = threading.Thread(target=self._prefetching, daemon=True)
                self.worker.start()

    def _prefetching(self) -> None:
        while True:
            with self.lock:
                last = next(reversed(self.models.values()), (None, 0))[1]  # a model's bytes
                if not self.pending or self._over(1, last):
                    self.pending, self.worker = [], None
                    return
                path = self.pending.pop(0)
            with contextlib.suppress(InputError):  # a bad checkpoint: its request will say so
                self.get(path)


def read_analysis(path: Path) -> tuple[dict | None, str | None]:
    """(the head analysis at `path`, None) if it can be read; (None, why not) if it is there but
    is not one (a FIFO, not JSON, another shape); (None, None) if there is none."""
    if not os.path.lexists(path):
        return None, None
    try:
        analysis = read_json(path)  # bounded in size and depth
    except (OSError, ValueError) as e:
        return None, f"{path.name} cannot be read: {getattr(e, 'strerror', None) or e}"
    heads = analysis.get("heads") if isinstance(analysis, dict) else None
    if not isinstance(heads, list) or not all(isinstance(row, dict) for row in heads):
        return None, f"{path.name} is not a head analysis (no list of heads)"
    return analysis, None


def captioned() -> list[dict]:
    """The per-head measures the page shows on a head's caption: {"name", "caption" (its label
    there), "fmt" (a format spec: "+.2f"), "help"}."""
    keys = ("name", "caption", "fmt", "help")
    return [{k: getattr(m, k) for k in keys} for m in MEASURES if m.caption is not None]


def head_labels(analysis: dict | None, n_layer: int, n_head: int) -> list[list[dict | None]]:
    """[layer][head] -> {"role", and each captioned measure's value} (a field of another type:
    None); None without this model's analysis."""
    labels = [[None] * n_head for _ in range(n_layer)]
    if not analysis or (analysis.get("n_layer"), analysis.get("n_head")) != (n_layer, n_head):
        return labels
    for row in analysis["heads"]:
        layer, head = row.get("layer"), row.get("head")
        ints = isinstance(layer, int) and isinstance(head, int)
        if ints and 0 <= layer < n_layer and 0 <= head < n_head:
            role = row.get("role")
            labels[layer][head] = {"role": role if isinstance(role, str) else "?"} | {
                m["name"]: _number(row.get(m["name"])) for m in captioned()
            }
    return labels


def _number(x) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return x if ok else None


def config_of(run: RunFolder) -> dict:
    """The run's config.yaml as trained; one that cannot be read, a config no other run has (the
    run is a group of its own). Read again only once rewritten (another size or time)."""
    try:
        stat = run.config_file.stat()
        return dict(_read_config(str(run.path), stat.st_size, stat.st_mtime_ns))
    except (OSError, RunFolderError):
        return {"unreadable": str(run.path)}


@functools.lru_cache(maxsize=1024)
def _read_config(path: str, size: int, mtime_ns: int) -> dict:
    return RunFolder(path).config()


def groups_of(runs: dict[str, RunFolder]) -> list[Group[str]]:
    """The groups (group_runs) of runs_under's run names, each named after its first run without
    the seed ("sweep/heads=4,seed=2" -> "sweep/heads=4")."""

    def name_of(name: str) -> str:
        log_dir, slash, run = name.rpartition("/")
        return log_dir + slash + group_name(run)

    return group_runs(list(runs), lambda name: config_of(runs[name]), name_of)


def role_counts(analyses: list[dict | None]) -> dict:
    """{"analysed": how many of `analyses` are head analyses, "roles": {role: in how many of them
    some head has it}}."""
    counts, analysed = {}, 0
    for labels in (summaries_of(analysis)["heads"] for analysis in analyses):
        if labels is None:
            continue
        analysed += 1
        for role in {label["role"] for row in labels for label in row if label}:
            counts[role] = counts.get(role, 0) + 1
    return {"analysed": analysed, "roles": dict(sorted(counts.items()))}


class RunStore:
    """The runs under the log dirs (log_dirs) and their models, as the tab asks for them."""

    def __init__(self, roots: dict[str, Path]):
        self.roots = roots  # {} when TensorBoard was started without --logdir: no runs
        self.models = ModelCache()

    def runs(self) -> list[dict]:
        """Every run: its name, its checkpoints (the default first), their steps (None: a best.pt
        or last.pt not loaded yet) and those analysed; a run whose folder cannot be listed, with
        why."""
        out = []
        for name, run in runs_under(self.roots).items():
            try:
                checkpoints = checkpoints_of(run)
                loaded = [self.models.get(run.checkpoints / c, load=False) for c in checkpoints]
                steps = [step_of(c, model) for c, model in zip(checkpoints, loaded)]
                analysed = [c for c in checkpoints if run.analysis(c).is_file()]
                out.append({"name": name, "checkpoints": checkpoints, "steps": steps,
                            "analysed": analysed})  # fmt: skip
            except (OSError, InputError) as e:  # InputError: a checkpoint gone meanwhile
                error = f"{name} cannot be read: {getattr(e, 'strerror', None) or e}"
                out.append({"name": name, "checkpoints": [], "steps": [], "analysed": [],
                            "error": error})  # fmt: skip
        return out

    def groups(self) -> list[dict]:
        """Every group of runs: {"name", "runs" (their names), "seeds" (runs[i]'s seed)}."""
        return [vars(group) for group in groups_of(runs_under(self.roots))]

    def example(self) -> str | None:
        """An input to start with: the first validation name of the first run that has one."""
        for run in runs_under(self.roots).values():
            with contextlib.suppress(InputError, OSError):  # an unreadable folder: the next run
                default = run.default_checkpoint()  # None: no checkpoint yet
                if default is not None and inside(run.path, default):
                    if example := self.models.get(default).example:
                        return example
        return None

    def run(self, name: str) -> RunFolder:
        """The run called `name` (one of runs_under's); an InputError if there is none."""
        if not self.roots:
            raise InputError("TensorBoard was started without --logdir")
        run = runs_under(self.roots).get(name)
        if run is None:
            raise InputError(f"no run {name!r} under {', '.join(map(str, self.roots.values()))}")
        return run

    def attention(
        self,
        name: str,
        checkpoint: str | None,
        text: str,
        off: str = "",
        ablation: str | None = None,
        pin: str | None = None,
    ) -> dict:
        """What one run's panel shows for `text` with the heads `off` ("0.1,1.3") switched off
        by `ablation` (zero, mean), the attribution at position `pin` (default: the last); an
        InputError the page shows instead."""
        run = self.run(name)
        checkpoints = checkpoints_of(run)
        if not checkpoints:
            raise InputError(
                f"{name} has no checkpoint yet (checkpoints/best.pt or last.pt): it is still "
                f"training or it stopped before its first evaluation"
            )
        checkpoint = checkpoint or checkpoints[0]
        if checkpoint not in checkpoints:
            raise InputError(f"{name} has no checkpoint {checkpoint!r}; it has {checkpoints}")
        if not inside(run.path, run.checkpoints / checkpoint):
            raise InputError(f"{name}: {checkpoint} leads out of the run's folder; not read")
        try:
            loaded = self.models.get(run.checkpoints / checkpoint)
        except InputError as e:
            raise InputError(f"{name}: {e}") from None
        config = loaded.model.config
        if not text:
            raise InputError(f"type {loaded.format.user_input} to see {name}'s heads at work")
        try:  # the format's input ids: after the boundary token as trained (<s>emma), but for text
            ids = loaded.format.input_ids(loaded.tokenizer, text, config.block_size, "input")
            heads = parse_off(off or "", config.n_layer, config.n_head)
            ablation, pin = parse_ablation(ablation), parse_pin(pin, len(ids))
        except (DataError, LabError) as e:  # unknown characters, or too many; a bad parameter
            raise InputError(f"{name}: {e}") from None
        # the head analysis (python -m microgpt.heads), where there is one that can be read
        analysis, unreadable = self._analysis(run, checkpoint)
        with loaded.lock:  # the model's hooks are its own while a request runs
            try:
                means = loaded.means() if ablation == "mean" and heads else None
            except InputError as e:  # a text run's file gone
                raise InputError(f"{name}: {e}") from None
            labels, boundary = loaded.tokenizer.labels, loaded.format.boundary
            shown = lab(loaded.model, labels, ids, boundary, heads, means, pin)
        return {
            "run": name,
            "checkpoint": checkpoint,
            "step": loaded.step,
            "format": loaded.format.name,
            "boundary": loaded.format.boundary,  # the tokens start with the boundary token
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "tokens": loaded.tokenizer.labels(ids),
            # "layers": [layer][head] -> (T, T) rows of weights, query by key (with `off`)
            "analysis": run.analysis(checkpoint).name if analysis else unreadable,
            "heads": head_labels(analysis, config.n_layer, config.n_head),
            "measures": captioned(),
            "off": [list(head) for head in heads],
            "ablation": ablation,
            "pin": pin,
            "group": self._group(name, checkpoint),
            **shown,
        }

    def _group(self, name: str, checkpoint: str) -> dict:
        """The group of run `name` ({"name", "runs", "seeds"}) and role_counts of its runs'
        analyses of `checkpoint`."""
        found = runs_under(self.roots)
        group = next(group for group in groups_of(found) if name in group.runs)
        analyses = [self._analysis(found[run], checkpoint)[0] for run in group.runs]
        return {**vars(group), **role_counts(analyses)}

    def timeline(self, name: str) -> dict:
        """The run's validation loss over training, and each step checkpoint with its heads'
        scores and roles where it has been analysed (python -m microgpt.heads --all-checkpoints)."""
        run = self.run(name)
        val, skipped = [], []  # skipped: the lines of metrics.jsonl not read, named
        metrics = run.path / METRICS_FILE
        if metrics.is_file() and inside(run.path, metrics):
            try:
                lines = read_metrics(metrics, skipped)
            except OSError as e:  # too large
                lines, skipped = [], [f"{metrics}: {e.strerror or e}"]
            val = [[line["step"], line[VAL_LOSS]] for line in lines if VAL_LOSS in line]
        checkpoints, ahead = [], []
        for checkpoint in checkpoints_of(run):
            if (step := step_of(checkpoint, None)) is None:
                continue  # best.pt, last.pt: the slider runs over the steps
            analysis, _ = self._analysis(run, checkpoint)
            checkpoints.append({"checkpoint": checkpoint, "step": step, **summaries_of(analysis)})
            if inside(run.path, run.checkpoints / checkpoint):
                ahead.append(run.checkpoints / checkpoint)
        self.models.prefetch(ahead)  # the slider's checkpoints, loaded while the page is read
        return {"run": name, "val": val, "checkpoints": checkpoints, "skipped": skipped}

    @staticmethod
    def _analysis(run: RunFolder, checkpoint: str) -> tuple[dict | None, str | None]:
        """read_analysis of the checkpoint's analysis, unless it leads out of the run's folder."""
        path = run.analysis(checkpoint)
        if os.path.lexists(path) and not inside(run.path, path):
            return None, f"{path.name} leads out of the run's folder; not read"
        return read_analysis(path)


def summaries_of(analysis: dict | None) -> dict:
    """{"heads": head_labels, "summaries": {name: value} of the main measures (None: not
    measured)} of a head analysis of any shape; both None without one (or one of another shape)."""
    shape = (analysis or {}).get("n_layer"), (analysis or {}).get("n_head")
    if not all(isinstance(n, int) and 0 < n <= 4096 for n in shape):
        return {"heads": None, "summaries": None}
    heads, values = head_labels(analysis, *shape), analysis.get("summaries")
    values = values if isinstance(values, dict) else {}
    names = [m.name for m in MEASURES if m.main and not m.per_head]
    return {"heads": heads, "summaries": {n: _number(values.get(f"heads/{n}")) for n in names}}
