"""What every section shares: figures, the Trainer of a recipe, the timed step, the machine.

The step timed is Trainer.train_step, the one Trainer.run takes; nothing here copies the
library's training or decoding.
"""

import contextlib
import itertools
import json
import operator
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from microgpt import system
from microgpt.config import load_config
from microgpt.train.trainer import Trainer

REPO = Path(__file__).resolve().parent.parent
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
# the plain reference GPT: microgpt's model trained as a plain GPT is (AdamW, every row padded to
# the longest, no weight averaging, float32)
PLAIN = ("optim=adamw", "train.pack=0", "train.ema=0", "train.precision=fp32")
UNIT = ("heads=4", *PLAIN)  # the default run before issue 27: the unit of the targets' cost
# --quick: every recipe shrunk to a few steps of a tiny model (a smoke test, not a result)
QUICK = ("model.n_layer=1", "model.n_embd=16", "train.max_steps=4", "optim.warmup_steps=1")
QUICK = (*QUICK, "train.eval_every=2", "train.num_samples=0", "log.attn_every=4")


def figure(values, unit: str, target: tuple[str, float] | None = None, **extra) -> dict:
    """{median, min, max, unit, n}; with a target ("<", 0.8), also `target` and `pass` (judged on
    the median). A None among the values (a loss never reached) makes the median None, a miss."""
    values = list(values)
    known = [v for v in values if v is not None]
    med = statistics.median(values) if values and len(known) == len(values) else None
    lo, hi = (min(known), max(known)) if known else (None, None)
    fig = {"median": med, "min": lo, "max": hi, "unit": unit, "n": len(values)}
    if target is not None:
        op, value = target
        fig["target"] = f"{op} {value:g}"
        fig["pass"] = med is not None and OPS[op](med, value)
    return {**fig, **extra}


def attempt(figures: dict, name: str, unit: str, work, *a):
    """work(*a)'s value; None if it raises, figures[name] then a figure not measured, with the
    first line of why: a case that cannot run (no text file, a compiler that fails) ends there."""
    try:
        return work(*a)
    except Exception as e:  # noqa: BLE001
        first = (str(e).strip().splitlines() or [""])[0]
        figures[name] = {**figure([], unit), "error": f"{type(e).__name__}: {first}"[:300]}
        return None


def measure(figures: dict, name: str, unit: str, target, work, *a, **extra) -> None:
    """figures[name]: the figure of work(*a)'s values, or why there is none (attempt)."""
    if (values := attempt(figures, name, unit, work, *a)) is not None:
        figures[name] = figure(values, unit, target, **extra)


def recipe(args, *overrides) -> list[str]:
    """overrides, then --row-override's, then QUICK with --quick."""
    return [*overrides, *args.row_override, *(QUICK if args.quick else ())]


def compose(overrides) -> object:
    """conf/config.yaml composed with overrides, as `python train.py ...` would."""
    import hydra

    from microgpt.cli import register

    register()
    with hydra.initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra.compose(config_name="config", overrides=list(overrides))


_runs = itertools.count(1)


def run_overrides(args, tmp: Path, out: Path | None = None) -> list[str]:
    """What every run here takes: the device, out_dir `out` (else a fresh one under tmp), no
    progress bar, the thread count (--threads, else auto)."""
    out = out or tmp / f"run{next(_runs)}"
    threads = f"threads={args.threads or 'auto'}"
    return [f"device={args.device}", f"out_dir='{out}'", "train.progress=false", threads]


def make_trainer(overrides, args, tmp: Path) -> Trainer:
    """A Trainer (data, model, optimizer; nothing written yet) for conf/ plus overrides."""
    return Trainer(load_config(compose([*run_overrides(args, tmp), *overrides])))


def timed(work, device: torch.device) -> float:
    """work()'s seconds, the device's queue drained before and after."""
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    sync()
    t0 = time.perf_counter()
    work()
    sync()
    return time.perf_counter() - t0


def time_steps(tr: Trainer, n: int) -> tuple[float, int]:
    """(seconds, real characters) of n steps of Trainer.train_step, its loss checked for
    finiteness when Trainer.run would check it."""
    every, chars = 1 if tr.device.type == "cpu" else tr.config.train.log_every, []
    steps = (tr.train_step(check=(tr.step + 1) % every == 0) for _ in range(n))  # lazy: timed
    seconds = timed(lambda: chars.extend(s.tokens for s in steps), tr.device)
    return seconds, sum(chars)


def alternate(trainers: list[Trainer], args) -> list[list]:
    """--rounds blocks of about --block-s seconds of each trainer's steps in turn, after 5 steps
    of warm-up (--quick: 1), the order reversed every round, so that whatever else the machine
    does slows all alike: per trainer, per round, (seconds a step, characters a second)."""
    for tr in trainers:
        time_steps(tr, 1 if args.quick else 5)
    steps = [max(1, round(args.block_s * 3 / time_steps(tr, 3)[0])) for tr in trainers]
    per: list[list] = [[] for _ in trainers]
    for r in range(args.rounds):
        for i in range(len(trainers))[:: -1 if r % 2 else 1]:
            seconds, chars = time_steps(trainers[i], steps[i])
            per[i].append((seconds / steps[i], chars / seconds))
    return per


def child(argv: list[str]) -> dict:
    """The JSON line `python argv` prints last, run fresh in the repository (on its path): its
    peak memory is its own."""
    env, cmd = {**os.environ, "PYTHONPATH": str(REPO)}, [sys.executable, *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} {argv[1][:40]} failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rss_mib(field: str = "VmHWM") -> float:
    """This process's resident memory from /proc: VmHWM, its peak (exec resets it: ru_maxrss
    would carry over the peak of the process that started this one), VmRSS, now."""
    lines = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in lines if line.startswith(f"{field}:")).split()[1]) / 1024


def machine_info() -> dict:
    lines = []
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    names = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    cpu = next(names, platform.processor() or "unknown")
    info = {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count()}
    # what decides bf16's kernels, so a bf16 figure's last digits: on another CPU kind they move
    info["bf16_instructions"] = sorted(set(system.BF16_FLAGS) & system.cpu_flags()) or "none"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


@contextlib.contextmanager
def busy(folder: Path, quick: bool = False):
    """Another training running on one thread while the block does: a busy core (`--busy`)."""
    steps = "train.max_steps=60" if quick else "train.max_steps=100000"
    command = [sys.executable, str(REPO / "train.py"), "heads=4", "threads=1", "seed=1", steps]
    load = subprocess.Popen([*command, f"out_dir={folder}", "train.progress=false"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(5)  # its start-up (imports, data) done: training
        yield
    finally:
        load.terminate()
        load.wait()


def git_commit() -> str:
    """The short commit of the repository, with +dirty when tracked files are changed."""
    git = ["git", "describe", "--always", "--dirty=+dirty", "--exclude=*"]  # no tag names
    try:
        done = subprocess.run(git, cwd=REPO, capture_output=True, text=True, check=True)
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
