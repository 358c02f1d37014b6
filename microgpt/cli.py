"""The Hydra glue shared by train.py and sample.py, and the one place user errors become one line.

Before @hydra.main composes anything: the schemas and two resolvers (the run folder, a sweep
job's folder; neither writes anything), quiet non-zero ranks, and the command line checked
(microgpt.startup_checks). Hydra writes nothing into a run folder (`hydra.output_subdir: null`):
the run claims it, then writes its own config and command (microgpt.runs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from microgpt import runs
from microgpt.config import parse_resume, register_configs
from microgpt.errors import UserError, error_line, print_error
from microgpt.startup_checks import check_command_line, sweep_jobs
from microgpt.system import THREADS_ENV, env_threads, jobs_at_once, share, usable_cores
from microgpt.train.checkpoint import Checkpoint, CheckpointError
from microgpt.train.trainer import Interrupted, TrainingError

SWEPT_KEYS_ENV = "MICROGPT_SWEPT_KEYS"


def register() -> None:
    """The config schemas (train, sample) and the resolvers, before @hydra.main composes."""
    register_configs()
    record_swept_keys(sys.argv[1:])
    for name, fn in (("microgpt_run_dir", run_dir), ("microgpt_job_dir", job_dir)):
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
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def run_dir(resume, default: str) -> str:
    """hydra.run.dir (resolver `microgpt_run_dir`): the run a resume continues, else `default`
    (outputs/<date>/<time>; under torchrun the launcher's start time, one folder for all ranks).
    A resume that names no run is refused by the start-up checks, not here."""
    with contextlib.suppress(runs.RunFolderError):
        folder = runs.resume_folder(parse_resume(resume))
        if folder is not None:
            return str(folder)
    start = _launcher_start_time()
    if start is not None and default.startswith("outputs/"):
        return time.strftime("outputs/%Y-%m-%d/%H-%M-%S", time.localtime(start))
    return default


def swept_keys(argv: list[str]) -> list[str]:
    """The keys a `-m` command line sweeps over: heads=1,2,4 or seed=range(3) -> [heads, seed]."""
    args = [a for a in quote_values(argv) if "=" in a and not a.startswith(("-", "hydra"))]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return []
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


def record_swept_keys(argv: list[str]) -> None:
    """Remember the swept keys for job_dir (in the environment: launcher subprocesses see it)."""
    if "-m" in argv or "--multirun" in argv:
        os.environ[SWEPT_KEYS_ENV] = ",".join(swept_keys(argv))


def job_dir(task_overrides, job_num) -> str:
    """hydra.sweep.subdir: a sweep job's folder named by its swept settings ("heads=4"), so that
    TensorBoard's run list reads heads=1, heads=2, ...; else every override, else the number."""
    swept = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    overrides = [str(o) for o in task_overrides]
    if swept:
        overrides = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept]
    name = ",".join(overrides).replace("/", "_").replace(os.sep, "_")
    return name[:200] if name else str(job_num)


def sweep_size(task_overrides) -> int:
    """How many jobs a `-m` command line's overrides make (heads=1,2,4,8 -> 4)."""
    return len(sweep_jobs([str(o) for o in task_overrides]))


class ShareCores(Callback):
    """hydra.callbacks.share_cores: before a parallel sweep on one machine (hydra/launcher=joblib)
    starts, give each job its share of the cores in OMP_NUM_THREADS, which the workers inherit
    (and threads=auto takes). An OMP_NUM_THREADS the user set stays."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        launcher = config.hydra.launcher
        if "joblib" not in str(launcher.get("_target_", "")) or env_threads(os.environ):
            return
        cores = usable_cores()
        jobs = sweep_size(config.hydra.overrides.task)
        at_once = jobs_at_once(int(launcher.get("n_jobs") or -1), jobs, cores)
        os.environ[THREADS_ENV] = str(share(cores, at_once))


# Under torchrun every rank runs @hydra.main in the one run folder; ranks other than 0 write
# nothing there (no train.log: console only, warnings and errors).
OTHER_RANK_OVERRIDES = ("hydra/job_logging=stdout", "hydra.job_logging.root.level=WARNING")


def quiet_other_ranks(argv: list[str]) -> None:
    """Add OTHER_RANK_OVERRIDES to a torchrun worker's command line when its RANK is not 0."""
    if "LOCAL_WORLD_SIZE" not in os.environ or os.environ.get("RANK", "0") == "0":
        return
    taken = {a.split("=", 1)[0] for a in argv[1:]}
    argv += [o for o in OTHER_RANK_OVERRIDES if o.split("=", 1)[0] not in taken]


# ----------------------------------------------------------------------------- errors


@contextlib.contextmanager
def user_errors():
    """Bad settings, data, checkpoints or folders end the program with one line, exit 2, not a
    traceback; a signal with one line, exit 128 + its number. A run that stops before its first
    checkpoint leaves no folder behind (remove_debris)."""
    try:
        yield
    except Interrupted as e:
        print(f"microgpt: {e}\nmicrogpt: resume with: {resume_command(e.checkpoint)}",
              file=sys.stderr)  # fmt: skip
        sys.exit(130)
    except (UserError, TrainingError, OSError) as e:
        removed = remove_debris()
        note = f" (removed the unused run folder {removed})" if removed else ""
        print_error(f"{error_line(e)}{note}")
        sys.exit(2)
    except KeyboardInterrupt as e:  # args: (signal name, what happened), either may be missing
        signame = e.args[0] if e.args else "SIGINT"
        removed = remove_debris()
        if len(e.args) > 1:
            what = e.args[1]
        elif removed:
            what = (
                f"before the first checkpoint; removed the run folder {removed}, so there is "
                f"nothing to resume: start again"
            )
        else:
            what = "checkpoints already written are intact"
        print(f"microgpt: interrupted ({signame}): {what}", file=sys.stderr)
        code = signal.Signals[signame].value if signame in signal.Signals.__members__ else 2
        sys.exit(128 + code)


def resume_command(checkpoint) -> str:
    """The short command that continues a run: the checkpoint holds every setting."""
    return shlex.join(["python", Path(sys.argv[0]).name, f"resume={checkpoint}"])


def remove_debris() -> str | None:
    """After an error, remove the run folder this process claimed or Hydra made for it, when it
    holds no checkpoint (microgpt.runs.discard). Returns the removed run folder, if any."""
    made_for = None
    with contextlib.suppress(ValueError):  # no Hydra run here (tests, other commands)
        hydra = HydraConfig.get()
        if hydra.job.config_name == "config":
            made_for = hydra.runtime.output_dir
    if made_for is not None and Path(made_for).resolve() == Path.cwd().resolve():
        made_for = None
    return runs.discard(_close_log_files, made_for)


def _close_log_files(folder: Path) -> None:
    for logger in (logging.getLogger(), *logging.Logger.manager.loggerDict.values()):
        for h in list(getattr(logger, "handlers", [])):
            name = getattr(h, "baseFilename", None)
            if name and Path(name).parent == folder.absolute():
                h.close()
                logger.removeHandler(h)


def startup_signals() -> None:
    """SIGTERM before the training loop installs its own handler raises KeyboardInterrupt, so an
    interrupted start-up says what happened and leaves no half-made run folder."""

    def handle(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, handle)


# ----------------------------------------------------------------------------- resume


def resume_settings(cfg: DictConfig) -> DictConfig:
    """A resume takes every setting from the checkpoint it continues (its train_config); settings
    given on the command line replace the checkpoint's, and the trainer refuses those that may not
    change (checkpoint.RESUMABLE_CHANGES). resume=<run folder> means its last.pt."""
    resume = parse_resume(cfg.get("resume"))
    if not resume:
        return cfg
    try:
        path = runs.resume_checkpoint(resume, str(cfg.out_dir))
        saved = Checkpoint.load(path).train_config
    except (runs.RunFolderError, CheckpointError, KeyError, TypeError):
        return cfg  # the trainer says what is wrong with it
    legacy = saved.get("log") if isinstance(saved.get("log"), dict) else {}
    if "entropy_items" in legacy:  # log.head_items' name in checkpoints before issue 22
        legacy.setdefault("head_items", legacy.pop("entropy_items"))
    merged = OmegaConf.create(saved)
    task = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    for override in task:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra") or key in ("resume", "out_dir"):
            continue
        if key == "experiment":  # a recipe may set anything: the command line's config, whole
            merged = OmegaConf.merge(merged, OmegaConf.masked_copy(cfg, list(saved)))
        elif OmegaConf.select(cfg, key) is not None or "=" in override:
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key), force_add=True)
    # heads=N on a run whose preset already had N heads asks for nothing new
    if saved.get("heads") is None and merged.get("heads") == saved["model"]["n_head"]:
        merged.heads = None
    merged.out_dir, merged.resume = str(cfg.out_dir), str(path)
    return merged


def quote_values(argv: list[str]) -> list[str]:
    """key=value arguments whose value holds '=' (run=multirun/<d>/<t>/heads=4) with the value
    quoted, as Hydra's grammar needs; quoted values, lists, dicts and interpolations as typed."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        typed = value[:1] in ("'", '"', "[", "{") or "${" in value
        if not eq or arg.startswith("-") or "=" not in value or typed:
            out.append(arg)
        else:
            quote = next((q for q in ("'", '"') if q not in value), "")
            out.append(f"{key}={quote}{value}{quote}")  # both quotes: Hydra says what it can't read
    return out


def main(hydra_main, conf_dir: Path, config_name: str) -> None:
    """What train.py and sample.py run: check the command line, then hand it to Hydra."""
    sys.argv[1:] = quote_values(sys.argv[1:])
    check_command_line(sys.argv[1:], conf_dir, config_name)
    startup_signals()
    with user_errors():  # a signal while Hydra starts, before main's own user_errors
        hydra_main()
