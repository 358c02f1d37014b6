"""microgpt.runs, the run folder: a run writes only into a folder it owns (claimed in one
exclusive step, carrying a run id), its lock lasts as long as the run, commands agree on what a
run folder is, and what a run logs as its throughput is training alone."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from microgpt import runs
from microgpt.checkpoint import Checkpoint
from microgpt.cli import quote_values, remove_debris
from microgpt.config import ConfigError
from microgpt.runs import RunFolderError
from microgpt.train.trainer import Trainer, train
from tests.conftest import REPO, TINY, compose_config, make_names
from tests.e2e.harness import fingerprint as snapshot


def lock_is_free(folder: Path) -> bool:
    """Whether a new open file description can take the folder's flock (another process, or
    this one through another descriptor, holding it: False)."""
    with open(folder / ".lock") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
    return True


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------------- a run owns its folder


def test_resuming_into_another_runs_folder_is_refused_naming_both(tiny_cfg, tmp_path, caplog):
    """issue 21, case 1: resume=<A>/checkpoints/last.pt with B's folder used to exit 0 with B's
    best.pt, last.pt and samples now A's."""
    train(tiny_cfg("train.max_steps=6", out=tmp_path / "a"))
    train(tiny_cfg("train.max_steps=6", out=tmp_path / "b"))
    a, b = runs.RunFolder(tmp_path / "a"), runs.RunFolder(tmp_path / "b")
    for inside in (a.path / "sub", a.checkpoints / "x"):  # nor a folder inside one
        with pytest.raises(RunFolderError, match=f"is inside the run folder {a.path}:"):
            train(tiny_cfg(out=inside))
        assert not inside.exists()
    before = snapshot(b.path)
    with pytest.raises(RunFolderError) as info:
        train(tiny_cfg(f"resume={a.last}", "train.max_steps=12", out=b.path))
    message = str(info.value)
    assert a.run_id() in message and b.run_id() in message and "\n" not in message
    assert f"resume={a.path}" in message  # what to do instead
    assert snapshot(b.path) == before
    assert remove_debris() is None and snapshot(b.path) == before
    # into its own folder, or a new one, the resume goes on and keeps its run id
    train(tiny_cfg(f"resume={a.last}", "train.max_steps=9", out=tmp_path / "c"))
    c = runs.RunFolder(tmp_path / "c")
    assert c.run_id() == a.run_id() == Checkpoint.load(c.last).run_id
    with pytest.raises(ConfigError, match=r"the head count of a run cannot change \(it has 2"):
        train(tiny_cfg(f"resume={a.path}", "heads=4", "train.max_steps=9", out=a.path))
    train(tiny_cfg(f"resume={a.path}", "train.max_steps=9", out=a.path))
    assert Checkpoint.load(a.last).step == 9
    before = snapshot(a.path)  # a finished run: nothing to resume, nothing written
    with pytest.raises(ConfigError, match=r"nothing to resume: .*last\.pt is at step 9 and train"):
        train(tiny_cfg(f"resume={a.path}", "train.max_steps=9", out=a.path))
    assert snapshot(a.path) == before
    assert "train.max_steps=9 on a run of 6 steps: the cosine schedule now spans 9" in caplog.text


def test_of_two_claims_on_one_folder_one_wins_and_the_loser_removes_nothing(tmp_path):
    """issue 21, case 2: the loser of a start-up race believed the folder was its own and its
    clean-up removed the winner's. Here the winner is another process, which claims the folder
    between this process's look at it and its own claim: the loser must leave every file."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "train.log").touch()  # what Hydra makes before the claim, in both processes
    runs.check_new(folder)  # this process looks first: empty, a new run fits
    claim = f"from microgpt import runs; print(runs.claim_new({str(folder)!r}))"
    winner = subprocess.run(
        [sys.executable, "-c", claim], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert winner.returncode == 0, winner.stderr
    (folder / ".hydra").mkdir()  # the winner's files
    (folder / ".hydra" / "config.yaml").write_text("the winner's\n")
    before = snapshot(folder)
    with pytest.raises(RunFolderError, match="already holds a run"):
        runs.claim_new(folder)
    assert remove_debris() is None
    assert snapshot(folder) == before
    assert runs.RunFolder(folder).run_id() == winner.stdout.strip()


# ----------------------------------------------------------------------------- the lock


def test_the_lock_is_released_when_the_run_ends_whatever_the_ending(tiny_cfg, tmp_path):
    """issue 22, item 3: the lock used to last until the process ended (a sweep's finished jobs
    stayed locked) and leaked one file descriptor per run."""
    fds = open_fds()
    train(tiny_cfg("train.num_samples=0", "train.save_every=6", out=tmp_path / "one"))
    assert lock_is_free(tmp_path / "one")
    run = runs.RunFolder(tmp_path / "one")  # every checkpoint carries its folder's run id
    for path in run.checkpoints.glob("*.pt"):  # best, last, step-000006, step-000012
        assert Checkpoint.load(path).run_id == run.run_id() and len(run.run_id()) > 12, path
    train(tiny_cfg(out=tmp_path / "two"))
    assert lock_is_free(tmp_path / "two") and open_fds() == fds
    with pytest.raises(Exception, match="non-finite"):  # an ending by error
        train(tiny_cfg("optim.lr=1e30", "optim.grad_clip=0", out=tmp_path / "three"))
    assert lock_is_free(tmp_path / "three")
    remove_debris()


# ------------------------------------------------------------------------- one idea of a run


def test_a_run_folder_its_checkpoints_folder_and_a_checkpoint_name_one_run(tmp_path, monkeypatch):
    """And issue 21's "a path means one thing": a relative data.path is stored resolved, with the
    hash of the file's bytes, so every command reads the same file whatever its directory."""
    data = tmp_path / "data" / "names.txt"
    data.parent.mkdir()
    data.write_text("\n".join(make_names()) + "\n")
    monkeypatch.chdir(tmp_path)
    out = ["data.path=data/names.txt", "out_dir=run", "train.num_samples=0"]
    train(compose_config([*TINY, *out]))
    run = runs.RunFolder(tmp_path / "run")
    ckpt = Checkpoint.load(run.best)
    assert ckpt.train_config["data"]["path"] == str(data)
    assert ckpt.data_sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    named = {run.path: run.best, run.checkpoints: run.best, run.best: run.best, run.last: run.last}
    for given, checkpoint in named.items():
        folder, ckpt = runs.resolve(given)
        assert (folder.path, ckpt) == (run.path, checkpoint), given
    for given in (run.path, run.checkpoints, run.last, True):  # resume=..., in the run's folder
        folder, ckpt = runs.resolve_resume(str(given), run.path)
        assert (folder.path, ckpt) == (run.path, run.last), given
    assert run.analysis(run.best) == run.path / "heads-best.json"
    assert run.analysis(run.snapshot(500), ".md") == run.path / "heads-step-000500.md"


def test_a_runs_snapshots_are_listed_in_step_order_and_only_regular_files(tmp_path):
    """By step, not by name (step-1000000.pt came before step-999999.pt); a FIFO or another name
    is no snapshot."""
    run = runs.RunFolder(tmp_path)
    run.checkpoints.mkdir()
    for name in ("step-1000000.pt", "step-999999.pt", "step-000010.pt", "best.pt", "step-x.pt"):
        (run.checkpoints / name).write_bytes(b"")
    os.mkfifo(run.checkpoints / "step-000005.pt")
    assert run.snapshots() == [(10, run.snapshot(10)), (999999, run.snapshot(999999)),
                               (1000000, run.checkpoints / "step-1000000.pt")]  # fmt: skip
    assert [p.name for p in run.checkpoint_files()] == [
        "best.pt", "step-000010.pt", "step-999999.pt", "step-1000000.pt"]  # fmt: skip


# ------------------------------------------------------------------------- the command line


def test_values_holding_an_equals_sign_are_quoted_for_hydra():
    """issue 22, item 1: sweep job folders are named heads=4, and Hydra's grammar refuses an
    unquoted '=' in a value (`run=multirun/d/t/heads=4` exited 2 with "mismatched input")."""
    quoted = ["run='multirun/d/t/heads=4'", "heads=4", "-m"]
    assert quote_values(["run=multirun/d/t/heads=4", "heads=4", "-m"]) == quoted
    last = "m/heads=4,seed=1/checkpoints/last.pt"
    assert quote_values([f"resume={last}"]) == [f"resume='{last}'"]
    assert quote_values(["prefix='a=b'", "out=x'=y"]) == ["prefix='a=b'", 'out="x\'=y"']


# ----------------------------------------------------------------------------- throughput


def test_tokens_per_sec_counts_training_alone(tiny_cfg, tmp_path, monkeypatch):
    """issue 22, item 4: the first window started in Trainer.__init__ and windows with an
    evaluation counted it. With a clock that moves 1 ms per target token in a training step and
    far more in set-up, evaluation, checkpoints and the head analysis, every logged throughput
    is exactly 1,000 tokens/s."""
    from microgpt.train import state
    from microgpt.train.listeners import HeadAnalysis

    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def taking(fn, seconds=None):  # None: 1 ms per target token of a training step
        def timed(*args, **kwargs):
            out = fn(*args, **kwargs)
            clock[0] += seconds if seconds is not None else out.tokens / 1000
            return out

        return timed

    monkeypatch.setattr(Trainer, "train_step", taking(Trainer.train_step))
    monkeypatch.setattr(state, "load_data", taking(state.load_data, 50))
    other_work = [(Trainer, "_evaluate", 30), (HeadAnalysis, "log", 20), (Trainer, "_save", 9)]
    for owner, name, seconds in other_work:
        monkeypatch.setattr(owner, name, taking(getattr(owner, name), seconds))
    metrics = train(tiny_cfg("train.save_every=4", "train.num_samples=0"))
    logged = [m.get("tokens_per_sec") for m in runs.RunFolder(tmp_path / "run").metrics()]
    assert [x for x in logged if x] == pytest.approx([1000.0] * 4, rel=1e-9)  # steps 3, 6, 9, 12
    assert metrics["tokens_per_sec"] == pytest.approx(1000.0, rel=1e-9)
