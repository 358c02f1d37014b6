"""The structured training config: dataclasses that mirror conf/*.yaml, validated once at start-up.

Hydra never calls __post_init__ on structured configs, so `load_config` converts the composed
DictConfig with OmegaConf.to_object, which builds these dataclasses and runs every check below.
A bad value stops the run before any work with a ConfigError that names the setting and what
would be valid. Library code receives the resulting `Config` (plain Python), never a DictConfig.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from microgpt.model import GPTConfig

DEVICES = ("auto", "cpu", "cuda", "mps")
DECAYS = ("cosine", "linear", "constant")


class ConfigError(ValueError):
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
class ModelConfig:
    name: str = "small"
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_kv_head: Optional[int] = None  # null = n_head (multi-head); 1 = multi-query
    block_size: Optional[int] = None  # null = longest item + 1, from the data
    dropout: float = 0.0
    bias: bool = False
    norm: str = "layernorm"
    activation: str = "gelu"
    attn_impl: str = "sdpa"
    tie_weights: bool = False
    mlp_ratio: int = 4


@dataclass
class DataConfig:
    name: str = "names"
    path: str = "data/names.txt"  # one item per line, UTF-8; relative paths are tried from the cwd, then the repo


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices (Linear weights, embeddings), never on biases or norm gains
    warmup_steps: int = 100
    decay: str = "cosine"  # cosine | linear | constant, after the warmup
    min_lr_ratio: float = 0.1  # where the decay ends, at max_steps, as a fraction of lr
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping


@dataclass
class TrainConfig:
    max_steps: int = 3500
    batch_size: int = 128  # per process; under torchrun the global batch is batch_size * world size
    group_by_length: int = 0  # >0: batches of similar-length items, sorted within runs of N batches (less padding)
    eval_every: int = 250
    eval_batch_size: int = 1000
    log_every: int = 10  # scalars to TensorBoard and the progress bar
    num_samples: int = 20  # names printed (and written to samples.txt) at the end
    compile: bool = False  # torch.compile the model for training
    amp: bool = True  # bf16 autocast on CUDA (ignored elsewhere)
    progress: Optional[bool] = None  # tqdm bar; null = only when stderr is a terminal


@dataclass
class LogConfig:
    attn_every: int = 1000  # per-head attention maps every N steps (and at step 0 and the end)
    probe: Optional[str] = None  # the item whose attention is drawn; null = a fixed validation item
    entropy_items: int = 256  # validation items used for the attention-entropy scalars


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    heads: Optional[int] = None  # sets model.n_head; null = the preset's
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    out_dir: str = "."  # the run folder; conf/config.yaml points it at Hydra's output dir
    resume: Any = False  # false | true (the run folder's checkpoints/last.pt) | a checkpoint path

    def __post_init__(self):
        if self.heads is not None:
            self.model.n_head = self.heads
        self._check()

    def _check(self):
        m, t, o = self.model, self.train, self.optim
        try:
            self.gpt_config(vocab_size=2, block_size=m.block_size or 2)
        except ValueError as e:
            raise ConfigError(_name_settings(str(e), heads_set=self.heads is not None)) from None
        positive = {"train.max_steps": t.max_steps, "train.batch_size": t.batch_size,
                    "train.eval_every": t.eval_every, "train.eval_batch_size": t.eval_batch_size,
                    "train.log_every": t.log_every, "log.attn_every": self.log.attn_every,
                    "log.entropy_items": self.log.entropy_items}
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name}={value} must be at least 1")
        if t.group_by_length < 0:
            raise ConfigError(f"train.group_by_length={t.group_by_length} must be >= 0 (0 = off)")
        if t.num_samples < 0:
            raise ConfigError(f"train.num_samples={t.num_samples} must be 0 or more")
        if not o.lr > 0:
            raise ConfigError(f"optim.lr={o.lr} must be > 0 (typical: 1e-3)")
        if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
            raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99]")
        if not o.eps > 0:
            raise ConfigError(f"optim.eps={o.eps} must be > 0 (typical: 1e-8)")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed={self.seed} must be in [0, 2**63)")
        if o.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay={o.weight_decay} must be >= 0")
        if o.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps={o.warmup_steps} must be >= 0")
        if o.decay not in DECAYS:
            raise ConfigError(f"optim.decay={o.decay!r} is unknown; choose one of {list(DECAYS)}")
        if not 0 <= o.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
        if o.grad_clip < 0:
            raise ConfigError(f"optim.grad_clip={o.grad_clip} must be >= 0 (0 = no clipping)")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r} is unknown; choose one of {list(DEVICES)}")
        if not isinstance(self.resume, (bool, str)) or self.resume == "":
            raise ConfigError(f"resume={self.resume!r} must be false, true, or the path of a checkpoint")

    def gpt_config(self, vocab_size: int, block_size: int) -> GPTConfig:
        """The model's GPTConfig, once the data has given the vocabulary and block size."""
        m = self.model
        return GPTConfig(
            vocab_size=vocab_size, block_size=block_size, n_layer=m.n_layer, n_embd=m.n_embd,
            n_head=m.n_head, n_kv_head=m.n_kv_head, dropout=m.dropout, bias=m.bias, norm=m.norm,
            activation=m.activation, attn_impl=m.attn_impl, tie_weights=m.tie_weights, mlp_ratio=m.mlp_ratio,
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _name_settings(message: str, heads_set: bool) -> str:
    """Point a GPTConfig message at the settings a user types."""
    head = "heads" if heads_set else "model.n_head"
    replacements = {"n_embd=": "model.n_embd=", "n_head=": f"{head}=", "n_kv_head=": "model.n_kv_head=",
                    "n_layer=": "model.n_layer=", "block_size=": "model.block_size=", "dropout=": "model.dropout=",
                    "attn_impl=": "model.attn_impl=", "norm=": "model.norm=", "activation=": "model.activation=",
                    "mlp_ratio=": "model.mlp_ratio="}
    out, i = [], 0
    while i < len(message):  # replace whole words only ("n_head=" but not "model.n_head=")
        for old, new in replacements.items():
            if message.startswith(old, i) and (i == 0 or not (message[i - 1].isalnum() or message[i - 1] in "_.")):
                out.append(new)
                i += len(old)
                break
        else:
            out.append(message[i])
            i += 1
    return "".join(out).replace("Use n_head in", f"Use {head} in").replace("or change n_embd", "or change model.n_embd")


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (conf/config.yaml lists it first in its defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)


def load_config(cfg: Config | DictConfig | dict) -> Config:
    """Validate a composed config (DictConfig or dict) into a Config; ConfigError if it is bad."""
    if isinstance(cfg, Config):
        return cfg
    try:
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.create(cfg)
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        return OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e.__cause__, ConfigError):
        return str(e.__cause__)
    if key:
        return f"bad setting {key}: {first}"
    return first
