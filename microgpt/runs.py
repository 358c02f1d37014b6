"""Where runs live: Hydra's output folders, the latest run, and the run folder for `resume`."""

from __future__ import annotations

import os
import time
from pathlib import Path

RUN_ROOTS = ("outputs", "multirun")  # conf/config.yaml: hydra.run.dir and hydra.sweep.dir


def find_checkpoints(roots=RUN_ROOTS, name: str = "best.pt") -> list[Path]:
    """Every checkpoints/<name> under the run roots, newest first."""
    found = [p for root in roots if Path(root).is_dir() for p in Path(root).glob(f"**/checkpoints/{name}")]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def latest_run_dir(roots=RUN_ROOTS) -> Path | None:
    """The folder of the most recently written checkpoints/last.pt, if any."""
    found = find_checkpoints(roots, "last.pt")
    return found[0].parent.parent if found else None


def _launcher_start_time() -> float | None:
    """When torchrun's agent (our parent process) started, so that all its ranks pick one folder."""
    if "LOCAL_WORLD_SIZE" not in os.environ:
        return None
    try:
        fields = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def run_dir(resume, default: str) -> str:
    """hydra.run.dir: the run to continue when resuming, else `default` (outputs/<date>/<time>).

    Registered as the OmegaConf resolver `microgpt_run_dir` by train.py. Under torchrun the
    timestamp is the launcher's start time, so every rank uses the same folder.
    """
    if resume is True or str(resume).lower() == "true":
        latest = latest_run_dir()
        if latest is not None:
            return str(latest)
    elif resume not in (False, None) and str(resume).lower() not in ("false", "none", "null", ""):
        ckpt = Path(str(resume)).expanduser()
        if ckpt.parent.name == "checkpoints":
            return str(ckpt.parent.parent)
    start = _launcher_start_time()
    if start is not None and default.startswith("outputs/"):
        return time.strftime("outputs/%Y-%m-%d/%H-%M-%S", time.localtime(start))
    return default


SWEPT_KEYS_ENV = "MICROGPT_SWEPT_KEYS"
_SWEEP_FUNCTIONS = ("range(", "choice(", "interval(", "glob(", "shuffle(", "sort(", "tag(")


def _has_top_level_comma(value: str) -> bool:
    depth, quote = 0, ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return True
    return False


def swept_keys(argv: list[str]) -> list[str]:
    """The keys a `-m` command line sweeps over: heads=1,2,4,8 or seed=range(3) -> ["heads", "seed"]."""
    keys = []
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra.") or key.startswith("hydra/"):
            continue
        if _has_top_level_comma(value) or value.startswith(_SWEEP_FUNCTIONS):
            keys.append(key)
    return keys


def record_swept_keys(argv: list[str]) -> None:
    """Remember the swept keys for job_dir (in the environment, so launcher subprocesses see them too)."""
    if "-m" in argv or "--multirun" in argv:
        os.environ[SWEPT_KEYS_ENV] = ",".join(swept_keys(argv))


def job_dir(task_overrides, job_num) -> str:
    """hydra.sweep.subdir: a sweep job's folder, named by the swept settings ("heads=4"), so that
    TensorBoard's run list reads heads=1, heads=2, ... Falls back to every override, then the job number."""
    swept = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    overrides = [str(o) for o in task_overrides]
    chosen = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept] if swept else overrides
    name = ",".join(chosen).replace("/", "_").replace(os.sep, "_")
    return name[:200] if name else str(job_num)


def output_subdir(resume) -> str:
    """hydra.output_subdir: `.hydra`, or a folder of its own for each resume, so that continuing a
    run in its folder keeps the original run's Hydra config and overrides."""
    if resume is True or str(resume).lower() not in ("false", "none", "null", ""):
        return time.strftime(".hydra-resume-%Y-%m-%d_%H-%M-%S")
    return ".hydra"
