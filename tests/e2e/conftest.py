"""The sandbox project every bad command runs in (built once per session): conf/, data/ (names, a
short play, edge files), finished tiny runs (runs/a and runs/b on names, runs/text on the play,
runs/away: a text run whose file lies outside the sandbox, so that a case can take that file away
or change it), a two-job sweep (multirun/sweep), damaged checkpoints (bad/), existing outputs and
links (out/), a working directory other than the project (sub/), and a broken sweep for compare.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import random
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from microgpt.checkpoint import Checkpoint
from tests.conftest import REPO, TINY, make_names
from tests.e2e.harness import EvilPickle, run

# every training command starts from a tiny model, so one that is wrongly accepted ends quickly
T = [*TINY, "device=cpu", "train.num_samples=0", "log.attn_every=1000", "data.path=data/names.txt"]
TEXT = ["data.format=text", "data.path=data/play.txt", "model.block_size=16"]
BEST, LAST = "runs/a/checkpoints/best.pt", "runs/a/checkpoints/last.pt"
WORDS = "the king and queen of a land where all men speak in verse to thee my lord".split()


def play(seed: int = 0, lines: int = 200) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(lines)) + "\n"


def _tensor_offset(path: Path) -> int:
    """Where the first tensor's bytes start in a checkpoint (a zip archive of the pickle and one
    file per tensor)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size >= 512)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + n + m


def _train(root: Path, *args) -> None:
    r = run("train.py", *T, "train.max_steps=4", "train.eval_every=2", *args, cwd=root)
    assert r.code == 0, r.stderr


def _damaged(root: Path) -> None:
    bad = root / "bad"
    bad.mkdir()
    best, last = (root / BEST).read_bytes(), (root / LAST).read_bytes()
    for name, data, at, size in (("flipped", best, 100, 0), ("zeroed", best, 0, 256),
                                 ("flipped-last", last, 7, 0)):  # fmt: skip
        data = bytearray(data)
        at += _tensor_offset(root / (LAST if name == "flipped-last" else BEST))
        if size:
            data[at : at + size] = bytes(size)
        else:
            data[at] ^= 0x40
        (bad / f"{name}.pt").write_bytes(data)
    (bad / "truncated.pt").write_bytes(best[: len(best) // 2])
    (bad / "empty.pt").write_bytes(b"")
    (bad / "text.pt").write_text("not a checkpoint\n")
    (bad / "image.pt").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    torch.save({"state_dict": {"w": torch.zeros(2)}}, bad / "foreign.pt")
    evil = {"format": "microgpt-checkpoint", "version": 1, "model": {}, "model_config": {},
            "tokenizer": {}, "hook": EvilPickle()}  # fmt: skip
    torch.save(evil, bad / "evil.pt")
    (bad / "pickle.pt").write_bytes(pickle.dumps(evil))  # a plain pickle, not torch's zip
    ckpt = torch.load(root / BEST, weights_only=True)
    torch.save({**ckpt, "version": 99}, bad / "newer.pt")
    torch.save({k: v for k, v in ckpt.items() if k != "model"}, bad / "no-model.pt")
    os.mkfifo(bad / "fifo.pt")
    (bad / "folder.pt").mkdir()
    # whole checksums, fields of the wrong type: what microgpt never writes (issue 37)
    good = Checkpoint.load(root / BEST)
    for name, change in (
        ("config-list", {"train_config": [1, 2]}),
        ("step-text", {"step": "abc"}),
        ("split-ints", {"split": {"train": [1], "val": [2], "test": [3]}}),
    ):
        dataclasses.replace(good, **change).save(bad / f"{name}.pt")
    # whole checksums, weights no run writes (issue 43): a NaN, one row short of the model's shape
    last, key = Checkpoint.load(root / LAST), "wte.weight"
    nan = {**good.model, key: torch.full_like(good.model[key], math.nan)}
    dataclasses.replace(good, model=nan).save(bad / "nan.pt")
    short = {**last.model, key: last.model[key][:-1]}
    dataclasses.replace(last, model=short).save(bad / "wrong-shape.pt")
    # issue 52: a config claiming 100,000 layers (a model of them took minutes to build)
    deep = {**last.model_config, "n_layer": 100_000}
    dataclasses.replace(last, model_config=deep).save(bad / "deep.pt")


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("harness")
    root = base / "project"
    root.mkdir()
    shutil.copytree(REPO / "conf", root / "conf")
    data = root / "data"
    data.mkdir()
    for name, text in (("names.txt", "\n".join(make_names()) + "\n"), ("play.txt", play()),
                       ("other.txt", "\n".join(make_names(seed=1)) + "\n"), ("empty.txt", ""),
                       ("blank.txt", "\n \n\t\n"), ("two.txt", "anna\nbob\nanna\n"),
                       ("one.txt", "a")):  # fmt: skip
        (data / name).write_text(text)
    (data / "latin1.txt").write_bytes("anna\nJos\xe9\nbob\n".encode("latin-1"))
    (data / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (data / "nul.txt").write_bytes(b"the king\x00 and\n")
    (data / "folder").mkdir()
    os.mkfifo(data / "fifo")
    (base / "away").mkdir()
    (base / "away" / "play.txt").write_text(play(seed=1))

    _train(root, "train.save_every=2", "hydra.run.dir=runs/a")
    _train(root, "seed=7", "hydra.run.dir=runs/b")
    _train(root, *TEXT, "hydra.run.dir=runs/text")
    _train(root, *TEXT, f"data.path={base / 'away' / 'play.txt'}", "hydra.run.dir=runs/away")
    r = run("train.py", "-m", *T, "train.max_steps=2", "train.eval_every=2", "heads=1,2",
            "hydra.sweep.dir=multirun/sweep", cwd=root)  # fmt: skip
    assert r.code == 0, r.stderr
    # a run from before Hydra stopped writing .hydra/ into run folders (issue 21, case 5)
    (root / "runs/a/.hydra").mkdir()
    (root / "runs/a/.hydra/config.yaml").write_text("heads: 2\n")
    _damaged(root)

    out = root / "out"
    out.mkdir()
    (out / "existing.txt").write_text("kept\nnames\n")
    for link, target in (("link.txt", "existing.txt"), ("link-to-data.txt", "../data/names.txt"),
                         ("link-to-run.txt", "../runs/a/samples.txt"),
                         ("link-to-conf.yaml", "../conf/config.yaml"),
                         ("dangling-into-run.txt", "../runs/a/new.txt")):  # fmt: skip
        (out / link).symlink_to(target)
    os.mkfifo(out / "fifo")
    (root / "sub").mkdir()

    broken = root / "broken-sweep"
    for job in ("heads=1", "heads=2", "bad-config", "bad-metrics", "binary-metrics", "bad-ckpt"):
        shutil.copytree(root / "multirun/sweep" / ("heads=2" if job != "heads=1" else job),
                        broken / job, ignore=shutil.ignore_patterns(".lock"))  # fmt: skip
    (broken / "bad-config" / "config.yaml").write_text("model: {n_head: [\n")
    (broken / "bad-metrics" / "metrics.jsonl").write_text('[1, 2]\n"text"\n{"no step": 1}\n')
    (broken / "binary-metrics" / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    (broken / "bad-ckpt" / "checkpoints" / "best.pt").write_bytes(b"PK\x03\x04" + bytes(50))
    return root


@pytest.fixture
def project(sandbox, monkeypatch) -> Path:
    """The sandbox as the project's root: a relative data path falls back to its data/, never to
    the checkout's, whatever that holds (a built shakespeare.txt, or no names.txt)."""
    from microgpt.commands import sample
    from microgpt.data import format

    for module in (format, sample):
        monkeypatch.setattr(module, "REPO_ROOT", sandbox)
    return sandbox
