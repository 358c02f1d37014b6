"""8. Threads under load: the default step (batch 128) in one process alone, then in two processes
at once, for each thread policy; and a parallel sweep against the same sweep run job after job.

Each process is a fresh `python bench/run.py --step-child JSON`: it builds the default Trainer
with the case's `threads` setting and wait policy (OMP_WAIT_POLICY, read when torch loads),
warms up, says it is ready, waits for "go" on stdin, then times steps for a window and prints
its steps/s. A pair is told "go" at the same moment. The ratio pair / solo is what a user who
samples or trains a second model while one trains sees: 1.0 would be no slowdown; 0.5 means the
two share the machine fairly (the total work stays that of one process alone).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, figure, make_trainer, step

RUN = REPO / "bench" / "run.py"
TRAIN = REPO / "train.py"

# name -> (threads setting, the wait's environment, what it is). GNU OpenMP's own default (no
# OMP_WAIT_POLICY) spins 300,000 times before it sleeps; microgpt leaves a GOMP_SPINCOUNT alone.
CASES = {
    "auto": ("auto", {"OMP_WAIT_POLICY": "PASSIVE"}, "threads=auto, idle threads sleep (default)"),
    "spin": ("auto", {"GOMP_SPINCOUNT": "300000"}, "every core, OpenMP's default spin: before"),
    "brief": ("auto", {"GOMP_SPINCOUNT": "10000"}, "every core, a short spin, then sleep"),
    "one": (1, {"OMP_WAIT_POLICY": "PASSIVE"}, "threads=1"),
}


def step_child(spec: dict, args) -> None:
    """In a fresh process: the default Trainer, warm-up, 'ready', wait for 'go', time a window."""
    with tempfile.TemporaryDirectory() as tmp:
        args.threads = spec["threads"]
        tr = make_trainer(["heads=4"], args, Path(tmp))
        for _ in range(spec["warmup"]):
            step(tr)
        print("ready", flush=True)
        sys.stdin.readline()
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < spec["seconds"]:
            step(tr)
            steps += 1
        seconds = time.perf_counter() - t0
    print(json.dumps({"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}))


def child_env(wait: dict) -> dict:
    """This process's environment without thread or wait settings, plus the case's wait."""
    drop = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **wait}


def run_together(n: int, case: str, args) -> list[float]:
    """Start n children, wait until all are ready, say go to all, return each one's steps/s."""
    threads, wait, _ = CASES[case]
    spec = {"threads": threads, "seconds": args.pair_seconds, "warmup": 3 if args.quick else 10}
    cmd = [sys.executable, str(RUN), "--step-child", json.dumps(spec), "--device", "cpu"]
    procs = [
        subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=child_env(wait),
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"step child failed: {p.communicate()[1].strip()[-300:]}")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"step child failed: {stderr.strip()[-300:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1])["steps_per_s"])
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def sweep_seconds(parallel: bool, args, tmp: Path) -> float:
    """Wall time of `python train.py -m seed=1,2` (a short default recipe), job after job or with
    hydra/launcher=joblib."""
    folder = tmp / f"sweep-{'joblib' if parallel else 'basic'}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        str(TRAIN),
        "-m",
        "seed=1,2",
        f"train.max_steps={args.sweep_steps}",
        "train.eval_every=100000",
        "train.num_samples=0",
        "train.progress=false",
        "device=cpu",
        "log.attn_every=100000",
        f"hydra.sweep.dir={folder}",
    ]
    if parallel:
        cmd.append("hydra/launcher=joblib")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sweep failed: {done.stderr.strip()[-300:]}")
    return time.perf_counter() - t0


def run_pair(args, device, tmp: Path) -> dict:
    figures, info = {}, {"cases": {k: CASES[k][2] for k in args.pair_cases}}
    repeats = 1 if args.quick else args.repeats
    for case in args.pair_cases:
        solo, pair, ratio = [], [], []
        for _ in range(repeats):
            alone = run_together(1, case, args)[0]
            both = run_together(2, case, args)
            solo.append(alone)
            pair.extend(both)
            ratio.append(statistics.mean(both) / alone)
        figures[f"{case}: steps/s alone"] = figure(solo, "steps/s")
        figures[f"{case}: steps/s each, two at once"] = figure(pair, "steps/s")
        figures[f"{case}: two at once / alone, each"] = figure(ratio, "x")
    if args.sweep_steps:
        seq = [sweep_seconds(False, args, tmp) for _ in range(repeats)]
        par = [sweep_seconds(True, args, tmp) for _ in range(repeats)]
        figures["sweep of 2 jobs, one after the other"] = figure(seq, "s")
        figures["sweep of 2 jobs, hydra/launcher=joblib"] = figure(par, "s")
        figures["sweep: joblib / one after the other"] = figure(
            [p / s for p, s in zip(par, seq)], "x", None if args.quick else ("<=", 1.0)
        )
        info["sweep"] = (
            f"python train.py -m seed=1,2 train.max_steps={args.sweep_steps} (wall time, start-up "
            f"included), with the basic launcher and with hydra/launcher=joblib"
        )
    info["window_s"] = args.pair_seconds
    return {"figures": figures, "info": info}
