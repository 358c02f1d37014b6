"""The undocumented APIs microgpt leans on where no public one does the job, each pinned to the
version it was read on: an upgrade that breaks one fails here, naming what to fix."""

from __future__ import annotations

from importlib.metadata import version

from microgpt.startup_checks import sweep_jobs
from microgpt.viz.tensorboard import TensorBoardLogger
from tests.conftest import read_events


def test_a_sweep_is_split_into_jobs_by_hydras_basic_sweeper():
    """startup_checks.sweep_jobs calls hydra-core 1.3.8's private BasicSweeper.split_arguments
    (Hydra splits a sweep nowhere public): the jobs Hydra will run, in its order."""
    jobs = sweep_jobs(["heads=1,2", "seed=range(2)", "train.max_steps=5"])
    expected = [[f"heads={h}", f"seed={s}", "train.max_steps=5"] for h in (1, 2) for s in (0, 1)]
    fix = f"hydra-core {version('hydra-core')} (read on 1.3.8): fix startup_checks.sweep_jobs"
    assert jobs == expected, fix


def test_text_and_images_go_through_the_summary_writers_file_writer(tmp_path):
    """The logger writes its images, texts and HParams protos through torch 2.13.0's undocumented
    SummaryWriter.file_writer, its texts renamed from torch's "<tag>/text_summary"."""
    logger = TensorBoardLogger(tmp_path)
    logger.samples(3, ["emma"])
    logger.close()
    acc = read_events(tmp_path)
    fix = f"torch {version('torch')} (read on 2.13.0): fix microgpt/viz/tensorboard.py _text"
    assert acc.Tags()["tensors"] == ["samples"], fix
    assert acc.Tensors("samples")[0].step == 3, fix
