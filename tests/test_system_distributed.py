"""Data-parallel training under torchrun (gloo, 2 CPU processes), launchers, and unwrapped
checkpoints.

One real `torchrun --nproc_per_node=2 train.py` run (module fixture, ~15 s) serves two tests: it
writes exactly one run folder, and its weights equal a single process's with the whole batch.
Every subprocess has a timeout and is killed with its whole process group, so a hang fails fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from microgpt import system
from microgpt.checkpoint import Checkpoint
from microgpt.config import ConfigError, load_config
from microgpt.model import GPT, GPTConfig
from microgpt.train.trainer import Trainer, train
from tests.conftest import CONF, REPO, TINY, compose_config, make_names

# 2 ranks x PER_RANK against 1 process x 2 * PER_RANK, dropout off, the same seed and data order
PER_RANK = 8
STEPS = 8
SETTINGS = [*TINY, "model.dropout=0", f"train.max_steps={STEPS}", f"train.eval_every={STEPS}"]
SETTINGS += ["train.num_samples=3", f"log.attn_every={STEPS}"]
SETTINGS += ["train.precision=fp32", "optim.muon_precision=fp32"]  # bf16 rounds each batch apart


def run_bounded(cmd: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """subprocess.run, but a timeout stops torchrun and its workers (each its own session): a
    SIGABRT first, which makes each print where it waited (faulthandler), then SIGKILL."""
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(cmd, cwd=cwd, **pipes, text=True, start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        err = ""
        for sig in (signal.SIGABRT, signal.SIGKILL):
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                err = proc.communicate(timeout=10)[1]
                break
        where = f"{' '.join(cmd[:6])} ... did not finish in {timeout} s (a hung rank?)"
        pytest.fail(f"{where}; its stderr ends:\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def descendants(pid: int) -> list[int]:
    """Every process started by pid or its children (Linux's /proc)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [d for c in children for d in (c, *descendants(c))]


def torchrun_train(cwd: Path, *settings: str, ok=True, timeout=120) -> subprocess.CompletedProcess:
    """torchrun --standalone --nproc_per_node=2 train.py <settings> device=cpu, in `cwd`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(REPO / "train.py"), *settings, "device=cpu"]
    result = run_bounded(cmd, cwd, timeout=timeout)
    if ok:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    """python -m torch.distributed.run --standalone --nproc_per_node=2 train.py, in a fresh folder
    without hydra.run.dir, so the outputs/<date>/<time> naming runs as it does for a user."""
    cwd = tmp_path_factory.mktemp("torchrun")
    data = cwd / "names.txt"
    data.write_text("\n".join(make_names()) + "\n")
    result = torchrun_train(cwd, *SETTINGS, f"train.batch_size={PER_RANK}", f"data.path={data}")
    return cwd, data, result


def test_torchrun_writes_exactly_one_run_folder(torchrun_run):
    cwd, _, result = torchrun_run
    (run,) = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    for name in ("config.yaml", "samples.txt", "checkpoints/best.pt", "checkpoints/last.pt"):
        assert (run / name).is_file(), name
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # rank 0's writer only
    log = result.stdout + result.stderr
    # rank 0 alone prints the summary (with the global batch) and the samples
    assert log.count("parameters\ndata ") == 1, log[-3000:]
    assert f"batch {2 * PER_RANK} ({PER_RANK} x 2 ranks)" in log
    assert log.count("samples:") == 1
    assert (run / "train.log").read_text().count("parameters\ndata ") == 1


def test_two_ranks_end_with_the_weights_of_one_process_with_the_whole_batch(torchrun_run, tmp_path):
    cwd, data, _ = torchrun_run
    (ddp_run,) = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    common = [*SETTINGS, f"data.path={data}", "device=cpu"]
    whole = [f"train.batch_size={2 * PER_RANK}", f"out_dir={tmp_path}"]
    single = train(compose_config([*common, *whole]))
    a = Checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    b = Checkpoint.load(ddp_run / "checkpoints" / "last.pt")
    assert a.step == b.step == STEPS
    # saved from the plain module, never the DDP wrapper: keys load into a plain GPT
    assert list(a.model) == list(b.model)
    GPT(GPTConfig(**b.model_config)).load_state_dict(b.model)
    worst = max((a.model[k] - b.model[k]).abs().max().item() for k in a.model)
    assert worst < 1e-5, f"largest weight difference {worst:.3g}"
    # evaluation, done by rank 0 alone on the whole split, gives the single process's numbers;
    # the logged train loss is the global batch's (all ranks), not rank 0's slice
    assert b.metrics["val_loss"] == pytest.approx(single["val_loss"], abs=1e-5)
    assert b.metrics["train_loss"] == pytest.approx(single["train_loss"], abs=1e-5)
    # the data order is drawn per global batch: one process with half of it cannot resume it
    with pytest.raises(ConfigError, match=f"global batch of {2 * PER_RANK} \\(2 ranks\\)"):
        resume = [f"train.max_steps={STEPS + 4}", f"resume={b.path}", f"out_dir={tmp_path}/r"]
        train(compose_config([*common, f"train.batch_size={PER_RANK}", *resume]))


# ----------------------------------------------------------------------------- who am I


LAUNCHER_VARIABLES = (
    "RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT SUBMITIT_EXECUTOR "
    "SLURM_JOB_ID SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_JOB_NUM_NODES SLURM_NODEID "
    "SLURM_JOB_NODELIST"
).split()


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables; whatever a test (or submitit's export) sets is undone afterwards."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.setenv(name, "x")  # recorded as unset, so undo removes what export() adds
        monkeypatch.delenv(name)
    return monkeypatch


def test_no_launcher_is_one_process_and_torchrun_variables_win_over_slurm_ones(clean_env):
    assert system.dist_info_from_env() == system.DistInfo(0, 1, 0)
    # torchrun inside a SLURM job: torchrun's variables win
    for k, v in {"RANK": 3, "WORLD_SIZE": 4, "LOCAL_RANK": 1, "SUBMITIT_EXECUTOR": "slurm"}.items():
        clean_env.setenv(k, str(v))
    assert system.dist_info_from_env() == system.DistInfo(3, 4, 1)


@pytest.mark.parametrize("tasks, rank", [(8, (5, 8, 1)), (1, (0, 1, 0))])
def test_a_submitit_slurm_task_becomes_a_rank(clean_env, tasks, rank):
    pytest.importorskip("submitit")
    slurm = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": str(tasks)}
    slurm.update(SLURM_PROCID=str(rank[0]), SLURM_LOCALID=str(rank[2]), SLURM_NODEID="1")
    slurm.update(SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="gpu[07-08]")
    for k, v in slurm.items():
        clean_env.setenv(k, v)
    info = system.dist_info_from_env()
    assert (info.rank, info.world_size, info.local_rank) == rank
    if tasks == 1:  # one process: no process group to join
        assert "MASTER_ADDR" not in os.environ
        return
    # what init_process_group(env://) reads: the first node, a port every task derives alike
    assert os.environ["MASTER_ADDR"] == "gpu07"
    assert 20000 <= int(os.environ["MASTER_PORT"]) <= 60000
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("5", "8")


def test_non_zero_ranks_write_no_hydra_files(clean_env):
    from microgpt.cli import OTHER_RANK_OVERRIDES, quiet_other_ranks

    clean_env.setenv("LOCAL_WORLD_SIZE", "2")
    for rank, added in (("0", []), ("1", OTHER_RANK_OVERRIDES)):  # rank 0 keeps Hydra's files
        clean_env.setenv("RANK", rank)
        quiet_other_ranks(argv := ["train.py", "heads=4"])
        assert argv == ["train.py", "heads=4", *added]
    mine = ["train.py", "hydra/job_logging=disabled"]
    quiet_other_ranks(mine)  # a choice on the command line is kept
    assert mine.count("hydra/job_logging=disabled") == 1 and "hydra/job_logging=stdout" not in mine


# -------------------------------------------------------------------- checkpoints of wrapped models


def test_a_compiled_model_trains_the_plain_modules_weights_and_saves_its_keys(tiny_cfg):
    """train.compile=true wraps the plain GPT (compiled at the first step): the wrapper trains
    the plain module's own tensors, and checkpoints hold its keys (no `_orig_mod.` prefix)."""
    trainer = Trainer(load_config(tiny_cfg("train.compile=true", "device=cpu")))
    assert trainer.train_model._orig_mod is trainer.model
    saved = trainer.checkpoint({}).model
    assert list(saved) == list(GPT(trainer.model_config).state_dict())


# ----------------------------------------------------------------------------- launchers


def test_the_slurm_launcher_config_composes():
    from hydra import compose, initialize_config_dir

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    task = ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.nodes=2"]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        launcher = compose("config", overrides=task, return_hydra_config=True).hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.nodes) == ("gpu", 2)
    assert all(launcher[key] is not None for key in ("timeout_min", "mem_gb", "tasks_per_node"))


def test_a_refused_run_folder_stops_every_rank_at_once(tmp_path):
    """A run folder that holds another run (an empty checkpoints/ is already there) is refused
    before any collective, so no rank waits for the process group's 10-minute timeout. Each rank
    checks its command line, but torchrun ends the others when the first exits: only one
    message is guaranteed (a busy machine showed rank 1 killed before it printed its own)."""
    data = tmp_path / "names.txt"
    data.write_text("\n".join(make_names()) + "\n")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    settings = [*SETTINGS, f"train.batch_size={PER_RANK}", f"data.path={data}"]
    result = torchrun_train(tmp_path, *settings, f"hydra.run.dir={run}", ok=False, timeout=120)
    assert result.returncode != 0
    message = "already holds a run; continue it with resume="
    assert result.stderr.count(message) >= 1, result.stderr[-3000:]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]  # nothing written there
    assert list((run / "checkpoints").iterdir()) == []


@pytest.mark.slow  # three 2-rank torchrun runs: about 30 s of the default suite's 4 minutes
def test_ddp_resume_with_dropout_is_exact(tmp_path):
    """Each rank draws its own dropout masks and saves its own RNG state in last.pt: 2 ranks
    trained 4 steps then resumed to 8 end with the weights of 2 ranks trained 8 steps at once.
    (Restoring rank 0's state on every rank, as before, gives rank 1 other masks after the
    resume.)"""
    data = tmp_path / "names.txt"
    data.write_text("\n".join(make_names()) + "\n")
    common = [*SETTINGS, "model.dropout=0.3", "train.eval_every=4", "train.num_samples=0"]
    # the same schedule whatever max_steps is
    common += ["optim.decay=constant", f"train.batch_size={PER_RANK}", f"data.path={data}"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    torchrun_train(tmp_path, *common, "train.max_steps=8", f"hydra.run.dir={whole}")
    torchrun_train(tmp_path, *common, "train.max_steps=4", f"hydra.run.dir={split}")
    last = split / "checkpoints" / "last.pt"
    ranks = Checkpoint.load(last).resume["ranks"]
    assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])  # two streams
    resume = ["train.max_steps=8", f"hydra.run.dir={split}", f"resume={last}"]
    torchrun_train(tmp_path, *common, *resume)
    a = Checkpoint.load(whole / "checkpoints" / "last.pt")
    b = Checkpoint.load(last)
    assert a.step == b.step == 8
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)


@pytest.mark.slow
def test_two_nodes_by_c10d_rendezvous_write_one_run(tmp_path):
    """Two torchrun agents, one rank each, meet by c10d rendezvous as two nodes would, each in
    its own working folder: one run, in rank 0's folder; the other node's folder is removed, and
    its weights are one process's with the whole batch."""
    data = tmp_path / "names.txt"
    data.write_text("\n".join(make_names()) + "\n")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"]
    node += ["--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=microgpt"]
    node += [str(REPO / "train.py"), *SETTINGS, f"train.batch_size={PER_RANK}"]
    node += [f"data.path={data}", "device=cpu"]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folders = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for cwd in folders:
        cwd.mkdir()
        procs.append(subprocess.Popen(node, cwd=cwd, **pipes, start_new_session=True))
    try:
        results = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
    made = [p for cwd in folders for p in cwd.glob("outputs/*/*")]
    assert len(made) == 1, made  # rank 0's; the other node made its own, then removed it
    (run,) = made
    assert (run / "checkpoints" / "last.pt").is_file()
    log = "".join(out + err for out, err in results)
    assert f"batch {2 * PER_RANK} ({PER_RANK} x 2 ranks)" in log
    whole = [f"train.batch_size={2 * PER_RANK}", f"out_dir={tmp_path}/one", f"data.path={data}"]
    train(compose_config([*SETTINGS, *whole, "device=cpu"]))
    a = Checkpoint.load(tmp_path / "one" / "checkpoints" / "last.pt")
    b = Checkpoint.load(run / "checkpoints" / "last.pt")
    worst = max((a.model[k] - b.model[k]).abs().max().item() for k in a.model)
    assert worst < 1e-5, f"largest weight difference {worst:.3g}"
