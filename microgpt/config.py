"""The schemas of train.py (`Config`; its `model` group is the model's `GPTConfig`) and sample.py
(`SampleConfig`), mirrored by conf/*.yaml. Each group checks itself in __post_init__, reached
through `load_config` (OmegaConf.to_object): library code receives these plain dataclasses.
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
from microgpt.data.dataset import data_format
from microgpt.errors import UserError, first_line
from microgpt.model import GPTConfig, check_gpt_settings
from microgpt.sample.generate import check_sampling_args
from microgpt.system import DEVICES, Precision, check_threads

DECAYS = ("cosine", "linear", "constant")
OPTIMIZERS = ("adamw", "muon")
MUON_ORTHOS = ("polar-express", "newton-schulz")  # microgpt.train.optim.ORTHOGONALISERS
MAX_EPS = 1.0  # optim.eps at or above it leaves the weights where they started
MAX_TRAIN_SAMPLES = 100_000  # train.num_samples, sampled after the last step (sample.py: more)


class ConfigError(UserError):
    """A bad setting; the message names it and what would be valid."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def require_choice(setting: str, value, choices) -> None:
    require(value in choices, f"{setting}={value!r} is unknown; choose one of {list(choices)}")


def require_at_least(group, prefix: str, least: int, names, note: str = "") -> None:
    """Each setting `names` of `group` (a dataclass) at least `least`, else refused by its name."""
    for name in names:
        value = getattr(group, name)
        require(value >= least, f"{prefix}{name}={value} must be at least {least}{note}")


def flatten(d, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: nested mappings as dotted keys."""
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
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
    path: str = "data/names.txt"  # UTF-8; relative: from the cwd, then the repo
    # lines (one item per line) | text (one stream of characters) | repeats (generated items)
    format: str = "lines"
    prepare: str | None = None  # the command that builds the file (--out PATH): named if missing
    repeats: RepeatsConfig = field(default_factory=RepeatsConfig)  # format=repeats: the generator
    # the train/val/test shuffle of items (lines, repeats), apart from `seed`: a sweep over seeds
    # scores every run on the same validation and test items (runs before it split by `seed`)
    split_seed: int = 1337


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
    lr: float = 3e-3
    muon_lr: float = 0.02  # with name=muon: the blocks' matrices' lr, on lr's schedule
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices (Linear weights, embeddings), never biases or gains
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine | linear | constant, after the warmup
    min_lr_ratio: float = 0.1  # where the decay ends, at max_steps, as a fraction of lr
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    # Muon's orthogonalisation: auto (bf16 where the device multiplies it natively: a GPU
    # with bf16, a CPU with AVX512-BF16 or AMX; else fp32) | fp32 | bf16
    muon_precision: str = "auto"
    # its orthogonalisation: polar-express (3 iterations on the Gram side) | newton-schulz (5)
    muon_ortho: str = "polar-express"

    def __post_init__(self):
        require_choice("optim.name", self.name, OPTIMIZERS)
        for name, value in asdict(self).items():  # every float finite (other groups: bounded)
            finite = not isinstance(value, float) or math.isfinite(value)
            require(finite, f"optim.{name}={value} must be a finite number")
        for name, typical in (("lr", "1e-3"), ("muon_lr", "0.02"), ("eps", "1e-8")):
            value = getattr(self, name)
            require(value > 0, f"optim.{name}={value} must be > 0 (typical: {typical})")
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            f"optim.betas={list(self.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99]",
        )
        # AdamW's step is lr * m / (sqrt(v) + eps), with |m|, sqrt(v) << 1
        require(
            self.eps < MAX_EPS,
            f"optim.eps={self.eps} divides every update by at least {self.eps:g}: the weights "
            f"would not move; use a small value (typical: 1e-8, at most {MAX_EPS:g})",
        )
        require_at_least(self, "optim.", 0, ("weight_decay", "warmup_steps", "grad_clip"))
        require_choice("optim.decay", self.decay, DECAYS)
        require_choice("optim.muon_precision", self.muon_precision, Precision.choices(fp16=False))
        require_choice("optim.muon_ortho", self.muon_ortho, MUON_ORTHOS)
        ratio = self.min_lr_ratio
        require(0 <= ratio <= 1, f"optim.min_lr_ratio={ratio} must be in [0, 1]")


@dataclass
class TrainConfig:
    max_steps: int = 3500
    batch_size: int = 128  # per process; under torchrun the global batch is batch_size * world size
    pack: int = 0  # >0: a batch's items end to end in rows of N tokens (no padding; text: none)
    eval_every: int = 250
    save_every: int = 0  # >0: keep checkpoints/step-NNNNNN.pt (weights, no optimizer) every N steps
    eval_batch_size: int = 1000
    log_every: int = 10  # scalars to TensorBoard and the progress bar
    num_samples: int = 20  # names printed (and written to samples.txt) at the end
    ema: float = 0.0  # >0: evaluate, sample and keep best.pt with a moving average of the weights
    compile: bool = False  # torch.compile the model for training
    # auto (bf16 where the device has it natively: a GPU, a CPU with AVX512-BF16 or AMX; else
    # fp16 on CUDA, fp32) | fp32 | bf16 | fp16
    precision: str = "auto"
    progress: bool | None = None  # tqdm bar; null = only when stderr is a terminal

    def __post_init__(self):
        steps = ("max_steps", "batch_size", "eval_every", "eval_batch_size", "log_every")
        require_at_least(self, "train.", 1, steps)
        require_at_least(self, "train.", 0, ("save_every", "pack", "num_samples"), " (0 = none)")
        require(0 <= self.ema < 1, f"train.ema={self.ema} must be in [0, 1) (0 = off; e.g. 0.995)")
        n, minutes = self.num_samples, system.decoding_seconds(self.num_samples, 16) / 60
        require(
            n <= MAX_TRAIN_SAMPLES,
            f"train.num_samples={n} would sample for about {minutes:,.0f} minutes on a CPU after "
            f"the last step, before the test loss is written; at most {MAX_TRAIN_SAMPLES:,} here: "
            f"sample more afterwards with python sample.py num_samples=N out=FILE",
        )
        require_choice("train.precision", self.precision, Precision.choices())


@dataclass
class LogConfig:
    attn_every: int = 1000  # attention maps and head analysis every N steps (and at 0 and the end)
    probe: str | None = None  # the item whose attention is drawn; null = a fixed validation item
    head_items: int = 256  # validation items the head analysis (roles, importance, pruning) uses

    def __post_init__(self):
        require_at_least(self, "log.", 1, ("attn_every", "head_items"))


@dataclass
class Config:
    """`python train.py`: its own settings and those that span groups, checked here."""

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
        m, heads = self.model, self.heads
        differ = f"heads={heads} and model.n_head={m.n_head} differ; give one of them"
        require(heads in (None, m.n_head), differ)
        require(
            m.vocab_size is None,
            f"model.vocab_size={m.vocab_size}: the vocabulary comes from the data (every "
            f"character of data.path), so this setting would be ignored; remove it",
        )
        seeds = {"seed": self.seed, "data.split_seed": self.data.split_seed}
        for name, seed in {**seeds, "data.repeats.seed": self.data.repeats.seed}.items():
            require(0 <= seed < 2**63, f"{name}={seed} must be in [0, 2**63)")
        data_format(self.data.format).check_settings(self.data, m.block_size)  # a DataError
        require_choice("device", self.device, DEVICES)
        check_threads(self.threads)  # a ThreadsError
        resume, valid = self.resume, isinstance(self.resume, (bool, str)) and self.resume != ""
        require(valid, f"resume={resume!r} must be false, true, or the path of a checkpoint")

    def model_for_data(self, vocab_size: int, block_size: int) -> GPTConfig:
        """The model's GPTConfig, once the data has given the vocabulary and block size."""
        return dataclasses.replace(self.model, vocab_size=vocab_size, block_size=block_size)

    def to_dict(self) -> dict:
        return asdict(self)


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
        names = ("temperature", "top_k", "top_p", "prefix", "num_samples", "batch_size", "seed")
        check_sampling_args(max_len=self.max_len, **{name: getattr(self, name) for name in names})
        require_choice("device", self.device, DEVICES)
        check_threads(self.threads)  # a ThreadsError
        require(
            self.ckpt is None or self.run is None,
            f"give ckpt=PATH or run=FOLDER, not both (ckpt={self.ckpt!r}, run={self.run!r})",
        )
        if self.out not in (None, "-"):  # out=-: standard output
            out = Path(self.out).expanduser()
            require(not out.is_dir(), f"out={self.out!r} must name a file, not a folder")
            require(out.parent.is_dir(), f"out={self.out}: folder {out.parent} does not exist")


def load_config(cfg, schema: type = Config, given=None):
    """A composed config (DictConfig, dict, or the schema itself) validated into `schema`; a
    UserError (a ConfigError, or the SamplingError, DataError, ... of the check that refused it)
    names a bad setting. `given`: the keys the user
    set by name (a command line's); None: every key of a plain dict, none of a DictConfig (whose
    model preset sets the n_head that `heads` replaces)."""
    if isinstance(cfg, schema):
        return cfg
    if given is None:
        given = flatten(cfg) if isinstance(cfg, dict) else {}
    try:
        # a signal raised inside OmegaConf would surface as its own AttributeError: held
        with system.signals_held():
            if not isinstance(cfg, DictConfig):
                cfg = OmegaConf.create(cfg)
            merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
            if schema is Config:
                _apply_heads(merged, "model.n_head" in given)
            config = OmegaConf.to_object(merged)
        # threads=auto takes OMP_NUM_THREADS: one that is no count is refused here, once
        system.choose_threads(config.threads, 1, os.environ)
        return config
    except OmegaConfBaseException as e:  # a schema's own check, or OmegaConf's (a bad type)
        if isinstance(e.__cause__, UserError):
            raise e.__cause__ from None
        key, first = getattr(e, "full_key", None), first_line(e)
        raise ConfigError(f"bad setting {key}: {first}" if key else first) from None


def _apply_heads(merged: DictConfig, n_head_given: bool) -> None:
    """`heads=N` replaces a preset's model.n_head (one the user gave too must agree: Config
    compares them); then the model's settings are checked under the names a user types (heads=3,
    model.n_embd=64), before GPTConfig checks them under its own."""
    by_heads = merged.heads is not None and not n_head_given
    if by_heads:
        merged.model.n_head = merged.heads

    def name(f: str) -> str:
        return "heads" if f == "n_head" and by_heads else f"model.{f}"

    try:
        check_gpt_settings(OmegaConf.to_container(merged.model), name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_training_memory(c: Config, device, vocab_size: int = 2, block_size: int = 0) -> None:
    """Refuse, before anything is allocated, a run whose training step cannot fit in `device`'s
    memory (system.training_bytes): the model and every setting that sizes the batch (the batch,
    the block, train.pack). Before the data is read, `vocab_size` and the block are lower bounds:
    2, and model.block_size or the format's (a text window, a generated item), else 2."""
    m, fmt, t = c.model, data_format(c.data.format), c.train
    known = fmt.known_block(c.data)
    block = block_size or m.block_size or known or 2
    rows, row_len, sizes = t.batch_size, block, []
    if t.pack and fmt.packs:  # rows of train.pack tokens; an item never straddles two
        row_len = max(t.pack, block)
        rows = min(t.batch_size, -(-t.batch_size * block // (row_len - block + 1)))
        sizes.append(f"train.pack={t.pack}")
    if m.block_size:
        sizes.append(f"model.block_size={block}")
    elif block_size or known:  # else not known before the data is read
        sizes.append(f"a block of {block} (from the data)")
    need = system.training_bytes(c.model_for_data(vocab_size, block), rows, row_len)
    # e.g. "train.pack=64 and model.block_size=32 with train.batch_size=128"
    what = " and ".join(sizes) + " with " * bool(sizes) + f"train.batch_size={t.batch_size}"
    system.check_memory(need, device, what, "lower one of them or the model's size", ConfigError)
