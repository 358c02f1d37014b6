"""Benchmarks: training throughput, time to quality, sampling, memory, MFU, the microgpt.py
setting, the targets of issue 20 (loss at a budget, cost as a ratio) and threads under load.

    python bench/run.py          # everything: about 2 hours on 2 CPU cores (targets: most of it)
    python bench/run.py --quick  # tiny sizes, under a minute: a smoke test, not a measurement
    python bench/run.py --only throughput,mfu --threads 2 --out bench/results.json --write-docs

Every figure is {median, min, max, unit, n[, target, pass]} over `--repeats` runs; one table is
printed and the JSON (machine, torch, threads, every figure, notes) goes to `--out`.
docs/benchmarks.md says what each section measures and how; `--write-docs` puts this run's table
into it.

One module a section (bench/throughput.py, quality.py, sampling.py, memory.py, mfu.py,
microgpt_setting.py, targets.py with cost.py, pair.py), their shared helpers in bench/common.py;
this file holds the command line and the output. The training step timed is
microgpt.train.trainer.Trainer.train_step, the one Trainer.run takes; decoding is
microgpt.sample.generate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # `python bench/run.py` puts bench/, not the repository, on the path
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
    sys.path.insert(0, str(REPO))

import microgpt  # noqa: E402, F401, I001 -- sets OMP_WAIT_POLICY before torch loads OpenMP

import torch  # noqa: E402

from bench.common import error_figure, git_commit, machine_info  # noqa: E402
from bench.memory import memory_child, run_memory  # noqa: E402
from bench.mfu import run_mfu  # noqa: E402
from bench.microgpt_setting import run_microgpt  # noqa: E402
from bench.pair import CASES, run_pair, step_child  # noqa: E402
from bench.quality import run_time_to_quality  # noqa: E402
from bench.sampling import run_sampling  # noqa: E402
from bench.targets import ROWS, format_targets, run_targets  # noqa: E402
from bench.throughput import run_throughput  # noqa: E402
from microgpt.system import DEVICES, pick_device  # noqa: E402
from microgpt.model import ATTN_IMPLS  # noqa: E402
from microgpt.system import set_threads  # noqa: E402

SECTIONS = (
    "throughput",
    "time_to_quality",
    "sampling",
    "memory",
    "mfu",
    "microgpt",
    "targets",
    "threads",
)
PRESETS = ("micro", "small", "base")
DOCS = REPO / "docs" / "benchmarks.md"
DOCS_START, DOCS_END = "<!-- bench:start -->", "<!-- bench:end -->"
RUNNERS = {
    "throughput": run_throughput,
    "time_to_quality": run_time_to_quality,
    "sampling": run_sampling,
    "memory": run_memory,
    "microgpt": run_microgpt,
    "targets": run_targets,
    "threads": run_pair,
}

# ----------------------------------------------------------------------------- output


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.4g}"


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for section, body in results["sections"].items():
        for case, f in body["figures"].items():
            if "error" in f:
                rows.append(
                    [
                        section,
                        case,
                        "error",
                        "",
                        "",
                        f["unit"],
                        f.get("target", ""),
                        f["error"][:60],
                    ]
                )
                continue
            verdict = "" if "pass" not in f else ("pass" if f["pass"] else "miss")
            rows.append(
                [
                    section,
                    case,
                    fmt(f["median"]),
                    fmt(f["min"]),
                    fmt(f["max"]),
                    f["unit"],
                    f.get("target", ""),
                    verdict,
                ]
            )
    return rows


HEADER = ["section", "case", "median", "min", "max", "unit", "target", "pass/miss"]
NUMERIC = {2, 3, 4}  # right-aligned columns


def format_table(results: dict) -> str:
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = []
    for k, r in enumerate(rows):
        cells = [
            c.rjust(w) if i in NUMERIC else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(results: dict) -> str:
    m = results["machine"]
    head = (
        f"Run {results['date']} on {m['cpu']} ({m['cores']} cores), {m['platform']}; torch "
        f"{results['torch']}, {results['threads']} threads, device {results['device']}"
        f"{', --quick (not a measurement)' if results['quick'] else ''}; "
        f"commit {results['commit']}."
    )
    out = [
        head,
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---:" if i in NUMERIC else "---" for i in range(len(HEADER))) + "|",
    ]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table_rows(results)]
    return "\n".join(out)


def write_docs(results: dict, path: Path = DOCS) -> None:
    text = path.read_text()
    if DOCS_START not in text or DOCS_END not in text:
        raise SystemExit(
            f"{path} has no {DOCS_START} ... {DOCS_END} markers to write the results between"
        )
    before, rest = text.split(DOCS_START, 1)
    _, after = rest.split(DOCS_END, 1)
    path.write_text(f"{before}{DOCS_START}\n{format_markdown(results)}\n{DOCS_END}{after}")


# ----------------------------------------------------------------------------- the command line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes and durations (< 60 s): a smoke test"
    )
    p.add_argument("--device", default="auto", choices=list(DEVICES))
    p.add_argument(
        "--out", default=str(REPO / "bench" / "results.json"), help="the JSON results file"
    )
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads; default: torch's"
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="runs per figure (default 3; 2 with --quick)"
    )
    p.add_argument(
        "--write-docs", action="store_true", help="put the table into docs/benchmarks.md"
    )
    g = p.add_argument_group("throughput")
    g.add_argument(
        "--presets", default=None, help="default micro,small,base (micro,small with --quick)"
    )
    g.add_argument("--batches", default="32,256")
    g.add_argument("--impls", default=",".join(ATTN_IMPLS))
    g.add_argument("--no-compile", action="store_true", help="eager only (always so with --quick)")
    g.add_argument(
        "--base-full",
        action="store_true",
        help="also time base at batch > 32 with the loop and batched attention (slow on CPU)",
    )
    g.add_argument(
        "--window-s",
        type=float,
        default=None,
        help="seconds per timed window (default 2; 0.2 with --quick; base: a quarter)",
    )
    g = p.add_argument_group("time to quality")
    g.add_argument("--ttq-budget", type=float, default=600.0, help="seconds of training")
    g.add_argument(
        "--ttq-steps", type=int, default=None, help="train.max_steps (default: the config's)"
    )
    g.add_argument(
        "--ttq-eval-every", type=int, default=None, help="steps between test evaluations"
    )
    g.add_argument(
        "--ttq-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override for the recipe (repeatable), e.g. optim.lr=2e-3",
    )
    g = p.add_argument_group("sampling")
    g.add_argument(
        "--ckpt", default=None, help="a small-preset checkpoint; default: train one briefly"
    )
    g.add_argument(
        "--sample-train-steps", type=int, default=None, help="default 300 (30 with --quick)"
    )
    g.add_argument(
        "--names", type=int, default=None, help="names per run (default 1000; 100 with --quick)"
    )
    g.add_argument("--contexts", default=None, help="base decode lengths (default 64,128,256)")
    g = p.add_argument_group("memory and MFU")
    g.add_argument("--memory-steps", type=int, default=None, help="default 200 (20 with --quick)")
    g.add_argument("--matmul-sizes", default=None, help="default 1024,2048 (256,512 with --quick)")
    g = p.add_argument_group("targets (issue 20)")
    g.add_argument(
        "--rows", default=",".join(r.key for r in ROWS), help="which rows of the targets table"
    )
    g.add_argument("--seeds", default=None, help="default 1337,1,2 (1337 with --quick)")
    g.add_argument(
        "--jobs", type=int, default=1, help="seeds trained at once, each in its own process (1)"
    )
    g.add_argument(
        "--row-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override added to every row (repeatable), e.g. optim.weight_decay=0.3",
    )
    g.add_argument(
        "--cost-rounds", type=int, default=None, help="alternations per cost (7; 2 with --quick)"
    )
    g.add_argument(
        "--cost-block-s", type=float, default=None, help="seconds per timed block (1; 0.05 quick)"
    )
    g = p.add_argument_group("threads under load")
    g.add_argument("--pair-cases", default=None, help=f"of {list(CASES)} (all; auto with --quick)")
    g.add_argument("--pair-seconds", type=float, default=None, help="timed window (5; 0.3 quick)")
    g.add_argument(
        "--sweep-steps", type=int, default=None, help="steps per sweep job (500; 0 = no sweep)"
    )
    p.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--step-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    q = a.quick
    a.repeats = a.repeats or (2 if q else 3)
    a.presets = (a.presets or ("micro,small" if q else "micro,small,base")).split(",")
    a.batches = [int(b) for b in a.batches.split(",")]
    a.impls = a.impls.split(",")
    a.no_compile = a.no_compile or q
    a.window_s = a.window_s or (0.2 if q else 2.0)
    if q and a.ttq_steps is None:
        a.ttq_steps = 200
    a.ttq_eval_every = a.ttq_eval_every or (50 if q else 100)
    a.sample_train_steps = (
        a.sample_train_steps if a.sample_train_steps is not None else (30 if q else 300)
    )
    a.names = a.names or (100 if q else 1000)
    a.contexts = [int(c) for c in (a.contexts or ("16,32" if q else "64,128,256")).split(",")]
    a.memory_steps = a.memory_steps or (20 if q else 200)
    a.matmul_sizes = [
        int(n) for n in (a.matmul_sizes or ("256,512" if q else "1024,2048")).split(",")
    ]
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    a.rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    a.seeds = [int(s) for s in (a.seeds or ("1337" if q else "1337,1,2")).split(",")]
    a.cost_rounds = a.cost_rounds or (2 if q else 7)
    a.cost_block_s = a.cost_block_s or (0.05 if q else 1.0)
    a.pair_cases = (a.pair_cases or ("auto" if q else ",".join(CASES))).split(",")
    a.pair_seconds = a.pair_seconds or (0.3 if q else 5.0)
    a.sweep_steps = a.sweep_steps if a.sweep_steps is not None else (0 if q else 500)
    for name, values, known in (
        ("--only", a.only, SECTIONS),
        ("--impls", a.impls, ATTN_IMPLS),
        ("--presets", a.presets, PRESETS),
        ("--rows", a.rows, [r.key for r in ROWS]),
        ("--pair-cases", a.pair_cases, list(CASES)),
    ):
        unknown = [v for v in values if v not in known]
        if unknown:
            p.error(f"{name}: unknown {unknown}; choose from {list(known)}")
    if a.jobs < 1:
        p.error(f"--jobs={a.jobs} must be at least 1")
    return a


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.step_child is not None:
        step_child(json.loads(args.step_child), args)
        return None
    set_threads(args.threads or "auto")  # as the Trainers built here will (bench/common.py)
    if args.memory_child is not None:
        memory_child(args)
        return None
    device = pick_device(args.device)
    results = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "machine": machine_info(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "quick": args.quick,
        "repeats": args.repeats,
        "command": " ".join(
            ["python", "bench/run.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "sections": {},
    }
    with tempfile.TemporaryDirectory(prefix="microgpt-bench-") as tmp:
        for section in SECTIONS:
            if section not in args.only:
                continue
            print(f"[bench] {section} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                if section == "mfu":
                    body = run_mfu(args, device, Path(tmp), results["sections"].get("throughput"))
                else:
                    body = RUNNERS[section](args, device, Path(tmp))
            except Exception as e:  # noqa: BLE001 -- one broken section must not lose the others' figures
                body = {"figures": {"section": error_figure(e, "")}, "info": {}}
            body["info"]["section_s"] = time.perf_counter() - t0
            results["sections"][section] = body
    print(format_table(results))
    if "targets" in results["sections"]:
        print("\nThe targets of issue 20 (docs/benchmarks.md):\n" + format_targets(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {out}", file=sys.stderr)
    if args.write_docs:
        write_docs(results)
        print(f"wrote the table into {DOCS}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
