"""Checking a command line before Hydra writes anything: every job of a sweep composed and
validated, one line per bad setting, and a run or sweep refused a folder it may not use."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from microgpt import runs
from microgpt.config import (
    Config,
    ConfigError,
    SampleConfig,
    check_training_memory,
    flatten,
    load_config,
)
from microgpt.data.dataset import check_data_file, data_format
from microgpt.errors import UserError, first_line, print_error
from microgpt.system import pick_device

# Hydra's own flags: those that only print something skip our checks; the rest take a value
INFO_FLAGS = set(
    "-h --help --hydra-help --version -c --cfg -i --info -sc --shell-completion --resolve "
    "--experimental-rerun".split()
)
CONFIG_FLAGS = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir"}
FLAGS = {"-m", "--multirun", "-p", "--package", *INFO_FLAGS, *CONFIG_FLAGS}
GROUPS = ("model", "data", "optim", "experiment")
OTHER_RANK_WAIT = 30  # seconds a rank other than 0 waits, its command line refused (torchrun)
SWEPT_KEYS_ENV = "MICROGPT_SWEPT_KEYS"  # the keys a -m command line sweeps, for cli.job_dir


class _LeaveToHydra(Exception):
    """HYDRA_FULL_ERROR=1, or a sweep Hydra alone can read: Hydra reports it, trace and all."""


def _leave_to_hydra_if_asked() -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise _LeaveToHydra


def check_command_line(argv: list[str], conf_dir: Path, config_name: str) -> None:
    """Compose and validate every job (all of a -m sweep's); each error in one line, exit 2."""
    if any(a.split("=", 1)[0] in INFO_FLAGS | CONFIG_FLAGS for a in argv):
        return
    try:
        errors = _command_line_errors(argv, conf_dir, config_name)
    except _LeaveToHydra:
        return
    # under torchrun every rank checks the same command line: rank 0 alone says what is wrong
    shown = errors if os.environ.get("RANK", "0") == "0" else []
    if len(shown) > 1:
        print_error(f"{len(errors)} of the sweep's jobs have bad settings; none was started:")
    for e in shown:
        print_error(e)
    if errors and not shown and "LOCAL_WORLD_SIZE" in os.environ:
        # another rank: its exit first would make torchrun end rank 0 before it says why, so it
        # waits for that end (torchrun's SIGTERM when rank 0 exits) and goes without a word
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(2))
        time.sleep(OTHER_RANK_WAIT)
    if errors:
        sys.exit(2)


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Every job of a -m command line, as Hydra's basic sweeper makes them (heads=1,2
    seed=range(2) -> 4 jobs, by the sweeper's own code); HydraException if unreadable."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return BasicSweeper.split_arguments(parsed, max_batch_size=None)[0]  # one batch: every job


def experiment_sweep(overrides: list[str], conf_dir: Path) -> list[str]:
    """The sweep the experiment on the command line declares (hydra.sweeper.params in its file:
    heads: 1,2,4,8), as overrides; a key the command line gives is left to it, as Hydra does."""
    given = _settings(overrides)
    path = conf_dir / "experiment" / f"{given.get('experiment')}.yaml"
    if "experiment" not in given or not path.is_file():
        return []  # none, or one Hydra names as missing
    params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params") or {}
    return [f"{key}={value}" for key, value in params.items() if key not in given]


def _settings(job: list[str]) -> dict[str, str]:
    """key -> value of the key=value overrides (a leading + dropped; the last one given wins)."""
    return {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in job if "=" in o}


def _overrides(argv: list[str]) -> list[str]:
    """The key=value arguments; `--heads=4` (a flag Hydra does not know) is a UserError."""
    for i, arg in enumerate(argv):
        if arg.startswith("-") and arg.split("=", 1)[0] not in FLAGS:
            name, _, value = arg.lstrip("-").partition("=")
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            if not value and nxt and "=" not in nxt and not nxt.startswith("-"):
                value = nxt
            written = f"{name}={value or 'VALUE'}"
            raise UserError(f"{arg}: settings are written {written}, without dashes")
    return [arg for arg in argv if arg.split("=", 1)[0] not in FLAGS]


def _parse(overrides: list[str]) -> list:
    """Hydra's reading of the overrides, one at a time to name one it cannot read (a UserError)."""
    parser, parsed = OverridesParser.create(), []
    for override in overrides:
        try:
            (o,) = parser.parse_overrides([override])
        except HydraException as e:
            _leave_to_hydra_if_asked()
            why = first_line(e).replace("Error parsing override", "").strip(" '")
            how = "write key=value, a value with '=' or spaces in quotes: run='multirun/x/heads=4'"
            raise UserError(f"{override}: cannot read the setting ({why}); {how}") from None
        key = o.get_key_element().lstrip("~")
        if o.is_delete() and key not in GROUPS and not key.startswith("hydra"):
            raise UserError(f"{override}: every setting needs a value; set {key}=VALUE")
        parsed.append(o)
    return parsed


def _command_line_errors(argv, conf_dir: Path, config_name: str) -> list[str]:
    multirun = "-m" in argv or "--multirun" in argv
    try:
        overrides = _overrides(argv)
        if multirun:  # a named experiment's own sweep (experiment=heads_seeds), as Hydra runs it
            overrides = experiment_sweep(overrides, conf_dir) + overrides
        elif sweep := experiment_sweep(overrides, conf_dir):  # Hydra would train one run
            name = f"experiment={_settings(overrides)['experiment']}"
            raise UserError(f"{name} is a sweep ({' '.join(sweep)}): add -m, or set each once")
        swept = [o for o in _parse(overrides) if o.is_sweep_override()]
        if swept and not multirun:
            how = "add -m (one value that is a list: key=[a,b]; text with a comma: key='a,b')"
            raise UserError(f"{swept[0].input_line}: a list of values is a sweep: {how}")
        if multirun:  # in the environment: launcher subprocesses see it too
            os.environ[SWEPT_KEYS_ENV] = ",".join(o.get_key_element().lstrip("+~") for o in swept)
        if multirun and config_name == "config":
            _check_folder(_settings(overrides), "hydra.sweep.dir", "multirun", "a sweep")
    except UserError as e:
        return [str(e)]
    try:
        jobs = sweep_jobs(overrides) if multirun else [overrides]
    except HydraException:
        raise _LeaveToHydra from None
    sweep_keys = {o.get_key_element() for o in swept}
    errors, seen = [], {}
    for job in jobs:
        message, settings = _job_error(job, conf_dir, config_name)
        name = ",".join(o for o in job if o.split("=", 1)[0] in sweep_keys)
        if message:
            errors.append(f"job {name}: {message}" if len(jobs) > 1 else message)
        elif settings in seen:  # two jobs that would train the same run, into one folder
            return [f"jobs {seen[settings]} and {name} are the same run (listed twice)"]
        else:
            seen[settings] = name
    # submitit's SLURM launcher on a machine without SLURM would stop in a traceback
    slurm = multirun and _settings(overrides).get("hydra/launcher") == "slurm"
    if not errors and slurm and not shutil.which("srun"):
        how = "run the command on the cluster, or use hydra/launcher=joblib for parallel jobs here"
        errors.append(f"hydra/launcher=slurm: this machine has no SLURM (no srun); {how}")
    return errors


def _job_error(job: list[str], conf_dir: Path, config_name: str) -> tuple[str | None, str]:
    """(what is wrong with this job, or None; its validated settings as text, to find twins)."""
    schema = SampleConfig if config_name == "sample" else Config
    known = list(flatten(dataclasses.asdict(schema())))
    task = [o for o in job if not o.lstrip("+~").startswith(("hydra.", "hydra/", "override hydra"))]
    if schema is Config and "out_dir" not in _settings(task):
        task.append("out_dir=.")  # ${hydra:...} does not resolve under compose()
    try:
        _check_keys(task, known)
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            try:
                cfg = compose(config_name=config_name, overrides=task)
            except (HydraException, OmegaConfBaseException) as e:
                _leave_to_hydra_if_asked()
                return _explain(e, task, conf_dir), ""
        c = load_config(cfg, schema, given=_settings(task))
        if schema is Config:
            _check_job(c, job)
    except UserError as e:
        return str(e), ""
    return None, json.dumps(dataclasses.asdict(c), sort_keys=True, default=str)


def _check_keys(task: list[str], known: list[str]) -> None:
    """A key the schema does not have (`+key=value` included: it would be ignored) is a UserError
    naming the closest setting, else those beside it."""
    for override in task:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in GROUPS or "/" in key or key.split(".")[0] == "hydra" or key in known:
            continue
        # a group of settings (data.repeats), or an item of one (optim.betas.0)
        if any(k.startswith(key + ".") or key.startswith(k + ".") for k in known):
            continue
        if not override.startswith("+"):
            _leave_to_hydra_if_asked()  # Hydra refuses the key itself, trace and all
        if close := difflib.get_close_matches(key, known, n=1, cutoff=0.75):
            raise UserError(f"{override}: unknown setting {key}; did you mean {close[0]}?")
        parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
        under = sorted({k[len(parent) :].split(".")[0] for k in known if k.startswith(parent)})
        where = f" under {parent[:-1]}" if parent else ""
        raise UserError(f"{override}: unknown setting {key}; known settings{where}: "
                        f"{', '.join(under)}")  # fmt: skip


def _explain(e: Exception, task: list[str], conf_dir: Path) -> str:
    """Hydra's multi-line composition error in one line: the setting, what is valid, a match."""
    for override in task:
        key, _, value = override.partition("=")
        bare = key.lstrip("+~")
        if bare in GROUPS or "/" in bare:
            options = sorted(p.stem for p in (conf_dir / bare).glob("*.yaml"))
            if value not in options and value != "null":
                close = difflib.get_close_matches(value, options, n=1)
                hint = f"; did you mean {bare}={close[0]}?" if close else ""
                choose = f"choose one of {', '.join(options)}{hint}"
                return f"{override}: there is no {bare} named {value!r}; {choose}"
    cause = e.__cause__ or e
    key = getattr(cause, "full_key", None)
    named = [o for o in task if key and o.split("=", 1)[0].lstrip("+~") == key]
    # the last one given wins
    return f"{named[-1] if named else first_line(e)}: {first_line(cause)}"


def _check_job(c: Config, job: list[str]) -> None:
    """What the schema cannot see: memory, the data file, the run's folders."""
    named, resume = _settings(job), runs.parse_resume(c.resume)
    # the settings that size the training step, against the device's memory (lower bounds)
    check_training_memory(c, pick_device(c.device, ConfigError))
    # a resume trains on its checkpoint's data; repeats reads no file
    if not (resume and "data.path" not in named) and data_format(c.data.format).reads_file:
        check_data_file(c.data.path, c.data.prepare)
    # under torchrun every rank checks the folder (rank 0 alone claims it, once every rank has
    # joined the process group, so after these checks): a refused one stops all ranks at once
    what = "a run" if not resume else None
    if c.out_dir != ".":  # given on the command line (_job_error sets the default)
        runs.check_new(c.out_dir, "out_dir", what, ours=False)
    _check_folder(named, "hydra.run.dir", "outputs", what)  # out_dir=X alone: X too (cli.main)
    if isinstance(resume, str):  # a named run or checkpoint that is not there fails here
        runs.resolve_resume(resume)


def _check_folder(named: dict, key: str, default: str, what: str | None) -> None:
    """The folder `key` names (else `default`): refused to `what` when named, else if unusable."""
    folder = named.get(key, "").strip("'\"") or default
    runs.check_new(folder, key, what if key in named else None, ours=False)
