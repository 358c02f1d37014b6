"""sample.py and the library behind it: finding the checkpoint, sampling settings, marks, errors.

One tiny model is trained once for the module (a second or two); a few tests run sample.py as a
subprocess, as a user would, and the rest call microgpt.commands.sample directly to stay fast.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from microgpt.checkpoint import Checkpoint
from microgpt.commands.sample import find_checkpoint, run_sampling
from microgpt.config import SampleConfig, load_config
from microgpt.errors import SamplingError, UserError
from microgpt.sample import report
from microgpt.train.trainer import train
from tests.conftest import REPO, TINY, compose_config, make_names

SAMPLE_PY = str(REPO / "sample.py")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder holding outputs/run1/checkpoints/{best,last}.pt of a tiny model, as train.py
    leaves it."""
    root = tmp_path_factory.mktemp("sample")
    names = root / "names.txt"
    names.write_text("\n".join(make_names(200)) + "\n")
    run = root / "outputs" / "run1"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread, on busy cores too
    settings = ["train.max_steps=20", "train.eval_every=10", "train.num_samples=0"]
    try:
        train(compose_config([*TINY, f"data.path={names}", f"out_dir={run}", *settings,
                              "log.attn_every=20"]))  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert (run / "checkpoints" / "best.pt").is_file()
    return root


@pytest.fixture(scope="module")
def best(trained) -> Path:
    return trained / "outputs" / "run1" / "checkpoints" / "best.pt"


def sample_clis(arg_lists, cwd) -> list[subprocess.CompletedProcess]:
    """Run `python sample.py ARGS` once per argument list, side by side (most of each is
    importing torch)."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen([sys.executable, SAMPLE_PY, *args], cwd=cwd, **pipes)
             for args in arg_lists]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]


def names_of(stdout: str) -> list[str]:
    """The items of sample.py's output: between the checkpoint line and the summary line."""
    lines = stdout.splitlines()
    assert lines[0].startswith("checkpoint ")
    assert re.fullmatch(r"\d+ of \d+ new, \d+ unique(, \d+ empty)?", lines[-1])
    return [re.sub(r"\s+\((new|in train|in val|in test)\)$", "", line) for line in lines[1:-1]]


def sample(best, **kw):
    return run_sampling(ckpt=str(best), device="cpu", **kw)


# ------------------------------------------------------------------------- sample.py, end to end


def test_latest_run_is_found_without_arguments_and_no_files_are_written(trained):
    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    (r,) = sample_clis([[]], trained)
    assert r.returncode == 0, r.stderr
    best = Path("outputs/run1/checkpoints/best.pt")
    assert r.stdout.splitlines()[0].startswith(f"checkpoint {best} (step 20, val loss ")
    assert len(names_of(r.stdout)) == 20
    assert re.fullmatch(r"\d+ of 20 new, \d+ unique(, \d+ empty)?", r.stdout.splitlines()[-1])
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before  # no .hydra/, *.log


def test_ckpt_and_run_pick_the_same_checkpoint_and_a_seed_repeats(trained, best, tmp_path):
    out = tmp_path / "names.txt"
    settings = ["num_samples=12", "seed=7", "prefix=b", "temperature=0.9"]
    by_ckpt = [f"ckpt={best}", *settings, f"out={out}"]
    by_ckpt, by_run = sample_clis([by_ckpt, [f"run={best.parent.parent}", *settings]], tmp_path)
    assert by_ckpt.returncode == 0 and by_run.returncode == 0, by_ckpt.stderr + by_run.stderr
    assert by_ckpt.stdout == by_run.stdout  # the same file, the same seed: the same names
    assert f"checkpoint {best} (step 20" in by_ckpt.stdout
    names = names_of(by_ckpt.stdout)
    assert len(names) == 12 and all(n.startswith("b") for n in names)
    assert out.read_text().splitlines() == names  # out=: the names, one per line
    assert [p.name for p in tmp_path.iterdir()] == ["names.txt"]


def test_no_checkpoint_anywhere_says_how_to_train_one(tmp_path):
    (r,) = sample_clis([["num_samples=3"]], tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("microgpt: error: no checkpoint found") and r.stderr.count("\n") == 1
    assert "python train.py heads=4" in r.stderr
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the config


def test_sample_yaml_mirrors_the_schema_takes_overrides_refuses_typos_and_writes_nothing():
    assert load_config(compose_config(config_name="sample"), SampleConfig) == SampleConfig()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        h = compose(config_name="sample", return_hydra_config=True).hydra
    assert h.output_subdir is None and h.run.dir == "." and h.job.chdir is False
    assert "handlers" not in h.job_logging and h.job_logging.root is None  # no sample.log
    overrides = ["num_samples=3", "top_k=5", "prefix=ab", "seed=1"]
    cfg = load_config(compose_config(overrides, config_name="sample"), SampleConfig)
    assert (cfg.num_samples, cfg.top_k, cfg.prefix, cfg.seed) == (3, 5, "ab", 1)
    with pytest.raises(ConfigCompositionException, match="temprature"):
        compose_config(["temprature=0.5"], config_name="sample")


# ----------------------------------------------------------------------------- sampling settings


def test_cache_on_and_off_give_the_same_names_in_batches_of_a_prefix_and_length(best):
    settings = dict(num_samples=23, seed=5, temperature=1.2, top_p=0.8, prefix="ma", max_len=4)
    on, off = (sample(best, use_cache=cache, batch_size=5, **settings) for cache in (True, False))
    assert on.names == off.names and on.lines == off.lines
    assert len(on.names) == 23 and all(n.startswith("ma") and len(n) <= 4 for n in on.names)


def test_each_name_is_marked_with_its_split(best):
    lists = Checkpoint.load(best).split  # the plain lists: no Split.where in the expectation
    r = sample(best, num_samples=200, seed=1, temperature=0.5)
    assert [n for n, _ in r.marked] == r.names
    for name, where in r.marked:
        found = [s for s in ("train", "val", "test") if name in lists[s]]
        assert where == ("empty" if name == "" else found[0] if found else "new")
    assert {w for _, w in r.marked} - {"new"}, "a trained model repeats some training names"
    new = sum(1 for n in r.names if n and not any(n in lists[s] for s in ("train", "val", "test")))
    unique, empty = len(set(r.names) - {""}), r.names.count("")
    empties = f", {empty} empty" if empty else ""
    assert r.lines[-1] == f"{new} of 200 new, {unique} unique{empties}"
    assert len(r.lines) == 202 and r.lines[0].startswith(f"checkpoint {best} (step 20, val loss ")


def test_out_writes_names_but_empty_ones_and_an_error_leaves_it(best, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "sample_items", lambda *args, **kwargs: ["ana", "", "bo"])
    out = tmp_path / "names.txt"
    r = sample(best, num_samples=3, seed=0, out=str(out))
    assert out.read_text() == "ana\nbo\n" and r.lines[-1].endswith(", 1 empty")  # counted
    with pytest.raises(UserError):
        sample(best, num_samples=3, prefix="Q", out=str(out), overwrite=True)
    assert out.read_text() == "ana\nbo\n"
    assert [p.name for p in tmp_path.iterdir()] == ["names.txt"]  # no temporary files left
    assert sample(best, num_samples=3, seed=0, out="-").stdout == ["ana", "bo"]  # out=- alike


def test_latest_run_is_the_newest_and_falls_back_to_last_pt(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old, new = Path("outputs/a/checkpoints"), Path("multirun/x/heads=2/checkpoints")
    for folder in (old, new):
        folder.mkdir(parents=True)
        (folder / "last.pt").touch()
    (old / "best.pt").touch()
    os.utime(old / "best.pt", (time.time() - 100,) * 2)
    os.utime(old / "last.pt", (time.time() - 100,) * 2)
    assert find_checkpoint() == new / "last.pt"  # the newest run has no best.pt yet
    (new / "best.pt").touch()
    assert find_checkpoint() == new / "best.pt"
    assert find_checkpoint(run="outputs/a") == old / "best.pt"
    sweep = r"run=multirun/x: .* holds no checkpoints/best.pt .*: multirun/x/heads=2"
    with pytest.raises(SamplingError, match=sweep):  # a sweep folder: names the runs inside it
        find_checkpoint(run="multirun/x")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "settings,message",
    [({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
     ({"max_len": 0}, "max_len=0 must be at least 1"),
     ({"device": "tpu"}, "device='tpu' is unknown; choose one of ['auto', 'cpu', 'cuda', 'mps']"),
     ({"run": "somewhere"}, "give ckpt=PATH or run=FOLDER, not both")],
)  # fmt: skip
def test_bad_settings_are_named_before_anything_is_loaded(settings, message):
    with pytest.raises(UserError, match=re.escape(message)):
        run_sampling(ckpt="/does/not/exist.pt", **settings)  # the setting is reported, not the file


def test_prefix_the_model_cannot_take(best):
    unknown = r"prefix='aQ!' has characters the vocabulary does not know: 'Q', '!'; use "
    with pytest.raises(UserError, match=unknown + "characters of the training data: 'abc"):
        sample(best, prefix="aQ!")
    block = Checkpoint.load(best).model_config["block_size"]
    long = rf"prefix='a{{{block}}}' has {block} characters but the model reads at most {block - 1}"
    with pytest.raises(UserError, match=long + " after the boundary token; shorten it"):
        sample(best, prefix="a" * block)
    assert len(sample(best, prefix="a" * (block - 1), num_samples=2).names[0]) == block - 1
    # a names run's max_len counts the prefix (a text run's counts the new characters)
    with pytest.raises(SamplingError, match=re.escape("max_len=3 must be longer than the prefix")):
        sample(best, prefix="abc", max_len=3)
