"""The Hydra glue of train.py and sample.py (schemas, resolvers that write nothing, the command
line checked first, resume settings) and their way through the front door (microgpt.entry)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from microgpt import entry, runs
from microgpt.checkpoint import Checkpoint, CheckpointError
from microgpt.config import Config, SampleConfig
from microgpt.errors import UserError, first_line
from microgpt.startup_checks import SWEPT_KEYS_ENV, check_command_line, sweep_jobs
from microgpt.system import THREADS_ENV, env_threads, share, usable_cores
from microgpt.train.trainer import Interrupted
from microgpt.viz.bands import GROUPS_DIR, write_bands

# what Hydra's override lexer reads in a bare value; any other character needs quotes
BARE_VALUE = re.compile(r"[\w\-/\\+.$%*@?|:,()\[\]{} \t]*", re.ASCII)
EXPANDED = ("hydra.run.dir", "hydra.sweep.dir")  # paths Hydra uses as typed: ~ expanded here

# torchrun's ranks other than 0 write nothing in the run folder (console only, warnings up)
OTHER_RANK_OVERRIDES = ("hydra/job_logging=stdout", "hydra.job_logging.root.level=WARNING")


def register() -> None:
    """The config schemas (first in conf/*.yaml's defaults) and the resolvers, before @hydra.main
    composes."""
    ConfigStore.instance().store(name="schema", node=Config)
    ConfigStore.instance().store(name="sample_schema", node=SampleConfig)
    for name, fn in (("microgpt_run_dir", run_dir), ("microgpt_job_dir", job_dir)):
        OmegaConf.register_new_resolver(name, fn, replace=True)
    quiet_other_ranks(sys.argv)


def main(hydra_main, conf_dir: Path, config_name: str) -> None:
    """Check the command line, then hand it to Hydra, behind the front door."""
    with user_errors():  # a signal while Hydra starts, before main's own user_errors
        given = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and a[0] != "-")
        if config_name == "config" and "out_dir" in given and "hydra.run.dir" not in given:
            if not {"-m", "--multirun"} & set(sys.argv):  # Hydra's folder (train.log) is out_dir
                sys.argv.append(f"hydra.run.dir={given['out_dir']}")  # not outputs/<date>/<time>
        sys.argv[1:] = quote_values(sys.argv[1:])
        check_command_line(sys.argv[1:], conf_dir, config_name)
        with scheduler_refusals(sys.argv[1:]):
            hydra_main()


# what sbatch refuses (its message, lower case) -> the launcher setting that asked for it
SBATCH_SETTINGS = (
    ("gres", "hydra.launcher.gpus_per_node (0 on a cluster without GPUs)"),
    ("partition", "hydra.launcher.partition (sinfo lists them)"),
    ("account", "hydra.launcher.account"),
    ("feature", "hydra.launcher.constraint"),
    ("time limit", "hydra.launcher.timeout_min"),
    ("memory", "hydra.launcher.mem_gb"),
    ("node configuration", "hydra.launcher's cpus_per_task, mem_gb, nodes or tasks_per_node"),
)


@contextlib.contextmanager
def scheduler_refusals(argv: list[str]):
    """A SLURM sweep (hydra/launcher=slurm): a job sbatch refuses, or one that fails in the
    scheduler, becomes one UserError naming the launcher setting (docs/cluster.md), not the
    traceback Hydra prints of submitit's FailedJobError (HYDRA_FULL_ERROR makes it re-raise)."""
    if not any(a.startswith("hydra/launcher=") and "slurm" in a for a in argv):
        yield
        return
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        yield
    except Exception as e:
        if type(e).__name__ not in ("FailedJobError", "UncompletedJobError"):
            raise
        said = next((line for line in str(e).splitlines() if "error" in line), first_line(e))
        if "sbatch: error" not in str(e):  # a job that failed once running: its log says why
            raise UserError(f"a SLURM job failed: {said}; its log: the sweep's .submitit/")
        said = said.split("error:", 1)[-1].strip()
        setting = next((s for key, s in SBATCH_SETTINGS if key in said.lower()), "hydra.launcher")
        remove_unsubmitted_sweep()
        raise UserError(f"SLURM refused the jobs ({said}); check {setting}; docs/cluster.md")


def remove_unsubmitted_sweep() -> None:
    """The sweep folder of jobs sbatch refused, which holds only what Hydra and submitit wrote
    before (it was new or empty: startup_checks), removed like a run's that failed at start."""
    sweep, made = SeedBands.sweep, {".submitit", "multirun.yaml", runs.SWEEP_FILE}
    if sweep is not None and sweep.is_dir() and set(os.listdir(sweep)) <= made:
        shutil.rmtree(sweep)


def quote_values(argv: list[str]) -> list[str]:
    """`argv` with each value Hydra's lexer would refuse quoted (run='m/heads=4', prefix='©',
    data.path='~/book.txt'); `~` expanded in the folders Hydra makes (hydra.run.dir=~/runs/x)."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+") in EXPANDED and value.startswith("~"):
            value = os.path.expanduser(value)
        typed = value[:1] in ("'", '"', "[", "{") or "${" in value
        bare = not eq or arg.startswith("-") or typed or BARE_VALUE.fullmatch(value)
        # a value holding both quotes stays bare: Hydra says what it cannot read
        quote = "" if bare else next((q for q in ("'", '"') if q not in value), "")
        out.append(f"{key}={quote}{value}{quote}" if eq and not arg.startswith("-") else arg)
    return out


def run_dir(resume, default: str) -> str:
    """hydra.run.dir: the run a resume continues, else `default` (torchrun: one for all ranks)."""
    with contextlib.suppress(runs.RunFolderError):
        folder, _ = runs.resolve_resume(resume)
        if folder is not None:
            return str(folder)
    if "LOCAL_WORLD_SIZE" not in os.environ or not default.startswith("outputs/"):
        return default
    # when torchrun's agent (our parent process) started: field 22 of its stat, in clock ticks
    with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
        ticks = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
        start = boot + ticks / os.sysconf("SC_CLK_TCK")
        return time.strftime("outputs/%Y-%m-%d/%H-%M-%S", time.localtime(start))
    return default


def job_dir(task_overrides, job_num) -> str:
    """hydra.sweep.subdir: the job's swept settings ("heads=4"), else its overrides or number."""
    swept = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    overrides = [str(o) for o in task_overrides]
    if swept:
        overrides = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept]
    name = ",".join(overrides).replace("/", "_").replace(os.sep, "_")
    return name[:200] if name else str(job_num)


class ShareCores(Callback):
    """A joblib sweep: before it, each job's share of the cores in OMP_NUM_THREADS, unless set;
    in each job, its name (`[heads=4]`) before each line it logs to the console, as the jobs'
    lines interleave."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        launcher = config.hydra.launcher
        if "joblib" not in str(launcher.get("_target_", "")) or env_threads(os.environ):
            return
        task = [str(o) for o in config.hydra.overrides.task]
        params = config.hydra.sweeper.get("params") or {}  # an experiment's own sweep
        jobs = len(sweep_jobs([f"{k}={v}" for k, v in params.items()] + task))
        n_jobs = int(launcher.get("n_jobs") or -1)
        os.environ[THREADS_ENV] = str(share(usable_cores(), jobs, n_jobs))

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        if "joblib" not in str(config.hydra.launcher.get("_target_", "")):
            return
        label = f"[{Path(config.hydra.runtime.output_dir).name}] "
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler:  # the console, not the job's train.log
                handler.setFormatter(Labelled(label, handler.formatter or logging.Formatter()))


class SeedBands(Callback):
    """After a sweep, each group of its runs that differ only by seed as a mean with a band in
    TensorBoard (microgpt.viz.bands); a problem writing them is one warning line, never the
    sweep's failure (its runs are done and intact). `sweep`: the folder of the sweep begun."""

    sweep: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        SeedBands.sweep = Path(str(config.hydra.sweep.dir))
        with entry.front_door():  # a second sweep into this folder: one line, exit 2
            runs.claim_sweep(SeedBands.sweep)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        try:
            groups = write_bands(sweep)
        except Exception as e:  # noqa: BLE001 - whatever it is, the sweep stands
            print(f"microgpt: warning: no seed bands: {first_line(e)}", file=sys.stderr, flush=True)
            return
        if groups:
            names = ", ".join(f"{g.name} ({g.n} seeds)" for g in groups)
            bands = "TensorBoard's Custom Scalars: each group's mean over its seeds in a band"
            where = f"from min to max, in {sweep / GROUPS_DIR}"
            logging.getLogger(__name__).info(f"{bands} {where}: {names}")


class Labelled(logging.Formatter):
    """Another formatter's lines, each after `label`."""

    def __init__(self, label: str, inner: logging.Formatter):
        super().__init__()
        self.label, self.inner = label, inner

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(self.label + line for line in self.inner.format(record).split("\n"))


def quiet_other_ranks(argv: list[str]) -> None:
    """Add OTHER_RANK_OVERRIDES to the command line of a torchrun worker other than rank 0."""
    if "LOCAL_WORLD_SIZE" not in os.environ or os.environ.get("RANK", "0") == "0":
        return
    taken = {a.split("=", 1)[0] for a in argv[1:]}
    argv += [o for o in OTHER_RANK_OVERRIDES if o.split("=", 1)[0] not in taken]


@contextlib.contextmanager
def user_errors():
    """train.py's and sample.py's front door (entry.front_door): a run stopped or failed before
    its first checkpoint leaves no folder; a stopped run says how to resume it."""
    with entry.front_door("checkpoints already written are intact", remove_debris):
        try:
            yield
        except Interrupted as e:
            resume = shlex.join(["python", Path(sys.argv[0]).name, f"resume={e.checkpoint}"])
            print(f"microgpt: {e}\nmicrogpt: resume with: {resume}", file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.Signals[e.signal_name].value) from None


def remove_debris() -> str | None:
    """After an error, remove the run folder this process claimed or Hydra made, if it holds no
    checkpoint; returns it."""
    made_for = None  # no Hydra run here (tests, other commands), or a run in the working folder
    if HydraConfig.initialized() and HydraConfig.get().job.config_name == "config":
        made_for = Path(HydraConfig.get().runtime.output_dir)
    here = made_for is not None and made_for.resolve() == Path.cwd().resolve()
    return runs.discard(_close_log_files, None if here else made_for)


def _close_log_files(folder: Path) -> None:
    for logger in (logging.getLogger(), *logging.Logger.manager.loggerDict.values()):
        for h in list(getattr(logger, "handlers", [])):
            name = getattr(h, "baseFilename", None)
            if name and Path(name).parent == folder.absolute():
                h.close()
                logger.removeHandler(h)


def resume_settings(cfg: DictConfig) -> DictConfig:
    """A resume's settings: the checkpoint's, those on the command line replacing them."""
    try:
        _, path = runs.resolve_resume(cfg.get("resume"), str(cfg.out_dir))
        saved = Checkpoint.load(path).train_config if path else None
    except (runs.RunFolderError, CheckpointError):
        saved = None  # the trainer says what is wrong with it
    if saved is None:  # a new run, or a checkpoint that cannot be resumed
        return cfg
    merged = OmegaConf.create(saved)
    for override in HydraConfig.get().overrides.task if HydraConfig.initialized() else []:
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
