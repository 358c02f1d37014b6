"""A sweep's seeds as bands in TensorBoard: for each group of runs that differ only by seed
(microgpt.groups), `Loss/val` and `Loss/train` as the mean over its seeds with a band from their
min to their max (W&B's default band), at each step all of its runs logged.

Each group of two runs or more is one TensorBoard run, `<sweep>/groups/<group>/` ("heads=4"),
whose custom-scalars layout has a margin chart per loss: every group draws one line in its band,
so a sweep of heads=1,2,4,8 x seed=1,2,3 reads as four curves with bands (Custom Scalars tab).

Their tags are their own, `seeds/Loss/val/mean`, `.../min`, `.../max`: the Scalars tab shows them
apart from the jobs (a `seeds` section, one line per group in each chart). The mean is not also
logged as `Loss/val`: the chart of the jobs would hold each group's mean among its own seeds, a
line like theirs that reads as one more seed, and whatever reads `Loss/val` of every run (a run
filter, the HParams tab, a script over TensorBoard's data) would count it as one.

`<sweep>/groups/` is this module's: groups.json in it says so and names what it holds; a new
write replaces it whole (built beside it, then renamed), and nothing else: a `groups` it did not
make, a link, or a file it did not write there is refused. No run's file is ever written."""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from microgpt import files
from microgpt.errors import UserError
from microgpt.groups import Group, group_runs
from microgpt.runs import RunFolder, find_runs
from microgpt.viz.tensorboard import TRAIN_LOSS, VAL_LOSS

GROUPS_DIR = "groups"  # <sweep>/groups/<group>/: one TensorBoard run per group
OWNER_FILE = "groups.json"  # in GROUPS_DIR: made by write_bands, and its groups' runs and seeds
MADE_BY = "microgpt.viz.bands"
LOSSES = (VAL_LOSS, TRAIN_LOSS)
EVENTS = "events.out.tfevents."  # how the names of SummaryWriter's files begin
CATEGORY = "Loss over seeds: mean, band min to max"


class BandsError(UserError):
    """Runs whose bands cannot be written, or a `groups` folder that is not ours to replace."""


def band_tags(loss: str) -> tuple[str, str, str]:
    """A loss's mean, lower and upper edge ("Loss/val" -> "seeds/Loss/val/mean", ...)."""
    return f"seeds/{loss}/mean", f"seeds/{loss}/min", f"seeds/{loss}/max"


def band(
    series: list[dict[int, tuple[float, float]]],
) -> list[tuple[int, float, float, float, float]]:
    """Runs' {step: (time, value)} -> (step, time, mean, min, max) at each step every run has; the
    time is the runs' mean (relative time: the mean time taken)."""
    steps = sorted(set.intersection(*(set(s) for s in series)))
    out = []
    for step in steps:
        times, values = zip(*(s[step] for s in series))
        mean = math.fsum(values) / len(values)
        out.append((step, math.fsum(times) / len(times), mean, min(values), max(values)))
    return out


def _config(run: RunFolder) -> dict:
    try:
        return run.config()
    except UserError as e:  # a RunFolderError: the file and why
        raise BandsError(str(e)) from None


def _losses(run: RunFolder) -> dict[str, dict[int, tuple[float, float]]]:
    """{loss: {step: (time, value)}} from a run's metrics.jsonl (a step twice: the last)."""
    try:
        lines = run.metrics()
    except (OSError, ValueError) as e:
        raise BandsError(f"cannot read {run.metrics_file}: {e}") from None
    out: dict[str, dict[int, tuple[float, float]]] = {loss: {} for loss in LOSSES}
    for line in lines:  # records: an int step and numbers (run.metrics leaves out the rest)
        for loss, points in out.items():
            if loss in line:
                points[line["step"]] = float(line.get("time", 0.0)), float(line[loss])
    return out


def folder_name(group: Group) -> str:
    """A group's folder in GROUPS_DIR: its name, a '/' (runs in nested folders) as '_'."""
    name = group.name.replace("/", "_")
    return name if name.strip(".") else "all"


def _check_ours(out: Path) -> None:
    """Refuse (BandsError) to replace `out` unless write_bands made it and it holds only that."""
    if not os.path.lexists(out):
        return
    fix = "move it away to have the bands written there"
    if out.is_symlink() or not out.is_dir():
        raise BandsError(f"{out} is {'a link' if out.is_symlink() else 'a file'}; {fix}")
    try:
        made = files.read_json(out / OWNER_FILE)
        ours = made["made_by"] == MADE_BY and set(made["groups"])
    except (OSError, ValueError, KeyError, TypeError):
        ours = None
    if not ours:
        raise BandsError(f"{out} was not made by microgpt's seed bands (no {OWNER_FILE}); {fix}")
    foreign = [p.name for p in out.iterdir() if p.name != OWNER_FILE and not _made(p, ours)]
    if foreign:
        raise BandsError(
            f"{out} holds what the seed bands did not write ({', '.join(foreign)}); {fix}"
        )


def _made(folder: Path, names) -> bool:
    """Whether `folder` is a group's as write_bands left it: named in OWNER_FILE, a folder (not a
    link) of event files only."""
    if folder.name not in names or folder.is_symlink() or not folder.is_dir():
        return False
    return all(
        f.name.startswith(EVENTS) and f.is_file() and not f.is_symlink() for f in folder.iterdir()
    )


def _write_group(folder: Path, group: Group[RunFolder]) -> bool:
    """The group's bands as one TensorBoard run in `folder`; False if its runs share no step."""
    runs = [_losses(run) for run in group.runs]
    bands = {loss: band([points[loss] for points in runs]) for loss in LOSSES}
    if not any(bands.values()):
        return False
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for loss, points in bands.items():
            for step, walltime, *values in points:
                for tag, value in zip(band_tags(loss), values):
                    writer.add_scalar(tag, value, step, walltime=walltime)
        # a margin chart per loss: each run with the three tags draws its mean as a line, its
        # band between min and max
        charts = {f"{loss}: mean over seeds, band min to max": ["Margin", list(band_tags(loss))]
                  for loss in LOSSES}  # fmt: skip
        writer.add_custom_scalars({CATEGORY: charts})
    finally:
        writer.close()
    return True


def write_bands(sweep: str | os.PathLike) -> list[Group[RunFolder]]:
    """For each group of two runs or more under `sweep` (find_runs, group_runs by config.yaml),
    its bands in <sweep>/groups/<group>/, replacing what an earlier call wrote there; returns the
    groups written (none: nothing is written, and the bands an earlier call wrote are removed)."""
    root = Path(sweep).expanduser()
    found = find_runs(root)
    groups = group_runs(found, _config, lambda run: run.name_under(root))
    groups = [g for g in groups if g.n >= 2]
    out = root / GROUPS_DIR
    _check_ours(out)
    if not groups:  # bands follow their seeds: those of an earlier call go with them
        shutil.rmtree(out, ignore_errors=True)
        return []
    # built beside `out` (hidden: find_runs skips it), then given its name in one step
    new, old = (root / f".{GROUPS_DIR}.{secrets.token_hex(4)}.{end}" for end in ("tmp", "old"))
    new.mkdir()
    try:
        written = [g for g in groups if _write_group(new / folder_name(g), g)]
        if not written:
            return []
        made = {
            folder_name(g): {"runs": [r.name_under(root) for r in g.runs], "seeds": g.seeds}
            for g in written
        }
        owner = {"made_by": MADE_BY, "groups": made}
        files.write_text(new / OWNER_FILE, json.dumps(owner, indent=1))
        if os.path.lexists(out):
            os.rename(out, old)  # checked ours above; kept until the new one has its name
        try:
            os.rename(new, out)
        except OSError:
            if os.path.lexists(old):
                os.rename(old, out)
            raise
    finally:
        shutil.rmtree(new, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return written
