"""What every section shares: figures, the config and Trainer of a run, the timed step, the machine.

The step timed is Trainer.train_step, the one Trainer.run takes, checked for finiteness as run
checks it; nothing here copies the library's training or decoding.
"""

from __future__ import annotations

import contextlib
import operator
import os
import platform
import statistics
import subprocess
from pathlib import Path

import torch
from torch import nn

from microgpt.config import load_config
from microgpt.train.trainer import StepResult, Trainer

REPO = Path(__file__).resolve().parent.parent
NAMES = REPO / "data" / "names.txt"
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}

# ----------------------------------------------------------------------------- figures


def figure(values, unit: str, target: tuple[str, float] | None = None, **extra) -> dict:
    """{median, min, max, unit, n}; with a target ("<", 0.8), also `target` and `pass` (of the
    median). A None among the values (a threshold never reached, say) makes the median None and
    the target a miss."""
    values = list(values)
    known = [v for v in values if v is not None]
    if len(known) == len(values) and values:
        med, lo, hi = statistics.median(values), min(values), max(values)
    else:
        med, lo, hi = None, (min(known) if known else None), (max(known) if known else None)
    fig = {"median": med, "min": lo, "max": hi, "unit": unit, "n": len(values)}
    if target is not None:
        op, value = target
        fig["target"] = f"{op} {value:g}"
        fig["pass"] = med is not None and OPS[op](med, value)
    fig.update(extra)
    return fig


def error_figure(e: BaseException, unit: str) -> dict:
    first = (str(e).strip().splitlines() or [""])[0]
    return {
        "median": None,
        "min": None,
        "max": None,
        "unit": unit,
        "n": 0,
        "error": f"{type(e).__name__}: {first}"[:300],
    }


# ----------------------------------------------------------------------------- runs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def compose(overrides) -> object:
    """conf/config.yaml composed with overrides, as `python train.py ...` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from microgpt.cli import register

    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


_runs = 0


def run_overrides(args, tmp: Path) -> list[str]:
    """The overrides every bench run takes: the device, a fresh out_dir under tmp, no progress
    bar, the thread count (--threads, else auto)."""
    global _runs
    _runs += 1
    return [
        f"device={args.device}",
        f"out_dir={tmp / f'run{_runs}'}",
        "train.progress=false",
        f"threads={args.threads or 'auto'}",  # the Trainer applies it (microgpt/threads.py)
    ]


def make_trainer(overrides, args, tmp: Path) -> Trainer:
    """A Trainer (data, model, optimizer; nothing written yet) for the default config plus
    overrides."""
    return Trainer(load_config(compose([*run_overrides(args, tmp), *overrides])))


def preset_model_config(preset: str, vocab_size: int):
    """The GPTConfig of a model preset at its own block size (256 when the preset leaves it to
    the data)."""
    cfg = load_config(compose([f"model={preset}", "device=cpu", "out_dir=."]))
    return cfg.model_for_data(vocab_size, cfg.model.block_size or 256)


def step(tr: Trainer) -> StepResult:
    """The step every section takes: Trainer.train_step, its loss and gradient checked for
    finiteness when Trainer.run would check them (every step on the CPU, every log_every steps
    elsewhere, where the check waits for the device)."""
    every = 1 if tr.device.type == "cpu" else tr.config.train.log_every
    return tr.train_step(check=(tr.step + 1) % every == 0)


def matmul_params(model: nn.Module) -> int:
    """Weights that multiply activations: every nn.Linear (lm_head included), not the embeddings."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


# ----------------------------------------------------------------------------- machine


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def git_commit() -> str:
    """The short commit of the repository, with +dirty when tracked files are changed."""

    def git(*args: str, check: bool) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=check)
        return done.stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD", check=True)
        dirty = git("status", "--porcelain", "--untracked-files=no", check=False)
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
