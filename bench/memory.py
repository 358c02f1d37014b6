"""4. Memory: the peak RSS of a fresh training process, and the KV cache's size per head layout."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import REPO, figure, make_trainer, preset_model_config, step
from microgpt.kv_cache import KVCache

RUN = REPO / "bench" / "run.py"


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
    """In a fresh process: build the small-preset Trainer, take N steps, print the peak RSS as
    JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trainer(["model=small"], args, Path(tmp))
        for _ in range(args.memory_child):
            step(tr)
    out = {"maxrss_kib": peak_rss_kib()}
    if tr.device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out))


def child_rss(args, steps: int) -> dict:
    cmd = [sys.executable, str(RUN), "--memory-child", str(steps), "--device", args.device]
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
    m = preset_model_config("base", 27)
    for label, kv in (("MHA", m.n_head), ("GQA", 2), ("MQA", 1)):
        for batch in (1, 64):
            # on the meta device: the size without the memory
            cache = KVCache(batch, m.n_layer, kv, m.block_size, m.head_dim, device="meta")
            figures[f"base KV cache {label} (n_kv_head={kv}) b{batch}"] = figure(
                [cache.nbytes / 2**20], "MiB", bytes=cache.nbytes
            )
    info["kv_cache"] = (
        f"KVCache.nbytes for the base preset (n_layer={m.n_layer}, block "
        f"{m.block_size}, head_dim {m.head_dim}, fp32)"
    )
    return {"figures": figures, "info": info}
