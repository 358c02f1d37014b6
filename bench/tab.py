"""How fast the microgpt tab answers: its routes (werkzeug's test client, in this process) on a
real sweep, heads=1,2,4,8 of the small preset (micro with --quick), trained a few steps with step
checkpoints, each best.pt analysed (the time of a request does not depend on training length).

    first_load   a new plugin (cold cache): /runs, then /attention and /timeline for every run
    switch_head  /attention with a head off, for every run
    pin          /attention pinned on another position, for every run
    slider_cold  /attention on another step checkpoint, not loaded yet, for every run
    slider       /attention back on a step checkpoint loaded before, for every run
    mean_first   the first mean ablation of every run (the means over the validation split)

and, in a fresh process (tab_memory), the tab's memory under load: MEMORY_REQUESTS requests at
once to /attention on the MEMORY_STEPS step checkpoints of a large run (a 10.7M-parameter text
model, nanoGPT's shakespeare-char size; --quick: a small one), each on a LINE-character input:
its peak resident memory, its resident memory once idle, and an answer's bytes.
"""

import contextlib
import gc
import io
import json
import shutil
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from bench.common import REPO, child, compose, figure, rss_mib, run_overrides, timed
from microgpt.commands.heads import main as analyse_run
from microgpt.commands.tab import MicrogptPlugin
from microgpt.runs import RunFolder
from microgpt.train.trainer import train

HEADS = (1, 2, 4, 8)
TARGETS = {"first_load": 1000.0, "switch_head": 150.0, "slider": 150.0, "pin": 150.0}  # ms
MEMORY_TARGETS = {"peak": 1500.0, "idle": 1000.0}  # MB, issue 52
MEMORY_REQUESTS, MEMORY_STEPS, LINE = 64, 32, 256
LARGE = ["model.n_layer=6", "model.n_embd=384", "model.n_head=6", "model.block_size=256"]


def make_sweep(args, root: Path) -> None:
    """root/heads=N for each of HEADS: 4 steps, a checkpoint every 2, best.pt analysed."""
    steps = ["train.max_steps=4", "train.eval_every=2", "train.save_every=2", "train.num_samples=0"]
    for heads in HEADS:
        out, model = root / f"heads={heads}", "model=micro" if args.quick else "model=small"
        train(compose([model, f"heads={heads}", *steps, *run_overrides(args, root, out)]))
        with contextlib.redirect_stdout(io.StringIO()):  # its table: not the bench's
            analyse_run([str(out), "--threads", str(args.threads or "auto")])


def plugin_routes(root: Path) -> tuple[dict[str, Client], MicrogptPlugin]:
    """Clients of each route of a new plugin (its own, empty model cache) on --logdir root."""
    plugin = MicrogptPlugin(base_plugin.TBContext(logdir=str(root), flags=Namespace()))
    return {path: Client(app) for path, app in plugin.get_plugin_apps().items()}, plugin


def ask(apps, route: str, **query) -> dict:
    response = apps[route].get(route, query_string=query)
    body = json.loads(response.get_data(as_text=True))
    if response.status_code != 200:
        raise RuntimeError(f"{route} {query}: {body}")
    return body


def run_tab(args, device, tmp: Path) -> dict:
    root = tmp / "tab-sweep"
    make_sweep(args, root)
    apps, _ = plugin_routes(root)
    listing = ask(apps, "/runs")
    runs, name = [r["name"] for r in listing["runs"]], listing["example"]
    snapshots = [checkpoint for checkpoint, _ in listing["runs"][0]["snapshots"]]  # steps 2, 4

    def first_load():
        fresh, _ = plugin_routes(root)
        ask(fresh, "/runs")
        for run in runs:
            ask(fresh, "/attention", run=run, input=name)
            ask(fresh, "/timeline", run=run)

    def every_run(**query):
        return lambda: [ask(apps, "/attention", run=run, input=name, **query) for run in runs]

    def ms(work) -> float:
        return 1000 * timed(work, device)

    # the first: a warm-up of the code, not measured
    times = {"first_load": [ms(first_load) for _ in range(args.repeats + 1)][1:]}
    every_run()()  # warm: each run's best.pt loaded
    times["switch_head"] = [ms(every_run(off="0.0" * (n % 2))) for n in range(args.repeats * 3)]
    times["pin"] = [ms(every_run(pin=str(n % (len(name) + 1)))) for n in range(args.repeats * 3)]
    times["slider_cold"], times["slider"] = [], []
    for n in range(args.repeats):
        apps, _ = plugin_routes(root)  # the step checkpoints not loaded yet
        every_run()()
        times["slider_cold"].append(ms(every_run(checkpoint=snapshots[n % 2])))
        every_run()()  # back to best.pt, then to the step loaded above
        times["slider"].append(ms(every_run(checkpoint=snapshots[n % 2])))
    times["mean_first"] = [ms(every_run(off="0.0", ablation="mean"))]
    quick = args.quick
    figures = {
        case: figure(ms, "ms", None if quick or case not in TARGETS else ("<=", TARGETS[case]))
        for case, ms in times.items()
    }
    memory, memory_info = tab_memory(args, tmp)
    figures |= memory
    info = {
        "sweep": f"heads={','.join(map(str, HEADS))}, {'micro' if quick else 'small'} preset",
        "input": name,
        "requests": "4 runs an interaction, one after the other, in this process",
        "memory": memory_info,
    }
    return {"figures": figures, "info": info}


def make_large_run(args, root: Path) -> None:
    """root/large: a text run of the LARGE model (one step: its weights' values do not matter
    here), its best.pt copied to MEMORY_STEPS step checkpoints (each a model of its own)."""
    root.mkdir(parents=True, exist_ok=True)
    text, out = root / "names.txt", root / "large"
    text.write_text((REPO / "data" / "names.txt").read_text())  # a text of a-z and newlines
    overrides = ["data.format=text", f"data.path='{text}'", "train.max_steps=1"]
    overrides += ["train.num_samples=0", "train.progress=false", "device=cpu", f"out_dir='{out}'"]
    train(compose([*overrides, *([] if args.quick else LARGE), f"threads={args.threads or 1}"]))
    run = RunFolder(out)
    for step in range(1, MEMORY_STEPS + 1):
        shutil.copyfile(run.best, run.snapshot(step))


def tab_memory(args, tmp: Path) -> tuple[dict, str]:
    """The memory figures of memory_child, in a fresh process on make_large_run's run."""
    root = tmp / "tab-memory"
    make_large_run(args, root)
    line = LINE if not args.quick else 64  # the quick model's block is 128
    found = child(["-c", f"import bench.tab as t; t.memory_child({str(root)!r}, {line})"])
    targets = {k: None if args.quick else ("<=", v) for k, v in MEMORY_TARGETS.items()}
    figures = {f"memory_{k}": figure([found[k]], "MB", target) for k, target in targets.items()}
    figures["attention_answer"] = figure([found["answer"]], "MB")
    what = f"{found['params']:,}-parameter model, {MEMORY_REQUESTS} requests at once"
    return figures, f"{what} on {MEMORY_STEPS} step checkpoints, a {line}-character input"


def memory_child(root: str, length: int = LINE) -> None:
    """MEMORY_REQUESTS requests at once to /attention on root/large's step checkpoints; prints
    {"peak", "idle" (MB resident), "answer" (MB of one answer), "params"} as JSON."""
    apps, plugin = plugin_routes(Path(root))
    line = ("abcdefghijklmnopqrstuvwxyz" * 20)[:length]

    def request(n: int) -> int:
        query = {"run": "large", "checkpoint": f"step-{n % MEMORY_STEPS + 1:06d}.pt", "input": line}
        response = apps["/attention"].get("/attention", query_string=query)
        assert response.status_code == 200, response.get_data(as_text=True)
        return len(response.get_data())

    with ThreadPoolExecutor(MEMORY_REQUESTS) as pool:
        sizes = list(pool.map(request, range(MEMORY_REQUESTS)))
    peak = rss_mib()
    gc.collect()
    time.sleep(1.0)  # idle
    idle = rss_mib("VmRSS")
    model = next(m for m in plugin.store.models.models.values() if not isinstance(m, str)).model
    found = {"peak": peak, "idle": idle, "answer": max(sizes) / 2**20, "params": model.num_params()}
    print(json.dumps(found))
