"""Every schema the commands accept, as dataclasses that conf/*.yaml mirror, validated once.

- `Config`: `python train.py`; its `model` group is the model's own `GPTConfig`.
- `SampleConfig`: `python sample.py`.

Hydra never calls __post_init__ on structured configs, so `load_config` converts the composed
DictConfig with OmegaConf.to_object, which builds these dataclasses and runs every check below.
A bad value stops the command before any work with an error that names the setting and what
would be valid. Library code receives the resulting dataclass (plain Python), never a DictConfig.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from microgpt import system
from microgpt.data.dataset import FORMATS
from microgpt.data.repeats import check_repeats
from microgpt.data.text import DEFAULT_BLOCK_SIZE as TEXT_BLOCK_SIZE
from microgpt.errors import SamplingError, UserError
from microgpt.model import GPTConfig, check_gpt_settings
from microgpt.sample.generate import check_sampling_args
from microgpt.sample.report import check_max_new
from microgpt.system import DEVICES, PRECISIONS, ThreadsError, available_memory, check_threads, gib

DECAYS = ("cosine", "linear", "constant")
MAX_EPS = 1.0  # optim.eps at or above it leaves the weights where they started
MAX_TRAIN_SAMPLES = 100_000  # train.num_samples, sampled after the last step (sample.py: more)
SAMPLES_PER_SECOND = 5_000  # small model, batched: 1,000 names in 0.165 s (docs/benchmarks.md)


class ConfigError(UserError):
    """A bad setting; the message names it and what would be valid."""


def flatten(d, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: nested mappings as dotted keys."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass
class RepeatsConfig:
    """data.format=repeats: generated items in which a random span appears twice (the induction
    experiment, microgpt.data.repeats); nothing is read or downloaded."""

    chars: str = "abcdefghijklmnopqrstuvwxyz"  # the vocabulary
    span: list[int] = field(default_factory=lambda: [2, 16])  # shortest and longest span
    length: int = 32  # characters per item (the block is length + 1)
    items: int = 100000  # items generated (then split train/val/test like lines)
    seed: int = 0  # the generator's own seed


@dataclass
class DataConfig:
    name: str = "names"
    path: str = "data/names.txt"  # UTF-8; relative: from the cwd, then the repo
    # lines (one item per line) | text (one stream of characters) | repeats (generated items)
    format: str = "lines"
    prepare: str | None = None  # the command that builds the file: named if it is missing
    repeats: RepeatsConfig = field(default_factory=RepeatsConfig)  # format=repeats: the generator

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ConfigError(
                f"data.format={self.format!r} is unknown; choose one of {list(FORMATS)} "
                f"(lines: one item per line, like names; text: one stream, like a play; repeats: "
                f"generated items where a random span repeats)"
            )
        if self.format == "repeats":
            r = self.repeats
            try:
                check_repeats(r.chars, tuple(r.span), r.length, r.items, r.seed)
            except ValueError as e:
                raise ConfigError(str(e)) from None


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices (Linear weights, embeddings), never biases or gains
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine | linear | constant, after the warmup
    min_lr_ratio: float = 0.1  # where the decay ends, at max_steps, as a fraction of lr
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping

    def __post_init__(self):
        for name in ("lr", "eps", "weight_decay", "min_lr_ratio", "grad_clip"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"optim.{name}={getattr(self, name)} must be a finite number")
        if not self.lr > 0:
            raise ConfigError(f"optim.lr={self.lr} must be > 0 (typical: 1e-3)")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(
                f"optim.betas={list(self.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99]"
            )
        if not self.eps > 0:
            raise ConfigError(f"optim.eps={self.eps} must be > 0 (typical: 1e-8)")
        # AdamW's step is lr * m / (sqrt(v) + eps), with |m|, sqrt(v) << 1
        if self.eps >= MAX_EPS:
            raise ConfigError(
                f"optim.eps={self.eps} divides every update by at least {self.eps:g}: the weights "
                f"would not move; use a small value (typical: 1e-8, at most {MAX_EPS:g})"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay={self.weight_decay} must be >= 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps} must be >= 0")
        if self.decay not in DECAYS:
            raise ConfigError(
                f"optim.decay={self.decay!r} is unknown; choose one of {list(DECAYS)}"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.grad_clip < 0:
            raise ConfigError(f"optim.grad_clip={self.grad_clip} must be >= 0 (0 = no clipping)")


@dataclass
class TrainConfig:
    max_steps: int = 3500
    batch_size: int = 128  # per process; under torchrun the global batch is batch_size * world size
    group_by_length: int = 0  # >0: batches of similar-length items, sorted within runs of N batches
    eval_every: int = 250
    save_every: int = 0  # >0: keep checkpoints/step-NNNNNN.pt (weights, no optimizer) every N steps
    eval_batch_size: int = 1000
    log_every: int = 10  # scalars to TensorBoard and the progress bar
    num_samples: int = 20  # names printed (and written to samples.txt) at the end
    ema: float = 0.0  # >0: evaluate, sample and keep best.pt with a moving average of the weights
    compile: bool = False  # torch.compile the model for training
    # auto (bf16 on GPUs with it, else fp16; fp32 on CPU) | fp32 | bf16 | fp16
    precision: str = "auto"
    progress: bool | None = None  # tqdm bar; null = only when stderr is a terminal

    def __post_init__(self):
        for name in ("max_steps", "batch_size", "eval_every", "eval_batch_size", "log_every"):
            _at_least_one(f"train.{name}", getattr(self, name))
        if self.save_every < 0:
            raise ConfigError(f"train.save_every={self.save_every} must be >= 0 (0 = off)")
        if self.group_by_length < 0:
            raise ConfigError(
                f"train.group_by_length={self.group_by_length} must be >= 0 (0 = off)"
            )
        if not 0 <= self.ema < 1:
            raise ConfigError(f"train.ema={self.ema} must be in [0, 1) (0 = off; e.g. 0.995)")
        if self.num_samples < 0:
            raise ConfigError(f"train.num_samples={self.num_samples} must be 0 or more")
        if self.num_samples > MAX_TRAIN_SAMPLES:
            raise ConfigError(
                f"train.num_samples={self.num_samples} would sample for about "
                f"{self.num_samples / SAMPLES_PER_SECOND / 3600:,.1f} hours on a CPU after the "
                f"last step, before the test loss is written; at most {MAX_TRAIN_SAMPLES:,} here: "
                f"sample more afterwards with python sample.py num_samples=N out=FILE"
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"train.precision={self.precision!r} is unknown; choose one of {list(PRECISIONS)}"
            )


@dataclass
class LogConfig:
    attn_every: int = 1000  # attention maps and head analysis every N steps (and at 0 and the end)
    probe: str | None = None  # the item whose attention is drawn; null = a fixed validation item
    head_items: int = 256  # validation items the head analysis (roles, importance, pruning) uses

    def __post_init__(self):
        _at_least_one("log.attn_every", self.attn_every)
        _at_least_one("log.head_items", self.head_items)


def _at_least_one(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{name}={value} must be at least 1")


@dataclass
class Config:
    """`python train.py`: each group above checks its own settings as it is built; this checks
    the settings that span groups, and those of its own."""

    model: GPTConfig = field(default_factory=lambda: GPTConfig(vocab_size=None, block_size=None))
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    heads: int | None = None  # sets model.n_head (load_config applies it); null = the preset's
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    threads: Any = "auto"  # CPU threads: auto (usable cores / jobs at once) | N (microgpt.system)
    out_dir: str = "."  # the run folder; conf/config.yaml points it at Hydra's output dir
    resume: Any = False  # false | true (the run folder's checkpoints/last.pt) | a checkpoint path

    def __post_init__(self):
        if self.heads is not None and self.heads != self.model.n_head:
            raise ConfigError(f"heads={self.heads} but model.n_head={self.model.n_head}: set one")
        if self.model.vocab_size is not None:
            raise ConfigError(
                f"model.vocab_size={self.model.vocab_size}: the vocabulary comes from the data "
                f"(every character of data.path), so this setting would be ignored; remove it"
            )
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed={self.seed} must be in [0, 2**63)")
        block = self.model.block_size
        if self.data.format == "text" and block is not None and block < 2:
            raise ConfigError(
                f"model.block_size={block} with data.format=text: a window of one character "
                f"gives attention nothing to look at but itself (a bigram model, no heads to "
                f"analyse); use at least 2 (null = {TEXT_BLOCK_SIZE})"
            )
        _check_machine(self.device, self.threads, ConfigError)
        if not isinstance(self.resume, (bool, str)) or self.resume == "":
            raise ConfigError(
                f"resume={self.resume!r} must be false, true, or the path of a checkpoint"
            )

    @property
    def resume_requested(self) -> bool | str:
        """False, True (the run folder's last.pt), or a checkpoint path."""
        return parse_resume(self.resume)

    def model_for_data(self, vocab_size: int, block_size: int) -> GPTConfig:
        """The model's GPTConfig, once the data has given the vocabulary and block size."""
        return dataclasses.replace(self.model, vocab_size=vocab_size, block_size=block_size)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_resume(value) -> bool | str:
    """resume as typed (false, true, "True", None, a path) -> False, True or the path."""
    if value is None or value is False or str(value).lower() in ("false", "none", "null", ""):
        return False
    if value is True or str(value).lower() == "true":
        return True
    return str(value)


@dataclass
class SampleConfig:
    """The settings of `python sample.py` (conf/sample.yaml mirrors it). Checked on construction."""

    num_samples: int | None = None  # null = 20 names, or 3 passages of a text run
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None  # keep the k most likely characters; null = all
    top_p: float | None = None  # keep the smallest set reaching this probability; null = all
    prefix: str = ""  # every item starts with it; a text run's passages continue it
    seed: int | None = None  # null = a random seed (printed, to repeat the run)
    # names: the longest item, prefix included (null = what the block size allows); a text run:
    # the characters added to the prefix (null = 300)
    max_len: int | None = None
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    threads: Any = "auto"  # CPU threads: auto (usable cores / jobs at once) | N (microgpt.system)
    use_cache: bool = True  # the KV cache; false recomputes the whole context (same items)
    out: str | None = None  # also write the items to this new file, one per line; - = stdout
    overwrite: bool = False  # let out= replace an existing file (never a run's or the data)
    batch_size: int | None = None  # items sampled at once; null = up to 1,024
    ckpt: str | None = None  # a checkpoint file
    run: str | None = None  # a run folder: its checkpoints/best.pt, else last.pt

    def __post_init__(self):
        for name in ("num_samples", "batch_size", "max_len", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SamplingError(f"{name}={value!r} must be an integer")
        if self.num_samples is not None and self.num_samples < 1:
            raise SamplingError(f"num_samples={self.num_samples} must be at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise SamplingError(
                f"batch_size={self.batch_size} must be at least 1 (or null = all at once)"
            )
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise SamplingError(f"seed={self.seed} must be in [0, 2**63) (or null = random)")
        check_sampling_args(self.temperature, self.top_k, self.top_p)
        if not isinstance(self.prefix, str):
            raise SamplingError(f"prefix={self.prefix!r} must be a string")
        if self.max_len is not None:
            check_max_new(self.max_len)
        _check_machine(self.device, self.threads, SamplingError)
        if self.ckpt is not None and self.run is not None:
            raise SamplingError(
                f"give ckpt=PATH or run=FOLDER, not both (ckpt={self.ckpt!r}, run={self.run!r})"
            )
        if self.out is not None and self.out != "-":  # -: standard output
            out = Path(self.out).expanduser()
            if self.out == "" or out.is_dir():
                raise SamplingError(f"out={self.out!r} must be a file path, not a folder")
            if not out.parent.is_dir():
                raise SamplingError(f"out={self.out}: folder {out.parent} does not exist")


def _check_machine(device: str, threads, error: type[Exception]) -> None:
    """device= and threads=, which train.py and sample.py share."""
    if device not in DEVICES:
        raise error(f"device={device!r} is unknown; choose one of {list(DEVICES)}")
    try:
        check_threads(threads)
    except ThreadsError as e:
        raise error(str(e)) from None


SCHEMAS = {"schema": Config, "sample_schema": SampleConfig}  # the names conf/*.yaml use


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (conf/config.yaml and conf/sample.yaml list
    them first in their defaults)."""
    from hydra.core.config_store import ConfigStore

    for name, schema in SCHEMAS.items():
        ConfigStore.instance().store(name=name, node=schema)


def load_config(cfg, schema: type = Config):
    """Validate a composed config (DictConfig, dict, or the schema itself) into `schema` (Config
    or SampleConfig). Raises ConfigError (SamplingError for SampleConfig) naming the setting."""
    error = SamplingError if schema is SampleConfig else ConfigError
    if isinstance(cfg, schema):
        return cfg
    try:
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.create(cfg)
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        if schema is Config:
            _apply_heads(merged)
        config = OmegaConf.to_object(merged)
        # threads=auto takes OMP_NUM_THREADS: one that is no count is refused here, once
        system.choose_threads(config.threads, 1, os.environ)
        return config
    except ThreadsError as e:
        raise error(str(e)) from None
    except (ConfigError, SamplingError):
        raise
    except OmegaConfBaseException as e:
        if isinstance(e.__cause__, (ConfigError, SamplingError)):
            raise error(str(e.__cause__)) from None
        key = getattr(e, "full_key", None)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise error(f"bad setting {key}: {first}" if key else first) from None


def _apply_heads(merged: DictConfig) -> None:
    """`heads=N` sets model.n_head; then the model's settings are checked under the names a user
    types (heads=3, model.n_embd=64), before GPTConfig checks them under its own."""
    if merged.heads is not None:
        merged.model.n_head = merged.heads

    def name(f: str) -> str:
        return "heads" if f == "n_head" and merged.heads is not None else f"model.{f}"

    try:
        check_gpt_settings(OmegaConf.to_container(merged.model), name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def training_bytes(config: GPTConfig, batch_size: int) -> int:
    """A rough upper estimate of the memory one training step takes: weights, gradients and
    AdamW's two moments, plus the activations kept for the backward pass of a full block
    (float32; attention weights counted as if materialised)."""
    C, T, L, H = config.n_embd, config.block_size, config.n_layer, config.n_head
    params = config.vocab_size * C * (1 if config.tie_weights else 2) + T * C
    ratio = config.mlp_ratio if config.mlp else 0
    params += L * (4 * C * C + 2 * ratio * C * C)
    per_layer = batch_size * T * ((8 + 2 * ratio) * C + 2 * H * T)
    logits = 3 * batch_size * T * config.vocab_size
    return 4 * (4 * params + L * per_layer + logits)


def check_memory(model: GPTConfig, batch_size: int, device, block_setting) -> None:
    """Refuse, before allocating anything, a model and batch that cannot fit in memory."""
    need, free = training_bytes(model, batch_size), available_memory(device)
    if free is None or need <= free:
        return
    block = (
        f"model.block_size={model.block_size}"
        if block_setting
        else f"a block of {model.block_size} (the longest item of the data + 1)"
    )
    raise ConfigError(
        f"{block} with train.batch_size={batch_size} needs about {gib(need)} to "
        f"train, but {device} has {gib(free)} free; lower train.batch_size or "
        f"model.block_size (or shorten the data's longest lines)"
    )
