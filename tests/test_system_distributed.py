"""Data-parallel training under torchrun (gloo, 2 CPU processes), launchers, and unwrapped
checkpoints.

One real `torchrun --nproc_per_node=2 train.py` run (module fixture, ~15 s) serves two tests: it
writes exactly one run folder, and its weights equal a single process's with the whole batch.
Every subprocess has a timeout and is killed with its whole process group, so a hang fails fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from microgpt import system
from microgpt.checkpoint import Checkpoint
from microgpt.config import load_config
from microgpt.model import GPT, GPTConfig
from microgpt.train.trainer import Trainer, train
from tests.conftest import REPO, TINY, compose_config, make_names

# 2 ranks x PER_RANK against 1 process x 2 * PER_RANK, dropout off, the same seed and data order
PER_RANK = 8
STEPS = 8
SETTINGS = [
    *TINY,
    "model.dropout=0",
    f"train.max_steps={STEPS}",
    f"train.eval_every={STEPS}",
    "train.num_samples=3",
    f"log.attn_every={STEPS}",
]


def run_bounded(cmd: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """subprocess.run, but a timeout kills the whole process group (torchrun and its workers)."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"{' '.join(cmd[:6])} ... did not finish in {timeout} s (a hung rank?)\n{err[-3000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun_train(cwd: Path, *settings: str, ok=True, timeout=240) -> subprocess.CompletedProcess:
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
    runs = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs
    run = runs[0]
    for name in (
        "config.yaml",
        "samples.txt",
        "checkpoints/best.pt",
        "checkpoints/last.pt",
        "run.json",
    ):
        assert (run / name).is_file(), name
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # rank 0's writer only
    log = result.stdout + result.stderr
    # rank 0 alone prints the summary (with the global batch) and the samples
    assert log.count("parameters | data") == 1, log[-3000:]
    assert f"batch {2 * PER_RANK} ({PER_RANK} x 2 ranks)" in log
    assert log.count("samples:") == 1
    assert (run / "train.log").read_text().count("parameters | data") == 1


def test_two_ranks_end_with_the_weights_of_one_process_with_the_whole_batch(torchrun_run, tmp_path):
    cwd, data, _ = torchrun_run
    (ddp_run,) = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    single = train(
        compose_config(
            [
                *SETTINGS,
                f"train.batch_size={2 * PER_RANK}",
                f"data.path={data}",
                "device=cpu",
                f"out_dir={tmp_path / 'single'}",
            ]
        )
    )
    a = Checkpoint.load(tmp_path / "single" / "checkpoints" / "last.pt")
    b = Checkpoint.load(ddp_run / "checkpoints" / "last.pt")
    assert a.step == b.step == STEPS
    # saved from the plain module, never the DDP wrapper: keys load into a plain GPT
    assert list(a.model) == list(b.model)
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in b.model)
    GPT(GPTConfig(**b.model_config)).load_state_dict(b.model)
    worst = max((a.model[k] - b.model[k]).abs().max().item() for k in a.model)
    assert worst < 1e-5, f"largest weight difference {worst:.3g}"
    # evaluation, done by rank 0 alone on the whole split, gives the single process's numbers;
    # the logged train loss is the global batch's (all ranks), not rank 0's slice
    assert b.metrics["val_loss"] == pytest.approx(single["val_loss"], abs=1e-5)
    assert b.metrics["train_loss"] == pytest.approx(single["train_loss"], abs=1e-5)
    assert b.resume["world_size"] == 2


def test_resuming_with_another_global_batch_is_refused(torchrun_run, tmp_path):
    from microgpt.config import ConfigError

    cwd, data, _ = torchrun_run
    (ddp_run,) = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    with pytest.raises(ConfigError, match=f"global batch of {2 * PER_RANK} \\(2 ranks\\)"):
        train(
            compose_config(
                [
                    *SETTINGS,
                    f"train.batch_size={PER_RANK}",
                    f"data.path={data}",
                    "device=cpu",
                    f"train.max_steps={STEPS + 4}",
                    f"resume={ddp_run / 'checkpoints' / 'last.pt'}",
                    f"out_dir={tmp_path / 'resumed'}",
                ]
            )
        )


# ----------------------------------------------------------------------------- who am I


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables; whatever a test (or submitit's export) sets is undone afterwards."""
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SUBMITIT_EXECUTOR",
        "SLURM_JOB_ID",
        "SLURM_NTASKS",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NODEID",
        "SLURM_JOB_NODELIST",
        "MASTER_PORT",
    ):
        monkeypatch.setenv(name, "x")  # recorded as unset, so undo removes what export() adds
        monkeypatch.delenv(name)
    return monkeypatch


def test_no_launcher_is_one_process(clean_env):
    assert system.dist_info_from_env() == system.DistInfo(0, 1, 0)


def test_torchrun_variables(clean_env):
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv(
        "SUBMITIT_EXECUTOR", "slurm"
    )  # torchrun inside a SLURM job: torchrun's variables win
    info = system.dist_info_from_env()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (3, 4, 1, False)


def test_a_submitit_slurm_task_becomes_a_rank(clean_env):
    pytest.importorskip("submitit")
    for k, v in {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }.items():
        clean_env.setenv(k, v)
    info = system.dist_info_from_env()
    assert (info.rank, info.world_size, info.local_rank) == (5, 8, 1)
    # what init_process_group(env://) reads: the first node, a port every task derives alike
    assert os.environ["MASTER_ADDR"] == "gpu07"
    assert 20000 <= int(os.environ["MASTER_PORT"]) <= 60000
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("5", "8")


def test_a_submitit_job_of_one_task_is_one_process(clean_env):
    pytest.importorskip("submitit")
    for k, v in {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "7",
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
    }.items():
        clean_env.setenv(k, v)
    assert not system.dist_info_from_env().enabled
    assert "MASTER_ADDR" not in os.environ


def test_non_zero_ranks_write_no_hydra_files(clean_env):
    from microgpt.cli import OTHER_RANK_OVERRIDES, quiet_other_ranks

    argv = ["train.py", "heads=4"]
    clean_env.setenv("LOCAL_WORLD_SIZE", "2")
    clean_env.setenv("RANK", "0")
    quiet_other_ranks(argv)
    assert argv == ["train.py", "heads=4"]  # rank 0 keeps Hydra's files and log
    clean_env.setenv("RANK", "1")
    quiet_other_ranks(argv)
    assert argv == ["train.py", "heads=4", *OTHER_RANK_OVERRIDES]
    mine = ["train.py", "hydra/job_logging=disabled"]
    quiet_other_ranks(mine)  # a choice on the command line is kept
    assert mine.count("hydra/job_logging=disabled") == 1 and "hydra/job_logging=stdout" not in mine


# -------------------------------------------------------------------- checkpoints of wrapped models


# importing torch.compile's machinery warns about torch.jit.script_method, in torch itself
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_training_on_cpu_saves_a_plain_checkpoint(tiny_cfg, tmp_path):
    """train.compile=true end to end (needs a C++ compiler; about a minute on 2 CPU cores): the
    checkpoint holds the plain GPT's keys (no `_orig_mod.` prefix) and the weights the compiled
    wrapper trained (saving the wrapper's state_dict, or a copy it does not train, fails)."""
    trainer = Trainer(
        load_config(
            tiny_cfg("train.compile=true", "train.max_steps=4", "train.eval_every=4", "device=cpu")
        )
    )
    assert trainer.train_model is not trainer.model  # the compiled wrapper trains
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.run()
    ckpt = Checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")
    assert metrics["step"] == 4
    assert list(ckpt.model) == list(GPT(trainer.model_config).state_dict())
    trained = trainer.train_model.state_dict()  # the wrapper's own keys: _orig_mod.<name>
    assert set(trained) == {f"_orig_mod.{k}" for k in ckpt.model}
    assert all(torch.equal(ckpt.model[k], trained[f"_orig_mod.{k}"]) for k in ckpt.model)
    assert not all(torch.equal(ckpt.model[k], start[k]) for k in start)


# ----------------------------------------------------------------------------- launchers


def compose_with_hydra(overrides):
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_with_hydra(
        [
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=4",
            "hydra.launcher.tasks_per_node=4",
        ]
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node) == ("gpu", 4, 4)
    for key in ("timeout_min", "cpus_per_task", "mem_gb", "nodes"):
        assert launcher[key] is not None, key


def test_joblib_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cfg = compose_with_hydra(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    assert cfg.hydra.launcher._target_.endswith("joblib_launcher.JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == 2


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


def test_ddp_resume_with_dropout_is_exact(tmp_path):
    """Each rank draws its own dropout masks and saves its own RNG state in last.pt: 2 ranks
    trained 4 steps then resumed to 8 end with the weights of 2 ranks trained 8 steps at once.
    (Restoring rank 0's state on every rank, as before, gives rank 1 other masks after the
    resume.)"""
    data = tmp_path / "names.txt"
    data.write_text("\n".join(make_names()) + "\n")
    common = [
        *SETTINGS,
        "model.dropout=0.3",
        "optim.decay=constant",  # the same schedule whatever max_steps is
        "train.eval_every=4",
        "train.num_samples=0",
        f"train.batch_size={PER_RANK}",
        f"data.path={data}",
    ]
    whole, split = tmp_path / "whole", tmp_path / "split"
    torchrun_train(tmp_path, *common, "train.max_steps=8", f"hydra.run.dir={whole}")
    torchrun_train(tmp_path, *common, "train.max_steps=4", f"hydra.run.dir={split}")
    last = split / "checkpoints" / "last.pt"
    ranks = Checkpoint.load(last).resume["ranks"]
    assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])  # two streams
    torchrun_train(
        tmp_path, *common, "train.max_steps=8", f"hydra.run.dir={split}", f"resume={last}"
    )
    a = Checkpoint.load(whole / "checkpoints" / "last.pt")
    b = Checkpoint.load(last)
    assert a.step == b.step == 8
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)
