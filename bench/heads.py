"""How long the head analysis takes: microgpt.heads.analyse.analyse on a validation split.

    python bench/heads.py [RUN_FOLDER_OR_CHECKPOINT] [--repeat 5] [--json bench/heads.json]
    python bench/heads.py --write-docs      # also replace the committed docs/heads_bench.json

With a run (or checkpoint), its model and the validation split stored in its checkpoint; without,
the small preset (4 layers, 4 heads, n_embd 64) with fresh weights on data/names.txt's validation
split at seed 1337 (the default run's): the same shapes and the same work, so the same time.
Prints the median, min and max seconds of --repeat analyses after one warm-up, against the
target (< 5 s on a 2-core CPU), and writes them as JSON to --json; the committed figures in
docs/heads_bench.json are replaced only with --write-docs (as bench/run.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from microgpt.data.dataset import load_data  # noqa: E402
from microgpt.data.lines import CharDataset  # noqa: E402
from microgpt.heads.analyse import analyse  # noqa: E402
from microgpt.model import GPT, GPTConfig  # noqa: E402
from microgpt.runs import resolve  # noqa: E402
from microgpt.train.checkpoint import Checkpoint  # noqa: E402

TARGET_S = 5.0
DOCS_JSON = REPO / "docs" / "heads_bench.json"


def setting(run: str | None):
    """(model, x, y, tokenizer, what): a run's model and validation rows, or the small
    preset's."""
    if run:
        _, path = resolve(run)
        ckpt = Checkpoint.load(path)
        model, tokenizer = ckpt.build_model("cpu")
        val = CharDataset.from_items(ckpt.split["val"], tokenizer, model.config.block_size)
        return model, val.X, val.Y, tokenizer, str(path)
    data = load_data(REPO / "data" / "names.txt", seed=1337)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=data.block_size)
    val = data.datasets["val"]
    what = "small preset, fresh weights, data/names.txt"
    return GPT(config).eval(), val.X, val.Y, data.tokenizer, what


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a run folder or checkpoint (default: none)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=str(REPO / "bench" / "heads.json"))
    parser.add_argument(
        "--write-docs", action="store_true", help=f"also write {DOCS_JSON.relative_to(REPO)}"
    )
    args = parser.parse_args(argv)

    model, x, y, tokenizer, what = setting(args.run)
    c = model.config
    analyse(model, x, y, tokenizer)  # warm-up
    times, report = [], None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = analyse(model, x, y, tokenizer)
        times.append(time.perf_counter() - t0)
    heads = c.n_layer * c.n_head
    result = {
        "what": what,
        "model": f"{c.n_layer} layers, {c.n_head} heads, n_embd {c.n_embd}, attn {c.attn_impl}",
        "items": report.items,
        "characters": report.tokens,
        # attention, a baseline per ablated_losses call (2), zero, mean, per-position mean,
        # pruning, each of those only from its head's layer on; one forward and backward
        # (gradient); on the probe's repeated spans two passes and one per head
        "forward_passes": 1 + 2 + 4 * heads,
        "backward_passes": 1,
        "probe_passes": 2 + heads,
        "seconds": {
            "median": statistics.median(times),
            "min": min(times),
            "max": max(times),
            "n": len(times),
        },
        "target_s": TARGET_S,
        "pass": statistics.median(times) < TARGET_S,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }
    s = result["seconds"]
    rows = [
        ("setting", what),
        ("model", result["model"]),
        ("rows", f"{report.items:,} items, {report.tokens:,} characters"),
        ("forward passes", str(result["forward_passes"])),
        ("seconds", f"median {s['median']:.2f} (min {s['min']:.2f}, max {s['max']:.2f})"),
        ("repeats", f"{s['n']} after one warm-up"),
        ("target", f"< {TARGET_S:g} s: {'pass' if result['pass'] else 'MISS'}"),
        ("machine", f"{result['machine']['cores']} cores, {torch.get_num_threads()} threads"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    for path in [Path(args.json), *([DOCS_JSON] if args.write_docs else [])]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
