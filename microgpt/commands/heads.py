"""`python -m microgpt.heads RUN`: what each head of a trained run does, and whether it matters.

    python -m microgpt.heads outputs/<date>/<time>                     # its best.pt, else last.pt
    python -m microgpt.heads outputs/<date>/<time>/checkpoints/step-000500.pt
    python -m microgpt.heads outputs/<date>/<time> --all-checkpoints   # each, one line each
    python -m microgpt.heads multirun/<date>/<time>                    # each job of a sweep

Prints a row per head on the checkpoint's validation split and writes the analysis beside it,
named after the checkpoint (heads-best.json and .md, heads-step-000500.json, ...: runs.RunFolder).
--all-checkpoints and a sweep folder give a line per checkpoint, and skip one whose analysis was
written after it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from microgpt import entry, runs
from microgpt.checkpoint import Checkpoint
from microgpt.data.dataset import Data, data_of_checkpoint
from microgpt.errors import UserError, first_line
from microgpt.files import check_new_file, write_text
from microgpt.heads.analyse import analyse
from microgpt.heads.report import HeadReport
from microgpt.system import DEVICES, check_threads, pick_device, set_threads


def analysis_rows(data: Data) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) (N, T): the first validation rows of `data` (a run's, data_of_checkpoint) holding
    the format's number of targets, the rows its head analysis reads."""
    val = data.datasets["val"]  # names, or windows of a text run
    x, y = val.batch(torch.arange(len(val)))  # (N, T) each
    keep = int(((y >= 0).sum(dim=1).cumsum(0) <= data.analysis_targets).sum().clamp(min=1))
    return x[:keep], y[:keep]


def analyse_checkpoint(
    path: str | Path, device: str = "cpu"
) -> tuple[HeadReport, runs.RunFolder, Path]:
    """(the report on the checkpoint's validation split, the run, the checkpoint); `path` is a run
    folder, its checkpoints/ folder or a checkpoint (runs.resolve)."""
    run, ckpt_path = runs.resolve(path)
    ckpt = Checkpoint.load(ckpt_path)
    model, tokenizer = ckpt.build_model(device)
    data = data_of_checkpoint(ckpt, device)
    x, y = analysis_rows(data)
    report = analyse(model, x, y, tokenizer, data.training_counts(), boundary=data.boundary)
    report.extra = {"checkpoint": str(ckpt_path), "step": ckpt.step}
    return report, run, ckpt_path


def main(argv: list[str] | None = None) -> int:
    """The command behind the front door: its exit status (0; 2 after one error line)."""
    return entry.run(lambda: _main(argv), "files already written are whole")


def _main(argv: list[str] | None) -> None:
    parser = entry.ArgumentParser(
        prog="python -m microgpt.heads",
        description="What each head of a trained run does, and whether it matters.",
    )
    add = parser.add_argument
    add("run", help="a run folder (outputs/<date>/<time>), a checkpoint file, or a sweep's folder")
    add("--device", default="cpu", choices=DEVICES, help="where to run the model (default: cpu)")
    add("--threads", default="auto", help="threads: auto (usable cores, or OMP_NUM_THREADS) or N")
    add("--all-checkpoints", action="store_true", help="every checkpoint of the run, a line each")
    args = parser.parse_args(argv)
    threads = int(args.threads) if args.threads.isdigit() else args.threads
    check_threads(threads, "--threads")
    set_threads(threads)
    device = str(pick_device(args.device, UserError))
    jobs = _sweep_jobs(Path(args.run).expanduser())
    if jobs:  # a sweep's folder: each job's best.pt (else last.pt), a line each
        root = Path(args.run).expanduser()
        return _analyse_each([(job, job.default_checkpoint()) for job in jobs], device, root)
    if not args.all_checkpoints:
        report, run, ckpt_path = analyse_checkpoint(args.run, device)
        print(report.markdown())
        written = _write(report, run, ckpt_path)
        return print(f"wrote {' and '.join(map(str, written))} ({report.seconds:.1f} s)")
    run = runs.resolve(args.run)[0]
    _analyse_each([(run, ckpt_path) for ckpt_path in run.checkpoint_files()], device)


def _sweep_jobs(folder: Path) -> list[runs.RunFolder]:
    """The runs with a checkpoint under `folder` when it is no run itself (a sweep), else []
    (runs.resolve then says what `folder` is)."""
    run = runs.run_at(folder)
    if not folder.is_dir() or run.path != folder or run.default_checkpoint():
        return []
    try:
        return [job for job in runs.find_runs(folder) if job.default_checkpoint() is not None]
    except runs.RunFolderError:
        return []


def _analyse_each(checkpoints: list[tuple[runs.RunFolder, Path]], device: str, root=None) -> None:
    """Each (run, checkpoint) analysed and written, a line each (`root`: a sweep's folder, the
    lines name the jobs under it); one whose analysis is newer than it is skipped, one that cannot
    be analysed (a damaged checkpoint, a read-only run) said and passed, and named at the end."""
    failed = []
    for run, ckpt_path in checkpoints:
        done, name = run.analysis(ckpt_path), f"{run.name_under(root)}: " if root else ""
        if done.is_file() and done.stat().st_mtime_ns >= ckpt_path.stat().st_mtime_ns:
            print(f"{name}{ckpt_path.name}: {done.name} is up to date")
            continue
        try:
            report, _, _ = analyse_checkpoint(ckpt_path, device)
            _write(report, run, ckpt_path)
        except (UserError, OSError) as e:  # the others are still analysed
            failed.append(f"{name}{ckpt_path.name}")
            print(f"{name}{ckpt_path.name}: not analysed: {first_line(e)}", flush=True)
            continue
        step, roles = report.extra["step"], Counter(r for row in report.roles for r in row)
        heads = ", ".join(f"{n} {role}" for role, n in roles.most_common())
        print(
            f"{name}{ckpt_path.name}: step {step}, loss {report.loss:.4f}, {heads} -> {done.name}"
        )
    if failed:
        raise UserError(f"{len(failed)} of {len(checkpoints)} checkpoints not analysed (said "
                        f"above, the others written): {'; '.join(failed)}")  # fmt: skip


def _write(report: HeadReport, run: runs.RunFolder, ckpt_path: Path) -> tuple[Path, Path]:
    """The analysis of `ckpt_path` into its run's folder, as JSON and markdown: their paths."""
    json_path, md_path = run.analysis(ckpt_path, ".json"), run.analysis(ckpt_path, ".md")
    for path, content in (
        (json_path, json.dumps(report.to_dict(), indent=1) + "\n"),
        (md_path, f"# Heads of {ckpt_path}\n\n{report.markdown()}\n"),
    ):
        try:  # its own file in the run folder, replaced; never through a link out of the folder
            write_text(check_new_file(path, "the analysis", own=True), content)
        except OSError as e:  # a read-only run: the analysis above stands, its file is not written
            raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    return json_path, md_path
