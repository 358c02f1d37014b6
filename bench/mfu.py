"""5. MFU: the model FLOPs of the sdpa throughput cases against the best fp32 matmul measured
here."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from bench.common import figure, sync
from bench.throughput import run_throughput


def flops_per_token(n_matmul: int, n_layer: int, n_embd: int, T: float) -> float:
    """Training FLOPs per token, forward + backward (PaLM appendix B, nanoGPT's estimate_mfu):
    6 * N (N = matmul weights: a multiply-add per weight, x3 for forward + two backward matmuls)
    + 12 * n_layer * T * n_embd (QK^T and AV over T keys, forward + backward, causality not
    halved)."""
    return 6 * n_matmul + 12 * n_layer * T * n_embd


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
