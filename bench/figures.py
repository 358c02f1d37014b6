"""The figures README.md and docs/ quote, each made by the command it names.

    python bench/figures.py [RECIPE ...] [--quick] [--out FILE]

Runs each recipe's README command (`python train.py ...`, then `python -m microgpt.heads RUN`
where the docs quote the analysis) from the working folder, as the README does, into a fresh
folder, on the threads the recipe names; reads what the run wrote (metrics.jsonl's result line,
heads-*.json and .md, compare's table) and writes every figure, with its command, seed, threads,
machine, date and wall time, to a new JSON file (default: bench/figures-DATE-TIME.json), or into
the file --update names (the recipes run replace theirs). docs/figures.json is the file the docs
quote (`--update docs/figures.json` refreshes it); tests/test_docs.py checks each quote against
it. --quick: a few steps each (a smoke test, not a figure).
Time one recipe at a time on a quiet machine (`cpu-slot --all`): the wall times are figures too.
"""

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # `python bench/figures.py` puts bench/, not the repository, on the path
    sys.path[0] = str(REPO)

from microgpt import entry  # noqa: E402
from microgpt.errors import UserError  # noqa: E402
from microgpt.files import check_new_file, project_data, read_json, write_text  # noqa: E402
from microgpt.runs import RunFolder  # noqa: E402

NS = "optim.muon_ortho=newton-schulz"  # Muon's default until 2026-11-28
# name: (the README's train.py settings, threads (None: as typed, a sweep's jobs sharing the
# cores), whether the docs quote its head analysis)
RECIPES = {
    "names": (["heads=4"], 1, True),
    "names-as-typed": (["heads=4"], None, False),  # threads=auto: its measured choice
    # the stand-in for a CPU without bf16 (the same fp32 kernels), as typed
    "names-fp32": (["heads=4", "train.precision=fp32", "optim.muon_precision=fp32"], None, False),
    # names-as-typed again, kept apart: the speed table's row for a second bf16 CPU kind
    "names-as-typed-amx": (["heads=4"], None, False),
    "names-busy": (["heads=4"], 1, False),  # BUSY: another training holds the other core
    "names-as-typed-busy": (["heads=4"], None, False),
    "names-seeds": (["-m", "heads=4", "seed=1,2,3,4,5"], 1, False),  # the headline over seeds
    "adamw": (["heads=4", "optim=adamw", "train.ema=0", "train.pack=0"], 1, False),
    "shakespeare": (["experiment=shakespeare"], 1, True),
    # docs/heads.md's analyses: made when Newton-Schulz was Muon's default (until 2026-11-28)
    "names-ns": (["heads=4", NS], 1, True),
    "shakespeare-ns": (["experiment=shakespeare", NS], 1, True),
    "shakespeare-seeds": (["-m", "experiment=shakespeare", "seed=1,2,3"], 1, False),
    # the study on 2 cores as typed: each job analysed, then compare's table
    # (made when Newton-Schulz was Muon's default, as docs/heads.md's analyses)
    "sweep": (["-m", "experiment=heads_seeds", "hydra/launcher=joblib", NS], None, True),
    # the README's table: today's default, 5 seeds, one job at a time on one thread
    "sweep-5": (["-m", "heads=1,2,4,8", "seed=1,2,3,4,5"], 1, True),
}
BUSY = ("names-busy", "names-as-typed-busy")
QUICK = ["train.max_steps=6", "train.eval_every=3", "log.attn_every=6", "log.head_items=8"]
SEED = 1337  # a recipe's that sweeps no seeds


def run_recipe(name: str, folder: Path, quick: bool) -> dict:
    """One recipe's run (and analysis) in `folder`: its figures, each with how it was made."""
    settings, threads, analysed = RECIPES[name]
    command = ["python", "train.py", *settings]
    run, sweep = folder / name, "-m" in settings
    seeds = "seed=" in " ".join(settings) or "experiment=heads_seeds" in settings
    extra = [*(QUICK if quick else []), "train.progress=false"]
    extra += ([f"threads={threads}"] if threads else []) + ([] if seeds else [f"seed={SEED}"])
    from bench.common import busy

    with busy(folder / f"{name}-load", quick) if name in BUSY else contextlib.nullcontext():
        t0 = time.perf_counter()
        _call([*command, *extra, f"hydra.sweep.dir={run}" if sweep else f"out_dir={run}"], threads)
        seconds = time.perf_counter() - t0
    made = {"command": " ".join(command), "seed": "each job's" if seeds else SEED}
    made["threads"] = threads or "as typed (threads=auto; a sweep's jobs share the cores)"
    if name in BUSY:
        made["load"] = "another `python train.py heads=4 threads=1` ran all along"
    if sweep and analysed:  # the README's table: every job analysed, then `compare`
        _call(["python", "-m", "microgpt.heads", str(run)], threads)
        table = _call(["python", "-m", "microgpt.compare", str(run)])
        made["table"] = "python -m microgpt.heads SWEEP, then python -m microgpt.compare SWEEP"
        figures = {"seconds": _figure(seconds, 0), "table": {"value": None, "text": table}}
        return {"made_by": made, "figures": figures}  # seconds: the training of every job
    if sweep:  # a figure over seeds: each seed's, their mean, spread and interval (no time)
        return {"made_by": made, "figures": _over_seeds(run)}
    result = _result(run)
    figures = {k: _figure(result[f"result/{k}"], 4) for k in ("test_loss", "best_val_loss")}
    figures["seconds"] = _figure(seconds, 0)
    if analysed:
        _call(["python", "-m", "microgpt.heads", str(run), "--threads", str(threads)])
        folder = RunFolder(run)
        analysis = read_json(folder.analysis(folder.best))
        figures["heads_loss"] = _figure(analysis["loss"], 4)
        figures["prunable"] = _figure(analysis["pruning"]["prunable"], 0)
        markdown = folder.analysis(folder.best, ".md").read_text()
        table = re.search(r"^\|.*(\n\|.*)*", markdown, re.MULTILINE)
        figures["table"] = {"value": None, "text": table[0]}  # the head table, as written
        # each named head (not mixed): its role, score and importance
        for row in (r for r in analysis["heads"] if r["role"] != "mixed"):
            head = f"L{row['layer']}H{row['head']}"
            figures[f"{head}_{row['role']}"] = _figure(row["score"], 2)
            figures[f"{head}_importance"] = _figure(row["zero_importance"], 2)
        made["analysis"] = f"python -m microgpt.heads RUN --threads {threads}"
    return {"made_by": made, "figures": figures}


def _over_seeds(sweep: Path) -> dict:
    """The test loss of each job of `sweep` (a seed each), their mean, standard deviation, range
    and the t-based 95% interval of the mean (microgpt.stats, as compare draws it)."""
    from microgpt.stats import interval

    jobs = sorted(p for p in sweep.iterdir() if RunFolder(p).metrics_file.is_file())
    losses = {job.name: _result(job)["result/test_loss"] for job in jobs}
    values, mean = list(losses.values()), interval(list(losses.values()))
    figures = {f"test_loss {job}": _figure(v, 4) for job, v in losses.items()}
    figures["seeds"] = _figure(len(values), 0)
    spread = {"mean": mean.mean, "sd": statistics.stdev(values) if len(values) > 1 else 0.0}
    spread |= {"min": min(values), "max": max(values), "ci_low": mean.low, "ci_high": mean.high}
    figures |= {f"test_loss_{k}": _figure(v, 4) for k, v in spread.items()}
    figures["interval"] = {"value": None, "text": mean.kind}
    return figures


def _result(run: Path) -> dict:
    """The result line of a run's metrics.jsonl: its last holding result/test_loss."""
    return next(line for line in reversed(RunFolder(run).metrics()) if "result/test_loss" in line)


def _figure(value: float, digits: int) -> dict:
    """A value and the text the docs quote it as (`digits` decimals, thousands with commas)."""
    return {"value": value, "text": f"{value:,.{digits}f}"}


def _call(command: list[str], threads: int | None = 1) -> str:
    """Run a README command in the working folder (its data/ is the runs'), the repository's
    scripts by path: what it printed; its error as this command's one line. threads None: as a
    user's shell runs it, with no OMP_NUM_THREADS (cpu-slot's) to keep a sweep's jobs from
    sharing the cores."""
    python = [sys.executable, *(str(REPO / w) if w == "train.py" else w for w in command[1:])]
    env = {k: v for k, v in os.environ.items() if threads or k != "OMP_NUM_THREADS"}
    done = subprocess.run(python, capture_output=True, env=env)
    if done.returncode:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        raise UserError(f"{' '.join(command)} failed (exit {done.returncode}): {last}")
    return done.stdout.decode()


def main(argv: list[str] | None = None) -> None:
    parser = entry.ArgumentParser(prog="bench/figures.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", metavar="RECIPE", help=f"of {', '.join(RECIPES)}")
    parser.add_argument("--quick", action="store_true", help="a few steps each: a smoke test")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", help="the JSON file to write (a new file)")
    where.add_argument("--update", help="a figures file of this command: the recipes run replaced")
    args = parser.parse_args(argv)
    if unknown := sorted(set(args.recipes) - set(RECIPES)):
        parser.error(f"unknown recipe {', '.join(unknown)}: choose among {', '.join(RECIPES)}")
    results, now = None if args.update else {}, datetime.now(timezone.utc)
    if args.update:  # a file of figures: every entry a recipe's, made by this command
        with contextlib.suppress(ValueError):  # not JSON (OSError: the front door's one line)
            results = read_json(args.update)
        if not isinstance(results, dict) or not set(results) <= set(RECIPES):
            raise UserError(f"--update={args.update} is not a figures file of bench/figures.py")
    out = args.update or args.out or REPO / "bench" / f"figures-{now:%Y-%m-%d-%H%M%S}.json"
    setting = "--update" if args.update else "--out"
    out = check_new_file(out, setting, own=bool(args.update), protected=project_data(),
                         overwrite_hint="--update in place of --out")  # fmt: skip
    from bench.common import git_commit, machine_info  # torch loads here, after the arguments

    made = {"date": f"{now:%Y-%m-%d}", "machine": machine_info(), "commit": git_commit()}
    with tempfile.TemporaryDirectory(prefix="microgpt-figures-") as tmp:
        for name in args.recipes or RECIPES:
            results[name] = run_recipe(name, Path(tmp), args.quick)
            results[name]["made_by"] |= made | ({"quick": True} if args.quick else {})
            figures = results[name]["figures"].items()
            shown = (f"{key} {f['text']}" for key, f in figures if f["value"] is not None)
            print(f"{name}: {', '.join(shown)}", flush=True)
    write_text(out, json.dumps(results, indent=1) + "\n", replace=bool(args.update))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(entry.run(main))
