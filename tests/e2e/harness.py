"""The machinery of tests/e2e/test_harness.py: a sandbox project, its fingerprint, and the commands
(train.py, sample.py, python -m microgpt.heads / compare) run in this process, as a user would
type them, with their exit status, standard output and standard error.

Running a command in-process (rather than in a new Python, 3-5 s of imports each) is what makes a
few hundred bad commands cheap: train.py and sample.py are loaded once, and each call goes through
the same `cli.main` -> Hydra -> `cli.user_errors` path as the command line, with sys.argv, the
working directory, the signal handlers and the environment put back afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import re
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

_SCRIPTS: dict = {}


def _script(name: str):
    """train.py or sample.py as a module (loaded once), its Hydra main found as __main__'s."""
    if name not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"_harness_{name[:-3]}", REPO / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        # Hydra finds conf/ next to the file of a task function defined in __main__
        module.main.__wrapped__.__module__ = "__main__"
        _SCRIPTS[name] = module
    return _SCRIPTS[name]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("microgpt: error")]


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1


@contextlib.contextmanager
def _restored_process_state(cwd: Path, argv: list[str]):
    from microgpt import runs

    old_cwd, old_argv, old_env = os.getcwd(), sys.argv, dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os.chdir(cwd)
    sys.argv = argv
    os.environ["HYDRA_FULL_ERROR"] = "0"
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
        os.environ.clear()
        os.environ.update(old_env)
        for s, h in handlers.items():
            signal.signal(s, h)
        for folder in list(runs._OWNED):  # what a command held: a test process lives on
            runs.release(folder)
        import logging

        for h in list(logging.root.handlers):  # Hydra's handlers, on train.log and the console
            if getattr(h, "baseFilename", None):
                h.close()
                logging.root.removeHandler(h)


def run(command: str, *args, cwd: Path) -> Result:
    """Run `command` ("train.py", "sample.py", "heads", "compare") with `args` in `cwd`."""
    from microgpt import cli

    args = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    if command in ("train.py", "sample.py"):
        argv = [str(REPO / command), *args]
        module = _script(command)
        config = "config" if command == "train.py" else "sample"
    else:
        argv = [f"microgpt.{command}", *args]
    with _restored_process_state(cwd, argv):
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if command in ("train.py", "sample.py"):
                    cli.main(module.main, REPO / "conf", config)
                elif command == "heads":
                    from microgpt.heads import command as heads

                    code = heads.main(args)
                else:
                    from microgpt import compare

                    code = compare.main(args)
        except SystemExit as e:
            code = _exit_code(e)
    return Result(code, out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------- the fingerprint


def fingerprint(root: Path) -> dict[str, str]:
    """Every file, link and folder under `root`: a file's sha256, a link's target, "dir"."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "special"  # a FIFO: never opened
    return out


def changes(before: dict, after: dict) -> tuple[list[str], list[str], list[str]]:
    """(changed, removed, added) paths between two fingerprints."""
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    removed = sorted(k for k in before if k not in after)
    added = sorted(k for k in after if k not in before)
    return changed, removed, added


def remove_added(root: Path, added) -> None:
    """Put the sandbox back for the next case: remove what a command added."""
    for p in added:
        path = root / p
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def check_one_line(case, r: Result, success_on_stdout: bool = False) -> None:
    """The harness's promise for a command: no traceback, the exit status expected, and a failure
    is `case.lines` lines of `microgpt: error:` (the first matching case.message), nothing else
    on train.py's or sample.py's stderr; a success prints case.message (on stdout, if
    success_on_stdout) and no error."""
    text = r.text
    assert "Traceback" not in text, text[-3000:]
    assert r.code == case.code, text[-3000:]
    if case.code == 0:
        shown = r.stdout if success_on_stdout else text
        assert re.search(case.message, shown), shown[-2000:]
        assert not r.errors, r.stderr
        return
    assert len(r.errors) == case.lines, r.stderr[-2000:]
    where = r.errors[0] if case.lines else r.stderr
    assert re.search(case.message, where), where
    if case.command in ("train.py", "sample.py"):  # nothing else on stderr: the one line
        others = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("microgpt")]
        assert not others, r.stderr
