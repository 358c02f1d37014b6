"""Reliability: exact resume, crash-safe checkpoints, Ctrl-C and SIGTERM, divergence, safe
loading."""

from __future__ import annotations

import ast
import hashlib
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from microgpt.checkpoint import Checkpoint
from microgpt.config import ConfigError, load_config
from microgpt.runs import RunFolder, find_checkpoints
from microgpt.train.trainer import Interrupted, Trainer, TrainingError
from tests.conftest import REPO, read_events

# dropout > 0, so that restoring the RNG state matters; the train loss logged as the mean of 3
# steps, so that a stop after step 5 falls inside a window (steps 4-6)
EXACT = ["device=cpu", "model.dropout=0.2", "train.max_steps=8", "train.eval_every=3",
         "train.log_every=3", "train.num_samples=0", "log.attn_every=1000"]  # fmt: skip


def run_trainer(cfg, on_step=None) -> tuple[Trainer, list[float], BaseException | None]:
    """Drive a Trainer as train() does, recording each training step's loss; on_step(n) runs after
    the n-th forward pass of this process (1, 2, ...), e.g. to send a signal mid-run."""
    trainer = Trainer(load_config(cfg))
    forward, losses = trainer.train_model, []

    def recording(x, y, **kw):
        logits, loss = forward(x, y, **kw)
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses))
        return logits, loss

    trainer.train_model = recording
    stopped = None
    try:
        trainer.run()  # its listeners closed (TensorBoard's files) however it ends
    except (Interrupted, KeyboardInterrupt, TrainingError) as e:
        stopped = e
    return trainer, losses, stopped


def sigint_at(n: int, sig: int = signal.SIGINT, times: int = 1):
    """on_step: `sig` sent `times` after the n-th forward pass."""

    def on_step(step):
        if step == n:
            for _ in range(times):
                os.kill(os.getpid(), sig)

    return on_step


def scalar_steps(run: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in read_events(run).Scalars(tag)]


def fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


# ----------------------------------------------------------------------------- exact resume


def test_resume_after_sigint_is_bit_exact_and_tensorboard_continues(tiny_cfg, tmp_path):
    """Stopped by SIGINT after step 5 of 8, then resumed: the same loss at every step and the same
    final weights, bit for bit, as one uninterrupted run; TensorBoard's Loss/train has each step
    once."""
    whole, whole_losses, stopped = run_trainer(tiny_cfg(*EXACT, out=tmp_path / "whole"))
    assert stopped is None and len(whole_losses) == 8

    run = tmp_path / "split"
    first, first_losses, stopped = run_trainer(tiny_cfg(*EXACT, out=run), on_step=sigint_at(5))
    assert isinstance(stopped, Interrupted)
    assert stopped.checkpoint == run / "checkpoints" / "last.pt"
    assert first.step == 5 and Checkpoint.load(run / "checkpoints" / "last.pt").step == 5
    # a run killed after its last checkpoint leaves points past it; the resumed run must replace
    # them
    with SummaryWriter(str(run)) as stale:
        for step in (6, 7):
            stale.add_scalar("Loss/train", 99.0, step)
    with open(run / "metrics.jsonl", "a") as f:  # and the same points in metrics.jsonl
        f.writelines(f'{{"step": {step}, "Loss/train": 99.0}}\n' for step in (6, 7))
    # event files are read in name order: <seconds>.<host>.<pid>.<writer number>, and within one
    # second writer 10 sorts before writer 9: those files a second older, as a resume in a later
    # process finds them, keep the resumed run's file last
    for events in run.glob("events.out.tfevents.*"):
        parts = events.name.split(".")
        events.rename(events.with_name(".".join([*parts[:3], str(int(parts[3]) - 1), *parts[4:]])))
    second, second_losses, stopped = run_trainer(tiny_cfg(*EXACT, "resume=true", out=run))
    assert stopped is None and second.step == 8
    assert first_losses + second_losses == whole_losses  # every step's loss, exactly
    a, b = whole.model.state_dict(), second.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    saved = Checkpoint.load(run / "checkpoints" / "last.pt").model
    assert saved["lm_head.weight"].equal(a["lm_head.weight"])

    points = scalar_steps(run, "Loss/train")
    assert [s for s, _ in points] == [3, 6, 8]  # strictly increasing, none twice, none missing
    # the window of steps 4-6 was cut by the stop: its mean is still the uninterrupted run's
    assert [v for _, v in points] == [v for _, v in scalar_steps(tmp_path / "whole", "Loss/train")]
    assert points[1][1] == pytest.approx(sum(whole_losses[3:6]) / 3, rel=1e-6)

    # metrics.jsonl, like TensorBoard, holds each step once and the uninterrupted run's values
    def train_lines(folder):
        lines = RunFolder(folder).metrics()
        return [(d["step"], d["Loss/train"]) for d in lines if "Loss/train" in d]

    assert train_lines(run) == train_lines(tmp_path / "whole")
    # TensorBoard keeps float32; metrics.jsonl the mean as computed (a double)
    as_float32 = [(s, struct.unpack("f", struct.pack("f", v))[0]) for s, v in train_lines(run)]
    assert as_float32 == [(s, v) for s, v in points]
    assert [s for s, _ in scalar_steps(run, "Loss/val")] == [3, 6, 8]


def test_sigterm_finishes_the_step_and_writes_a_resumable_last_pt(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_cfg("device=cpu", "train.max_steps=4", "train.eval_every=100", "train.num_samples=0")
    _, losses, stopped = run_trainer(cfg, on_step=sigint_at(2, signal.SIGTERM))
    assert str(stopped).startswith("SIGTERM received: stopped at step 2 of 4")
    assert stopped.checkpoint == run / "checkpoints" / "last.pt" and len(losses) == 2
    ckpt = Checkpoint.load(stopped.checkpoint)
    assert ckpt.step == 2 and ckpt.resume is not None and "interrupted_at" in ckpt.metrics
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are put back


def test_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_cfg("device=cpu", "train.max_steps=10", "train.eval_every=4", "train.num_samples=0")
    trainer, losses, stopped = run_trainer(cfg, on_step=sigint_at(6, times=2))
    assert isinstance(stopped, KeyboardInterrupt) and len(losses) == 6
    assert trainer.step == 5  # step 6 unfinished
    ckpt = Checkpoint.load(run / "checkpoints" / "last.pt")  # the one written at step 4, whole
    assert ckpt.step == 4 and ckpt.resume is not None
    assert not [p for p in (run / "checkpoints").iterdir() if p.name not in ("best.pt", "last.pt")]


def test_non_finite_loss_stops_with_advice_and_keeps_the_last_good_checkpoint(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.pt"
    seen = {}
    cfg = tiny_cfg("device=cpu", "train.max_steps=10", "train.eval_every=4", "train.num_samples=0")
    trainer = Trainer(load_config(cfg))
    forward = trainer.train_model

    def poisoned(x, y, **kw):  # step 6 of 10 goes wrong, after last.pt was written at step 4
        logits, loss = forward(x, y, **kw)
        if trainer.step == 5:
            seen["last.pt"] = fingerprint(last)
            return logits, loss * float("nan")
        return logits, loss

    trainer.train_model = poisoned
    with pytest.raises(TrainingError) as info:
        trainer.run()
    message = str(info.value)
    for part in ("non-finite loss at step 6", "optim.lr=", "optim.grad_clip", str(last)):
        assert part in message, part
    assert fingerprint(last) == seen["last.pt"]
    ckpt = Checkpoint.load(last)
    assert ckpt.step == 4 and all(torch.isfinite(t).all() for t in ckpt.model.values())


# ----------------------------------------------------------------------------- crash-safe writes

# A helper process: saves a checkpoint once, then for each line on stdin forks a child that saves
# checkpoints to the same path without end (each one whole: every tensor holds its save's number)
# and prints the child's pid; the test kills the child with SIGKILL. Nothing has started a thread
# before the fork (one intra-op thread), so forking is safe.
SAVER = r"""
import os, sys, time, torch
torch.set_num_threads(1)  # no OpenMP thread pool: a forked child could deadlock on it
from microgpt.checkpoint import Checkpoint
from microgpt.model import GPT, GPTConfig
path = sys.argv[1]
config = {"vocab_size": 3, "block_size": 8, "n_layer": 5, "n_embd": 128}  # about 4 MB of float32
shapes = {k: t.shape for k, t in GPT(GPTConfig(**config)).state_dict().items()}
def save(n):
    model = {k: torch.full(s, float(n)) for k, s in shapes.items()}
    Checkpoint(model=model, model_config=config, tokenizer={"chars": "ab"}, step=n).save(path)
save(0)
print("ready", flush=True)
def stop_before_rename(fd):  # "N mid": the third save says so once written, and waits there
    fsync(fd)
    if n >= start + 3:
        print("mid", flush=True)
        while True:  # until SIGKILL (no os.pause: not every Python build has it)
            time.sleep(60)
fsync = os.fsync
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        n = start = int(line.split()[0])
        if line.split()[1:] == ["mid"]:
            os.fsync = stop_before_rename
        while True:
            n += 1
            save(n)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def test_sigkill_at_random_moments_while_saving_leaves_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "run" / "checkpoints" / "last.pt"
    helper = subprocess.Popen(
        [sys.executable, "-c", SAVER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    rng = random.Random(0)
    try:
        assert helper.stdout.readline().strip() == "ready"
        last_step, mid_write = 0, 0
        for i in range(10):
            # child i numbers its saves from here (exact in float32); every other one stops in
            # its third save, written but not renamed; the rest are killed at a random moment
            before = {p for p in path.parent.iterdir() if p.suffix == ".tmp"}
            helper.stdin.write(f"{(i + 1) * 100_000}{' mid' if i % 2 else ''}\n")
            helper.stdin.flush()
            said = [helper.stdout.readline().strip() for _ in range(1 + i % 2)]  # "mid": any order
            pid = int(next(line for line in said if line != "mid"))
            if not i % 2:
                time.sleep(rng.uniform(0.0, 0.3))
            os.kill(pid, signal.SIGKILL)
            assert helper.stdout.readline().strip() == "reaped"
            mid_write += len({p for p in path.parent.iterdir() if p.suffix == ".tmp"} - before)
            ckpt = Checkpoint.load(path)  # always whole: one save's tensors, every one of them
            values = {float(t.flatten()[0]) for t in ckpt.model.values()}
            assert values == {float(ckpt.step)}, values
            assert all(bool((t == ckpt.step).all()) for t in ckpt.model.values())
            assert ckpt.step >= last_step  # never an older one than what a reader already saw
            last_step = ckpt.step
            if i % 2:  # the third save's, never the one it stopped in
                assert ckpt.step == (i + 1) * 100_000 + 2
        assert mid_write >= 5  # a temporary file left by each stopped save, at least
    finally:
        helper.stdin.close()
        helper.wait(timeout=30)
    # leftover temporary files are never taken for checkpoints
    assert find_checkpoints(roots=(str(tmp_path),), name="last.pt") == [path]
    leftovers = [p for p in path.parent.iterdir() if p != path]
    assert all(p.name.startswith(".last.pt.") and p.suffix == ".tmp" for p in leftovers)


# ----------------------------------------------------------------------------- safe loading


def test_every_torch_load_is_weights_only_on_a_torch_without_known_bypass():
    """Every torch.load call in microgpt/ (every file, every depth) and the entry points passes
    weights_only=True, and pyproject.toml requires a torch whose weights-only unpickler has no
    known bypass (2.6, CVE-2025-32434). At least one call is found: the scan cannot pass empty."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_req,) = [d for d in deps if re.match(r"torch\b", d)]
    low = re.fullmatch(r"torch\s*>=\s*(\d+)\.(\d+)(\.\d+)?(\s*,\s*<.*)?", torch_req)
    assert low and (int(low[1]), int(low[2])) >= (2, 6), torch_req
    calls = []
    for source in [*(REPO / "microgpt").rglob("*.py"), *REPO.glob("*.py")]:
        for node in ast.walk(ast.parse(source.read_text())):
            f = getattr(node, "func", None)
            if isinstance(f, ast.Attribute) and f.attr == "load" and ast.unparse(f) == "torch.load":
                safe = any(k.arg == "weights_only" and ast.unparse(k.value) == "True"
                           for k in node.keywords)  # fmt: skip
                calls.append((f"{source.relative_to(REPO)}:{node.lineno}", safe))
    assert calls, "no torch.load found under microgpt/: the scan looks in the wrong place"
    assert all(safe for _, safe in calls), [where for where, safe in calls if not safe]


# ----------------------------------------------------------------------------- resume


def test_resume_with_other_model_settings_names_the_differing_keys(tiny_cfg, tmp_path):
    base = ("device=cpu", "train.num_samples=0", "resume=true")
    run_trainer(tiny_cfg("device=cpu", "train.max_steps=4", "train.eval_every=2", *base[:2]))
    # settings that may change on resume: max_steps, eval_every, logging
    changed = ("train.max_steps=8", "train.eval_every=3", "train.log_every=1", "log.attn_every=2")
    Trainer(load_config(tiny_cfg(*base, *changed)))
    with pytest.raises(ConfigError) as info:
        Trainer(load_config(tiny_cfg(*base, "train.max_steps=8", "model.n_embd=32")))
    message = str(info.value)
    assert re.search(r"model\.n_embd: 16 in the checkpoint, 32 now", message), message
    differing = message.split("settings differ from the checkpoint's (")[1].split(")")[0]
    assert "\n" not in message and not re.search("max_steps|eval_every|log", differing), differing


def test_run_dir_resolver_continues_the_run_being_resumed(tmp_path, monkeypatch):
    """hydra.run.dir under resume: the newest run's folder, the checkpoint's run folder, else a
    new one."""
    from microgpt.cli import run_dir

    monkeypatch.chdir(tmp_path)
    assert run_dir(True, "outputs/new") == "outputs/new"  # nothing to resume: train() then says so
    for name, age in (("old", 100), ("newer", 0)):
        last = tmp_path / "outputs" / "day" / name / "checkpoints" / "last.pt"
        last.parent.mkdir(parents=True)
        last.write_bytes(b"x")
        os.utime(last, (time.time() - age, time.time() - age))
    (tmp_path / "outputs" / "day" / "newer" / "checkpoints" / ".last.pt.x.tmp").write_bytes(b"x")
    assert Path(run_dir(True, "outputs/new")) == Path("outputs/day/newer")
    assert Path(run_dir("true", "outputs/new")) == Path("outputs/day/newer")
    assert run_dir("outputs/day/old/checkpoints/last.pt", "outputs/new") == "outputs/day/old"
    assert run_dir(False, "outputs/new") == "outputs/new"
