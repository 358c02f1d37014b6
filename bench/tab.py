"""How fast the microgpt tab answers: its routes (werkzeug's test client, in this process) on a
real sweep, heads=1,2,4,8 of the small preset (micro with --quick), trained a few steps with step
checkpoints, each best.pt analysed (the time of a request does not depend on training length).

    first_load   a new plugin (cold cache): /runs, then /attention and /timeline for every run
    switch_head  /attention with a head off, for every run
    pin          /attention pinned on another position, for every run
    slider       /attention on another step checkpoint, for every run, once /timeline's
                 prefetching has loaded them (a reader's pause after the first load)
    slider_cold  the same on checkpoints not loaded yet (no /timeline, no prefetching)
    mean_first   the first mean ablation of every run (the means over the validation split)
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from argparse import Namespace
from pathlib import Path

from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from bench.common import compose, figure, timed
from microgpt.commands.heads import main as analyse_run
from microgpt.commands.tab import MicrogptPlugin
from microgpt.train.trainer import train

HEADS = (1, 2, 4, 8)
TARGETS = {"first_load": 1000.0, "switch_head": 150.0, "slider": 150.0, "pin": 150.0}  # ms


def make_sweep(args, root: Path) -> None:
    """root/heads=N for each of HEADS: 4 steps, a checkpoint every 2, best.pt analysed."""
    for heads in HEADS:
        out = root / f"heads={heads}"
        overrides = ["model=micro" if args.quick else "model=small", f"heads={heads}"]
        overrides += ["train.max_steps=4", "train.eval_every=2", "train.save_every=2"]
        overrides += ["train.num_samples=0", "train.progress=false", f"device={args.device}"]
        train(compose([*overrides, f"threads={args.threads or 'auto'}", f"out_dir='{out}'"]))
        with contextlib.redirect_stdout(io.StringIO()):  # its table: not the bench's
            analyse_run([str(out), "--threads", str(args.threads or "auto")])


def plugin_routes(root: Path) -> tuple[dict[str, Client], MicrogptPlugin]:
    """Clients of each route of a new plugin (its own, empty model cache) on --logdir root."""
    plugin = MicrogptPlugin(base_plugin.TBContext(logdir=str(root), flags=Namespace()))
    return {path: Client(app) for path, app in plugin.get_plugin_apps().items()}, plugin


def settled(plugin: MicrogptPlugin) -> None:
    """Wait until the plugin's prefetching ends."""
    while plugin.store.models.worker is not None:
        time.sleep(0.01)


def ask(apps, route: str, **query) -> dict:
    response = apps[route].get(route, query_string=query)
    body = json.loads(response.get_data(as_text=True))
    if response.status_code != 200:
        raise RuntimeError(f"{route} {query}: {body}")
    return body


def run_tab(args, device, tmp: Path) -> dict:
    root = tmp / "tab-sweep"
    make_sweep(args, root)
    apps, plugin = plugin_routes(root)
    listing = ask(apps, "/runs")
    runs, name = [r["name"] for r in listing["runs"]], listing["example"]
    snapshots = [checkpoint for checkpoint, _ in listing["runs"][0]["snapshots"]]  # steps 2, 4

    def first_load():
        fresh, plugin = plugin_routes(root)
        ask(fresh, "/runs")
        for run in runs:
            ask(fresh, "/attention", run=run, input=name)
            ask(fresh, "/timeline", run=run)
        return plugin

    def every_run(**query):
        return lambda: [ask(apps, "/attention", run=run, input=name, **query) for run in runs]

    def ms(work) -> float:
        return 1000 * timed(work, device)

    times = {"first_load": []}
    for _ in range(args.repeats + 1):  # the first: a warm-up of the code, not measured
        t0 = time.perf_counter()
        plugin = first_load()
        times["first_load"].append((time.perf_counter() - t0) * 1000)
        settled(plugin)  # its prefetching, not measured, out of the next one's way
    times["first_load"] = times["first_load"][1:]
    every_run()()  # warm: each run's best.pt loaded
    times["switch_head"] = [ms(every_run(off="0.0" * (n % 2))) for n in range(args.repeats * 3)]
    times["pin"] = [ms(every_run(pin=str(n % (len(name) + 1)))) for n in range(args.repeats * 3)]
    for case in ("slider", "slider_cold"):
        times[case] = []
        for n in range(args.repeats):
            apps, plugin = plugin_routes(root)  # the step checkpoints not loaded yet
            every_run()()
            if case == "slider":  # the page asks for each run's timeline beside the slider
                [ask(apps, "/timeline", run=run) for run in runs]
                settled(plugin)
            times[case].append(ms(every_run(checkpoint=snapshots[n % 2])))
    times["mean_first"] = [ms(every_run(off="0.0", ablation="mean"))]
    quick = args.quick
    figures = {
        case: figure(ms, "ms", None if quick or case not in TARGETS else ("<=", TARGETS[case]))
        for case, ms in times.items()
    }
    info = {
        "sweep": f"heads={','.join(map(str, HEADS))}, {'micro' if quick else 'small'} preset",
        "input": name,
        "requests": "4 runs an interaction, one after the other, in this process",
    }
    return {"figures": figures, "info": info}
