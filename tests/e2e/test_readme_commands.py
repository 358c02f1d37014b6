"""Every command in README.md, run as a user types it (issue 25, item 1).

The commands are read from the README's indented code blocks (lines of four spaces and `python`,
`pip`, `tensorboard`, `torchrun` or `ruff`; a `&&` chain is one command per part), so a command
added to the README without a row in COVERED fails here: "README command not covered".

Each runs through the real command line (a new Python, `sys.executable train.py ...`) in a sandbox
project (tmp: data/names.txt, a slice of the real one; a small fake data/shakespeare.txt), in
README order. A long command runs in small form: settings APPENDED to it (SMALL: the last value
of a key wins), never another command. A placeholder
(`outputs/<date>/<time>`, `multirun/2026-11-21/10-00-00/heads=4`) becomes the folder that an
earlier command of the sandbox made. What is not run, and why, is said in its row: `pip install`
(checked against pyproject.toml), `python data/prepare.py shakespeare` (downloads: --help),
`bench/run.py` (its flags parsed here; its quick runs are tests/test_bench.py's).

Two tiers: every command as a real command line is marked slow (about 2.5 minutes on one core);
the default suite's fast version (about 35 s) runs train/sample/heads/compare in this process
through tests/harness.py (the same cli.main -> Hydra path, ~1 s each instead of 4 s of imports),
tensorboard and ruff as processes, and leaves out what takes its own processes and many seconds
(torchrun, the joblib and SLURM launchers, pytest). Every experiment and data preset of conf/
(the settings table names them inline) also starts a run in the fast tier.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import REPO, make_names
from tests.e2e.harness import Result
from tests.e2e.harness import run as run_in_process

README = REPO / "README.md"
PROMPTS = ("python", "pip", "tensorboard", "torchrun", "ruff")

# appended to every training command: a model and a run of a second or two (the default
# warmup of 100 steps is longer than this run: it is cut to fit, and said)
SMALL = (
    "model.n_layer=1",
    "model.n_embd=16",
    "train.batch_size=16",
    "train.max_steps=12",
    "train.eval_every=6",
    "train.num_samples=3",
    "log.attn_every=6",
    "log.head_items=16",
)
# the short run keeps its 40 steps: they are what the command is about
SHORT = tuple(a for a in SMALL if not a.startswith("train.max_steps="))


def readme_commands(text: str | None = None) -> list[str]:
    """The README's commands in order, each once: comments dropped, `&&` parts apart."""
    text = README.read_text() if text is None else text
    out: list[str] = []
    for line in text.splitlines():
        if not re.match(rf"    ({'|'.join(PROMPTS)})\b", line):
            continue
        line = re.sub(r"\s+#.*$", "", line.strip())
        for part in line.split("&&"):
            command = " ".join(part.split())
            if command not in out:
                out.append(command)
    return out


# ----------------------------------------------------------------------------- the sandbox


def fake_play(n_chars: int, seed: int) -> str:
    """Speeches under speakers' names (`Romeo.` on its own line, as the shipped plays write them):
    text enough for data.format=text."""
    rng = random.Random(seed)
    speakers = ["Romeo", "Juliet", "Nurse", "Mercutio", "Friar Laurence"]
    words = (
        "love night fair sweet death light heart thou thee my the and of to a is in doth hath "
        "swear moon star wherefore art name rose by any other word would smell as"
    ).split()
    speeches = []
    while sum(map(len, speeches)) < n_chars:
        lines = [" ".join(rng.choices(words, k=rng.randint(4, 9))).capitalize() + "."
                 for _ in range(rng.randint(1, 4))]  # fmt: skip
        speeches.append(f"{rng.choice(speakers)}.\n" + "\n".join(lines) + "\n\n")
    return "".join(speeches)


class Sandbox:
    """A project folder the commands run in, and the folders they made, by name."""

    def __init__(self, root: Path, real: bool):
        self.root, self.real = root, real
        self.folders: dict[str, Path] = {}  # "names", "text", "induction": runs; "heads": a sweep
        self.started = 0  # the runs started
        (root / "data").mkdir(parents=True)
        # 2,000 names of each, whatever the checkout's data/ holds: enough to train
        for seed, name in enumerate(("names.txt", "names-1980s.txt")):
            (root / "data" / name).write_text("\n".join(make_names(2000, seed)) + "\n")
        (root / "data" / "shakespeare.txt").write_text(fake_play(12_000, seed=0))

    def folder(self, key: str) -> Path:
        """The folder `key` names, made by its command now if it was not made yet."""
        if key not in self.folders:
            execute(self, MAKES[key])
        return self.folders[key]


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def run_command(argv: list[str], cwd: Path, timeout: int = 300, env: dict | None = None) -> Result:
    """A command line in a new process group; a timeout kills the group (torchrun's ranks)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env or _env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{shlex.join(argv)} did not end in {timeout} s\n{err[-3000:]}")
    return Result(proc.returncode, out, err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- how each is run


@dataclass(frozen=True)
class How:
    """How a README command runs here. kind: run (a python/torchrun command), pip, tensorboard,
    bench, slurm. append: what shrinks it. runs: placeholder -> the folder key it stands for.
    makes: the key its run (or sweep) folder is kept under. needs: the run that must be the
    latest. cwd: sandbox or repo. says: regexes its standard output matches. warmup: (the run's
    steps, the warmup it is cut to), said once. check(sandbox, result): the rest. slow: a command
    of its own processes and many seconds (torchrun, the launchers, pytest): in the slow, real
    tier only. A training command's run folders each hold a best.pt, and it prints a test loss."""

    kind: str = "run"
    append: tuple = ()
    runs: tuple = ()
    makes: str = ""
    needs: str = ""
    cwd: str = "sandbox"
    says: tuple = ()
    warmup: tuple = ()
    check: Callable | None = None
    slow: bool = False


def run_folders(r: Result) -> list[Path]:
    return [Path(m) for m in re.findall(r"run folder: (\S+)", r.stdout)]


def _sweep(s: Sandbox, r: Result) -> None:
    jobs = sorted(f.name for f in run_folders(r))
    assert jobs == [f"heads={h},seed={seed}" for h in (1, 2, 4, 8) for seed in (1, 2, 3)], jobs
    assert len({f.parent for f in run_folders(r)}) == 1  # one sweep folder


def _names_file(s: Sandbox, r: Result) -> None:
    # a name per line, none for an empty sample (the summary counts them)
    empty = re.search(r"of 1000 new, \d+ unique(?:, (\d+) empty)?$", r.stdout.strip())
    lines = (s.root / "names.txt").read_text().splitlines()
    assert len(lines) == 1000 - int(empty[1] or 0) and all(lines), r.stdout[-500:]


def _prefixed(s: Sandbox, r: Result) -> None:
    marked = [line for line in r.stdout.splitlines() if line.endswith(("(new)", "(in train)"))]
    assert marked and all(line.startswith("ma") for line in marked), r.stdout


def _heads(s: Sandbox, r: Result) -> None:
    assert (s.folders["names"] / "heads-best.json").is_file(), r.stdout[-2000:]


def _sweep_heads(s: Sandbox, r: Result) -> None:
    jobs = [line.split(":")[0] for line in r.stdout.splitlines()]
    assert len(jobs) == 12 and all(
        (s.folders["heads"] / j / "heads-best.json").is_file() for j in jobs
    )


def _resumed(s: Sandbox, r: Result) -> None:
    assert f"resumed from {s.folders['induction']}" in r.stdout, r.stdout[-2000:]


def _one_run(s: Sandbox, r: Result) -> None:
    assert len(run_folders(r)) == 1, r.stdout  # rank 0 alone writes the run


def _figures(s: Sandbox, r: Result) -> None:
    made = json.loads((s.root / "figures.json").read_text())["names"]
    assert made["made_by"]["command"] == "python train.py heads=4" and made["made_by"]["quick"]
    loss = made["figures"]["test_loss"]
    assert loss["text"] == f"{loss['value']:.4f}" and 0 < loss["value"] < 5, loss
    assert made["figures"]["table"]["text"].startswith("| layer | head | role |"), made


SAMPLED = r"\d+ of \d+ new"
COLLECTED = r"\d+ tests collected"

MAKES = {  # the command whose folder a placeholder stands for
    "names": "python train.py heads=4",
    "heads": "python train.py -m heads=1,2,4,8 seed=1,2,3",
    "text": "python train.py experiment=shakespeare",
    "induction": "python train.py experiment=induction",
}

COVERED: dict[str, How] = {
    # Set up: pip is not run (a network and minutes); what it names must exist
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": How("pip"),
    "pip install -e .": How("pip"),
    'pip install -e ".[test]"': How("pip"),
    # collected, not run: this test is part of it
    "python -m pytest": How(
        append=("--collect-only", "-q"), cwd="repo", says=(COLLECTED,), slow=True
    ),
    # Use: a short run keeps the default warmup of 100 steps: cut to fit, said once (issue 25, 1b)
    "python train.py heads=4": How(append=SMALL, makes="names", warmup=(12, 1)),
    "python sample.py": How(needs="names", says=(SAMPLED,)),
    "python train.py -m heads=1,2,4,8 seed=1,2,3": How(append=SMALL, makes="heads", check=_sweep),
    "tensorboard --logdir multirun/<date>/<time> --samples_per_plugin images=100": How(
        "tensorboard", runs=("heads",)
    ),
    "python -m microgpt.compare multirun/<date>/<time>": How(
        runs=("heads",), says=("heads=1", "heads=2", "heads=4", "heads=8")
    ),
    "python -m microgpt.heads outputs/<date>/<time>": How(runs=("names",), check=_heads),
    "python -m microgpt.heads multirun/<date>/<time>": How(runs=("heads",), check=_sweep_heads),
    # as typed but smaller: its 40 steps are what it is about (the warmup: a tenth of them)
    "python train.py train.max_steps=40": How(append=SHORT, warmup=(40, 4)),
    "python train.py heads=4 optim=adamw train.ema=0 train.pack=0": How(append=SMALL),
    # Sampling
    "python sample.py num_samples=1000 out=names.txt": How(
        needs="names", says=(SAMPLED,), check=_names_file
    ),
    "python sample.py prefix=ma temperature=0.8 top_k=10 seed=1": How(
        needs="names", says=(SAMPLED,), check=_prefixed
    ),
    # Your own text
    "python data/prepare.py shakespeare": How(append=("--help",), says=(r"\Ausage:", "--sdist")),
    "python train.py experiment=shakespeare": How(append=SMALL, makes="text", says=(r"\(text\)",)),
    'python sample.py prefix="Romeo."': How(
        needs="text", says=(r"(?s)(Romeo\..*?){3}", "verbatim")
    ),
    # Heads, explained
    # 2,000 generated items, not 100,000: the run is what the command is about
    "python train.py experiment=induction": How(
        append=(*SMALL, "data.repeats.items=2000"), makes="induction"
    ),
    # Resume: the settings come from the checkpoint; a longer run is what is appended
    "python train.py resume=true": How(
        append=("train.max_steps=24",),
        needs="induction",
        says=("at step 12", "after 24 steps"),
        check=_resumed,
    ),
    # More than one process
    # 4 CPU processes over gloo (device=cpu: a machine with one GPU cannot give 4 ranks one each)
    "torchrun --nproc_per_node=4 train.py heads=4": How(
        append=(*SMALL, "device=cpu"), check=_one_run, slow=True
    ),
    "python train.py -m experiment=heads_seeds hydra/launcher=joblib": How(
        append=SMALL, check=_sweep, slow=True
    ),
    # no cluster: it must fail only for want of srun; then submitit's local launcher runs it
    "python train.py -m heads=1,2,4,8 hydra/launcher=slurm": How("slurm", append=SMALL, slow=True),
    # Benchmarks: minutes; its quick runs are tests/test_bench.py's
    "python bench/run.py --quick": How("bench"),
    # its figures small, written into the sandbox (the default file is a new one in bench/)
    "python bench/figures.py --quick names": How(
        append=("--out", "figures.json"), check=_figures, slow=True
    ),
    # Tests
    'python -m pytest -m "slow or not slow"': How(
        append=("--collect-only", "-q"), cwd="repo", says=(COLLECTED,), slow=True
    ),
    "ruff check .": How(cwd="repo"),
    "ruff format --check .": How(cwd="repo"),
}

IN_PROCESS = {"train.py", "sample.py", "microgpt.heads", "microgpt.compare"}

PLACEHOLDER = re.compile(r"(outputs|multirun)/(<date>|\d{4}-\d\d-\d\d)/(<time>|\d\d-\d\d-\d\d)")


def resolve(sandbox: Sandbox, command: str, how: How) -> list[str]:
    """The command's words, its placeholders replaced by the sandbox's folders, SMALL appended;
    a new run gets a folder of its own (two runs started within a second would share Hydra's
    outputs/<date>/<time>)."""
    keys = iter(how.runs)
    words = []
    for word in shlex.split(command):
        if PLACEHOLDER.search(word):
            word = PLACEHOLDER.sub(str(sandbox.folder(next(keys))), word)
        words.append(word)
    if "train.py" in words and not {"-m", "resume=true"} & set(words):
        sandbox.started += 1
        words.append(f"hydra.run.dir=outputs/readme/{sandbox.started}")
    return [*words, *how.append]


def argv_for(words: list[str]) -> list[str]:
    """The words as a process runs them: this Python, the repository's scripts by path."""
    program, args = words[0], words[1:]
    scripts = {"train.py", "sample.py", "data/prepare.py", "bench/run.py", "bench/figures.py"}
    args = [str(REPO / a) if a in scripts else a for a in args]
    modules = {"python": [], "torchrun": ["-m", "torch.distributed.run"],
               "tensorboard": ["-m", "tensorboard.main"], "ruff": ["-m", "ruff"]}  # fmt: skip
    return [sys.executable, *modules[program], *args]


def execute(sandbox: Sandbox, command: str) -> None:
    """Run one README command (in small form) in the sandbox and check what it did."""
    how = COVERED.get(command)
    if how is None:
        pytest.fail(f"README command not covered: {command!r}: add a row to COVERED")
    if how.needs:  # in README order the commands before made it; alone, it is made now
        sandbox.folder(how.needs)
    words = resolve(sandbox, command, how)
    {"pip": _pip, "bench": _bench, "tensorboard": _tensorboard, "slurm": _slurm}.get(
        how.kind, _run
    )(sandbox, words, how)


def _run(sandbox: Sandbox, words: list[str], how: How) -> None:
    cwd = REPO if how.cwd == "repo" else sandbox.root
    if words[0] == "ruff":
        pytest.importorskip("ruff", reason="ruff comes with the test extra")
    in_process = not sandbox.real and len(words) > 1 and words[0] == "python"
    target = words[2] if words[1:2] == ["-m"] else words[1]
    if in_process and target in IN_PROCESS:  # the fast version: one process, same cli path
        name = target.removeprefix("microgpt.")
        r = run_in_process(name, *words[(3 if words[1] == "-m" else 2) :], cwd=cwd)
    else:
        env = _env()
        if words[0] == "torchrun":  # torchrun's own --master-port, as its environment variable
            env["PET_MASTER_PORT"] = str(free_port())
        r = run_command(argv_for(words), cwd, env=env)
    assert r.code == 0 and "Traceback" not in r.text, f"{shlex.join(words)}\n{r.text[-4000:]}"
    assert "microgpt: error" not in r.stderr, r.stderr
    folders = run_folders(r)  # a training command's: every job's
    if "train.py" in words:
        assert "test loss" in r.stdout, r.stdout[-2000:]
        assert folders and all((f / "checkpoints" / "best.pt").is_file() for f in folders), folders
    if how.makes:  # a run, or a sweep
        sandbox.folders[how.makes] = folders[0] if len(folders) == 1 else folders[0].parent
    for said in how.says:
        assert re.search(said, r.stdout), (said, r.stdout[-3000:])
    if how.warmup:
        steps, cut = how.warmup
        line = f"warmup_steps=100 is longer than the run (train.max_steps={steps}): using {cut}"
        assert r.stdout.count("is longer than the run") == 1 and line in r.stdout, r.stdout
        assert f"warmup_steps: {cut}\n" in (folders[0] / "config.yaml").read_text()
    if how.check:
        how.check(sandbox, r)


def _pip(sandbox: Sandbox, words: list[str], how: How) -> None:
    """pip is not run: the package (or the extra) it installs must be what pyproject.toml has."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert words[:2] == ["pip", "install"], words
    targets = [w for w in words[2:] if not w.startswith("-") and not w.startswith("http")]
    for target in targets:
        m = re.fullmatch(r"\.(?:\[(\w+)\])?", target)
        if m:
            assert project["name"] == "microgpt"
            assert m[1] is None or m[1] in project["optional-dependencies"], target
        else:  # a dependency installed first (torch's CPU build)
            assert any(re.match(rf"{target}\b", d) for d in project["dependencies"]), target


def _bench(sandbox: Sandbox, words: list[str], how: How) -> None:
    """Its flags are parsed (a flag or section renamed fails here); tests/test_bench.py runs the
    quick forms."""
    from bench.run import parse_args

    args = parse_args([*words[2:], "--out", str(sandbox.root / "bench.json")])
    assert args.out == str(sandbox.root / "bench.json")
    assert not (sandbox.root / "bench.json").exists()


def _tensorboard(sandbox: Sandbox, words: list[str], how: How) -> None:
    """It starts and answers on localhost, listing the runs under --logdir; then it is stopped."""
    pytest.importorskip("tensorboard")
    port = free_port()
    logdir = Path(words[words.index("--logdir") + 1])
    logdir = logdir if logdir.is_absolute() else sandbox.root / logdir
    want = {str(p.parent.relative_to(logdir)) for p in logdir.rglob("events.out.tfevents.*")}
    assert want, f"no runs under {logdir}"
    proc = subprocess.Popen(argv_for([*words, "--port", str(port)]), cwd=sandbox.root, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    runs, deadline = set(), time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not want <= runs:
            assert proc.poll() is None, f"tensorboard ended: {proc.communicate()[0][-3000:]}"
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/data/runs", timeout=5) as f:
                    runs = set(json.loads(f.read()))
            except OSError:
                pass
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert want <= runs, f"tensorboard on port {port} listed {sorted(runs)}, not {sorted(want)}"


def _slurm(sandbox: Sandbox, words: list[str], how: How) -> None:
    """Without a cluster the command checks every job, then stops in one line (no srun), before
    Hydra writes the sweep's folder; the same sweep then runs under submitit's local launcher
    (appended: hydra/launcher=submitit_local, two of the jobs)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    if shutil.which("srun") is None:  # on a cluster this would submit real jobs: not here
        before = sorted(sandbox.root.rglob("*"))
        r = run_command(argv_for(words), sandbox.root)
        assert r.code == 2 and "Traceback" not in r.stderr, r.text[-3000:]
        assert "error: hydra/launcher=slurm: this machine has no SLURM (no srun)" in r.stderr
        assert sorted(sandbox.root.rglob("*")) == before
    local = [*words, "heads=1,2", "hydra/launcher=submitit_local"]
    r = run_command(argv_for(local), sandbox.root)
    assert r.code == 0 and "Traceback" not in r.stderr, r.text[-4000:]
    sweep = Path(re.search(r"sweep output dir : (\S+)", r.stdout)[1])
    sweep = sweep if sweep.is_absolute() else sandbox.root / sweep
    for job in ("heads=1", "heads=2"):
        assert (sweep / job / "checkpoints" / "best.pt").is_file(), job
        assert "test loss" in (sweep / job / "train.log").read_text()
    assert (sweep / ".submitit").is_dir()


# ----------------------------------------------------------------------------- the tests

COMMANDS = readme_commands()


def test_every_readme_command_is_covered():
    assert len(COMMANDS) >= 20, COMMANDS  # the parser found the code blocks
    missing = [c for c in COMMANDS if c not in COVERED]
    assert not missing, f"README command not covered: {missing}: add a row to COVERED"
    stale = [c for c in COVERED if c not in COMMANDS]
    assert not stale, f"COVERED has commands the README no longer has: {stale}"


def test_the_parser_reads_chains_and_drops_comments():
    text = "x\n    pip install -e . && python train.py heads=4   # a comment\n  python no\n"
    assert readme_commands(text) == ["pip install -e .", "python train.py heads=4"]


@pytest.fixture(scope="module")
def fast_sandbox(tmp_path_factory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("readme-fast") / "project", real=False)


@pytest.fixture(scope="module")
def real_sandbox(tmp_path_factory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("readme") / "project", real=True)


def _params(real: bool):
    for c in COMMANDS:
        how = COVERED.get(c, How())
        if not real and how.slow:
            continue  # only as a real command line
        yield pytest.param(c, id=c[:70], marks=[pytest.mark.slow] if real else [])


@pytest.mark.parametrize("command", list(_params(real=False)))
def test_readme_command_in_process(fast_sandbox, command):
    """The default suite's version: train/sample/heads/compare in this process (harness.run)."""
    execute(fast_sandbox, command)


@pytest.mark.parametrize("command", list(_params(real=True)))
def test_readme_command_line(real_sandbox, command):
    """Every command as a new process, as typed (slow: ~4 s of imports each)."""
    execute(real_sandbox, command)


# ----------------------------------------------------------------------------- the presets

# The settings table names its presets inline (`experiment=induction`): every experiment and data
# preset in conf/ starts a run, in small form (experiment=induction and data=repeats stopped at
# start-up looking for a file at data.path, a label for generated data: issue 25, 1a).
PRESETS = sorted(
    f"{group}={p.stem}"
    for group in ("experiment", "data")
    for p in (REPO / "conf" / group).glob("*.yaml")
)


def test_the_readme_presets_are_the_ones_in_conf():
    docs = README.read_text() + (REPO / "docs" / "guide.md").read_text()  # guide: the settings
    named = set(re.findall(r"`((?:experiment|data)=[\w-]+)`", docs))
    assert named and named <= set(PRESETS), named - set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_starts_a_run(fast_sandbox, preset):
    if f"python train.py {preset}" in COMMANDS:
        pytest.skip("a README command: run by test_readme_command_in_process")
    if preset == "experiment=heads_seeds":  # a sweep: the README's -m command runs it
        pytest.skip("without -m it is refused (tests/e2e/test_harness.py)")
    small = list(SMALL)
    if preset == "experiment=microgpt":
        small.remove("train.batch_size=16")  # one name per step is what it is
    if preset in ("experiment=induction", "data=repeats"):
        small.append("data.repeats.items=2000")  # 100,000 generated by default
    # a folder per preset: two runs started in the same second would share outputs/<date>/<time>
    small.append(f"hydra.run.dir=outputs/preset-{preset.replace('=', '-')}")
    r = run_in_process("train.py", preset, *small, cwd=fast_sandbox.root)
    assert r.code == 0 and "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert "test loss" in r.stdout, r.stdout[-2000:]
