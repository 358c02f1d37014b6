"""The choice of CPU threads (microgpt/system.py): the setting, the environment, a parallel sweep's
share of the cores, and the wait policy set before torch loads OpenMP. No timing here: how the
choice behaves under load is bench/run.py's `threads` section. And signals_held."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch
from hydra import compose, initialize_config_dir

from microgpt import cli, system
from microgpt.config import load_config
from microgpt.system import ThreadsError, check_threads, choose_threads
from microgpt.train import threads
from microgpt.train.trainer import Trainer
from tests.conftest import CONF


@pytest.mark.parametrize(
    ("setting", "environ", "expected"),
    [
        ("auto", {}, 8),  # every usable core
        ("auto", {"OMP_NUM_THREADS": "3"}, 3),  # a launcher's share, or the user's choice
        ("auto", {"OMP_NUM_THREADS": "2,1"}, 2),  # OpenMP's nested form: the first level
        ("auto", {"OMP_NUM_THREADS": " "}, 8),  # blank: as if unset
        (2, {"OMP_NUM_THREADS": "5"}, 2),  # threads=N wins over everything
        (12, {}, 12),  # more than the cores, if asked
    ],
)
def test_choose_threads(setting, environ, expected):
    assert choose_threads(setting, 8, environ) == expected


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5"])
def test_an_omp_num_threads_that_is_not_a_count_is_refused_not_ignored(value):
    with pytest.raises(ThreadsError, match=rf"OMP_NUM_THREADS='{value}' is not a number"):
        choose_threads("auto", 8, {"OMP_NUM_THREADS": value})
    assert choose_threads(2, 8, {"OMP_NUM_THREADS": value}) == 2  # threads=N: not read


@pytest.mark.parametrize("bad", [0, -1, "two", 1.5, True, None, ""])
def test_a_bad_threads_setting_is_refused_by_name(bad):  # the schemas' rows: tests/test_config.py
    with pytest.raises(ThreadsError, match=r"threads=.* must be auto .* or a whole number"):
        check_threads(bad)


def test_the_trainer_applies_the_setting(tiny_cfg, monkeypatch, request):
    request.addfinalizer(lambda n=torch.get_num_threads(): torch.set_num_threads(n))
    monkeypatch.delenv("OMP_NUM_THREADS")  # auto: the cores this process may use (its affinity)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    chosen = {1: 0.02, 2: 0.01, 3: 0.02}  # made-up step times: 2 threads the fastest
    monkeypatch.setattr(
        threads, "fastest", lambda step, counts: (2, {n: chosen[n] for n in counts})
    )
    trainer = Trainer(load_config(tiny_cfg()))  # auto: measured over 1, 2 and 3 threads
    assert trainer.threads == 2
    assert trainer.notes[-1].startswith("threads=auto chose 2 of 3 cores, the fastest step")
    assert "1: 20.0 ms, 2: 10.0 ms, 3: 20.0 ms" in trainer.notes[-1]
    assert trainer.describe().endswith("2 threads (threads=auto measured it the fastest)")
    trainer = Trainer(load_config(tiny_cfg("threads=3")))  # a count: as given, not measured
    assert trainer.threads == torch.get_num_threads() == 3 and not trainer.notes
    assert trainer.describe().endswith("3 threads (threads=3)")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    trainer = Trainer(load_config(tiny_cfg()))  # auto: the environment's share
    assert trainer.threads == torch.get_num_threads() == 2
    assert trainer.describe().endswith("2 threads (from OMP_NUM_THREADS=2, not measured)")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4}, raising=False)
    trainer = Trainer(load_config(tiny_cfg()))  # one usable core: nothing to measure
    assert trainer.describe().endswith("1 thread (the 1 core this process may use, not measured)")


def hydra_config(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def test_a_parallel_sweep_gives_each_job_its_share(monkeypatch):
    """The callback conf/config.yaml names runs in the process that launches the sweep and writes
    the share into the environment its workers inherit."""
    cfg = hydra_config(["hydra/launcher=joblib"])
    cfg.hydra.overrides.task = ["heads=1,2,4,8", "seed=1,2"]  # what Hydra passes: 8 jobs
    callback = cfg.hydra.callbacks.share_cores
    assert callback._target_ == "microgpt.cli.ShareCores"
    monkeypatch.setattr(cli, "usable_cores", lambda: 16)
    # 8 jobs at once (joblib's -1: a worker per core), 4, 2, 3 (16 // 3 threads each); joblib reads
    # n_jobs < 0 as cores + 1 + n_jobs (-13: 4 workers), never fewer than 1 (-20)
    shares = ((-1, "2"), (4, "4"), (2, "8"), (3, "5"), (-13, "4"), (-20, "16"))
    for n_jobs, expected in shares:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        cfg.hydra.launcher.n_jobs = n_jobs
        cli.ShareCores().on_multirun_start(cfg)
        assert os.environ["OMP_NUM_THREADS"] == expected, n_jobs
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stays
    cli.ShareCores().on_multirun_start(cfg)
    assert os.environ["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    cfg = hydra_config([])  # the basic launcher: one job at a time, all cores
    cfg.hydra.overrides.task = ["heads=1,2,4,8"]
    cli.ShareCores().on_multirun_start(cfg)
    assert "OMP_NUM_THREADS" not in os.environ


def test_a_signal_held_waits_for_the_block_whichever_thread_the_kernel_hands_it_to():
    """A thread that does not hold it (TensorBoard's writer, tqdm's monitor) took the signal and
    Python ran the handler inside the block (a thread's signal mask holds only that thread)."""
    other_thread_ends, seen = threading.Event(), []
    threading.Thread(target=other_thread_ends.wait, daemon=True).start()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("handled"))
    arrived, wakeup = os.pipe()  # the C-level handler writes the signal's number there
    os.set_blocking(wakeup, False)
    previous_fd = signal.set_wakeup_fd(wakeup)
    try:
        with system.signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.read(arrived, 1)  # it has arrived: Python's handler runs next, were it not held
            seen.append("block ended")
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous)
        other_thread_ends.set()
        os.close(arrived), os.close(wakeup)
    assert seen == ["block ended", "handled"]
