"""What the microgpt tab shows, as JSON (`RunStore`): the runs under a log directory; every
head's attention of one run's checkpoint on a typed input, with the head lab's fields
(microgpt/commands/tab/lab.py); a run's timeline. Checkpoints load lazily and safely onto the
CPU (Checkpoint.load) into a cache bounded in bytes (ModelCache); only what lies under
the log dirs is read (`inside`), each file through its run (RunFolder). Runs whose config.yaml
differ only by seed form a group (microgpt.groups), which the page shows seed by seed. A user's
mistake is an `InputError`, which the page shows."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from microgpt.checkpoint import Checkpoint, CheckpointError
from microgpt.commands.heads import analysis_rows
from microgpt.commands.tab.lab import LabError, lab, parse_ablation, parse_off, parse_pin
from microgpt.data.dataset import Data, DataError, checkpoint_format, data_of_checkpoint
from microgpt.files import inside
from microgpt.groups import Group, group_name, group_runs
from microgpt.heads.analyse import length_batches
from microgpt.heads.circuits import mean_outputs
from microgpt.heads.measures import MEASURES, summary_measures
from microgpt.runs import RunFolder, RunFolderError, find_runs
from microgpt.tokenizer import CharTokenizer
from microgpt.viz.tensorboard import VAL_LOSS

MAX_BYTES = 256 * 2**20  # the loaded models' parameters at most, and a checkpoint file's size


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
    bytes: int  # its parameters'
    _means: torch.Tensor | None = None

    def means(self) -> torch.Tensor:
        """(L, H, hd) each head's mean output over the run's validation split, computed once, as
        the head analysis computes it (its rows, circuits.mean_outputs). A text run reads its text
        file again, at the path its checkpoint holds (a request names no path). In RunStore's
        worker."""
        if self._means is None:
            try:
                rows = analysis_rows(data_of_checkpoint(self.checkpoint))
            except DataError as e:
                raise InputError(f"ablation=mean needs the validation split: {e}") from None
            self._means = mean_outputs(self.model, length_batches(*rows))[0]
        return self._means


def log_dirs(logdir: str | None, logdir_spec: str | None = None) -> dict[str, Path]:
    """{group name ("" for none): folder} from TensorBoard's --logdir, else its --logdir_spec
    (`name:/path,/other/path`: commas between log dirs, a colon after a name; a path that starts
    with / or a drive has no name, its colons kept, as TensorBoard reads it); {} without either."""
    if logdir:
        return {"": Path(logdir).expanduser()}
    found = {}
    for spec in logdir_spec.split(",") if logdir_spec else ():
        named = ":" in spec and not spec.startswith("/") and not os.path.splitdrive(spec)[0]
        name, path = spec.split(":", 1) if named else ("", spec)
        found[name] = Path(path).expanduser().resolve()
    return found


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


def load_model(path: Path) -> Loaded:
    """Load a checkpoint safely onto the CPU; an InputError saying what is wrong with it."""
    try:
        ckpt = Checkpoint.load(path, map_location="cpu")
        model, tokenizer = ckpt.build_model("cpu")
        ckpt.model, ckpt.resume = {}, None  # the weights live in the model; no optimizer state
        # the schema's split: lists of items (names), or a text's bounds (no "val")
        example = next(iter((ckpt.split or {}).get("val") or []), None)
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        fmt = checkpoint_format(ckpt)
        return Loaded(model, tokenizer, fmt, ckpt.step or 0, example, ckpt, size)
    except (CheckpointError, DataError) as e:
        raise InputError(str(e)) from None
    except Exception as e:  # anything else (a model that cannot be built): this run only
        raise InputError(f"{path} cannot be read ({type(e).__name__}: {e})") from None


class ModelCache:
    """The models of the checkpoints used last, their parameters at most MAX_BYTES together (the
    one used longest ago pushed out first); a checkpoint rewritten since (another size or time) is
    loaded again, one whose load failed answers its error until then. One lock, held through a
    load: one checkpoint loads at a time, once, however many threads ask for it (the tab asks
    from one, RunStore.worker)."""

    def __init__(self):
        self.models: OrderedDict[tuple, Loaded | str] = OrderedDict()  # its model, or its error
        self.lock = threading.Lock()

    def get(self, path: Path) -> Loaded:
        try:
            stat = path.stat()
        except OSError:
            raise InputError(f"checkpoint {path} does not exist") from None
        if stat.st_size > MAX_BYTES:  # what torch.load would read
            mib = f"{stat.st_size / 2**20:.0f} MiB, more than the tab loads ({MAX_BYTES >> 20} MiB)"
            raise InputError(f"{path} is {mib}; analyse it with python -m microgpt.heads")
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        with self.lock:
            if key not in self.models:
                try:
                    self.models[key] = load_model(path)
                except InputError as e:
                    self.models[key] = str(e)
            self.models.move_to_end(key)
            total = sum(m.bytes for m in self.models.values() if isinstance(m, Loaded))
            while len(self.models) > 1 and total > MAX_BYTES:  # the oldest pushed out
                gone = self.models.popitem(last=False)[1]
                total -= gone.bytes if isinstance(gone, Loaded) else 0
            found = self.models[key]
        if isinstance(found, str):
            raise InputError(found)
        return found


def captioned() -> list[dict]:
    """The per-head measures the page shows on a head's caption: {"name", "caption" (its label
    there), "fmt" (a format spec: "+.2f"), "help"}."""
    keys = ("name", "caption", "fmt", "help")
    return [{k: getattr(m, k) for k in keys} for m in MEASURES if m.caption is not None]


def timeline_lines() -> list[dict]:
    """The summaries the page's timeline draws over the steps (0-1): {"name", "line" (its label
    there), "fmt", "help"}."""
    keys = ("name", "line", "fmt", "help")
    return [{k: getattr(m, k) for k in keys} for m in summary_measures("line")]


def head_labels(analysis: dict | None, n_layer: int, n_head: int) -> list[list[dict | None]]:
    """[layer][head] -> {"role", and each captioned measure's value} (a field of another type:
    None); None without an analysis (RunFolder.read_analysis: one of this model's shape)."""
    labels = [[None] * n_head for _ in range(n_layer)]
    for row in analysis["heads"] if analysis else []:
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
    analysed = [h for a in analyses if (h := summaries_of(a)["heads"]) is not None]
    roles = ({label["role"] for row in heads for label in row if label} for heads in analysed)
    counts = Counter(role for found in roles for role in found)
    return {"analysed": len(analysed), "roles": dict(sorted(counts.items()))}


class RunStore:
    """The runs under the log dirs (log_dirs) and their models, as the tab asks for them."""

    def __init__(self, roots: dict[str, Path]):
        self.roots = roots  # {} when TensorBoard was started without --logdir: no runs
        self.models = ModelCache()
        # every model's work (a load, a request's passes) in one thread, one at a time: a model's
        # hooks are its own while it runs, a model pushed out lives on in no request, and what
        # they allocate stays in one thread's memory arena (64 request threads, each loading
        # models in its own, held 2.4 GB at peak and 1.3 GB idle)
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="microgpt-models")

    def runs(self) -> list[dict]:
        """Every run: its name, its checkpoints (the default first), its snapshots ([name, step]
        in step order) and the checkpoints analysed; a run whose folder cannot be listed, with
        why."""
        out = []
        for name, run in runs_under(self.roots).items():
            out.append({"name": name, "checkpoints": [], "snapshots": [], "analysed": []})
            try:
                checkpoints = [p.name for p in run.checkpoint_files()]
                analysed = [c for c in checkpoints if run.analysis(c).is_file()]
                snapshots = [[p.name, step] for step, p in run.snapshots()]
                out[-1].update(checkpoints=checkpoints, snapshots=snapshots, analysed=analysed)
            except OSError as e:
                out[-1]["error"] = f"{name} cannot be read: {e.strerror or e}"
        return out

    def groups(self) -> list[dict]:
        """Every group of runs: {"name", "runs" (their names), "seeds" (runs[i]'s seed)}."""
        return [vars(group) for group in groups_of(runs_under(self.roots))]

    def example(self) -> str | None:
        """An input to start with: the first validation name of the first run that has one."""
        for run in runs_under(self.roots).values():
            with contextlib.suppress(InputError, OSError):  # an unreadable folder: the next run
                default = run.default_checkpoint()  # None: no checkpoint yet
                if default and inside(run.path, default):
                    if example := self.worker.submit(self.models.get, default).result().example:
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

    def attention(self, name: str, checkpoint: str | None, text: str, off: str = "",
                  ablation: str | None = None, pin: str | None = None) -> dict:  # fmt: skip
        """What one run's panel shows for `text` with the heads `off` ("0.1,1.3") switched off
        by `ablation` (zero, mean), the attribution at position `pin` (default: the last); an
        InputError the page shows instead, after the run's name."""
        run = self.run(name)
        try:
            return self._attention(name, run, checkpoint, text, off, ablation, pin)
        except (InputError, DataError, LabError) as e:  # a bad input or parameter, a bad file
            raise InputError(f"{name}: {e}") from None

    def _attention(self, name, run, checkpoint, text, off, ablation, pin) -> dict:
        checkpoints = [p.name for p in run.checkpoint_files()]  # the default first
        if not checkpoints:
            raise InputError(
                "no checkpoint yet (checkpoints/best.pt or last.pt): it is still training or it "
                "stopped before its first evaluation"
            )
        checkpoint = checkpoint or checkpoints[0]
        if checkpoint not in checkpoints:
            raise InputError(f"no checkpoint {checkpoint!r}; it has {checkpoints}")
        if not inside(run.path, run.checkpoints / checkpoint):
            raise InputError(f"{checkpoint} leads out of the run's folder; not read")
        path = run.checkpoints / checkpoint
        loaded, ids, heads, ablation, pin, shown = self.worker.submit(
            self._lab, path, text, off, ablation, pin
        ).result()
        # the head analysis (python -m microgpt.heads), where there is one that can be read
        config = loaded.model.config
        shape = (config.n_layer, config.n_head)
        analysis, unreadable = self._analysis(run, checkpoint, shape)
        out = {"run": name, "checkpoint": checkpoint, "step": loaded.step}
        # the tokens start with the boundary token, if the format has one
        out |= {"format": loaded.format.name, "boundary": loaded.format.boundary}
        out |= {"n_layer": shape[0], "n_head": shape[1], "tokens": loaded.tokenizer.labels(ids)}
        out["analysis"] = run.analysis(checkpoint).name if analysis else unreadable
        out |= {"heads": head_labels(analysis, *shape), "measures": captioned()}
        out |= {"off": [list(head) for head in heads], "ablation": ablation, "pin": pin}
        # the run's group and role_counts of its runs' analyses of `checkpoint` (of this shape)
        found = runs_under(self.roots)
        group = next(group for group in groups_of(found) if name in group.runs)
        analyses = [self._analysis(found[run], checkpoint, shape)[0] for run in group.runs]
        # shown: "layers": [layer][head] -> (T, T) rows of weights, query by key (with `off`), ...
        return out | {"group": {**vars(group), **role_counts(analyses)}, **shown}

    def _lab(self, path: Path, text: str, off: str, ablation: str | None, pin: str | None):
        """In the worker: the checkpoint's model, the request's ids, heads off, ablation and pin,
        and the lab's fields."""
        loaded = self.models.get(path)
        config = loaded.model.config
        if not text:
            raise InputError(f"type {loaded.format.user_input} to see its heads at work")
        # the format's input ids: after the boundary token as trained (<s>emma), but for text
        ids = loaded.format.input_ids(loaded.tokenizer, text, config.block_size, "input")
        heads = parse_off(off or "", config.n_layer, config.n_head)
        ablation, pin = parse_ablation(ablation), parse_pin(pin, len(ids))
        means = loaded.means() if ablation == "mean" and heads else None
        labels, boundary = loaded.tokenizer.labels, loaded.format.boundary
        shown = lab(loaded.model, labels, ids, boundary, heads, means, pin)
        return loaded, ids, heads, ablation, pin, shown

    def timeline(self, name: str) -> dict:
        """The run's validation loss over training, and each step checkpoint with its heads'
        scores and roles where it has been analysed (python -m microgpt.heads --all-checkpoints)."""
        run = self.run(name)
        val, skipped = [], []  # skipped: the lines of metrics.jsonl not read, named
        metrics = run.metrics_file
        if metrics.is_file() and inside(run.path, metrics):
            try:
                lines = run.metrics(skipped)
            except OSError as e:  # too large
                lines, skipped = [], [f"{metrics}: {e.strerror or e}"]
            val = [[line["step"], line[VAL_LOSS]] for line in lines if VAL_LOSS in line]
        model = config_of(run).get("model")  # its analyses are of its model's heads, no more
        shape = (model.get("n_layer"), model.get("n_head")) if isinstance(model, dict) else None
        checkpoints = []
        for step, path in run.snapshots():  # the slider runs over the steps
            analysis, _ = self._analysis(run, path.name, shape or (None, None))
            checkpoints.append({"checkpoint": path.name, "step": step, **summaries_of(analysis)})
        out = {"run": name, "val": val, "checkpoints": checkpoints, "skipped": skipped}
        return out | {"lines": timeline_lines()}

    @staticmethod
    def _analysis(run: RunFolder, checkpoint: str, shape) -> tuple[dict | None, str | None]:
        """The checkpoint's analysis of a model of `shape` (RunFolder.read_analysis), unless it
        leads out of the run's folder."""
        path = run.analysis(checkpoint)
        if os.path.lexists(path) and not inside(run.path, path):
            return None, f"{path.name} leads out of the run's folder; not read"
        return run.read_analysis(checkpoint, shape)


def summaries_of(analysis: dict | None) -> dict:
    """{"heads": head_labels, "summaries": {name: value} of the timeline's lines (None: not
    measured)} of a head analysis of any shape; both None without one (or one of another shape)."""
    shape = (analysis or {}).get("n_layer"), (analysis or {}).get("n_head")
    if not all(isinstance(n, int) and 0 < n <= 4096 for n in shape):
        return {"heads": None, "summaries": None}
    heads, values = head_labels(analysis, *shape), analysis.get("summaries")
    values = values if isinstance(values, dict) else {}
    drawn = {m.name: _number(values.get(f"heads/{m.name}")) for m in summary_measures("line")}
    return {"heads": heads, "summaries": drawn}
