"""The Hydra glue shared by train.py and sample.py: schemas and resolvers registered before
@hydra.main composes anything, run folders (the latest run, resume, sweep job names), quiet
non-zero ranks, and the one place user errors are printed."""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from microgpt import runs
from microgpt.config import (
    ConfigError,
    parse_resume,
    register_configs,
)
from microgpt.data.dataset import DataError
from microgpt.errors import print_error
from microgpt.files import OutputRefused
from microgpt.sample.generate import SamplingError
from microgpt.startup_checks import check_command_line
from microgpt.system import THREADS_ENV, env_threads, jobs_at_once, share, usable_cores
from microgpt.train.checkpoint import CheckpointError, load_checkpoint
from microgpt.train.trainer import Interrupted, TrainingError

RESOLVERS = {}  # filled below: the names conf/config.yaml calls


def register() -> None:
    """The config schemas (train, sample) and the resolvers, before @hydra.main composes."""
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
    folder = runs.resume_folder(parse_resume(resume))
    if folder is not None:
        return str(folder)
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
    """The keys a `-m` command line sweeps over: heads=1,2,4 or seed=range(3) -> [heads, seed]."""
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
    """Remember the swept keys for job_dir (in the environment: launcher subprocesses see it)."""
    if "-m" in argv or "--multirun" in argv:
        os.environ[SWEPT_KEYS_ENV] = ",".join(swept_keys(argv))


def job_dir(task_overrides, job_num) -> str:
    """hydra.sweep.subdir: a sweep job's folder, named by the swept settings ("heads=4"), so that
    TensorBoard's run list reads heads=1, heads=2, ... Falls back to every override, then the
    job number."""
    swept = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    overrides = [str(o) for o in task_overrides]
    chosen = (
        [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept] if swept else overrides
    )
    name = ",".join(chosen).replace("/", "_").replace(os.sep, "_")
    return name[:200] if name else str(job_num)


def sweep_size(task_overrides) -> int:
    """How many jobs a `-m` command line's overrides make (heads=1,2,4,8 -> 4)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([str(o) for o in task_overrides])
    return len(BasicSweeper.split_arguments(parsed, None)[0])


class ShareCores(Callback):
    """hydra.callbacks.share_cores in conf/config.yaml: before a parallel sweep on one machine
    (`hydra/launcher=joblib`) starts its jobs, give each job its share of the cores: the cores
    divided by the jobs that run at once, written into OMP_NUM_THREADS, which the launcher's worker
    processes inherit (and `threads=auto` then takes; see microgpt/threads.py). An OMP_NUM_THREADS
    the user set stays. Other launchers run one job at a time here, or on machines of their own."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        launcher = config.hydra.launcher
        if "joblib" not in str(launcher.get("_target_", "")) or env_threads(os.environ):
            return
        cores = usable_cores()
        at_once = jobs_at_once(
            int(launcher.get("n_jobs") or -1), sweep_size(config.hydra.overrides.task), cores
        )
        os.environ[THREADS_ENV] = str(share(cores, at_once))


def output_subdir(resume) -> str:
    """hydra.output_subdir, resolved by Hydra when the run folder exists and before it writes
    anything there but an empty train.log: the moment a new run claims its folder
    (microgpt.runs.claim_new). The claimant writes `.hydra`; a resume, or a run refused because
    the folder is not its own, writes a subfolder of its own, so the folder's Hydra config stays
    byte-identical (and the refused run removes only that, see remove_debris)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        folder = Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        folder = None
    if folder is None or not folder.is_dir():
        return ".hydra-resume-" + _stamp() if parse_resume(resume) else ".hydra"
    name = runs.hydra_subdir(folder)
    if name is not None:  # Hydra may ask more than once
        return name
    if parse_resume(resume):  # claimed when the run starts (runs.claim_resume)
        name = ".hydra-resume-" + _stamp()
        runs.note_hydra_subdir(folder, name, fresh=runs.new_run_error(folder) is None)
        return name
    try:
        runs.claim_new(folder)
        name = ".hydra"
    except runs.RunFolderError:  # refused when the run starts; writes beside the owner's
        name = ".hydra-" + _stamp()
    runs.note_hydra_subdir(folder, name)
    return name


def _stamp() -> str:
    return time.strftime("%Y-%m-%d_%H-%M-%S") + f"-{os.getpid()}"


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
    """Bad settings, data or checkpoints end the program with a one-line message, not a traceback.
    A run that stops before its first checkpoint leaves no folder behind (see remove_debris)."""
    try:
        yield
    except Interrupted as e:
        print(
            f"microgpt: {e}\nmicrogpt: resume with: {resume_command(e.checkpoint)}", file=sys.stderr
        )
        sys.exit(130)
    except (
        ConfigError,
        DataError,
        CheckpointError,
        SamplingError,
        TrainingError,
        runs.RunFolderError,
        OutputRefused,
        OSError,
    ) as e:
        removed = remove_debris(keep_failed_runs=isinstance(e, TrainingError))
        note = f" (removed the unused run folder {removed})" if removed else ""
        print_error(f"{os_error_line(e) if isinstance(e, OSError) else e}{note}")
        sys.exit(2)
    except KeyboardInterrupt as e:  # args: (signal name, what happened), either may be missing
        signame = e.args[0] if e.args else "SIGINT"
        removed = remove_debris(keep_failed_runs=False)
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


class Progress:
    """`microgpt: sampled 3,000 of 10,000 (30%)` on stderr, at most once a second and at the end,
    for work that takes more than one step."""

    def __init__(self, what: str, every: float = 1.0):
        self.what, self.every, self.last, self.calls = what, every, -math.inf, 0

    def __call__(self, done: int, total: int) -> None:
        self.calls += 1
        now = time.monotonic()
        if done >= total and self.calls == 1:  # done in one step: nothing to show
            return
        if done < total and now - self.last < self.every:
            return
        self.last = now
        print(f"microgpt: {self.what} {done:,} of {total:,} ({100 * done // total}%)",
              file=sys.stderr, flush=True)  # fmt: skip


def os_error_line(e: OSError) -> str:
    """An operating-system failure in one line: what failed, on which file, and what to check."""
    where = f" {e.filename}" if e.filename else ""
    also = f" -> {e.filename2}" if getattr(e, "filename2", None) else ""
    reason = e.strerror or str(e).splitlines()[0] if str(e) else type(e).__name__
    return (
        f"cannot use{where}{also}: {reason}; check that the path exists, is readable (and "
        f"writable, for a run folder or out=) and that its disk has space"
    )


def resume_command(checkpoint) -> str:
    """The short command that continues a run: the checkpoint holds every setting."""
    return shlex.join(["python", Path(sys.argv[0]).name, f"resume={checkpoint}"])


# ----------------------------------------------------------------------------- no debris


def remove_debris(keep_failed_runs: bool = False) -> str | None:
    """After an error, remove what this process wrote into run folders that hold no checkpoint
    (microgpt.runs.discard: a folder it claimed empty, whole; else its Hydra subfolder alone).
    Returns the removed run folder, if any."""
    return runs.discard(keep_failed_runs, before_removing=_close_log_files)


def _close_log_files(folder: Path) -> None:
    import logging

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
    change (checkpoint.RESUMABLE_CHANGES), naming them. resume=<run folder> means its last.pt."""
    resume = parse_resume(cfg.get("resume"))
    if not resume:
        return cfg
    try:
        path = runs.resume_checkpoint(resume, str(cfg.out_dir))
        saved = load_checkpoint(path)["train_config"]
    except (runs.RunFolderError, CheckpointError, KeyError, TypeError):
        return cfg  # the trainer says what is wrong with it
    legacy = saved.get("log") if isinstance(saved.get("log"), dict) else {}
    if "entropy_items" in legacy:  # log.head_items' name in checkpoints before issue 22
        legacy.setdefault("head_items", legacy.pop("entropy_items"))
    try:
        from hydra.core.hydra_config import HydraConfig

        task = list(HydraConfig.get().overrides.task)
    except ValueError:
        task = []
    merged = OmegaConf.create(saved)
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
    """key=value arguments whose value holds '=' (a sweep job's folder, multirun/<d>/<t>/heads=4)
    with the value quoted: Hydra's override grammar refuses an unquoted '=' in a value. Values
    already quoted, and lists, dicts and interpolations, are left as typed."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if (
            not eq
            or arg.startswith("-")
            or "=" not in value
            or value[:1] in ("'", '"', "[", "{")
            or "${" in value
        ):
            out.append(arg)
        elif "'" not in value:
            out.append(f"{key}='{value}'")
        elif '"' not in value:
            out.append(f'{key}="{value}"')
        else:
            out.append(arg)  # both quotes: Hydra says what it cannot read
    return out


def main(hydra_main, conf_dir: Path, config_name: str) -> None:
    """What train.py and sample.py run: check the command line, then hand it to Hydra."""
    sys.argv[1:] = quote_values(sys.argv[1:])
    check_command_line(sys.argv[1:], conf_dir, config_name)
    startup_signals()
    with user_errors():  # a signal while Hydra writes its files, before main's own user_errors
        hydra_main()
