"""Memory: the peak resident memory of a fresh training process, and the KV cache's size."""

import json
import tempfile
from pathlib import Path

import torch

from bench.common import child, compose, figure, make_trainer, rss_mib, time_steps
from microgpt.config import load_config
from microgpt.kv_cache import KVCache


def memory_child(args) -> None:
    """In a fresh process: the small preset's Trainer, N steps, the peak memory as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trainer(["model=small"], args, Path(tmp))
        time_steps(tr, args.memory_child)
    out = {"rss_mib": rss_mib()}
    if tr.device.type == "cuda":
        out["cuda_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out))


def run_memory(args, device, tmp: Path) -> dict:
    figures = {}
    for n in (0, args.memory_steps):
        argv = ["bench/run.py", "--memory-child", str(n), "--device", args.device]
        argv += ["--threads", str(args.threads)] if args.threads else []
        runs = [child(argv) for _ in range(args.repeats)]
        label = f"small train, {n} steps"
        figures[f"{label}, peak RSS"] = figure([r["rss_mib"] for r in runs], "MiB")
        if "cuda_bytes" in runs[0]:
            figures[f"{label}, CUDA peak"] = figure([r["cuda_bytes"] / 2**20 for r in runs], "MiB")
    m = load_config(compose(["model=base", "device=cpu", "out_dir=."])).model_for_data(27, 256)
    for batch in (1, 64):  # on the meta device: the size without the memory
        cache = KVCache(batch, m.n_layer, m.n_head, m.block_size, m.head_dim, device="meta")
        figures[f"base KV cache b{batch}"] = figure([cache.nbytes / 2**20], "MiB")
    info = {
        "rss": "peak resident memory of a fresh `python bench/run.py --memory-child N`: imports, "
        "the small preset's Trainer (data, model, optimizer), N training steps",
        "kv_cache": f"KVCache.nbytes, base preset (n_layer {m.n_layer}, block {m.block_size}, "
        f"{m.n_head} heads of {m.head_dim}, fp32)",
    }
    return {"figures": figures, "info": info}
