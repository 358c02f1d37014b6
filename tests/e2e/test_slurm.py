"""A real SLURM: bench/slurm.sh starts a one-node cluster (Debian's slurm-wlm and munge) in a
temporary folder, sees two refused sweeps end in one line each, sends a 4-job sweep through
sbatch, compares it and stops the daemons. Skipped where the daemons are not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
PATH = os.environ.get("PATH", "") + ":/usr/sbin"


@pytest.mark.slow
@pytest.mark.skipif(
    not all(shutil.which(d, path=PATH) for d in DAEMONS),
    reason="no SLURM here: apt-get install slurm-wlm munge",
)
def test_a_sweep_through_a_real_slurm_is_compared():
    env = {**os.environ, "PATH": PATH, "PYTHON": sys.executable}
    cmd = ["bash", str(REPO / "bench" / "slurm.sh"), "train.max_steps=30", "train.eval_every=10"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = r.stdout
    for setting in ("gpus_per_node", "partition"):  # each refusal names its setting
        assert f"check hydra.launcher.{setting}" in out, out[-3000:]
    assert "Traceback" not in out + r.stderr
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("heads=")]
    assert ["heads=1", "1", "2"] in rows and ["heads=2", "2", "2"] in rows, out[-3000:]
    assert "heads=2 - heads=1" in out  # a verdict, by seed
    assert not [p for p in os.listdir("/tmp") if p.startswith("microgpt-slurm.")]
