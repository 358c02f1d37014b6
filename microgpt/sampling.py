"""Choosing the next token (temperature, top-k, top-p), sampling named items from a model, and
sampling from a checkpoint (what `python sample.py` does).

The part that picks a token from logits knows nothing of models, so `GPT.generate` uses it and
tests can check it alone. `sample_from_config` / `run_sampling` are the library behind sample.py:
they validate every setting first, find and load the checkpoint, sample in batches with the KV
cache, mark each item new or found in a split, and return a `SampleResult`; they print nothing.

This module is imported by microgpt.model, so the checkpoint, data and run modules (which import
the model) are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from microgpt.files import pick_device, write_text

TRAIN_COMMAND = "python train.py heads=4"
DEFAULT_BATCH = 1024  # items sampled at once when batch_size is null: bounds the KV cache's memory
DEVICES = ("auto", "cpu", "cuda", "mps")


class SamplingError(ValueError):
    """A bad sampling setting, or no checkpoint to sample from; the message says what would be valid."""


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise a ValueError naming the setting and its valid range."""
    if temperature is None or not temperature >= 0:
        raise SamplingError(
            f"temperature={temperature!r} must be >= 0 (0 = greedy, 1 = the model's own distribution)"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise SamplingError(
            f"top_k={top_k!r} must be an integer >= 1 (or null to keep every token)"
        )
    if top_p is not None and not 0 < top_p <= 1:
        raise SamplingError(f"top_p={top_p!r} must be in (0, 1] (1 keeps every token)")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits (B, V) -> one token id per row (B,).

    temperature 0 is greedy (argmax). Otherwise the logits are divided by the temperature, cut to
    the top_k most likely tokens and then to the smallest set whose probability reaches top_p,
    and a token is drawn with `generator`.
    """
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    # subtracting the max first keeps a tiny temperature from overflowing to inf (and NaN after softmax)
    logits = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
        before = (
            sorted_probs.cumsum(dim=-1) - sorted_probs
        )  # probability of the tokens ranked above
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)


def sample_items(
    model,
    tokenizer,
    num_samples: int,
    prefix: str = "",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    use_cache: bool = True,
    max_len: int | None = None,
) -> list[str]:
    """Sample `num_samples` items (strings) from `model`, `batch_size` at a time, each starting with `prefix`.

    The same seed gives the same items, with or without the cache. max_len caps the length of an
    item (prefix included); by default it is what the block size allows.
    """
    if num_samples < 1:
        raise SamplingError(f"num_samples={num_samples} must be at least 1")
    if batch_size is not None and batch_size < 1:
        raise SamplingError(f"batch_size={batch_size} must be at least 1")
    if max_len is not None and max_len <= len(prefix):
        raise SamplingError(
            f"max_len={max_len} must be longer than the prefix ({len(prefix)} characters)"
        )
    check_sampling_args(temperature, top_k, top_p)
    try:
        tokenizer.check(prefix, what="prefix")
    except SamplingError:
        raise
    except ValueError as e:
        raise SamplingError(str(e)) from None
    prefix_ids = tokenizer.encode(prefix)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(7), "little"))
    max_new = None if max_len is None else max_len - len(prefix)
    batch_size = batch_size or min(num_samples, DEFAULT_BATCH)
    items: list[str] = []
    with _num_threads(_sampling_threads(model, min(batch_size, num_samples), device)):
        while len(items) < num_samples:  # generate() samples in eval mode and restores the mode
            n = min(batch_size, num_samples - len(items))
            rows = model.generate(
                n,
                prefix=prefix_ids,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
                use_cache=use_cache,
                max_new_tokens=max_new,
            )
            items.extend(tokenizer.decode(row) for row in rows.tolist())
    return items


# Below this much work per decoding step (batch x n_layer x n_embd^2), a CPU forward pass is a few
# hundred small ops, and handing each to a pool of threads costs more than it saves. Measured on 2
# busy cores with the small preset (4 layers, n_embd 64): 1,000 names 5-40x faster on one thread
# than on two, 10,000 names 3-4x faster. Bigger work (the base preset, large batches) keeps
# PyTorch's thread count.
SINGLE_THREAD_WORK = 2**30


def _sampling_threads(model, batch: int, device: torch.device) -> int | None:
    """1 for small CPU work, None (leave PyTorch's setting alone) otherwise."""
    c = getattr(model, "config", None)
    if device.type != "cpu" or c is None:
        return None
    return 1 if batch * c.n_layer * c.n_embd**2 < SINGLE_THREAD_WORK else None


@contextlib.contextmanager
def _num_threads(n: int | None):
    """Run with n intra-op CPU threads, then restore the previous setting."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def mark_items(items: list[str], split) -> list[tuple[str, str]]:
    """Each item with where it was found: "train", "val", "test", or "new" (split: data.Split or None)."""
    return [(item, (split.where(item) if split is not None else None) or "new") for item in items]


def format_marked(marked: list[tuple[str, str]]) -> list[str]:
    """Printable lines, makemore style: each item with its mark, then a summary line."""
    width = max((len(item) for item, _ in marked), default=0)
    lines = [
        f"{item:<{width}}  {'(new)' if where == 'new' else f'(in {where})'}"
        for item, where in marked
    ]
    n_new = sum(where == "new" for _, where in marked)
    n_unique = len({item for item, _ in marked})
    lines.append(f"{n_new} of {len(marked)} new, {n_unique} unique")
    return lines


# ----------------------------------------------------------------------------- sample.py


@dataclass
class SampleConfig:
    """The settings of `python sample.py` (conf/sample.yaml mirrors it). Checked on construction."""

    num_samples: int = 20
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None  # keep the k most likely characters; null = all
    top_p: float | None = None  # keep the smallest set reaching this probability; null = all
    prefix: str = ""  # every item starts with it
    seed: int | None = None  # null = a random seed (printed, to repeat the run)
    max_len: int | None = None  # longest item, prefix included; null = what the block size allows
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    use_cache: bool = (
        True  # the KV cache; false recomputes the whole context every step (same items)
    )
    out: str | None = None  # also write the items to this file, one per line
    batch_size: int | None = None  # items sampled at once; null = up to 1,024
    ckpt: str | None = None  # a checkpoint file
    run: str | None = None  # a run folder: its checkpoints/best.pt, else last.pt

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raise a SamplingError naming the first bad setting and its valid range."""
        for name in ("num_samples", "batch_size", "max_len", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SamplingError(f"{name}={value!r} must be an integer")
        if self.num_samples < 1:
            raise SamplingError(f"num_samples={self.num_samples} must be at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise SamplingError(
                f"batch_size={self.batch_size} must be at least 1 (or null = all at once)"
            )
        check_sampling_args(self.temperature, self.top_k, self.top_p)
        if not isinstance(self.prefix, str):
            raise SamplingError(f"prefix={self.prefix!r} must be a string")
        if self.max_len is not None and self.max_len <= len(self.prefix):
            raise SamplingError(
                f"max_len={self.max_len} must be greater than the length of the prefix "
                f"({len(self.prefix)}), or null for no limit but the block size"
            )
        if self.device not in DEVICES:
            raise SamplingError(f"device={self.device!r} is unknown; choose one of {list(DEVICES)}")
        if self.ckpt is not None and self.run is not None:
            raise SamplingError(
                f"give ckpt=PATH or run=FOLDER, not both (ckpt={self.ckpt!r}, run={self.run!r})"
            )
        if self.out is not None:
            out = Path(self.out).expanduser()
            if self.out == "" or out.is_dir():
                raise SamplingError(f"out={self.out!r} must be a file path, not a folder")
            if not out.parent.is_dir():
                raise SamplingError(f"out={self.out}: folder {out.parent} does not exist")


@dataclass
class SampleResult:
    """What one sampling run produced; `lines` is what sample.py prints."""

    names: list[str]
    marked: list[tuple[str, str]]  # (name, "new" | "train" | "val" | "test")
    checkpoint: Path
    step: int | None
    val_loss: float | None
    seed: int
    seconds: float  # sampling only, without loading
    header: str = ""
    lines: list[str] = field(default_factory=list)  # header, one line per item, summary

    @property
    def summary(self) -> str:
        return self.lines[-1] if self.lines else ""

    @property
    def num_new(self) -> int:
        return sum(where == "new" for _, where in self.marked)

    @property
    def num_unique(self) -> int:
        return len(set(self.names))


def register_configs() -> None:
    """Register SampleConfig with Hydra's ConfigStore as "sample_schema" (conf/sample.yaml's defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="sample_schema", node=SampleConfig)


def load_sample_config(cfg) -> SampleConfig:
    """A SampleConfig from a composed DictConfig, a dict or a SampleConfig; SamplingError if bad."""
    if isinstance(cfg, SampleConfig):
        cfg.check()
        return cfg
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        if not isinstance(cfg, DictConfig):
            cfg = OmegaConf.create(cfg)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SampleConfig), cfg))
    except SamplingError:
        raise
    except OmegaConfBaseException as e:
        if isinstance(e.__cause__, SamplingError):
            raise SamplingError(str(e.__cause__)) from None
        key = getattr(e, "full_key", None)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SamplingError(f"bad setting {key}: {first}" if key else first) from None


def find_checkpoint(ckpt: str | None = None, run: str | None = None, roots=None) -> Path:
    """The checkpoint to sample from: `ckpt`; else `run`/checkpoints/best.pt (or last.pt); else the
    best.pt (or last.pt) of the most recently written run under `roots` (outputs/, multirun/)."""
    from microgpt.runs import RUN_ROOTS, find_checkpoints

    roots = RUN_ROOTS if roots is None else roots
    if ckpt is not None:
        return Path(ckpt).expanduser()  # load_checkpoint says what is wrong with it, if anything
    if run is not None:
        folder = Path(run).expanduser()
        if not folder.is_dir():
            raise SamplingError(f"run={run}: folder {folder} does not exist")
        for path in (
            folder / "checkpoints" / "best.pt",
            folder / "checkpoints" / "last.pt",
            folder / "best.pt",
            folder / "last.pt",
        ):  # the run folder, or its checkpoints/
            if path.is_file():
                return path
        inside = [p.parent.parent for p in find_checkpoints((folder,), "best.pt")]
        hint = f"; it holds these runs: {', '.join(map(str, inside[:5]))}" if inside else ""
        raise SamplingError(
            f"run={run}: no checkpoints/best.pt or checkpoints/last.pt in {folder}{hint}"
        )
    found = find_checkpoints(roots, "best.pt") + find_checkpoints(roots, "last.pt")
    if not found:
        where = " or ".join(f"{r}/" for r in roots)
        raise SamplingError(
            f"no checkpoint found: no run under {where} in {Path.cwd()} has checkpoints/best.pt or "
            f"last.pt. Train one first: {TRAIN_COMMAND} (or pass ckpt=PATH or run=FOLDER)"
        )
    latest = max(found, key=lambda p: p.stat().st_mtime).parent  # the newest run's checkpoints/
    best = latest / "best.pt"
    return best if best.is_file() else latest / "last.pt"


def check_prefix(prefix: str, tokenizer, block_size: int) -> None:
    """The prefix against the model: known characters, and room left to sample."""
    unknown = tokenizer.unknown_chars(prefix)
    if unknown:
        raise SamplingError(
            f"prefix={prefix!r} has characters the model does not know: {', '.join(map(repr, unknown))}. "
            f"Known characters: {''.join(tokenizer.chars)!r}"
        )
    if len(prefix) >= block_size:
        raise SamplingError(
            f"prefix={prefix!r} has {len(prefix)} characters; this model's block size is {block_size}, "
            f"so a prefix may have 0 to {block_size - 1} characters"
        )


def write_lines(path: str | os.PathLike, lines: list[str]) -> Path:
    """Write lines to `path` atomically: an error leaves the old file."""
    return write_text(Path(path).expanduser(), "".join(line + "\n" for line in lines))


def sample_from_config(cfg) -> SampleResult:
    """Everything `python sample.py` does but printing: validate, find and load the checkpoint,
    sample, mark each item, and write `out` if asked. Returns a SampleResult."""
    from microgpt.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint
    from microgpt.data import DataError, Split
    from microgpt.tokenizer import CharTokenizer

    c = load_sample_config(cfg)  # every setting that does not need the model, before any loading
    device = pick_device(c.device, SamplingError)
    path = find_checkpoint(c.ckpt, c.run)
    ckpt = load_checkpoint(path, map_location="cpu")
    try:
        tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"])
        block_size = int(ckpt["model_config"]["block_size"])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path} holds no usable tokenizer or model config ({e})") from None
    check_prefix(c.prefix, tokenizer, block_size)  # before building the model and sampling
    model, tokenizer = model_from_checkpoint(ckpt, device=device, path=path)
    try:
        split = Split.from_dict(ckpt["split"]) if "split" in ckpt else None
    except DataError:
        split = None
    seed = c.seed if c.seed is not None else int.from_bytes(os.urandom(4), "little")

    start = time.perf_counter()
    names = sample_items(
        model,
        tokenizer,
        c.num_samples,
        prefix=c.prefix,
        temperature=c.temperature,
        top_k=c.top_k,
        top_p=c.top_p,
        seed=seed,
        batch_size=c.batch_size,
        use_cache=c.use_cache,
        max_len=c.max_len,
    )
    seconds = time.perf_counter() - start
    marked = mark_items(names, split)

    metrics = ckpt.get("metrics") or {}
    val_loss = metrics.get("val_loss", metrics.get("best_val_loss"))
    step = ckpt.get("step")
    header = (
        f"checkpoint {path} (step {step if step is not None else '?'}, val loss "
        f"{f'{val_loss:.4f}' if isinstance(val_loss, (int, float)) else 'n/a'}), seed {seed}"
    )
    if split is None:
        header += " [no data split in this checkpoint: every item is marked new]"
    if c.out is not None:
        try:
            write_lines(c.out, names)
        except OSError as e:
            raise SamplingError(f"cannot write out={c.out}: {e.strerror or e}") from None
    return SampleResult(
        names=names,
        marked=marked,
        checkpoint=path,
        step=step,
        val_loss=val_loss,
        seed=seed,
        seconds=seconds,
        header=header,
        lines=[header, *format_marked(marked)],
    )


def run_sampling(**settings) -> SampleResult:
    """sample_from_config with keyword arguments: run_sampling(ckpt="...", num_samples=5, seed=0)."""
    return sample_from_config(SampleConfig(**settings))
