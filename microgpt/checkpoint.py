"""A self-describing checkpoint, the typed `Checkpoint`: on disk a dict of plain containers and
tensors (loaded with weights_only=True: nothing in it runs code) with a sha256 checksum checked at
load, saved atomically (a killed save leaves the previous checkpoint whole)."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import reprlib
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from microgpt import system
from microgpt.config import Config, ConfigError, flatten
from microgpt.errors import UserError, reason
from microgpt.files import atomic_write
from microgpt.model import GPT, GPTConfig, check_gpt_settings
from microgpt.runs import run_of
from microgpt.tokenizer import CharTokenizer

FORMAT = "microgpt-checkpoint"
VERSION = 1
# settings that may differ when a run is resumed (names, or "log.": all of log; no setting's name
# starts with another's); the data's content (items, split, tokenizer) must match, wherever it lies
RESUMABLE_CHANGES = tuple(
    "train.max_steps train.eval_every train.save_every train.eval_batch_size train.log_every "
    "train.num_samples train.progress train.compile train.precision data.path data.prepare log. "
    "device threads out_dir resume".split()
)


NUMBER = (int, float)


class CheckpointError(UserError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def _is(kind, value) -> bool:
    """isinstance, with a bool no number (True is an int to Python)."""
    return isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, NUMBER))


def _is_tokenizer(value) -> bool:
    return _mapping()(value) and _is(str, value.get("chars")) and value.get("boundary_id", 0) == 0


def _mapping(values=object):
    """The check of a dict whose keys are strings and values `values`."""
    return lambda d: isinstance(d, dict) and all(_is(str, k) and _is(values, d[k]) for k in d)


def _is_split(v) -> bool:
    """A run's split: lists of the train, val and test items, or a text's bounds and digest."""
    if isinstance(v, dict) and "bounds" in v:
        ints = _is(list, v["bounds"]) and all(_is(int, b) for b in v["bounds"])
        return ints and _is(str, v.get("digest"))
    lists = (v.get(n) for n in ("train", "val", "test")) if isinstance(v, dict) else [None]
    return all(_is(list, items) and all(_is(str, x) for x in items) for items in lists)


def _is_resume(v) -> bool:
    """last.pt's training state: optimizer, sampler (its global batch) and random states."""
    ok = _mapping()(v) and all(_is(dict, v.get(k)) for k in ("optimizer", "sampler", "rng"))
    return ok and _is(int, v["sampler"].get("batch_size")) and _is(NUMBER, v.get("best_val_loss"))


TRAIN_GROUPS = ("model", "data", "optim", "train", "log")  # train_config's


def _checked(must: str, ok, **default):
    """A Checkpoint field that `validated` checks at load with ok(value) (`must`: what it must be,
    for the message); one with a `default` may be None (not saved)."""
    check = (lambda value: value is None or ok(value)) if default else ok
    return field(**default, metadata={"must": must, "ok": check})


_optional = functools.partial(_checked, default=None)  # a field that may be None (not saved)


@dataclass
class Checkpoint:
    """The plain module's state_dict and what rebuilds it, the run's settings, step, metrics and
    split; `resume` (last.pt only): what an exact resume needs (optimizer, sampler, RNG, ...)."""

    # each field with what it must be and the check `validated` makes at load: the schema
    model: dict = _checked("a mapping of parameter names to tensors", _mapping(torch.Tensor))
    model_config: dict = _checked("a mapping of the model's settings", _mapping())
    tokenizer: dict = _checked("a mapping: chars a string, boundary_id 0", _is_tokenizer)
    train_config: dict | None = _optional(
        f"a mapping with the groups {', '.join(TRAIN_GROUPS)} (each a mapping)",
        lambda v: _mapping()(v) and all(_mapping()(v.get(group)) for group in TRAIN_GROUPS),
    )
    step: int | None = _optional("a non-negative integer", lambda v: _is(int, v) and v >= 0)
    metrics: dict = _checked(
        "a mapping of names to numbers", _mapping(NUMBER), default_factory=dict
    )
    split: dict | None = _optional(
        "lists of the train, val and test items (strings), or a text's bounds", _is_split
    )
    run_id: str | None = _optional("a string", lambda v: _is(str, v))
    data_sha256: str | None = _optional("a string", lambda v: _is(str, v))
    resume: dict | None = _optional(
        "a mapping of the optimizer, sampler and random states", _is_resume
    )
    # where it was loaded from (not saved), for its errors
    path: Path = field(default=Path("checkpoint"), compare=False)

    @property
    def data(self) -> dict:
        """The run's data settings (path, format); {} where the checkpoint names none."""
        return (self.train_config or {}).get("data", {})  # a mapping: the schema says so

    def to_dict(self) -> dict:
        """What is saved: format, version and the fields (no `resume` in a weights-only one)."""
        saved = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "path"}
        if self.resume is None:
            del saved["resume"]
        return {"format": FORMAT, "version": VERSION, **saved}

    def save(self, path: str | os.PathLike) -> Path:
        """Write it with its checksum to `path` atomically; a failed write is a CheckpointError
        saying which checkpoint of the run is whole."""
        path, full = Path(path), self.to_dict()
        full["checksum"] = checksum(full)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a signal (a second Ctrl-C) waits for the save's end: no half-made file to clean
            with system.signals_held(), atomic_write(path) as f:
                torch.save(full, f)
        # torch.save reports a failed write (a full disk: "unexpected pos") as RuntimeError
        except (OSError, RuntimeError) as e:
            last = run_of(path).last
            kept = f"{last} is whole: free space, then python train.py resume={last}"
            if not last.is_file():
                kept = "no checkpoint of this run was written yet: free space, then start again"
            raise CheckpointError(f"cannot write {path}: {reason(e)}; {kept}") from None
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, map_location="cpu") -> Checkpoint:
        """Load with torch.load(weights_only=True), check its checksum and every field against
        the schema (`validated`), else CheckpointError."""
        path = Path(path)
        # a FIFO would block the read forever; a device never ends
        if not path.exists():
            problem = "does not exist"
        elif path.is_dir():
            problem = "is a folder, not a file (use run=FOLDER to pick a run)"
        elif not path.is_file():
            problem = "is not a regular file (a device, FIFO or socket); name a .pt file"
        elif path.stat().st_size == 0:
            problem = "is empty (0 bytes): it was never written completely"
        elif not isinstance(raw := _read(path, map_location), dict) or raw.get("format") != FORMAT:
            problem = f"is not a microgpt checkpoint (no {FORMAT!r} format marker)"
        elif not {"model", "model_config", "tokenizer"} <= raw.keys():
            problem = "is not a microgpt checkpoint (no model, model_config or tokenizer)"
        elif not isinstance(version := raw.get("version", 0), int) or version > VERSION:
            problem = f"was written by a newer microgpt (version {version!r} > {VERSION}); upgrade"
        elif "checksum" in raw and raw["checksum"] != checksum(raw):
            problem = "is corrupt: its content does not match its checksum; use another checkpoint"
        else:
            try:
                loaded = cls(**validated(raw), path=path)
            except (ValueError, TypeError) as e:
                why = f"checkpoint {path}: field {e}; it is not in microgpt's checkpoint format"
                raise CheckpointError(why) from None
            loaded.check_weights()
            return loaded
        raise CheckpointError(f"{path} {problem}")

    def check_weights(self) -> None:
        """The weights are the ones its model_config gives (names and shapes, on the meta device:
        nothing allocated) and finite, for every reader (a resume's load_state_dict, an
        eigen-solver on NaN), else a CheckpointError; a config that builds no model: build_model's
        error."""
        layers = len({k.split(".")[1] for k in self.model if k.startswith("blocks.")})
        if _is(int, claimed := self.model_config.get("n_layer")) and claimed != layers:
            why = f"n_layer: {layers} in the weights, its config gives {claimed}"  # none built
            raise CheckpointError(f"{self.path} holds weights of the wrong shape for its model "
                                  f"({why}); use another checkpoint")  # fmt: skip
        try:
            with torch.device("meta"):
                expected = GPT(GPTConfig(**self.model_config)).state_dict()
        except (TypeError, ValueError, KeyError, RuntimeError):
            return
        shape = lambda d, k: "x".join(map(str, d[k].shape)) if k in d else "none"  # noqa: E731
        wrong = [k for k in expected.keys() | self.model.keys() if k not in self.model
                 or k not in expected or self.model[k].shape != expected[k].shape]  # fmt: skip
        bad = [k for k, t in self.model.items() if t.is_floating_point() and not t.isfinite().all()]
        if wrong:
            k = sorted(wrong)[0]
            got, want = shape(self.model, k), shape(expected, k)
            why = f"weights of the wrong shape for its model ({k}: {got}, its config gives {want})"
        elif bad:
            why = f"weights that are not finite ({sorted(bad)[0]} holds NaN or inf)"
        else:
            return
        raise CheckpointError(f"{self.path} holds {why}; use another checkpoint")

    def build_model(self, device="cpu") -> tuple[GPT, CharTokenizer]:
        """The model (in eval mode, on `device`) and its tokenizer."""
        try:
            config = GPTConfig(**self.model_config)
            tokenizer = CharTokenizer.from_dict(self.tokenizer)
            model = GPT(config)
            model.load_state_dict(self.model)
        except (TypeError, ValueError, RuntimeError, KeyError) as e:
            raise CheckpointError(f"{self.path} holds a model that cannot be rebuilt: {reason(e)}")
        if tokenizer.vocab_size != config.vocab_size:
            raise CheckpointError(f"{self.path} does not hang together: its tokenizer has "
                                  f"{tokenizer.vocab_size} symbols, its model {config.vocab_size}; "
                                  f"use an unedited checkpoint")  # fmt: skip
        return model.to(device).eval(), tokenizer

    def check_resumable(self, current: Checkpoint, global_batch: int, world_size: int) -> None:
        """Refuse a resume from this last.pt into the run whose own checkpoint would be `current`,
        naming what differs: the head count, settings outside RESUMABLE_CHANGES (the model's
        among them), the data, the global batch, or no steps left."""
        if self.resume is None:
            raise CheckpointError(f"{self.path} has no training state (best.pt holds weights "
                                  f"only); resume from checkpoints/last.pt")  # fmt: skip
        heads, asked = self.model_config["n_head"], current.model_config["n_head"]
        # a setting added to microgpt after the checkpoint was written counts as its default
        was = {**flatten(asdict(Config())), **flatten(self.train_config or {})}
        now = flatten(current.train_config)
        changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
        refused = [k for k in changed if not k.startswith(RESUMABLE_CHANGES)]
        max_steps, saved_batch = now["train.max_steps"], self.resume["sampler"]["batch_size"]
        ranks = self.resume.get("world_size", 1)
        if heads != asked:
            why = (f"the head count of a run cannot change (it has {heads} heads, heads={asked} "
                   f"asks for {asked}); resume without heads=, or start a new run with "
                   f"heads={asked}")  # fmt: skip
        elif refused:
            details = ", ".join(f"{k}: {was.get(k)!r} in the checkpoint, {now.get(k)!r} now"
                                for k in refused)  # fmt: skip
            allowed = ", ".join(r.rstrip(".") for r in RESUMABLE_CHANGES)
            why = (f"settings differ from the checkpoint's ({details}); only {allowed} may "
                   f"change, or start a new run")  # fmt: skip
        elif self.split != current.split or self.tokenizer != current.tokenizer:
            why = (f"the data of a run cannot change, and data.path={now['data.path']} holds other "
                   f"data than the run's {self.data.get('path')}; resume with the run's own data, "
                   f"or start a new run")  # fmt: skip
        elif self.step >= max_steps:
            why = (f"nothing to resume: {self.path} is at step {self.step} and train.max_steps="
                   f"{max_steps}; pass a larger train.max_steps")  # fmt: skip
        elif saved_batch != global_batch:  # the data order is drawn per global batch
            why = (f"it was trained with a global batch of {saved_batch} ({ranks} rank"
                   f"{'s' if ranks != 1 else ''}) but this run's is {global_batch} "
                   f"(train.batch_size={now['train.batch_size']} x {world_size} ranks); resume on "
                   f"{ranks} rank(s)")  # fmt: skip
        else:
            return
        raise ConfigError(f"cannot resume from {self.path}: {why}")


def _model_settings(values: dict, name: str) -> dict:
    """A checkpoint's model settings, checked as GPTConfig checks them (a setting added since
    takes its default; one dropped since is refused)."""
    defaults = asdict(GPTConfig())
    if unknown := sorted(values.keys() - defaults.keys()):
        raise ValueError(f"{name} holds settings this microgpt does not have: {unknown}; retrain")
    for size in ("vocab_size", "block_size") if name == "model_config" else ():
        if values.get(size) is None:  # None in a run's settings: from the data
            raise ValueError(f"{name}.{size} must be a positive integer, found None")
    check_gpt_settings({**defaults, **values}, lambda f: f"{name}.{f}")
    return values


def validated(raw: dict) -> dict:
    """The fields of a loaded checkpoint dict, each checked as Checkpoint declares (and the model's
    settings as GPTConfig checks them); a ValueError or TypeError names the first bad field."""
    out = {}
    for f in (f for f in fields(Checkpoint) if "ok" in f.metadata):  # all but path
        if not f.metadata["ok"](value := raw.get(f.name)):
            raise ValueError(f"{f.name} must be {f.metadata['must']}, found {reprlib.repr(value)}")
        out[f.name] = value
    out["model_config"] = _model_settings(out["model_config"], "model_config")
    out["metrics"] = out["metrics"] or {}
    if (config := out["train_config"]) is not None:
        config["model"] = _model_settings(config["model"], "train_config.model")
        # a run from before data.split_seed split its items by its seed: say so where it is read
        if "split_seed" not in config["data"] and _is(int, config.get("seed")):
            config["data"]["split_seed"] = config["seed"]
    return out


def checksum(checkpoint: dict) -> str:
    """ "sha256:<hex>" of a checkpoint's content but its checksum: each tensor's dtype, shape and
    bytes, every other value's repr, in key order (the same on any device)."""
    h = hashlib.sha256()

    def feed(x) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            keys = sorted((k for k in x if x is not checkpoint or k != "checksum"), key=repr)
            h.update(f"D{len(keys)}".encode())
            for k in keys:
                h.update(repr(k).encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(f"L{len(x)}".encode())
            for v in x:
                feed(v)
        else:
            h.update(f"V{x!r}".encode())

    feed(checkpoint)
    return "sha256:" + h.hexdigest()


def _read(path: Path, map_location):
    """torch.load(weights_only=True) of a regular file that starts as a zip does; an unreadable
    one is an OSError, one line at the front door."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":  # torch.save writes a zip archive; anything else is never unpickled
        raise CheckpointError(f"{path} is not a microgpt checkpoint (not written by torch.save)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # weights_only met what it does not load
        raise CheckpointError(f"refused to load {path}: it holds Python objects that could run "
                              f"code when unpickled, so it is not a microgpt checkpoint (or was "
                              f"tampered with)") from None  # fmt: skip
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError) as e:
        why = f"{path} is truncated or corrupt ({reason(e)}); use another checkpoint"
        raise CheckpointError(why) from None
