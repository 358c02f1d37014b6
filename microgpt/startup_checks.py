"""Checking a command line before Hydra writes anything: every job of a sweep composed and
validated, with one line per bad setting (unknown keys with a close match, unknown group options,
wrong types, `--heads=4`), and a new run refused where a run already is."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from microgpt import runs
from microgpt.config import Config, ConfigError, SampleConfig, flatten, load_config, parse_resume
from microgpt.errors import print_error
from microgpt.generate import SamplingError

# Hydra's own flags: those that only print something skip our checks; the rest take a value
INFO_FLAGS = {
    "-h",
    "--help",
    "--hydra-help",
    "--version",
    "-c",
    "--cfg",
    "-i",
    "--info",
    "-sc",
    "--shell-completion",
    "--resolve",
    "--experimental-rerun",
}
CONFIG_FLAGS = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir"}
FLAGS = {"-m", "--multirun", "-p", "--package", *INFO_FLAGS, *CONFIG_FLAGS}
GROUPS = ("model", "data", "optim", "experiment")


def check_command_line(argv: list[str], conf_dir: Path, config_name: str) -> None:
    """Before @hydra.main writes anything: every setting of every job (all of a -m sweep's) is
    composed and validated, and each error is printed in one line (exit 2). With
    HYDRA_FULL_ERROR=1, a setting Hydra cannot compose is left to Hydra, trace and all."""
    if any(a.split("=", 1)[0] in INFO_FLAGS | CONFIG_FLAGS for a in argv):
        return
    try:
        errors = _command_line_errors(argv, conf_dir, config_name)
    except _LeaveToHydra:
        return
    if errors:
        if len(errors) > 1:
            print_error(f"{len(errors)} of the sweep's jobs have bad settings; none was started:")
        for e in errors:
            print_error(e)
        sys.exit(2)


class _LeaveToHydra(Exception):
    pass


def _command_line_errors(argv, conf_dir: Path, config_name: str) -> list[str]:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    multirun = "-m" in argv or "--multirun" in argv
    overrides = []
    for i, arg in enumerate(argv):
        if arg in FLAGS or arg.split("=", 1)[0] in FLAGS:
            continue
        if arg.startswith("-"):
            name, _, value = arg.lstrip("-").partition("=")
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            if not value and nxt and "=" not in nxt and not nxt.startswith("-"):
                value = nxt
            return [f"{arg}: settings are written {name}={value or 'VALUE'}, without dashes"]
        if i > 0 and argv[i - 1].startswith("-") and argv[i - 1] not in FLAGS:
            continue
        overrides.append(arg)
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        if full_error:
            raise _LeaveToHydra from None
        bad = _first(e).replace("Error parsing override", "cannot read the setting")
        return [f"{bad}; settings are written key=value, e.g. heads=4"]
    if multirun:
        try:
            jobs = BasicSweeper.split_arguments(parsed, None)[0]
        except HydraException:
            raise _LeaveToHydra from None
    elif any(o.is_sweep_override() for o in parsed):
        raise _LeaveToHydra  # Hydra says: add -m
    else:
        jobs = [overrides]
    sweep_keys = {o.get_key_element() for o in parsed if o.is_sweep_override()}
    errors = []
    for job in jobs:
        message = _job_error(list(job), conf_dir, config_name, full_error)
        if message:
            swept = [o for o in job if o.split("=", 1)[0] in sweep_keys]
            errors.append(f"job {','.join(swept)}: {message}" if len(jobs) > 1 else message)
    return errors


def _job_error(job: list[str], conf_dir: Path, config_name: str, full_error: bool) -> str | None:
    from hydra import compose, initialize_config_dir

    schema, error = (
        (SampleConfig, SamplingError) if config_name == "sample" else (Config, ConfigError)
    )
    task = [o for o in job if not o.lstrip("+~").startswith(("hydra.", "hydra/", "override hydra"))]
    if schema is Config and not any(o.split("=", 1)[0] == "out_dir" for o in task):
        task.append("out_dir=.")  # ${hydra:...} does not resolve under compose()
    base = None
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            groups = [o for o in task if o.split("=", 1)[0].lstrip("+~") in GROUPS]
            base = _compose(compose, config_name, groups)
            cfg = _compose(compose, config_name, task)
    except _BadOverride as e:
        if full_error:
            raise _LeaveToHydra from None
        return _explain(e, task, base, conf_dir)
    try:
        c = load_config(cfg, schema)
    except error as e:
        return str(e)
    if schema is Config:
        return _run_folder_error(c, job)
    return None


class _BadOverride(Exception):
    pass


def _compose(compose, config_name, overrides):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise _BadOverride(e) from None


def _first(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _explain(bad: _BadOverride, task: list[str], base, conf_dir: Path) -> str:
    """Hydra's multi-line composition error in one line: the setting, what is valid, a match."""
    e = bad.args[0]
    known = list(flatten(OmegaConf.to_container(base, resolve=False))) if base is not None else []
    for override in task:
        key, _, value = override.partition("=")
        bare = key.lstrip("+~")
        if bare in GROUPS or "/" in bare:
            group = conf_dir / bare
            options = sorted(p.stem for p in group.glob("*.yaml")) if group.is_dir() else []
            if value not in options and value != "null":
                close = difflib.get_close_matches(value, options, n=1)
                hint = f"; did you mean {bare}={close[0]}?" if close else ""
                return (
                    f"{override}: there is no {bare} named {value!r}; choose one of "
                    f"{', '.join(options)}{hint}"
                )
        elif known and not key.startswith("+") and bare not in known:
            parent = bare.rsplit(".", 1)[0] + "." if "." in bare else ""
            close = difflib.get_close_matches(bare, known, n=1, cutoff=0.75)
            if close:
                hint = f"; did you mean {close[0]}?"
            else:
                under = [k for k in known if k.startswith(parent)] if parent else known
                hint = f"; known settings{' under ' + parent[:-1] if parent else ''}: " + ", ".join(
                    sorted({k[len(parent) :].split(".")[0] for k in under})
                )
            return f"{override}: unknown setting {bare}{hint}"
    cause = e.__cause__ or e
    key = getattr(cause, "full_key", None)
    named = [o for o in task if key and o.split("=", 1)[0].lstrip("+~") == key]
    where = named[-1] if named else None  # the last one given wins
    return f"{where or _first(e)}: {_first(cause)}"


def _run_folder_error(c: Config, job: list[str]) -> str | None:
    """The run folder named on the command line, for a new run: a file, a folder holding a run,
    or one holding anything else (microgpt.runs.new_run_error), before Hydra writes there."""
    named = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in job if "=" in o}
    for key in ("hydra.run.dir", "out_dir"):
        if key not in named or (key == "out_dir" and c.out_dir == "."):
            continue
        folder = Path(named[key]).expanduser()
        if folder.exists() and not folder.is_dir():
            return f"{key}={named[key]} is an existing file, not a folder; name a new folder"
        if not parse_resume(c.resume):
            error = runs.new_run_error(folder)
            if error:
                return error
    return None
