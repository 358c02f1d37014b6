"""End to end: a tiny training run writes everything it promises, and the checkpoint reloads."""

import collections
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from microgpt.checkpoint import Checkpoint
from microgpt.commands.compare import main as compare_main
from microgpt.commands.heads import main as heads_main
from microgpt.config import load_config
from microgpt.train.listeners import HeadAnalysis
from microgpt.train.trainer import Trainer, lr_at, train
from tests.conftest import REPO, TINY, read_events


def run(script: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / script), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_tiny_run_writes_events_samples_and_self_describing_checkpoints(tiny_cfg, tmp_path):
    metrics = train(tiny_cfg())
    run = tmp_path / "run"
    for name in ("config.yaml", "samples.txt", "checkpoints/best.pt", "checkpoints/last.pt"):
        assert (run / name).is_file(), name
    assert (metrics["step"], len(metrics["samples"])) == (12, 5)
    assert metrics["test_loss"] > 0 and metrics["best_val_loss"] > 0
    assert len((run / "samples.txt").read_text().splitlines()) == 6  # 5 names + the summary line

    acc = read_events(run)
    tags = acc.Tags()
    scalars = {"Loss/train", "Loss/val", "lr", "train/grad_norm", "tokens_per_sec"}
    assert scalars <= set(tags["scalars"])
    # TensorBoard's Scalars tab: groups are the prefixes before '/', sorted, the first two open
    groups = sorted({tag.split("/")[0] for tag in tags["scalars"]})
    assert groups[:2] == ["Loss", "heads"], groups
    maps = {"attention/layer0", "attention/layer0/head0", "attention/layer0/head1"}
    assert maps <= set(tags["images"])
    assert "per_head/layer0/head1/entropy" in tags["scalars"]
    # step 0, every log.attn_every, and the end
    assert [e.step for e in acc.Images("attention/layer0/head1")] == [0, 6, 12]
    assert [e.step for e in acc.Scalars("Loss/val")] == [6, 12]
    assert "samples" in tags["tensors"]
    assert acc.PluginTagToContent("hparams")  # one HParams row, in the run's own folder
    assert [p.name for p in run.iterdir() if p.is_dir()] == ["checkpoints"]
    # the checkpoint describes itself: it rebuilds the model with nothing else
    ckpt = Checkpoint.load(run / "checkpoints" / "last.pt")
    for key in "model model_config tokenizer train_config step metrics split resume".split():
        assert getattr(ckpt, key) is not None, key
    assert ckpt.step == 12 and ckpt.model_config["n_head"] == 2
    model, tokenizer = ckpt.build_model()
    logits, _ = model(torch.tensor([[0, *tokenizer.encode("bala")]]))
    assert logits.shape == (1, 5, tokenizer.vocab_size)
    assert "test_loss" in Checkpoint.load(run / "checkpoints" / "best.pt").metrics


def test_training_lowers_the_loss_below_what_character_frequencies_reach(tiny_cfg, names_file):
    """A model that learned only how often each character occurs scores the unigram entropy of
    the data (2.92 nats here); 60 steps of a model that uses the context reach about 2.5."""
    names = names_file.read_text().split()
    # every name ends with the boundary token
    counts = [*collections.Counter("".join(names)).values(), len(names)]
    unigram = -sum(n / sum(counts) * math.log(n / sum(counts)) for n in counts)
    metrics = train(tiny_cfg("train.max_steps=60", "train.eval_every=30", "optim.lr=3e-3"))
    assert unigram > 2.8 and metrics["best_val_loss"] < unigram - 0.25


def test_each_seed_draws_its_own_training_batches_from_the_shared_split(tiny_cfg):
    a, b = (Trainer(load_config(tiny_cfg(f"seed={seed}"))) for seed in (1, 2))
    assert a.data.split == b.data.split  # data.split_seed's
    # the first global batch's items (one seed's order: tests/data's ItemBatches tests)
    assert not torch.equal(a.batches.next_batch(), b.batches.next_batch())


def test_lr_schedule_warms_up_then_decays():
    optim = {"warmup_steps": 10, "lr": 1e-3, "min_lr_ratio": 0.1}
    config = load_config({"optim": optim, "train": {"max_steps": 100}})
    lrs = [lr_at(s, config) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)


def test_multirun_names_job_folders_by_their_overrides_and_the_readme_commands_take_them(
    tmp_path, names_file, monkeypatch, capsys
):
    """A sweep's job folders are named heads=1, heads=2; the README's commands on them work as
    written (issue 22: `sample.py run=multirun/<d>/<t>/heads=4` and `train.py resume=<job>` used
    to exit 2 with "mismatched input '='")."""

    def command(script, *args):
        result = run(script, *args, cwd=tmp_path)
        assert result.returncode == 0, (script, args, result.stderr[-2000:])
        return result.stdout

    sweep = ["-m", "heads=1,2", *TINY[:1], *TINY[3:], "train.max_steps=4", "train.eval_every=4"]
    command("train.py", *sweep, "model.n_embd=16", "train.num_samples=2", f"data.path={names_file}")
    (sweep,) = (tmp_path / "multirun").glob("*/*")  # multirun/<date>/<time>
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["heads=1", "heads=2"], jobs
    for job in jobs:
        assert (sweep / job / "checkpoints" / "best.pt").is_file()
        assert list((sweep / job).glob("events.out.tfevents.*"))
    job = (sweep / "heads=2").relative_to(tmp_path)  # as a user types it: multirun/<d>/<t>/heads=2
    out = command("sample.py", f"run={job}", "num_samples=3", "seed=0", "device=cpu")
    assert out.startswith(f"checkpoint {job / 'checkpoints' / 'best.pt'} (step 4")
    command("train.py", f"resume={job}", "train.max_steps=6")
    assert Checkpoint.load(tmp_path / job / "checkpoints" / "last.pt").step == 6
    # python -m microgpt.heads and microgpt.compare on the same folders (in this process: they
    # take no Hydra overrides, so the '=' never reaches a grammar)
    monkeypatch.chdir(tmp_path)
    assert heads_main([str(job)]) == 0 and (tmp_path / job / "heads-best.json").is_file()
    assert compare_main([str(sweep.relative_to(tmp_path))]) == 0
    table = capsys.readouterr().out
    assert "heads=1" in table and "heads=2" in table


def test_a_signal_during_the_final_analysis_stops_it_at_once(tiny_cfg):
    trainer = Trainer(load_config(tiny_cfg()))
    (analysis,) = [x for x in trainer.listeners if isinstance(x, HeadAnalysis)]
    light_analysis = analysis.log

    def final_analysis_interrupted(trainer):
        if not trainer.final:
            return light_analysis(trainer)
        signal.raise_signal(signal.SIGTERM)  # to this thread: handled before the next line
        raise AssertionError("the analysis went on after the signal")

    analysis.log = final_analysis_interrupted
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        trainer.run()
