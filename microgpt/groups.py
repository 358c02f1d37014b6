"""Runs that differ only by their seed form a group: a sweep `heads=1,2,4,8 seed=1,2,3` is four
groups of three runs. compare, the TensorBoard bands and the microgpt tab group runs here, by
their validated config.yaml (what the run trained with, whatever the command line said).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from microgpt.config import flatten

T = TypeVar("T")
# settings that never make two runs different experiments: the seed (what a group varies), where
# the run lies and how it ran (the machine's cores, a resume, the progress bar)
NOT_THE_EXPERIMENT = tuple("seed out_dir resume threads device train.progress".split())
SEED_PART = re.compile(r"(^|,)seed=[^,]*")  # "heads=4,seed=2" -> "heads=4"


def experiment_key(config: dict) -> str:
    """What a run's config says of its experiment, the seed and how it ran left out: runs with the
    same key differ only by seed."""
    kept = {k: v for k, v in flatten(config).items() if k not in NOT_THE_EXPERIMENT}
    return json.dumps(kept, sort_keys=True, default=str)


def group_name(run_name: str) -> str:
    """A sweep job's name without its seed ("heads=4,seed=2" -> "heads=4"; "seed=2" -> "all")."""
    return SEED_PART.sub("", run_name).strip(",") or "all"


@dataclass
class Group(Generic[T]):
    """Runs of one experiment, by seed (a seed given twice: each run kept, in name order)."""

    name: str
    runs: list[T] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)  # runs[i] trained with seeds[i]

    @property
    def n(self) -> int:
        return len(self.runs)


def group_runs(
    runs: Sequence[T], config_of: Callable[[T], dict], name_of: Callable[[T], str]
) -> list[Group[T]]:
    """`runs` grouped by experiment_key of config_of(run), in the order their groups first appear;
    each named after its first run's name without the seed part (" #2", " #3" where two groups
    would share a name), its runs in seed order."""
    by_key: dict[str, Group[T]] = {}
    for run in runs:
        config = config_of(run)
        group = by_key.setdefault(experiment_key(config), Group(group_name(name_of(run))))
        group.runs.append(run)
        group.seeds.append(config.get("seed", 0))  # an int: runs.TYPED
    names: dict[str, int] = {}
    for group in by_key.values():
        names[group.name] = names.get(group.name, 0) + 1
        if names[group.name] > 1:
            group.name = f"{group.name} #{names[group.name]}"
        pairs = sorted(zip(group.seeds, group.runs), key=lambda pair: pair[0])  # stable
        group.seeds, group.runs = [seed for seed, _ in pairs], [run for _, run in pairs]
    return list(by_key.values())
