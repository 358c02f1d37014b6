"""How many CPU threads torch uses, chosen so that work degrades gracefully on a shared machine.

PyTorch's default is one intra-op thread per core, and OpenMP threads that wait for work spin.
Two processes that each take every core then wait on each other's spinning threads: measured on
2 cores with the default model's step (batch 128), 35 steps/s alone with 2 threads, but 0.8 steps/s
each when two such processes run at once (issue 20). So every command has a `threads` setting:

- `threads=auto` (the default) takes the cores this process may use (`os.sched_getaffinity`,
  which taskset, cpusets, containers and SLURM restrict), divided by the jobs that run at once.
  Those jobs are known where they are launched: the process that starts a parallel sweep
  (`hydra/launcher=joblib`, see `microgpt.cli.ShareCores`) writes each job's share into the
  jobs' OMP_NUM_THREADS. An OMP_NUM_THREADS that is set, by the user or a launcher (torchrun sets
  1 per rank), is taken as it is.
- `threads=N` asks for N, whatever the environment says.

The other half is the wait policy: `microgpt/__init__.py` sets OMP_WAIT_POLICY=PASSIVE (idle
threads sleep rather than spin) unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set already. OpenMP
reads them once, when torch loads it, so they must be in the environment before `import torch`:
importing any microgpt module first does that, and launched jobs inherit it. `export
OMP_WAIT_POLICY=ACTIVE` (spin) or `GOMP_SPINCOUNT=N` (spin N times, then sleep) choose otherwise;
`bench/run.py --only threads` measures them alone and two at once (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

THREADS_ENV = "OMP_NUM_THREADS"


class ThreadsError(ValueError):
    """A bad `threads` setting; the message names it and what would be valid."""


def check_threads(value, name: str = "threads") -> None:
    """`auto` or a whole number >= 1; anything else raises ThreadsError naming the setting."""
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ThreadsError(
            f"{name}={value!r} must be auto (the cores this process may use, shared among the "
            f"jobs running at once) or a whole number of threads >= 1"
        )


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1


def env_threads(environ: Mapping[str, str]) -> int | None:
    """OMP_NUM_THREADS as a number of threads (its first entry: OpenMP allows "4,2" for nested
    levels), or None when it is unset or not a positive number."""
    first = environ.get(THREADS_ENV, "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def choose_threads(setting, cores: int, environ: Mapping[str, str]) -> int:
    """The intra-op threads for a `threads` setting: N itself; for auto, OMP_NUM_THREADS when it
    is set (a launcher's share or the user's choice), else every usable core."""
    check_threads(setting)
    if setting != "auto":
        return setting
    return env_threads(environ) or max(1, cores)


def jobs_at_once(n_jobs: int, jobs: int, cores: int) -> int:
    """How many of a sweep's `jobs` a joblib launcher runs at once with `n_jobs` workers: joblib
    reads n_jobs < 0 as cores + 1 + n_jobs (-1 = every core), and never runs more than there
    are jobs."""
    workers = n_jobs if n_jobs > 0 else cores + 1 + n_jobs
    return max(1, min(workers, jobs))


def share(cores: int, jobs: int) -> int:
    """Each of `jobs` processes' share of `cores`: at least one thread."""
    return max(1, cores // max(1, jobs))


def set_threads(setting) -> int:
    """Apply a `threads` setting to this process (torch.set_num_threads); returns the count."""
    n = choose_threads(setting, usable_cores(), os.environ)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n
