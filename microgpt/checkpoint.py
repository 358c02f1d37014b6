"""A self-describing checkpoint, the typed `Checkpoint`: on disk a dict of plain containers and
tensors (loaded with weights_only=True: nothing in it runs code) with a sha256 checksum checked at
load, saved atomically (a killed save leaves the previous checkpoint whole)."""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from microgpt import system
from microgpt.config import Config, ConfigError, flatten
from microgpt.errors import UserError, reason
from microgpt.files import atomic_write
from microgpt.model import GPT, GPTConfig, check_gpt_settings
from microgpt.tokenizer import CharTokenizer

FORMAT = "microgpt-checkpoint"
VERSION = 1
# torch.save writes a zip archive; anything else is never unpickled
ZIP_MAGIC = b"PK\x03\x04"
# settings that may differ when a run is resumed (names, or "log.": all of log; no setting's name
# starts with another's); the data's content (items, split, tokenizer) must match, wherever it lies
RESUMABLE_CHANGES = tuple(
    "train.max_steps train.eval_every train.save_every train.eval_batch_size train.log_every "
    "train.num_samples train.progress train.compile train.precision data.path data.prepare log. "
    "device threads out_dir resume".split()
)


class CheckpointError(UserError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


@dataclass
class Checkpoint:
    """The plain module's state_dict and what rebuilds it, the run's settings, step, metrics and
    split; `resume` (last.pt only): what an exact resume needs (optimizer, sampler, RNG, ...)."""

    model: dict
    model_config: dict
    tokenizer: dict
    train_config: dict | None = None
    step: int | None = None
    metrics: dict = field(default_factory=dict)
    split: dict | None = None
    run_id: str | None = None
    data_sha256: str | None = None
    resume: dict | None = None
    # where it was loaded from (not saved), for its errors
    path: Path = field(default=Path("checkpoint"), compare=False)

    @property
    def data(self) -> dict:
        """The run's data settings (path, format); {} where the checkpoint names none."""
        data = (self.train_config or {}).get("data")
        return data if isinstance(data, dict) else {}

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
            last = path.parent / "last.pt"
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
        raw = _read(path, map_location)
        required = {"model", "model_config", "tokenizer"}
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or not required <= raw.keys():
            problem = f"is not a microgpt checkpoint (no {FORMAT!r} format marker or model)"
        elif not isinstance(version := raw.get("version", 0), int) or version > VERSION:
            problem = f"was written by a newer microgpt (version {version!r} > {VERSION}); upgrade"
        elif "checksum" in raw and raw["checksum"] != checksum(raw):
            problem = "is corrupt: its content does not match its checksum; use another checkpoint"
        else:
            try:
                return cls(**validated(raw), path=path)
            except ValueError as e:
                raise CheckpointError(
                    f"checkpoint {path}: field {e}; it is not in microgpt's checkpoint format"
                ) from None
        raise CheckpointError(f"{path} {problem}")

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
            raise CheckpointError(
                f"{self.path} does not hang together: its tokenizer has {tokenizer.vocab_size} "
                f"symbols, its model {config.vocab_size}; use an unedited checkpoint"
            )
        return model.to(device).eval(), tokenizer

    def check_resumable(self, current: Checkpoint, global_batch: int, world_size: int) -> None:
        """Refuse a resume from this last.pt into the run whose own checkpoint would be `current`,
        naming what differs: settings, model, data, the global batch, or no steps left."""
        if self.resume is None:
            raise CheckpointError(
                f"{self.path} has no training state (best.pt holds weights only); resume from "
                f"checkpoints/last.pt"
            )
        config, mine = current.train_config, current.model_config
        heads = (self.model_config["n_head"], mine["n_head"])
        if heads[0] != heads[1]:
            raise ConfigError(
                f"cannot resume from {self.path}: the head count of a run cannot change (it has "
                f"{heads[0]} heads, heads={heads[1]} asks for {heads[1]}); resume without heads=, "
                f"or start a new run with heads={heads[1]}"
            )
        _check_settings(self.train_config, config, self.path)
        differing = sorted(k for k, v in self.model_config.items() if v != mine.get(k))
        same_data = self.split == current.split and self.tokenizer == current.tokenizer
        was, now = self.data.get("path"), config["data"]["path"]
        max_steps, saved_batch = config["train"]["max_steps"], self.resume["sampler"]["batch_size"]
        ranks = self.resume.get("world_size", 1)
        if differing:
            why = f"the model differs in {', '.join(differing)}"
        elif not same_data and was != now:
            why = (
                f"the data of a run cannot change, and data.path={now} holds other data than the "
                f"run's {was}; resume with the run's own data, or start a new run"
            )
        elif not same_data:
            why = f"{now} no longer holds the run's data; restore it or start a new run"
        elif self.step >= max_steps:
            why = (
                f"nothing to resume: {self.path} is at step {self.step} and train.max_steps="
                f"{max_steps}; pass a larger train.max_steps"
            )
        elif saved_batch != global_batch:  # the data order is drawn per global batch
            why = (
                f"it was trained with a global batch of {saved_batch} ({ranks} rank"
                f"{'s' if ranks != 1 else ''}) but this run's is {global_batch} (train.batch_size="
                f"{config['train']['batch_size']} x {world_size} ranks); resume on {ranks} rank(s)"
            )
        else:
            return
        raise ConfigError(f"cannot resume from {self.path}: {why}")


def _kind(value) -> str:
    """What a value is, as a message names it: "a list", "the string 'abc'"."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (str, int, float)):
        what = "the string" if isinstance(value, str) else "the number"
        return f"{what} {value!r}"[:80]
    kinds = {dict: "a mapping", list: "a list", tuple: "a list", torch.Tensor: "a tensor"}
    return next((k for t, k in kinds.items() if isinstance(value, t)), type(value).__name__)


def _is(kind, v) -> bool:
    """isinstance, with a bool no number (True is an int to Python)."""
    return isinstance(v, kind) and not (isinstance(v, bool) and kind in (int, (int, float)))


def _mapping(values=object):
    """The check of a dict whose keys are strings and values `values`."""
    return lambda d: isinstance(d, dict) and all(_is(str, k) and _is(values, d[k]) for k in d)


def _maybe(check):
    return lambda v: v is None or check(v)


def _is_split(v) -> bool:
    """A run's split: lists of the train, val and test items, or a text's bounds and digest."""
    if not isinstance(v, dict):
        return False
    if "bounds" in v:
        bounds = v["bounds"]
        return _is(list, bounds) and all(_is(int, b) for b in bounds) and _is(str, v.get("digest"))
    return all(_is(list, v.get(n)) and all(_is(str, x) for x in v[n]) for n in SPLIT_NAMES)


def _is_resume(v) -> bool:
    """last.pt's training state: optimizer, sampler (its global batch) and random states."""
    parts = ("optimizer", "sampler", "rng")
    if not (_mapping()(v) and all(isinstance(v.get(k), dict) for k in parts)):
        return False
    return _is(int, v["sampler"].get("batch_size")) and _is((int, float), v.get("best_val_loss"))


def _model_settings(values: dict, field_name: str) -> dict:
    """A checkpoint's model settings, checked as GPTConfig checks them; n_kv_head (null or n_head,
    from before grouped-query attention was dropped) left out."""
    values = dict(values)
    kv = values.pop("n_kv_head", None)
    if kv is not None and kv != values.get("n_head"):
        raise ValueError(
            f"{field_name}.n_kv_head={kv!r}: grouped-query attention (n_kv_head other than "
            f"n_head={values.get('n_head')!r}) is no longer supported; retrain the model"
        )
    unknown = sorted(set(values) - {f.name for f in fields(GPTConfig)})
    if unknown:
        raise ValueError(f"{field_name} holds settings GPTConfig does not have: {unknown}")
    for size in ("vocab_size", "block_size") if field_name == "model_config" else ():
        if values.get(size) is None:
            raise ValueError(f"{field_name}.{size} must be a positive integer, found None")
    try:
        # a setting added after the checkpoint was written takes its default
        defaults = {f.name: f.default for f in fields(GPTConfig)}
        check_gpt_settings({**defaults, **values}, lambda f: f"{field_name}.{f}")
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(reason(e)) from None
    return values


TRAIN_GROUPS, SPLIT_NAMES = ("model", "data", "optim", "train", "log"), ("train", "val", "test")
# field -> (what it must be, the check), for the fields the typed Checkpoint holds
SCHEMA = {
    "model": ("a mapping of parameter names to tensors", _mapping(torch.Tensor)),
    "model_config": ("a mapping of the model's settings", _mapping()),
    "tokenizer": (
        "a mapping whose vocabulary (chars) is a string",
        lambda v: _mapping()(v) and _is(str, v.get("chars")),
    ),
    "train_config": (
        f"a mapping with the groups {', '.join(TRAIN_GROUPS)} (each a mapping)",
        _maybe(lambda v: _mapping()(v) and all(_mapping()(v.get(g)) for g in TRAIN_GROUPS)),
    ),
    "step": ("a non-negative integer", _maybe(lambda v: _is(int, v) and v >= 0)),
    "metrics": ("a mapping of names to numbers", _maybe(_mapping((int, float)))),
    "split": (
        "lists of the train, val and test items (strings), or a text's bounds",
        _maybe(_is_split),
    ),
    "run_id": ("a string", _maybe(lambda v: _is(str, v))),
    "data_sha256": ("a string", _maybe(lambda v: _is(str, v))),
    "resume": ("a mapping of the optimizer, sampler and random states", _maybe(_is_resume)),
}


def validated(raw: dict) -> dict:
    """The fields of a loaded checkpoint dict, each checked against SCHEMA (and the model's
    settings as GPTConfig checks them); a ValueError names the first bad field."""
    out = {}
    for name, (must, ok) in SCHEMA.items():
        value = raw.get(name)
        if not ok(value):
            raise ValueError(f"{name} must be {must}, found {_kind(value)}")
        out[name] = value
    out["model_config"] = _model_settings(out["model_config"], "model_config")
    out["metrics"] = out["metrics"] or {}
    if (config := out["train_config"]) is not None:
        # settings renamed or dropped since, which a resume would otherwise meet as unknown
        config["train"].pop("group_by_length", None)
        if "entropy_items" in config["log"]:  # log.head_items' name before issue 22
            config["log"].setdefault("head_items", config["log"].pop("entropy_items"))
        model = _model_settings(out["train_config"]["model"], "train_config.model")
        out["train_config"] = {**out["train_config"], "model": model}
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
    """torch.load(weights_only=True) of a non-empty regular file that starts as a zip does (a FIFO
    would block the read forever; a device never ends)."""
    if not path.exists():
        problem = "does not exist"
    elif path.is_dir():
        problem = "is a folder, not a file (use run=FOLDER to pick a run)"
    elif not path.is_file():
        problem = "is not a regular file (a device, FIFO or socket); name a .pt file"
    elif path.stat().st_size == 0:
        problem = "is empty (0 bytes): it was never written completely"
    else:
        problem = None
    if problem:
        raise CheckpointError(f"checkpoint {path} {problem}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {reason(e)}") from None
    if magic != ZIP_MAGIC:
        raise CheckpointError(f"{path} is not a microgpt checkpoint (not written by torch.save)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "not allowed" in str(e):
            raise CheckpointError(
                f"refused to load {path}: it holds Python objects that could run code when "
                f"unpickled, so it is not a microgpt checkpoint (or was tampered with)"
            ) from None
        raise CheckpointError(f"{path} is not a readable checkpoint ({reason(e)})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"{path} is truncated or corrupt ({reason(e)}); use another checkpoint"
        )


def _check_settings(saved: dict, current: dict, path: Path) -> None:
    """Refuse to resume when a setting outside RESUMABLE_CHANGES differs from the checkpoint's."""
    # a setting added to microgpt after the checkpoint was written counts as its default
    a, b = {**flatten(asdict(Config())), **flatten(saved)}, flatten(current)
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if refused := [k for k in changed if not k.startswith(RESUMABLE_CHANGES)]:
        details = ", ".join(
            f"{k}: {a.get(k)!r} in the checkpoint, {b.get(k)!r} now" for k in refused
        )
        allowed = ", ".join(r.rstrip(".") for r in RESUMABLE_CHANGES)
        raise ConfigError(
            f"cannot resume from {path}: settings differ from the checkpoint's ({details}); only "
            f"{allowed} may change, or start a new run"
        )
