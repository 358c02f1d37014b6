"""Benchmarks: training throughput, time to quality, sampling, memory, MFU and the microgpt.py setting.

    python bench/run.py                      # everything: 20-30 minutes on 2 CPU cores
    python bench/run.py --quick              # tiny sizes, under a minute: a smoke test, not a measurement
    python bench/run.py --only throughput,mfu --threads 2 --out bench/results.json --write-docs

Every figure is {median, min, max, unit, n[, target, pass]} over `--repeats` runs; one table is
printed and the JSON (machine, torch, threads, every figure, notes) goes to `--out`. docs/benchmarks.md
says what each section measures and how; `--write-docs` puts this run's table into it.

The training step timed here is the one microgpt.trainer.Trainer.run takes: a batch from the
CharDataset (trimmed to its longest item unless compiled), forward, backward, clip_grad_norm_,
the AdamW of make_optimizer, zero_grad. The Trainer itself builds the data, model and optimizer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import operator
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/run.py` puts bench/, not the repository, on the path
    sys.path.insert(0, str(REPO))

import torch
from torch import nn

from microgpt.config import load_config
from microgpt.data import read_items
from microgpt.kv_cache import KVCache
from microgpt.model import GPT
from microgpt.tokenizer import BOUNDARY_ID
from microgpt.files import pick_device
from microgpt.trainer import Trainer, TrainingError, evaluate, lr_at, train

SECTIONS = ("throughput", "time_to_quality", "sampling", "memory", "mfu", "microgpt")
IMPLS = ("loop", "batched", "sdpa")
NAMES = REPO / "data" / "names.txt"
DOCS = REPO / "docs" / "benchmarks.md"
DOCS_START, DOCS_END = "<!-- bench:start -->", "<!-- bench:end -->"
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
BASE_LINE = 255  # base's block is 256: one boundary token + at most 255 characters

# ----------------------------------------------------------------------------- figures


def figure(values, unit: str, target: tuple[str, float] | None = None, **extra) -> dict:
    """{median, min, max, unit, n}; with a target ("<", 0.8), also `target` and `pass` (of the median).
    A None among the values (a threshold never reached, say) makes the median None and the target a miss."""
    values = list(values)
    known = [v for v in values if v is not None]
    if len(known) == len(values) and values:
        med, lo, hi = statistics.median(values), min(values), max(values)
    else:
        med, lo, hi = None, (min(known) if known else None), (max(known) if known else None)
    fig = {"median": med, "min": lo, "max": hi, "unit": unit, "n": len(values)}
    if target is not None:
        op, value = target
        fig["target"] = f"{op} {value:g}"
        fig["pass"] = med is not None and OPS[op](med, value)
    fig.update(extra)
    return fig


def error_figure(e: BaseException, unit: str) -> dict:
    first = (str(e).strip().splitlines() or [""])[0]
    return {
        "median": None,
        "min": None,
        "max": None,
        "unit": unit,
        "n": 0,
        "error": f"{type(e).__name__}: {first}"[:300],
    }


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
        f"{', --quick (not a measurement)' if results['quick'] else ''}; commit {results['commit']}."
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


# ----------------------------------------------------------------------------- machine


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- the training step


_runs = 0


def compose(overrides) -> object:
    """conf/config.yaml composed with overrides, as `python train.py ...` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from microgpt.cli import register

    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))


def make_trainer(overrides, args, tmp: Path) -> Trainer:
    """A Trainer (data, model, optimizer; nothing written yet) for the default config plus overrides."""
    global _runs
    _runs += 1
    cfg = compose(
        [
            f"device={args.device}",
            f"out_dir={tmp / f'run{_runs}'}",
            "train.progress=false",
            *overrides,
        ]
    )
    return Trainer(load_config(cfg))


def train_step(tr: Trainer) -> tuple[int, int]:
    """One step exactly as Trainer.run takes it (single process). Returns (target chars, padded tokens)."""
    c = tr.config
    lr = lr_at(tr.step, c)
    for group in tr.optimizer.param_groups:
        group["lr"] = lr
    idx = tr.sampler.next_batch()
    x, y = tr.datasets["train"].batch(idx)
    with tr.autocast():
        _, loss = tr.train_model(x, y)
    loss.backward()
    max_norm = c.optim.grad_clip if c.optim.grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), max_norm)
    if not math.isfinite(float(grad_norm)) or not math.isfinite(
        float(loss.detach())
    ):  # as on the CPU
        raise TrainingError(f"non-finite loss or gradient at step {tr.step + 1}")
    tr.optimizer.step()
    tr.optimizer.zero_grad(set_to_none=True)
    tr.step += 1
    chars = int((tr.datasets["train"].lengths[idx] + 1).sum())
    return chars, x.numel()


def matmul_params(model: nn.Module) -> int:
    """Weights that multiply activations: every nn.Linear (lm_head included), not the embeddings."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def flops_per_token(n_matmul: int, n_layer: int, n_embd: int, T: float) -> float:
    """Training FLOPs per token, forward + backward (PaLM appendix B, nanoGPT's estimate_mfu):
    6 * N (N = matmul weights: a multiply-add per weight, x3 for forward + two backward matmuls)
    + 12 * n_layer * T * n_embd (QK^T and AV over T keys, forward + backward, causality not halved)."""
    return 6 * n_matmul + 12 * n_layer * T * n_embd


def base_data(tmp: Path) -> Path:
    """data/names.txt packed into lines of up to 255 characters (names joined by spaces), so that the
    base preset's batches are 256 wide like text of its block size."""
    lines, line = [], ""
    for name in read_items(NAMES):
        if line and len(line) + 1 + len(name) > BASE_LINE:
            lines.append(line)
            line = ""
        line = f"{line} {name}" if line else name
    lines.append(line)
    path = tmp / "names_packed.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------- 1. throughput


def measure_training(tr: Trainer, repeats: int, window_s: float, warmup: int) -> dict:
    """Warm-up steps (compilation included), then `repeats` windows of at least window_s seconds."""
    device = tr.device
    first = None
    for i in range(warmup):
        t0 = time.perf_counter()
        train_step(tr)
        sync(device)
        if i == 0:
            first = time.perf_counter() - t0
    windows = []
    for _ in range(repeats):
        steps = chars = padded = 0
        t0 = time.perf_counter()
        while True:
            ch, pad = train_step(tr)
            steps, chars, padded = steps + 1, chars + ch, padded + pad
            if time.perf_counter() - t0 >= window_s:
                break
        sync(device)
        windows.append((steps, chars, padded, time.perf_counter() - t0))
    return {"first_step_s": first, "windows": windows}


def throughput_cases(args):
    """(preset, batch, impl, compiled) in the order they run."""
    for preset in args.presets:
        for batch in args.batches:
            for compiled in [False] if args.no_compile else [False, True]:
                for impl in args.impls:
                    if preset == "base" and batch > 32 and impl != "sdpa" and not args.base_full:
                        continue  # (B, H, 256, 256) score tensors: minutes per step; --base-full runs them
                    yield preset, batch, impl, compiled


def run_throughput(args, device, tmp: Path, cases=None) -> dict:
    figures, info = {}, {"cases": {}}
    packed = None
    for preset, batch, impl, compiled in cases or throughput_cases(args):
        name = f"{preset} b{batch} {impl} {'compiled' if compiled else 'eager'}"
        overrides = [
            f"model={preset}",
            f"train.batch_size={batch}",
            f"model.attn_impl={impl}",
            f"train.compile={str(compiled).lower()}",
        ]
        if preset == "base":
            packed = packed or base_data(tmp)
            overrides.append(f"data.path={packed}")
            info["base_data"] = (
                f"data/names.txt packed into lines of up to {BASE_LINE} characters "
                f"(names joined by spaces): real text-like rows of T=256, not random tokens"
            )
        slow = preset == "base"
        warmup = 1 if slow else (2 if args.quick else 5)
        try:
            if compiled:
                torch._dynamo.reset()
            tr = make_trainer(overrides, args, tmp)
            m = measure_training(tr, args.repeats, args.window_s * (0.25 if slow else 1.0), warmup)
        except Exception as e:  # noqa: BLE001 -- a compiler missing or failing must not end the whole benchmark
            for unit in ("tokens/s", "chars/s", "steps/s"):
                figures[f"{name} {unit}"] = error_figure(e, unit)
            continue
        block = tr.model_config.block_size
        w = m["windows"]
        target = {32: (">=", 40000), 256: (">=", 55000)}.get(batch)
        is_default = preset == "small" and impl == "sdpa" and not compiled and not args.quick
        figures[f"{name} tokens/s"] = figure(
            [s * batch * block / t for s, _, _, t in w], "tokens/s", target if is_default else None
        )
        figures[f"{name} chars/s"] = figure([c / t for _, c, _, t in w], "chars/s")
        figures[f"{name} steps/s"] = figure([s / t for s, _, _, t in w], "steps/s")
        if compiled:
            figures[f"{name} first step"] = figure([m["first_step_s"]], "s")
        steps = sum(s for s, *_ in w)
        info["cases"][name] = {
            "block_size": block,
            "batch": batch,
            "timed_steps": steps,
            "mean_width": sum(p for *_, p, _ in w)
            / (steps * batch),  # padded T the model processed
            "chars_per_row": sum(c for _, c, _, _ in w) / (steps * batch),
            "matmul_params": matmul_params(tr.model),
            "n_layer": tr.model_config.n_layer,
            "n_embd": tr.model_config.n_embd,
            "params": tr.model.num_params(),
            "first_step_s": m["first_step_s"],
        }
        del tr
    info["counting"] = (
        "tokens/s = batch * block_size per step (makemore's count: every row padded to "
        "the block); chars/s = real targets per step (characters + end token); eager "
        "batches are trimmed to their longest item, compiled ones are not"
    )
    return {"figures": figures, "info": info}


# ----------------------------------------------------------------------------- 2. time to quality

THRESHOLDS = ((2.10, None), (2.00, 90.0), (1.95, 600.0))


def ttq_recipes(args) -> list[tuple[str, list[str]]]:
    """The recipes timed: the default (python train.py) and the 10-minute one (experiment=long)."""
    overrides = list(args.ttq_override)
    if args.ttq_steps:
        overrides.append(f"train.max_steps={args.ttq_steps}")
    if args.quick or args.ttq_override or args.ttq_steps:
        return [("default", overrides)]
    return [("default", overrides), ("experiment=long", ["experiment=long"])]


def ttq_curve(overrides, args, device, tmp: Path) -> dict:
    """Train one recipe, evaluating the test loss every ttq_eval_every steps (not timed)."""
    tr = make_trainer(overrides, args, tmp)
    c = tr.config
    test = tr.datasets["test"]
    every = args.ttq_eval_every
    train_s, eval_s, curve = 0.0, 0.0, []
    while tr.step < c.train.max_steps and train_s < args.ttq_budget:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(min(every, c.train.max_steps - tr.step)):
            train_step(tr)
            if train_s + time.perf_counter() - t0 >= args.ttq_budget:
                break
        sync(device)
        train_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        loss = evaluate(tr.model, test, c.train.eval_batch_size, tr.autocast)
        eval_s += time.perf_counter() - t1
        curve.append(
            {"step": tr.step, "train_s": train_s, "wall_s": train_s + eval_s, "test_loss": loss}
        )
    return {
        "recipe": f"conf/config.yaml ({c.model.name} preset) with overrides {overrides}",
        "max_steps": c.train.max_steps,
        "steps_run": tr.step,
        "eval_every": every,
        "budget_s": args.ttq_budget,
        "train_s": train_s,
        "eval_s": eval_s,
        "curve": curve,
    }


def run_time_to_quality(args, device, tmp: Path) -> dict:
    figures, info = {}, {}
    runs = {name: ttq_curve(overrides, args, device, tmp) for name, overrides in ttq_recipes(args)}
    for name, run in runs.items():
        curve = run["curve"]
        # the default recipe answers the 90-second target, experiment=long the 10-minute one
        targeted = {2.00} if name == "default" else {1.95}
        for th, limit in THRESHOLDS:
            hit = next((p for p in curve if p["test_loss"] <= th), None)
            figures[f"{name}: time to test loss {th:.2f}"] = figure(
                [hit["train_s"] if hit else None],
                "s",
                ("<=", limit) if limit and th in targeted and not args.quick else None,
                step=hit["step"] if hit else None,
                wall_s=hit["wall_s"] if hit else None,
            )
        best = min((p["test_loss"] for p in curve if p["train_s"] <= args.ttq_budget), default=None)
        figures[f"{name}: best test loss in {args.ttq_budget:g} s"] = figure(
            [best], "nats", None if args.quick or name == "default" else ("<=", 1.95)
        )
        figures[f"{name}: steps/s"] = figure(
            [run["steps_run"] / run["train_s"] if run["train_s"] else None], "steps/s"
        )
        info[name] = run
    info["timing"] = (
        "time = training steps only (test evaluations excluded; wall_s includes them); "
        "a threshold's time is that of the first evaluation at or below it"
    )
    return {"figures": figures, "info": info}


# ----------------------------------------------------------------------------- 3. sampling


def sampling_model(args, tmp: Path):
    """The small preset: from --ckpt, or trained here for --sample-train-steps steps."""
    if args.ckpt:
        from microgpt.checkpoint import load_checkpoint, model_from_checkpoint

        model, tok = model_from_checkpoint(
            load_checkpoint(args.ckpt), device=pick_device(args.device), path=args.ckpt
        )
        return model, tok, f"checkpoint {args.ckpt}"
    tr = make_trainer(["model=small"], args, tmp)
    for _ in range(args.sample_train_steps):
        train_step(tr)
    loss = evaluate(tr.model, tr.datasets["val"], 1000, tr.autocast)
    return (
        tr.model.eval(),
        tr.tokenizer,
        f"small preset trained here for {args.sample_train_steps} steps (val loss {loss:.3f})",
    )


@torch.inference_mode()
def decode(model: GPT, context: int, use_cache: bool, generator: torch.Generator) -> None:
    """Fill a context of `context` positions one sampled token at a time (no stopping at the boundary):
    the boundary token, then context - 1 tokens; with the cache, one token per forward."""
    device = model.wte.weight.device
    idx = torch.full((1, context), BOUNDARY_ID, dtype=torch.long, device=device)
    cache = KVCache.for_model(model, 1) if use_cache else None
    for end in range(1, context):
        if cache is not None:
            logits, _ = model(idx[:, end - 1 : end], kv_cache=cache)  # (1, 1, V)
        else:
            logits, _ = model(idx[:, :end])  # (1, end, V): the whole context again
        probs = logits[:, -1, :].softmax(dim=-1)  # (1, V)
        idx[:, end] = torch.multinomial(probs, 1, generator=generator)[:, 0]


def run_sampling(args, device, tmp: Path) -> dict:
    from microgpt.sampling import sample_items

    model, tok, source = sampling_model(args, tmp)
    n = args.names
    full = n == 1000 and not args.quick
    figures, info = {}, {"model": source, "names": n}
    lengths = []
    for one_at_a_time in (False, True):
        for use_cache in (True, False):
            times = []
            for r in range(args.repeats):
                sync(device)
                t0 = time.perf_counter()
                items = sample_items(
                    model,
                    tok,
                    n,
                    seed=r,
                    batch_size=1 if one_at_a_time else None,
                    use_cache=use_cache,
                )
                sync(device)
                times.append(time.perf_counter() - t0)
                lengths += [len(s) for s in items]
            limit = 12.0 if one_at_a_time else 0.8
            how = "one at a time" if one_at_a_time else "as one batch"
            figures[f"{n} names {how}, {'cache' if use_cache else 'no cache'}"] = figure(
                times, "s", ("<", limit) if full and use_cache else None
            )
    info["mean_name_length"] = sum(lengths) / len(lengths)

    cfg = load_config(compose(["model=base", "device=cpu", "out_dir=."]))
    base = GPT(cfg.gpt_config(tok.vocab_size, cfg.model.block_size or 256)).to(device).eval()
    info["base"] = (
        f"base preset, random weights ({base.num_params():,} parameters), batch 1: a context "
        f"of N positions is the boundary token then N-1 sampled tokens, one forward each; "
        f"tokens/s = (N-1) / time"
    )
    for context in args.contexts:
        per = {True: [], False: []}
        for r in range(args.repeats):
            for use_cache in (True, False):
                g = torch.Generator(device=device).manual_seed(r)
                sync(device)
                t0 = time.perf_counter()
                decode(base, context, use_cache, g)
                sync(device)
                per[use_cache].append(time.perf_counter() - t0)
        for use_cache in (True, False):
            figures[f"base {context} tokens, {'cache' if use_cache else 'no cache'}"] = figure(
                [(context - 1) / t for t in per[use_cache]], "tokens/s"
            )
        speedup = [nc / c for c, nc in zip(per[True], per[False])]
        figures[f"base {context} tokens, cache speedup"] = figure(
            speedup, "x", (">=", 5.0) if context == 256 and not args.quick else None
        )
    return {"figures": figures, "info": info}


# ----------------------------------------------------------------------------- 4. memory


def peak_rss_kib() -> int:
    """This process's peak resident memory in KiB. VmHWM belongs to the process's own memory map,
    which exec replaces; ru_maxrss would carry over the peak of the (big) benchmark process that
    forked this one, since Linux keeps it across execve."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS


def memory_child(args) -> None:
    """In a fresh process: build the small-preset Trainer, take N steps, print the peak RSS as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trainer(["model=small"], args, Path(tmp))
        for _ in range(args.memory_child):
            train_step(tr)
    out = {"maxrss_kib": peak_rss_kib()}
    if tr.device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out))


def child_rss(args, steps: int) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-child",
        str(steps),
        "--device",
        args.device,
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_memory(args, device, tmp: Path) -> dict:
    figures, info = {}, {}
    steps = args.memory_steps
    repeats = 1 if args.quick else min(args.repeats, 3)  # each run is a fresh interpreter: seconds
    for n in (0, steps):
        runs = [child_rss(args, n) for _ in range(repeats)]
        label = "setup only (0 steps)" if n == 0 else f"{n} steps"
        figures[f"small train, {label}, peak RSS"] = figure(
            [r["maxrss_kib"] / 1024 for r in runs], "MiB"
        )
        if "cuda_max_allocated" in runs[0]:
            figures[f"small train, {label}, CUDA peak"] = figure(
                [r["cuda_max_allocated"] / 2**20 for r in runs], "MiB"
            )
    info["rss"] = (
        "ru_maxrss of a fresh `python bench/run.py --memory-child N` process: imports, the "
        "small-preset Trainer (data, model, AdamW), then N training steps at batch 32"
    )
    cfg = load_config(compose(["model=base", "device=cpu", "out_dir=."]))
    m = cfg.gpt_config(27, cfg.model.block_size or 256)
    for label, kv in (("MHA", m.n_head), ("GQA", 2), ("MQA", 1)):
        for batch in (1, 64):
            cache = KVCache(
                batch, m.n_layer, kv, m.block_size, m.head_dim, device="meta"
            )  # no memory
            figures[f"base KV cache {label} (n_kv_head={kv}) b{batch}"] = figure(
                [cache.nbytes / 2**20], "MiB", bytes=cache.nbytes
            )
    info["kv_cache"] = (
        f"KVCache.nbytes for the base preset (n_layer={m.n_layer}, block "
        f"{m.block_size}, head_dim {m.head_dim}, fp32)"
    )
    return {"figures": figures, "info": info}


# ----------------------------------------------------------------------------- 5. MFU


def matmul_gflops(n: int, repeats: int, device: torch.device) -> list[float]:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.mm(a, b)
    out = []
    for _ in range(max(repeats, 5)):
        sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        out.append(2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return out


def run_mfu(args, device, tmp: Path, throughput: dict | None) -> dict:
    figures = {}
    peaks = {}
    for n in args.matmul_sizes:
        values = matmul_gflops(n, args.repeats, device)
        figures[f"fp32 matmul {n}x{n}"] = figure(values, "GFLOP/s")
        peaks[n] = statistics.median(values)
    peak = max(peaks.values())
    info = {
        "peak_gflops": peak,
        "peak_from": f"the best median over sizes {list(peaks)}",
        "formula": "flops/token = 6 * N_matmul + 12 * n_layer * T * n_embd, with N_matmul = "
        "nn.Linear weights (lm_head included, embeddings not) and T = the mean batch "
        "width the model processed; MFU = flops/token * chars/s / peak (real tokens only)",
        "reference": "makemore: about 31% at batch 256 on this machine",
    }
    if throughput is None:  # --only mfu: measure the default impl of the small preset here
        cases = [("small", b, "sdpa", False) for b in args.batches]
        throughput = run_throughput(args, device, tmp, cases=cases)
    info["flops_per_token"] = {}
    for name, case in throughput["info"]["cases"].items():
        if " sdpa " not in f" {name} ":
            continue
        chars = throughput["figures"].get(f"{name} chars/s", {})
        if chars.get("median") is None:
            continue
        fpt = flops_per_token(
            case["matmul_params"], case["n_layer"], case["n_embd"], case["mean_width"]
        )
        info["flops_per_token"][name] = fpt
        figures[f"{name} MFU"] = {
            **figure([100 * fpt * chars[k] / 1e9 / peak for k in ("median", "min", "max")], "%"),
            "n": chars["n"],
            "gflops": fpt * chars["median"] / 1e9,
        }
    return {"figures": figures, "info": info}


# ----------------------------------------------------------------------------- 6. microgpt


def run_microgpt(args, device, tmp: Path) -> dict:
    global _runs
    times, val, test = [], [], []
    for _ in range(args.repeats):
        _runs += 1
        cfg = compose(
            [
                "experiment=microgpt",
                f"device={args.device}",
                f"out_dir={tmp / f'run{_runs}'}",
                "train.progress=false",
                "train.num_samples=0",
            ]
        )
        t0 = time.perf_counter()
        metrics = train(cfg)
        times.append(time.perf_counter() - t0)
        val.append(metrics.get("val_loss"))
        test.append(metrics.get("test_loss"))
    figures = {
        "experiment=microgpt wall time": figure(times, "s", None if args.quick else ("<", 5.0)),
        "final val loss": figure(val, "nats"),
        "test loss": figure(test, "nats"),
    }
    info = {
        "what": "microgpt.trainer.train(compose(['experiment=microgpt'])): 1,000 steps of the micro "
        "preset at batch 1, with set-up, evaluation, checkpoints and TensorBoard logging "
        "(train.num_samples=0)",
        "reference": "Karpathy's microgpt.py: 379 s for the same 1,000 steps on this machine",
    }
    return {"figures": figures, "info": info}


# ----------------------------------------------------------------------------- the command line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes and durations (< 60 s): a smoke test"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
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
    g.add_argument("--impls", default=",".join(IMPLS))
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
    p.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
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
    for name, values, known in (
        ("--only", a.only, SECTIONS),
        ("--impls", a.impls, IMPLS),
        ("--presets", a.presets, ("micro", "small", "base")),
    ):
        unknown = [v for v in values if v not in known]
        if unknown:
            p.error(f"{name}: unknown {unknown}; choose from {list(known)}")
    return a


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
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
    runners = {
        "throughput": run_throughput,
        "time_to_quality": run_time_to_quality,
        "sampling": run_sampling,
        "memory": run_memory,
        "microgpt": run_microgpt,
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
                    body = runners[section](args, device, Path(tmp))
            except Exception as e:  # noqa: BLE001 -- one broken section must not lose the others' figures
                body = {"figures": {"section": error_figure(e, "")}, "info": {}}
            body["info"]["section_s"] = time.perf_counter() - t0
            results["sections"][section] = body
    print(format_table(results))
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
