"""1. Training throughput: Trainer.train_step timed per preset, batch size, attention and
compiler."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.common import NAMES, error_figure, figure, make_trainer, matmul_params, step, sync
from microgpt.data.lines import read_items
from microgpt.train.trainer import Trainer

BASE_LINE = 255  # base's block is 256: one boundary token + at most 255 characters


def base_data(tmp: Path) -> Path:
    """data/names.txt packed into lines of up to 255 characters (names joined by spaces), so that
    the base preset's batches are 256 wide like text of its block size."""
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


def measure_training(tr: Trainer, repeats: int, window_s: float, warmup: int) -> dict:
    """Warm-up steps (compilation included), then `repeats` windows of at least window_s seconds."""
    device = tr.device
    first = None
    for i in range(warmup):
        t0 = time.perf_counter()
        step(tr)
        sync(device)
        if i == 0:
            first = time.perf_counter() - t0
    windows = []
    for _ in range(repeats):
        steps = chars = padded = 0
        t0 = time.perf_counter()
        while True:
            out = step(tr)  # out.tokens: target chars of the batch; out.padded: B x T
            steps, chars, padded = steps + 1, chars + out.tokens, padded + out.padded
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
                        # (B, H, 256, 256) score tensors: minutes per step; --base-full runs them
                        continue
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
