"""The Hydra glue shared by train.py and sample.py: schemas and resolvers registered before
@hydra.main composes anything, run folders (the latest run, resume, sweep job names), quiet
non-zero ranks, and the one place user errors are printed."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from microgpt.checkpoint import CheckpointError, latest_run_dir
from microgpt.config import ConfigError, parse_resume, register_configs
from microgpt.data import DataError
from microgpt.generate import SamplingError
from microgpt.trainer import Interrupted, TrainingError

RESOLVERS = {}  # filled below: the names conf/config.yaml calls


def register() -> None:
    """The config schemas (train, sample) and the resolvers, before @hydra.main composes anything."""
    register_configs()
    record_swept_keys(sys.argv[1:])
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    quiet_other_ranks(sys.argv)


# ----------------------------------------------------------------------------- run folders


def _launcher_start_time() -> float | None:
    """When torchrun's agent (our parent process) started, so that all its ranks pick one folder."""
    if "LOCAL_WORLD_SIZE" not in os.environ:
        return None
    try:
        fields = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def run_dir(resume, default: str) -> str:
    """hydra.run.dir: the run to continue when resuming, else `default` (outputs/<date>/<time>).

    Registered as the OmegaConf resolver `microgpt_run_dir` by train.py. Under torchrun the
    timestamp is the launcher's start time, so every rank uses the same folder.
    """
    resume = parse_resume(resume)
    if resume is True:
        latest = latest_run_dir()
        if latest is not None:
            return str(latest)
    elif resume:
        ckpt = Path(resume).expanduser()
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
        if key.startswith(("hydra.", "hydra/")):
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
    chosen = (
        [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept] if swept else overrides
    )
    name = ",".join(chosen).replace("/", "_").replace(os.sep, "_")
    return name[:200] if name else str(job_num)


def output_subdir(resume) -> str:
    """hydra.output_subdir: `.hydra`, or a folder of its own for each resume, so that continuing a
    run in its folder keeps the original run's Hydra config and overrides."""
    if parse_resume(resume):
        return time.strftime(".hydra-resume-%Y-%m-%d_%H-%M-%S")
    return ".hydra"


RESOLVERS.update(
    microgpt_run_dir=run_dir, microgpt_output_subdir=output_subdir, microgpt_job_dir=job_dir
)


# ----------------------------------------------------------------------------- processes and errors


# Under torchrun every rank runs @hydra.main in the one run folder. Ranks other than 0 write
# nothing there: no .hydra/ copy of the config, no train.log (console only, warnings and errors).
OTHER_RANK_OVERRIDES = (
    "hydra.output_subdir=null",
    "hydra/job_logging=stdout",
    "hydra.job_logging.root.level=WARNING",
)


def quiet_other_ranks(argv: list[str]) -> None:
    """Add OTHER_RANK_OVERRIDES to a torchrun worker's command line when its RANK is not 0."""
    if "LOCAL_WORLD_SIZE" not in os.environ or os.environ.get("RANK", "0") == "0":
        return
    taken = {a.split("=", 1)[0] for a in argv[1:]}
    argv += [o for o in OTHER_RANK_OVERRIDES if o.split("=", 1)[0] not in taken]


@contextlib.contextmanager
def user_errors():
    """Bad settings, data or checkpoints end the program with a one-line message, not a traceback."""
    try:
        yield
    except Interrupted as e:
        print(
            f"microgpt: {e}\nmicrogpt: resume with: {resume_command(e.checkpoint)}", file=sys.stderr
        )
        sys.exit(130)
    except (ConfigError, DataError, CheckpointError, SamplingError, TrainingError) as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("microgpt: interrupted; checkpoints already written are intact", file=sys.stderr)
        sys.exit(130)


def resume_command(checkpoint) -> str:
    """This program's command line with resume=<checkpoint> in place of any resume=...: the same settings."""
    args = [a for a in sys.argv[1:] if not a.lstrip("+~").startswith("resume=")]
    return shlex.join(["python", Path(sys.argv[0]).name, *args, f"resume={checkpoint}"])
