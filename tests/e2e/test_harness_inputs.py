"""Bad input, issue 26: generated data, text edges, sampling settings, thread settings and signals
during every command, each run as a user would type it (tests/e2e/harness.py) on a sandbox
project hashed before and after. Each case ends in one clear line (or does what the README
documents), with the exit status it should have, no traceback, and nothing lost.

The sandbox: data/ (names, a short play, edge files), a finished names run (runs/names), a text
run (runs/text), and a text run whose file lies outside the sandbox (runs/away), so that a case
can take that file away or change it without touching the sandbox.

A signal "during" a command is sent from inside it: the case replaces one step of the command's
work (loading, generating data, sampling, reading a sweep, drawing) by one that signals this
process, so the signal lands exactly there, every time, without a subprocess.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from tests.conftest import TINY, make_names
from tests.e2e.harness import Result, changes, check_one_line, fingerprint, remove_added, run

# every training command starts from a tiny model, so one that is wrongly accepted ends quickly
T = [*TINY, "device=cpu", "train.num_samples=0", "log.attn_every=1000", "train.max_steps=2",
     "train.eval_every=2", "hydra.run.dir=runs/new"]  # fmt: skip
TEXT = ["data.format=text", "data.path=data/play.txt", "model.block_size=16"]
# generated items few enough to be made in a blink
R = ["data=repeats", "data.repeats.items=300", "model.block_size=null"]
S = ["device=cpu", "seed=0"]  # sample.py
NAMES_RUN, TEXT_RUN, AWAY_RUN = "run=runs/names", "run=runs/text", "run=runs/away"
WORDS = "the king and queen of a land where all men speak in verse to thee my lord".split()


def _play(seed: int = 0, lines: int = 200) -> str:
    import random

    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(lines)) + "\n"


@pytest.fixture(scope="session")
def inputs_sandbox(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("inputs")
    root = base / "project"
    root.mkdir()
    shutil.copytree(Path(__file__).resolve().parents[2] / "conf", root / "conf")
    data = root / "data"
    data.mkdir()
    (data / "names.txt").write_text("\n".join(make_names()) + "\n")
    (data / "other.txt").write_text("\n".join(make_names(seed=1)) + "\n")
    (data / "play.txt").write_text(_play())
    (data / "empty.txt").write_text("")
    (data / "blank.txt").write_text("\n \n\t\n")
    (data / "one.txt").write_text("a")
    (data / "nul.txt").write_bytes(b"the king\x00 and\n")
    (data / "folder").mkdir()
    (root / "out").mkdir()
    (root / "out" / "existing.txt").write_text("kept\n")
    away = base / "away"
    away.mkdir()
    (away / "play.txt").write_text(_play(seed=1))

    for name, extra in (
        ("names", ["data.path=data/names.txt"]),
        ("text", TEXT),
        ("away", ["data.format=text", f"data.path={away / 'play.txt'}", "model.block_size=16"]),
    ):
        r = run("train.py", *T[:-1], *extra, f"hydra.run.dir=runs/{name}", cwd=root)
        assert r.code == 0, r.stderr
    return root


@dataclass
class Case:
    id: str
    command: str  # train.py | sample.py | heads | compare
    args: list
    message: str = ""  # a regex: the error line (or stderr) when code != 0, else stdout+stderr
    code: int = 2
    added: tuple = ()  # glob patterns of the paths the command may add
    setup: object = None  # (sandbox) -> a context manager around the command
    lines: int = 1  # how many "microgpt: error" lines
    absent: str = ""  # a regex the output must not match (advice that does not work)
    marks: tuple = ()


def train(id, *args, message, **k) -> Case:
    return Case(id, "train.py", [*T, *args], message, **k)


def sample(id, *args, message, **k) -> Case:
    return Case(id, "sample.py", [*S, *args], message, **k)


# ----------------------------------------------------------------------------- generated data

REPEATS = [
    # issue 26: each a traceback and a run folder left behind
    train("repeats-items-ten-billion", *R, "data.repeats.items=10000000000",
          message=r"data\.repeats\.items=10,000,000,000 .* would take about .* of memory"),
    train("repeats-length-hundred-million", *R, "data.repeats.length=100000000",
          message=r"data\.repeats\.length=100,000,000 .* memory"),
    train("repeats-chars-empty", *R, "data.repeats.chars=''",
          message=r"data\.repeats\.chars='' must be distinct characters, at least one"),
    # the family: every setting of the generator, out of bounds
    train("repeats-items-hundred-million", *R, "data.repeats.items=100000000",
          message=r"data\.repeats\.items=100,000,000 .* more than half"),
    train("repeats-chars-repeated", *R, "data.repeats.chars=abca",
          message=r"data\.repeats\.chars='abca' must be distinct"),
    train("repeats-items-zero", *R, "data.repeats.items=0",
          message=r"data\.repeats\.items=0 must be at least 3"),
    train("repeats-items-negative", *R, "data.repeats.items=-5",
          message=r"data\.repeats\.items=-5 must be at least 3"),
    train("repeats-items-two", *R, "data.repeats.items=2",
          message=r"data\.repeats\.items=2 must be at least 3 \(one each for train, val and test"),
    train("repeats-items-text", *R, "data.repeats.items=many", message=r"data\.repeats\.items"),
    train("repeats-span-reversed", *R, "data.repeats.span=[5,2]",
          message=r"data\.repeats\.span=\[5, 2\] must be \[lo, hi\]"),
    train("repeats-span-zero", *R, "data.repeats.span=[0,3]",
          message=r"data\.repeats\.span=\[0, 3\]"),
    train("repeats-span-three", *R, "data.repeats.span=[1,2,3]",
          message=r"data\.repeats\.span=\[1, 2, 3\]"),
    train("repeats-span-too-long", *R, "data.repeats.span=[2,20]",
          message=r"span=\[2, 20\] .*length=32 \(hi <= 16\)"),
    train("repeats-length-zero", *R, "data.repeats.length=0",
          message=r"data\.repeats\.length=0 \(hi <= 0\)"),
    train("repeats-length-negative", *R, "data.repeats.length=-4",
          message=r"data\.repeats\.length=-4"),
    train("repeats-seed-negative", *R, "data.repeats.seed=-1",
          message=r"data\.repeats\.seed=-1 must be in \[0, 2\*\*63\)"),
    train("repeats-seed-huge", *R, "data.repeats.seed=9223372036854775808",
          message=r"data\.repeats\.seed"),
    # the generator is named, never a file the items do not come from
    train("repeats-block-too-small", *R, "model.block_size=16",
          message=r"^microgpt: error: generated repeats \(seed 0\): item 1 ",
          absent=r"generated:repeats|names\.txt"),
    train("format-repeats-keeps-no-file-name", "data.format=repeats", "data.repeats.items=300",
          "data.path=data/names.txt", "model.block_size=16",
          message=r"generated repeats \(seed 0\): item 1", absent=r"names\.txt"),
    train("repeats-trains", *R, "data.repeats.seed=3", code=0, added=("runs/new",),
          message=r"data generated repeats \(seed 3\) \(repeats\)", absent=r"generated:repeats"),
]  # fmt: skip

# ----------------------------------------------------------------------------- text edges

TEXTS = [
    # issue 26: a traceback from the head analysis and a folder left behind
    train("text-block-one", *TEXT, "model.block_size=1",
          message=r"model\.block_size=1 with data\.format=text: .* use at least 2"),
    train("text-block-zero", *TEXT, "model.block_size=0", message=r"model\.block_size=0"),
    train("text-block-negative", *TEXT, "model.block_size=-8", message=r"model\.block_size=-8"),
    train("text-empty-file", "data.format=text", "data.path=data/empty.txt",
          message=r"empty\.txt is empty"),
    train("text-blank-file", "data.format=text", "data.path=data/blank.txt",
          message=r"blank\.txt is empty \(or only whitespace\)"),
    train("text-one-char", "data.format=text", "data.path=data/one.txt", message=r"one\.txt"),
    train("text-nul-bytes", "data.format=text", "data.path=data/nul.txt",
          message=r"nul\.txt holds NUL bytes"),
    train("text-folder", "data.format=text", "data.path=data/folder", message=r"folder"),
    train("text-missing", "data.format=text", "data.path=data/none.txt",
          message=r"none\.txt"),
    train("text-block-beyond-the-text", *TEXT, "model.block_size=100000",
          message=r"block_size|100,?000"),
    train("text-probe-unknown", *TEXT, "log.probe=XYZ",
          message=r"log\.probe='XYZ' has characters the vocabulary does not know"),
    train("text-probe-too-long", *TEXT, "log.probe=" + "the " * 10,
          message=r"log\.probe=.* the model reads at most 16"),
    train("text-block-two", *TEXT, "model.block_size=2", code=0, added=("runs/new",),
          message=r"test loss"),
    # issue 26: a run's data cannot change, and the message says so rather than "restore it"
    Case("resume-another-data-file", "train.py",
         [*T[:-1], "data.path=data/other.txt", "resume=runs/names", "train.max_steps=6",
          "hydra.run.dir=runs/names"],
         message=r"the data of a run cannot change.*data\.path=.*other\.txt",
         absent=r"no longer holds|restore it"),
]  # fmt: skip

# ----------------------------------------------------------------------------- sampling settings


@contextlib.contextmanager
def _moved(path: Path):
    """The file at `path` gone while open, then back."""
    hidden = path.with_name(path.name + ".hidden")
    path.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(path)


@contextlib.contextmanager
def _rewritten(path: Path, text: str):
    old = path.read_bytes()
    path.write_text(text)
    try:
        yield
    finally:
        path.write_bytes(old)


def _away(root: Path) -> Path:
    return root.parent / "away" / "play.txt"


SAMPLING = [
    # issue 26: minutes of silence; bounded before the checkpoint is even read
    sample("text-max-len-ten-million", TEXT_RUN, "num_samples=1", "max_len=10000000",
           message=r"max_len=10,000,000 would take 10,000,000 steps of the model.*at most 100,000"),
    sample("text-max-len-just-over", TEXT_RUN, "max_len=100001", message=r"max_len=100,001"),
    sample("names-max-len-million", NAMES_RUN, "max_len=1000000", message=r"max_len=1,000,000"),
    sample("text-max-len-zero", TEXT_RUN, "max_len=0", message=r"max_len=0 must be at least 1"),
    sample("text-max-len-negative", TEXT_RUN, "max_len=-3", message=r"max_len=-3"),
    sample("text-max-len-text", TEXT_RUN, "max_len=long", message=r"max_len"),
    sample("text-max-len-one", TEXT_RUN, "num_samples=1", "max_len=1", code=0,
           message=r"1 passage\(s\)"),
    sample("text-prefix-unknown", TEXT_RUN, "prefix=XYZ",
           message=r"prefix has characters this model's vocabulary does not know: 'X'"),
    sample("text-prefix-longer-than-block", TEXT_RUN, "num_samples=1", "max_len=5",
           "prefix=" + "the king " * 4, code=0, message=r"continues the last 15"),
    sample("text-num-samples-zero", TEXT_RUN, "num_samples=0", message=r"num_samples=0"),
    sample("text-temperature-negative", TEXT_RUN, "temperature=-1", message=r"temperature"),
    sample("text-top-k-zero", TEXT_RUN, "top_k=0", message=r"top_k"),
    sample("text-top-p-over-one", TEXT_RUN, "top_p=1.5", message=r"top_p"),
    sample("names-prefix-unknown", NAMES_RUN, "prefix=XYZ", message=r"prefix"),
    # issue 26: advice that sample.py would refuse ("set data.path=...") is not given
    sample("text-file-gone", AWAY_RUN, "num_samples=1", "max_len=5", code=0,
           message=r"memorisation not measured: the run's text file .*play\.txt is missing.*put "
                   r"the file the run was trained on back",
           absent=r"data\.path", setup=lambda root: _moved(_away(root))),
    sample("text-file-changed", AWAY_RUN, "num_samples=1", "max_len=5", code=0,
           message=r"play\.txt no longer holds the text this run was trained on",
           absent=r"data\.path", setup=lambda root: _rewritten(_away(root), _play(seed=5))),
    sample("text-file-emptied", AWAY_RUN, "num_samples=1", "max_len=5", code=0,
           message=r"play\.txt no longer holds the text", absent=r"data\.path",
           setup=lambda root: _rewritten(_away(root), "")),
]  # fmt: skip

# ----------------------------------------------------------------------------- thread settings


@contextlib.contextmanager
def _env(**values):
    old = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(old)


def omp(value: str):
    return lambda root: _env(OMP_NUM_THREADS=value)


THREADS = [
    # issue 26: one libgomp warning, then every core, against the README
    train("omp-zero", message=r"OMP_NUM_THREADS='0' is not a number of threads", setup=omp("0")),
    train("omp-negative", message=r"OMP_NUM_THREADS='-3' is not a number", setup=omp("-3")),
    train("omp-text", message=r"OMP_NUM_THREADS='abc' is not a number", setup=omp("abc")),
    train("omp-fraction", message=r"OMP_NUM_THREADS='1\.5'", setup=omp("1.5")),
    train("omp-nested-bad", message=r"OMP_NUM_THREADS='x,2'", setup=omp("x,2")),
    sample("omp-zero-sample", NAMES_RUN, message=r"OMP_NUM_THREADS='0'", setup=omp("0")),
    sample("omp-text-sample", TEXT_RUN, message=r"OMP_NUM_THREADS='abc'", setup=omp("abc")),
    Case("omp-text-heads", "heads", ["runs/names"], message=r"OMP_NUM_THREADS='abc'",
         setup=omp("abc")),
    # threads=N does not read it; a valid one is taken
    sample("omp-text-threads-given", NAMES_RUN, "num_samples=2", "threads=1", code=0,
           message=r"seed 0", setup=omp("abc")),
    sample("omp-nested", NAMES_RUN, "num_samples=2", code=0, message=r"seed 0",
           setup=omp("1,1")),
    sample("omp-blank", NAMES_RUN, "num_samples=2", code=0, message=r"seed 0", setup=omp(" ")),
    sample("threads-zero-sample", NAMES_RUN, "threads=0", message=r"threads=0 must be auto"),
    sample("threads-fraction-sample", NAMES_RUN, "threads=1.5", message=r"threads=1\.5"),
    train("threads-negative", "threads=-2", message=r"threads=-2 must be auto"),
    train("threads-text", "threads=many", message=r"threads='many' must be auto"),
    Case("threads-zero-heads", "heads", ["runs/names", "--threads", "0"],
         message=r"--threads=0 must be auto"),
]  # fmt: skip

# ----------------------------------------------------------------------------- signals


@contextlib.contextmanager
def _signal_at(target: str, signame: str):
    """`target` (a module's attribute the command calls) sends `signame` to this process when
    called. A SIGTERM no handler of the command catches stops the case, not the test run."""

    def unhandled(signum, frame):
        raise AssertionError(f"{signame} reached the test: the command installed no handler")

    def send(*args, **kwargs):
        signal.raise_signal(getattr(signal, signame))
        raise AssertionError(f"{signame} was ignored")

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        with mock.patch(target, send):
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signal_while_drawing(signame: str):
    """compare's PNG half written when the signal lands."""

    def save(image, fp, *args, **kwargs):
        fp.write(b"\x89PNG\r\n\x1a\n")
        signal.raise_signal(getattr(signal, signame))

    with _signal_at("PIL.Image.Image.save", signame):
        with mock.patch("PIL.Image.Image.save", save):
            yield


def interrupted(id, command, args, target, signame, message, **k) -> Case:
    code = 128 + getattr(signal, signame).value
    return Case(id, command, args, message, code=code, lines=0,
                setup=lambda root: _signal_at(target, signame), **k)  # fmt: skip


SAMPLE_NAMES = "microgpt.sample.command.sample_names"
SAMPLE_PASSAGES = "microgpt.sample.command.sample_passages"
SIGNALS = [
    interrupted(f"{sig.lower()}-{what}", "sample.py", [*S, *args], target, sig, message)
    for sig in ("SIGINT", "SIGTERM")
    for what, args, target, message in (
        ("sampling-names", [NAMES_RUN, "num_samples=5000"], SAMPLE_NAMES,
         r"interrupted \(SIG(INT|TERM)\): sampling stopped"),
        ("sampling-passages", [TEXT_RUN], SAMPLE_PASSAGES,
         r"interrupted \(SIG(INT|TERM)\): sampling stopped"),
        ("sampling-into-out", [NAMES_RUN, "out=out/new.txt"], SAMPLE_NAMES,
         r"nothing was written to out=out/new\.txt"),
        ("loading-checkpoint", [NAMES_RUN], "microgpt.sample.command.Checkpoint.load",
         r"interrupted \(SIG(INT|TERM)\)"),
    )
] + [
    interrupted(f"{sig.lower()}-compare-{what}", "compare", args, target, sig,
                r"microgpt: interrupted \(SIG(INT|TERM)\): nothing was written")
    for sig in ("SIGINT", "SIGTERM")
    for what, args, target in (
        ("reading", ["runs"], "microgpt.compare.read_sweep"),
        ("table", ["runs", "--no-plot"], "microgpt.compare.format_table"),
    )
] + [
    Case(f"{sig.lower()}-compare-drawing", "compare", ["runs", "--plot", "out/curves.png"],
         r"interrupted \(SIG(INT|TERM)\): nothing was written",
         code=128 + getattr(signal, sig).value, lines=0,
         setup=lambda root, sig=sig: _signal_while_drawing(sig))
    for sig in ("SIGINT", "SIGTERM")
] + [
    interrupted(f"{sig.lower()}-generating-repeats", "train.py", [*T, *R],
                "microgpt.data.dataset.repeat_items", sig,
                r"interrupted \(SIG(INT|TERM)\): before the first checkpoint")
    for sig in ("SIGINT", "SIGTERM")
]  # fmt: skip

CASES = [*REPEATS, *TEXTS, *SAMPLING, *THREADS, *SIGNALS]

# the few cases that train or sample for seconds: the rest refuse at once
SLOW = {"repeats-trains", "text-block-two"}


def _params():
    for c in CASES:
        marks = [*c.marks, *([pytest.mark.slow] if c.id in SLOW else [])]
        yield pytest.param(c, id=c.id, marks=marks)


def test_the_cases_are_many_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "case ids are unique"
    assert len(CASES) >= 50


def _match(path: str, patterns) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("*") + "/") for p in patterns)


@pytest.mark.parametrize("case", list(_params()))
def test_bad_input_is_one_line_and_loses_nothing(inputs_sandbox, case):
    root = inputs_sandbox
    before = fingerprint(root)
    setup = case.setup(root) if case.setup else contextlib.nullcontext()
    try:
        with setup:
            try:
                r = run(case.command, *case.args, cwd=root)
            except KeyboardInterrupt:  # the command let it through: a traceback, and no test run
                r = Result(-2, "", "Traceback: KeyboardInterrupt escaped the command")
        after = fingerprint(root)
    finally:
        remove_added(root, changes(before, fingerprint(root))[2])
    check_one_line(case, r)
    if case.absent:
        text = r.stdout + r.stderr
        assert not re.search(case.absent, text), text[-2000:]
    changed, removed, added = changes(before, after)
    assert not removed, f"removed: {removed}"
    assert not changed, f"changed: {changed}"
    assert not [p for p in added if not _match(p, case.added)], f"added: {added}"
