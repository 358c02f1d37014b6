"""Benchmarks a user runs: training throughput against a plain reference GPT, the time to the
plain reference's loss, sampling, memory, the head analysis' time, and the targets table.

    python bench/run.py --quick                      # tiny sizes: a smoke test, not a measurement
    python bench/run.py                              # every section: hours on 2 CPU cores
    python bench/run.py --only throughput,sampling --threads 2 --out results.json

Every figure is {median, min, max, unit, n[, target, pass]}. One table is printed; the JSON
(machine, torch, threads, commit, every figure) is written to --out at the end, as a new file
(--overwrite: replacing one; --out -: to standard output, the table then to stderr).
docs/benchmarks.md says what each section measures, and holds the figures measured.
"""

import argparse
import contextlib
import functools
import importlib
import json
import math
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # `python bench/run.py` puts bench/, not the repository, on the path
    sys.path[0] = str(REPO)

from microgpt import entry  # noqa: E402

with entry.loading(__name__):  # OMP_WAIT_POLICY before torch loads; Ctrl-C meanwhile: one line
    import torch

    from bench.common import attempt, busy, git_commit, machine_info
    from bench.memory import memory_child
    from bench.targets import ROWS, format_targets
    from microgpt.errors import UserError
    from microgpt.files import STDOUT, OutputRefused, check_new_file, project_data, write_text
    from microgpt.model import ATTN_IMPLS
    from microgpt.runs import resolve
    from microgpt.system import DEVICES, pick_device, set_threads

    # each section: bench/<section>.py's run_<section>(args, device, tmp) -> {"figures", "info"}
    NAMES = ("throughput", "step", "time_to_loss", "sampling", "memory", "heads", "tab", "targets")
    SECTIONS = {s: getattr(importlib.import_module(f"bench.{s}"), f"run_{s}") for s in NAMES}

# the defaults --quick shrinks (a setting given stays as given)
QUICK = {"presets": ["micro"], "batches": [32], "repeats": 1, "rounds": 2, "block_s": 0.05}
QUICK |= {"sample_steps": 20, "names": 50, "contexts": [16], "memory_steps": 5, "seeds": [1337]}


def listed(kind=int, least: float | None = 1, known=None, single: bool = False):
    """An argparse type: comma-separated values of `kind`, each >= least or one of `known`
    (single: one value, not a list)."""

    def parse(text: str):
        try:
            values = [kind(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give {kind.__name__}s, as 1,2") from None
        if known is not None and not set(values) <= set(known):
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(known)}")
        if least is not None and not all(math.isfinite(v) and v >= least for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: each must be at least {least}")
        if single and len(values) > 1:
            raise argparse.ArgumentTypeError(f"{text!r}: give one value")
        return values[0] if single else values

    return parse


one = functools.partial(listed, single=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = entry.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--only", type=listed(str, None, SECTIONS), default=list(SECTIONS))
    # a new file each run: none replaced
    new_file = str(REPO / "bench" / f"results-{datetime.now():%Y%m%d-%H%M%S}.json")
    p.add_argument("--out", default=new_file, help="the JSON file (bench/results-DATE-TIME.json)")
    p.add_argument("--overwrite", action="store_true", help="let --out replace a file")
    p.add_argument("--device", default="auto", choices=list(DEVICES))
    p.add_argument("--threads", type=one(), help="torch threads (default: microgpt's auto)")
    p.add_argument("--repeats", type=one(), default=3, help="runs per figure (3; --quick 1)")
    p.add_argument("--busy", action="store_true", help="another training holds a core meanwhile")
    p.add_argument("--run", help="a run folder or checkpoint: sampling's and heads' model")
    g = p.add_argument_group("throughput, and the targets' cost")
    presets = ["micro", "small", "base"]
    g.add_argument("--presets", type=listed(str, None, presets), default=presets[:2])
    g.add_argument("--batches", type=listed(), default=[32, 128], help="batch sizes (32,128)")
    g.add_argument("--impls", type=listed(str, None, ATTN_IMPLS), default=["sdpa"])
    g.add_argument("--compile", action="store_true", help="torch.compile the steps")
    g.add_argument("--rounds", type=one(), default=5, help="alternations of the two steps (5)")
    g.add_argument("--block-s", type=one(float, 1e-3), default=1.0, help="seconds a block (1.0)")
    g = p.add_argument_group("sampling and memory")
    g.add_argument("--sample-steps", type=one(int, 0), default=300, help="without --run (300)")
    g.add_argument("--names", type=one(), default=1000, help="names sampled a run (1000)")
    g.add_argument("--contexts", type=listed(int, 2), default=[64, 128, 256])
    g.add_argument("--memory-steps", type=one(), default=200, help="training steps (200)")
    g.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    g = p.add_argument_group("targets")
    keys = [r.key for r in ROWS]
    g.add_argument("--rows", type=listed(str, None, keys), default=keys)
    g.add_argument("--seeds", type=listed(int, 0), default=[1337, 1, 2])
    g.add_argument("--jobs", type=one(), default=1, help="seeds trained at once, each a process")
    g.add_argument("--row-override", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(**(QUICK if p.parse_args(argv).quick else {}))  # what is given stays
    return p.parse_args(argv)


def check_args(args) -> None:
    """What must hold before anything runs (a UserError otherwise): the device, --run, --out."""
    args.device_found = pick_device(args.device, UserError)
    args.checkpoint = resolve(args.run)[1] if args.run else None
    if args.out != STDOUT:
        if os.path.islink(args.out):
            raise OutputRefused(f"--out={args.out} is a symbolic link; name the file itself")
        project = project_data()  # never an output, even with --overwrite
        args.out_path = check_new_file(args.out, "--out", args.overwrite, project, "--overwrite")
        if not args.out_path.parent.is_dir():
            raise OutputRefused(f"--out={args.out}: no folder {args.out_path.parent}")


def fmt(v) -> str:
    if v is None or not math.isfinite(v):
        return "-" if v is None else str(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.4g}"


def format_table(results: dict) -> str:
    rows = [["section", "case", "median", "min", "max", "unit", "target", "pass/miss"]]
    for section, body in results["sections"].items():
        for case, f in body["figures"].items():
            verdict = "" if "pass" not in f else ("pass" if f["pass"] else "miss")
            numbers = [fmt(f[k]) for k in ("median", "min", "max")]
            if "error" in f:
                numbers, verdict = ["error", "", ""], f["error"][:60]
            rows.append([section, case, *numbers, f["unit"], f.get("target", ""), verdict])
    widths = [max(map(len, column)) for column in zip(*rows)]
    rows.insert(1, ["-" * w for w in widths])
    align = [str.ljust] * 2 + [str.rjust] * 3 + [str.ljust] * 3  # the numbers to the right
    return "\n".join("  ".join(a(c, w) for a, c, w in zip(align, r, widths)).rstrip() for r in rows)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    set_threads(args.threads or "auto")  # as the Trainers built here will
    if args.memory_child is not None:
        return memory_child(args)
    check_args(args)
    results = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "bench/run.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),
        "machine": machine_info(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(args.device_found),
        "quick": args.quick,
        "busy": args.busy and "another `python train.py heads=4 threads=1` ran all along",
        "sections": {},
    }
    failed = []  # sections that raised (a case that cannot run is told in its figure)
    with tempfile.TemporaryDirectory(prefix="microgpt-bench-") as tmp, contextlib.ExitStack() as on:
        if args.busy:
            on.enter_context(busy(Path(tmp) / "load", args.quick))
        for section in (s for s in SECTIONS if s in args.only):
            print(f"[bench] {section} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            work, broken = SECTIONS[section], {}  # one broken section keeps the others' figures
            body = attempt(broken, "section", "", work, args, args.device_found, Path(tmp))
            body = body or {"figures": broken, "info": {}}
            if all("error" in f for f in body["figures"].values()):  # it, or each of its rows
                failed.append(section)
            body["info"]["section_s"] = time.perf_counter() - t0
            results["sections"][section] = body
    table = format_table(results)
    if "targets" in results["sections"]:
        table += "\n\nThe targets:\n" + format_targets(results)
    print(table, file=sys.stderr if args.out == STDOUT else sys.stdout, flush=True)
    text = json.dumps(results, indent=1) + "\n"
    if args.out == STDOUT:
        print(text, end="")
    else:
        write_text(args.out_path, text, replace=args.overwrite)
        print(f"wrote {args.out_path}", file=sys.stderr)
    if failed:  # requested work that failed: exit 2, the rest's figures written all the same
        raise UserError(f"section {', '.join(failed)} failed (see the table); the rest stand")
    return results


if __name__ == "__main__":
    sys.exit(entry.run(main))
