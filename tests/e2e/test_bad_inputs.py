"""Every bad input gives one clear line, and harms nothing already written.

One finished tiny run is made first. Each bad setting, data file, checkpoint or sampling argument
must then raise the error it names, with the message it must give, while the run's folder keeps
every file's bytes and mtime and no new checkpoint appears anywhere.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from microgpt.config import ConfigError
from microgpt.data.dataset import DataError
from microgpt.runs import RunFolderError
from microgpt.sample.command import sample_from_config
from microgpt.sample.generate import SamplingError
from microgpt.train.checkpoint import Checkpoint, CheckpointError
from microgpt.train.trainer import TrainingError, train
from tests.conftest import REPO, TINY, compose_config, make_names

# the settings every case starts from: the run's own, with room to resume (max_steps 8 > 4)
BASE = [
    *TINY,
    "device=cpu",
    "train.max_steps=8",
    "train.eval_every=2",
    "train.num_samples=0",
    "log.attn_every=1000",
]


class RunsCode:
    """Unpickling this touches `marker`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_inputs")
    w = SimpleNamespace(root=root, run=root / "run", new=root / "new", marker=root / "code-ran")
    w.names = root / "names.txt"
    w.names.write_text("\n".join(make_names()) + "\n")
    train(compose_config([*BASE, f"data.path={w.names}", f"out_dir={w.run}", "train.max_steps=4"]))
    w.last, w.best = w.run / "checkpoints" / "last.pt", w.run / "checkpoints" / "best.pt"

    files = root / "files"
    files.mkdir()
    w.empty_txt = files / "empty.txt"
    w.empty_txt.write_text("")
    w.blank_txt = files / "blank.txt"
    w.blank_txt.write_text("\n  \n\t\n")
    w.two_txt = files / "two.txt"
    w.two_txt.write_text("anna\nbob\nanna\n")  # two distinct items
    w.latin1_txt = files / "latin1.txt"
    w.latin1_txt.write_bytes("anna\nJosé\nbob\n".encode("latin-1"))
    w.other_txt = files / "other.txt"
    w.other_txt.write_text("\n".join(make_names()) + "\nzaza\n")

    data = w.last.read_bytes()
    w.truncated = files / "truncated.pt"  # a write cut short, copied aside
    w.truncated.write_bytes(data[: len(data) // 2])
    w.leftover = (
        w.run / "checkpoints" / ".last.pt.k1ll3d.tmp"
    )  # what a save killed mid-write leaves
    w.leftover.write_bytes(data[: len(data) // 3])
    w.empty_pt = files / "empty.pt"
    w.empty_pt.write_bytes(b"")
    w.text_pt = files / "text.pt"
    w.text_pt.write_text("this is not a checkpoint\n")
    w.foreign_pt = files / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, w.foreign_pt)
    w.evil_pt = files / "evil.pt"
    torch.save(
        {
            "format": "microgpt-checkpoint",
            "version": 1,
            "model": {},
            "model_config": {},
            "tokenizer": {},
            "hook": RunsCode(w.marker),
        },
        w.evil_pt,
    )
    w.evil_pickle = files / "evil.pkl"
    w.evil_pickle.write_bytes(pickle.dumps({"hook": RunsCode(w.marker)}))
    w.newer_pt = files / "newer.pt"
    torch.save({**Checkpoint.load(w.last).to_dict(), "version": 99}, w.newer_pt)
    return w


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_nothing_harmed(w, before: dict) -> None:
    assert snapshot(w.run) == before, "the existing run's files changed"
    assert not list(w.root.rglob("*.pt")) or all(
        p.parent.name in ("checkpoints", "files") for p in w.root.rglob("*.pt")
    )
    assert not list(w.new.glob("checkpoints/*.pt")), "a bad input made a new checkpoint"
    assert not w.marker.exists(), "a checkpoint ran code"


@dataclass
class Case:
    id: str
    args: object  # (world) -> overrides
    error: type
    message: str  # a regular expression the message must match
    out: str = "new"  # "new": a fresh folder; "run": the existing run's folder
    edit: object = (
        None  # (config as a plain dict) -> None: a change the command line cannot express
    )


CASES = [
    # settings
    Case(
        "heads-not-dividing-n_embd",
        lambda w: ["heads=3"],
        ConfigError,
        r"heads=3.*Use heads in \[1, 2, 4",
    ),
    Case("zero-lr", lambda w: ["optim.lr=0"], ConfigError, r"optim\.lr=0\.0 must be > 0"),
    Case(
        "zero-batch",
        lambda w: ["train.batch_size=0"],
        ConfigError,
        r"train\.batch_size=0 must be at least 1",
    ),
    Case(
        "unknown-decay",
        lambda w: ["optim.decay=sawtooth"],
        ConfigError,
        r"optim\.decay='sawtooth' is unknown",
    ),
    Case(
        "unknown-device",
        lambda w: ["device=tpu"],
        ConfigError,
        r"device='tpu' is unknown; choose one of",
    ),
    # (Hydra itself rejects train.max_steps=lots on the command line, before train(); a YAML or
    # dict can hold it)
    Case(
        "steps-not-a-number",
        lambda w: [],
        ConfigError,
        r"bad setting train\.max_steps: Value 'lots'",
        edit=lambda cfg: cfg["train"].update(max_steps="lots"),
    ),
    Case(
        "dropout-one",
        lambda w: ["model.dropout=1.0"],
        ConfigError,
        r"model\.dropout=1\.0 must be in \[0, 1\)",
    ),
    Case(
        "one-beta",
        lambda w: ["optim.betas=[0.9]"],
        ConfigError,
        r"optim\.betas=\[0\.9\] must be two numbers",
    ),
    Case("probe-outside-vocabulary", lambda w: ["log.probe=QQ"], ConfigError, r"log\.probe"),
    Case(
        "block-too-small",
        lambda w: ["model.block_size=4"],
        DataError,
        r"model\.block_size=4 fits at most 3; raise model\.block_size",
    ),
    Case(
        "lr-that-diverges",
        lambda w: ["optim.lr=1e6", "optim.grad_clip=0"],
        TrainingError,
        r"non-finite .* at step \d+ .*lr 1e\+06.*no checkpoint was written yet.*lower optim\.lr",
    ),
    # data files
    Case(
        "missing-data",
        lambda w: [f"data.path={w.root / 'nope.txt'}"],
        DataError,
        r"no data file at .*nope\.txt",
    ),
    Case(
        "data-is-a-folder",
        lambda w: [f"data.path={w.root / 'files'}"],
        DataError,
        r"is a folder",
    ),
    Case("empty-data", lambda w: [f"data.path={w.empty_txt}"], DataError, r"empty\.txt is empty"),
    Case(
        "blank-lines-only",
        lambda w: [f"data.path={w.blank_txt}"],
        DataError,
        r"is empty \(or only blank lines\)",
    ),
    Case(
        "two-items",
        lambda w: [f"data.path={w.two_txt}"],
        DataError,
        r"only 2 distinct item\(s\); it needs at least 3",
    ),
    Case(
        "not-utf8",
        lambda w: [f"data.path={w.latin1_txt}"],
        DataError,
        r"is not UTF-8 \(first bad byte on line 2\)",
    ),
    # the existing run: never overwritten, resumed only when everything matches
    Case(
        "new-run-into-a-run-folder",
        lambda w: [],
        RunFolderError,
        r"already holds a run; continue it with resume=",
        out="run",
    ),
    Case(
        "resume-other-heads",
        lambda w: ["resume=true", "heads=4"],
        ConfigError,
        r"heads: 2 in the checkpoint, 4 now, model\.n_head: 2 in the checkpoint, 4 now",
        out="run",
    ),
    Case(
        "resume-other-data",
        lambda w: ["resume=true", f"data.path={w.other_txt}"],
        ConfigError,
        r"cannot resume from .*last\.pt: the data of a run cannot change, and "
        r"data\.path=.*other\.txt holds other data than the run's",
        out="run",
    ),
    Case(
        "resume-finished-run",
        lambda w: ["resume=true", "train.max_steps=4"],
        ConfigError,
        r"nothing to resume: .*last\.pt is at step 4 and train\.max_steps=4",
        out="run",
    ),
    Case(
        "resume-from-best",
        lambda w: [f"resume={w.best}"],
        CheckpointError,
        r"no training state .*last\.pt",
        out="run",
    ),
    Case("resume-with-no-run", lambda w: ["resume=true"], RunFolderError, r"no run to resume"),
    # bad checkpoints, interrupted writes
    Case(
        "truncated-checkpoint",
        lambda w: [f"resume={w.truncated}"],
        CheckpointError,
        r"truncated or corrupt",
        out="run",
    ),
    Case(
        "leftover-temporary-file",
        lambda w: [f"resume={w.leftover}"],
        CheckpointError,
        r"truncated or corrupt",
        out="run",
    ),
    Case(
        "empty-checkpoint",
        lambda w: [f"resume={w.empty_pt}"],
        CheckpointError,
        r"is empty \(0 bytes\)",
        out="run",
    ),
    Case(
        "text-checkpoint",
        lambda w: [f"resume={w.text_pt}"],
        CheckpointError,
        r"truncated or corrupt|not a microgpt checkpoint",
        out="run",
    ),
    Case(
        "foreign-checkpoint",
        lambda w: [f"resume={w.foreign_pt}"],
        CheckpointError,
        r"not a microgpt checkpoint",
        out="run",
    ),
    Case(
        "malicious-checkpoint",
        lambda w: [f"resume={w.evil_pt}"],
        CheckpointError,
        r"refused to load .*run code",
        out="run",
    ),
    Case(
        "malicious-plain-pickle",
        lambda w: [f"resume={w.evil_pickle}"],
        CheckpointError,
        r"refused to load|not a microgpt checkpoint",
        out="run",
    ),
    Case(
        "newer-checkpoint",
        lambda w: [f"resume={w.newer_pt}"],
        CheckpointError,
        r"newer microgpt .*version 99",
        out="run",
    ),
    Case(
        "missing-checkpoint",
        lambda w: [f"resume={w.root / 'gone.pt'}"],
        CheckpointError,
        r"gone\.pt does not exist",
        out="run",
    ),
    Case(
        "checkpoint-is-a-folder-without-a-run",
        lambda w: [f"resume={w.run.parent}"],
        RunFolderError,
        r"is a folder that holds no run; pass a run folder",
        out="run",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_training_input(world, case):
    before = snapshot(world.run)
    out = world.run if case.out == "run" else world.new
    cfg = compose_config([*BASE, f"data.path={world.names}", f"out_dir={out}", *case.args(world)])
    if case.edit is not None:
        cfg = OmegaConf.to_container(cfg)
        case.edit(cfg)
    try:
        with pytest.raises(case.error, match=case.message) as info:
            train(cfg)
        assert "\n" not in str(info.value), "the message must be one line"
        assert_nothing_harmed(world, before)
    finally:
        shutil.rmtree(world.new, ignore_errors=True)


SAMPLING = [  # sample.py's settings: (id, overrides, error, message)
    (
        "prefix-outside-vocabulary",
        lambda w: [f"ckpt={w.best}", "prefix=QQ"],
        SamplingError,
        r"prefix 'QQ' has characters the vocabulary does not know: 'Q'",
    ),
    (
        "prefix-fills-the-block",
        lambda w: [f"ckpt={w.best}", "prefix=" + "ba" * 20],
        SamplingError,
        r"prefix of 40 characters is longer than this model's items: block_size is \d+",
    ),
    (
        "negative-temperature",
        lambda w: [f"ckpt={w.best}", "temperature=-1"],
        SamplingError,
        r"temperature=-1\.0 must be >= 0",
    ),
    (
        "zero-top-k",
        lambda w: [f"ckpt={w.best}", "top_k=0"],
        SamplingError,
        r"top_k=0 must be an integer >= 1",
    ),
    (
        "top-p-above-one",
        lambda w: [f"ckpt={w.best}", "top_p=1.5"],
        SamplingError,
        r"top_p=1\.5 must be in \(0, 1\]",
    ),
    (
        "no-samples",
        lambda w: [f"ckpt={w.best}", "num_samples=0"],
        SamplingError,
        r"num_samples=0 must be at least 1",
    ),
    (
        "out-is-a-folder",
        lambda w: [f"ckpt={w.best}", f"out={w.run}"],
        SamplingError,
        r"must be a file path",
    ),
    (
        "run-folder-missing",
        lambda w: [f"run={w.root / 'nope'}"],
        SamplingError,
        r"run=.*nope.* does not exist",
    ),
    (
        "truncated-checkpoint",
        lambda w: [f"ckpt={w.truncated}"],
        CheckpointError,
        r"truncated or corrupt",
    ),
    (
        "malicious-checkpoint",
        lambda w: [f"ckpt={w.evil_pt}"],
        CheckpointError,
        r"refused to load .*run code",
    ),
    (
        "foreign-checkpoint",
        lambda w: [f"ckpt={w.foreign_pt}"],
        CheckpointError,
        r"not a microgpt checkpoint",
    ),
]


@pytest.mark.parametrize(
    "args, error, message", [s[1:] for s in SAMPLING], ids=[s[0] for s in SAMPLING]
)
def test_bad_sampling_input(world, args, error, message):
    """sample.py's library call, with the config composed from conf/sample.yaml as sample.py
    does."""
    before = snapshot(world.run)
    cfg = compose_config(["seed=0", "device=cpu", *args(world)], config_name="sample")
    with pytest.raises(error, match=message) as info:
        sample_from_config(cfg)
    assert "\n" not in str(info.value)
    assert_nothing_harmed(world, before)


@pytest.mark.parametrize(
    "script, case",
    [
        ("train.py", "malicious-checkpoint"),
        ("sample.py", "truncated-checkpoint"),
        ("sample.py", "prefix-outside-vocabulary"),
    ],
)
def test_bad_input_on_the_command_line_is_one_line_exit_2(world, script, case, tmp_path):
    before = snapshot(world.run)
    if script == "train.py":
        args = [
            *BASE,
            f"data.path={world.names}",
            *next(c for c in CASES if c.id == case).args(world),
        ]
    else:
        args = ["device=cpu", *next(s for s in SAMPLING if s[0] == case)[1](world)]
    result = subprocess.run(
        [sys.executable, str(REPO / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("microgpt: error: ")
        and "Traceback" not in result.stderr
    )
    assert not list(tmp_path.rglob("*.pt"))
    if script == "sample.py":
        assert not list(tmp_path.iterdir()), "sample.py wrote something"
    assert_nothing_harmed(world, before)
