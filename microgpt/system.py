"""The machine a command runs on: device and precision, data-parallel ranks (torchrun's variables,
else a submitit job's: docs/cluster.md; else rank 0 of 1), CPU threads, and `eval_mode`.

Two processes that each take every core wait on each other's threads (issue 20), so `threads=auto`
takes the cores this process may use (`sched_getaffinity`) or, when set, OMP_NUM_THREADS (a
parallel sweep's share, `microgpt.cli.ShareCores`; torchrun's 1). Idle threads sleep:
`microgpt/__init__.py` sets OMP_WAIT_POLICY=PASSIVE.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel

from microgpt.errors import SIGNALS, UserError

DEVICES = ("auto", "cpu", "cuda", "mps")  # the choices of every command's `device` setting
THREADS_ENV = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    # rank 0 alone writes logs, TensorBoard, checkpoints and samples
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_info_from_env() -> DistInfo:
    """This process's rank, from torchrun's variables, else from a submitit job's."""
    env = os.environ
    if "RANK" not in env and "WORLD_SIZE" not in env and env.get("SUBMITIT_EXECUTOR"):
        # without submitit installed there is nothing to read its variables with
        with contextlib.suppress(ImportError):
            from submitit.helpers import TorchDistributedEnvironment

            job = TorchDistributedEnvironment()
            if job.world_size > 1:
                # CUDA_VISIBLE_DEVICES is left as SLURM set it: setup() copes with all or one
                job.export(set_cuda_visible_devices=False, overwrite=True)
    return DistInfo(
        int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0"))
    )


def setup(device: torch.device) -> tuple[DistInfo, torch.device]:
    """(this process's rank, its device): when started by a launcher, join the process group
    (NCCL on GPUs, gloo on CPU); a rank's GPU is its local_rank among those visible (SLURM may
    show each rank just its own)."""
    info = dist_info_from_env()
    if info.enabled and device.type == "cuda":
        device = torch.device("cuda", info.local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=10))
    return info, device


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def over_ranks(value: float, op: str, info: DistInfo) -> float:
    """`value` summed (op "sum": the train loss) or its maximum ("max": a stop request on any rank
    stops them all at once) over all ranks; every rank must call it at the same point."""
    if not info.enabled:
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.item()


def broadcast_from_main(obj, info: DistInfo):
    """Rank 0's `obj` (any picklable value) on every rank."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank (every rank must call it)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def run_on_main(fn, info: DistInfo):
    """fn() on rank 0 alone, returning its result there (None elsewhere); its exception is raised
    on every rank (elsewhere: its type with its message, or a RuntimeError where the type takes
    other arguments), so that none waits for rank 0 in the next collective until a timeout."""
    if not info.enabled:
        return fn()
    result, error = None, None
    if info.is_main:
        try:
            result = fn()
        except Exception as e:  # re-raised below, on every rank
            error = e
    failed = broadcast_from_main(None if error is None else (type(error), str(error)), info)
    if failed is not None and error is None:
        cls, message = failed
        with contextlib.suppress(TypeError):  # else a class that takes other arguments
            error = cls(message)
        raise error or RuntimeError(message)
    if error is not None:
        raise error
    return result


def pick_device(name: str, error: type[Exception] = ValueError) -> torch.device:
    """`auto` is cuda, then mps, then cpu; a named device that is not there raises `error`."""
    available = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if name == "auto":
        return torch.device(next((d for d, ok in available.items() if ok), "cpu"))
    if not available.get(name, True):
        what = "no CUDA GPU is available" if name == "cuda" else "MPS is not available"
        raise error(f"device={name} but {what}; use device=auto or device=cpu")
    return torch.device(name)


class Precision(str, Enum):
    """What a model's arithmetic runs in: a setting (train.precision; optim.muon_precision, which
    has no fp16) is one of `choices`, and `resolve` turns it, auto included, into one by the one
    rule. A str: "fp16" compares equal to Precision.FP16, and prints as it."""

    FP32, BF16, FP16 = "fp32", "bf16", "fp16"
    __str__ = str.__str__

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.value, torch.float32)

    @classmethod
    def choices(cls, fp16: bool = True) -> tuple[str, ...]:
        """A setting's values: auto, then the precisions (fp16 where the setting has it)."""
        return ("auto", *(p.value for p in cls if fp16 or p is not cls.FP16))

    @classmethod
    def resolve(cls, setting: str, device: torch.device, fp16: bool = True) -> Precision:
        """`setting` on `device`; auto: bf16 where the device multiplies it in hardware
        (native_bf16), else fp16 on CUDA where the setting has it, else fp32."""
        if setting != "auto":
            return cls(setting)
        cuda_fp16 = fp16 and device.type == "cuda"
        return cls.BF16 if native_bf16(device) else cls.FP16 if cuda_fp16 else cls.FP32


def pick_precision(
    name: str, device: torch.device, error: type[Exception] = ValueError
) -> Precision:
    """train.precision on `device` (Precision.resolve); bf16 on a GPU without it raises `error`."""
    precision = Precision.resolve(name, device)
    if precision is Precision.BF16 and device.type == "cuda" and not native_bf16(device):
        raise error(
            f"train.precision=bf16 but {torch.cuda.get_device_name(device)} has no bf16 support; "
            f"use train.precision=fp16 (or auto, which picks it)"
        )
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The precision's autocast on the device (nothing for fp32). On the CPU, attention then runs
    PyTorch's math kernel: its bf16 flash-attention backward is about 10x slower than fp32's
    (torch 2.13), which cost more than bf16 saved everywhere else (docs/benchmarks.md)."""
    precision, stack = Precision(precision), contextlib.ExitStack()
    if precision is not Precision.FP32:
        stack.enter_context(torch.autocast(device.type, precision.dtype))
        if device.type == "cpu":
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
    return stack


def native_bf16(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether `device` multiplies bf16 in hardware: a CUDA GPU with bf16, or a CPU with
    AVX512-BF16 or AMX (its flags in Linux's `cpuinfo`; elsewhere False)."""
    if device.type != "cpu":
        return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags(cpuinfo))


# the instruction sets that decide a CPU's bf16 kernels (and so a bf16 run's last digits)
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's flags in Linux's `cpuinfo` (elsewhere none)."""
    with contextlib.suppress(OSError, StopIteration), open(cpuinfo) as f:
        return set(next(line.split(":", 1)[1].split() for line in f if line.startswith("flags")))
    return set()


# what holding one generated or sampled item costs at its peak: the Python string and its place
# in lists, and per character the int64 ids and masks it is made from (about 60 bytes measured)
ITEM_BYTES, CHAR_BYTES = 200, 100
# a small model decoding on a CPU, one character per step: a step of one row takes 1/3,000 s,
# each row more 1/100,000 s (a passage at 3,000 characters a second; 1,000 names of 16 in 0.165 s)
STEP_SECONDS, ROW_SECONDS, DECODE_BATCH = 1 / 3_000, 1 / 100_000, 1_024


def training_bytes(model, rows: int, row_len: int) -> int:
    """A rough upper estimate of one training step's float32 memory for `model` (a GPTConfig:
    vocab_size, block_size, n_embd, n_layer, n_head, mlp, mlp_ratio, tie_weights) on a batch of
    (rows, row_len) tokens: weights, gradients, AdamW's moments, and the activations the backward
    pass keeps, (row_len, row_len) attention weights per head included."""
    C, L, H, T = model.n_embd, model.n_layer, model.n_head, row_len
    params = model.vocab_size * C * (1 if model.tie_weights else 2) + model.block_size * C
    ratio = model.mlp_ratio if model.mlp else 0
    params += L * (4 * C * C + 2 * ratio * C * C)
    per_layer = rows * T * ((8 + 2 * ratio) * C + 2 * H * T)
    logits = 3 * rows * T * model.vocab_size
    return 4 * (4 * params + L * per_layer + logits)


def items_bytes(items: int, chars: int) -> int:
    """What generating or sampling `items` items of up to `chars` characters holds at its peak."""
    return items * (ITEM_BYTES + CHAR_BYTES * chars)


def check_memory(need: int, device: torch.device, what: str, fix: str, error=UserError) -> None:
    """The one rule for every estimate: `what` (the settings that size it) needing `need` bytes
    is refused, naming `fix`, where `device` has less free (the GPU's free memory, else Linux's
    MemAvailable); unknown free memory passes."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free, unknown = None, (OSError, ValueError, IndexError, StopIteration)
        with contextlib.suppress(*unknown), open("/proc/meminfo") as f:
            free = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    if free is not None and need > free:
        need_gib, free_gib = f"{need / 2**30:.1f} GiB", f"{free / 2**30:.1f} GiB"
        raise error(f"{what} needs about {need_gib}, but {device} has {free_gib} free; {fix}")


def decoding_seconds(items: int, chars: int) -> float:
    """About how long a small model takes to sample `items` items of `chars` characters on a CPU
    (the one time estimate): one step per character, up to DECODE_BATCH items a step."""
    return chars * (-(-items // DECODE_BATCH) * STEP_SECONDS + items * ROW_SECONDS)


class ThreadsError(UserError):
    """A bad `threads` setting."""


def check_threads(value, name: str = "threads") -> None:
    """A ThreadsError unless `auto` or 1 to max(64, 4 per usable core) threads (more only slow a
    run down, and very many crash the OpenMP runtime)."""
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ThreadsError(
            f"{name}={value!r} must be auto (the cores this process may use, shared among the "
            f"jobs running at once) or a whole number of threads >= 1"
        )
    most = max(64, 4 * usable_cores())
    if value > most:
        raise ThreadsError(
            f"{name}={value} is more threads than this machine can use (at most {most}: "
            f"4 per usable core); use threads=auto or a number up to {most}"
        )


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (errors.SIGNALS) held while the block runs, delivered when it
    ends: for library code (OmegaConf) that an exception raised inside it would leave
    half-updated. Held by handlers that note them, not by a signal mask: a mask holds them in the
    calling thread only, and the kernel hands a process's signal to any thread (tqdm's monitor),
    after which Python runs the handler in the main thread anyway, inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread runs Python's signal handlers
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(caught):  # each once, in the order they came
            signal.raise_signal(s)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1  # macOS and Windows have no sched_getaffinity


def env_threads(environ: Mapping[str, str]) -> int | None:
    """OMP_NUM_THREADS's first entry (OpenMP allows "4,2" for nested levels), None if no count."""
    first = environ.get(THREADS_ENV, "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def choose_threads(setting, cores: int, environ: Mapping[str, str]) -> int:
    """The threads for a `threads` setting: N; auto: OMP_NUM_THREADS if set, else every core."""
    check_threads(setting)
    if setting != "auto":
        return setting
    given = environ.get(THREADS_ENV, "").strip()
    if given and env_threads(environ) is None:
        # OpenMP ignores it (with a warning): taking every core instead would defy the user
        raise ThreadsError(
            f"{THREADS_ENV}={given!r} is not a number of threads; set it to a whole number >= 1, "
            f"unset it, or give threads=N"
        )
    return env_threads(environ) or max(1, cores)


def threads_origin(setting, count: int, environ: Mapping[str, str]) -> str:
    """Where choose_threads took its `count` from, for the line a user reads: the setting,
    OMP_NUM_THREADS (a cluster's or conda's, often) or the cores this process may use."""
    if setting != "auto":
        return f"threads={setting}"
    if env_threads(environ) is not None:
        return f"from {THREADS_ENV}={environ[THREADS_ENV].strip()}, not measured"
    return f"the {count} core{'s' if count != 1 else ''} this process may use, not measured"


def share(cores: int, jobs: int, n_jobs: int = -1) -> int:
    """Each job's share of `cores` (at least one thread) when `jobs` processes run, at most
    `n_jobs` at once (joblib's n_jobs; -1: one per core, -2: one fewer, ...: cores + 1 + n_jobs)."""
    at_once = min(jobs, n_jobs if n_jobs > 0 else cores + 1 + n_jobs)
    return max(1, cores // max(1, at_once))


def set_threads(setting) -> int:
    """Apply a `threads` setting to this process (torch.set_num_threads); returns the count."""
    n = choose_threads(setting, usable_cores(), os.environ)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model in eval mode (no dropout) while open, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
