"""`python -m microgpt.heads RUN`: what each head of a trained run does, and whether it matters.

    python -m microgpt.heads outputs/<date>/<time>                     # its best.pt, else last.pt
    python -m microgpt.heads outputs/<date>/<time>/checkpoints/step-000500.pt

Prints a row per head on the checkpoint's validation split and writes the analysis beside it,
named after the checkpoint (heads-best.json and .md, heads-step-000500.json, ...: runs.RunFolder).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from microgpt import entry, runs
from microgpt.checkpoint import Checkpoint
from microgpt.data.dataset import data_of_checkpoint
from microgpt.errors import UserError
from microgpt.files import check_new_file, write_text
from microgpt.heads.analyse import analyse
from microgpt.heads.report import HeadReport
from microgpt.system import DEVICES, check_threads, pick_device, set_threads


def analyse_checkpoint(
    path: str | Path, device: str = "cpu"
) -> tuple[HeadReport, runs.RunFolder, Path]:
    """(the report on the checkpoint's validation split, the run, the checkpoint); `path` is a run
    folder, its checkpoints/ folder or a checkpoint (runs.resolve)."""
    run, ckpt_path = runs.resolve(path)
    ckpt = Checkpoint.load(ckpt_path)
    model, tokenizer = ckpt.build_model(device)
    data = data_of_checkpoint(ckpt, device)
    val = data.datasets["val"]  # names, or windows of a text run
    x, y = val.batch(torch.arange(len(val)))  # (N, T) each
    # the first validation rows holding the format's number of targets
    keep = int(((y >= 0).sum(dim=1).cumsum(0) <= data.analysis_targets).sum().clamp(min=1))
    x, y = x[:keep], y[:keep]
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
    add("run", help="a run folder (outputs/<date>/<time>) or a checkpoint file")
    add("--device", default="cpu", choices=DEVICES, help="where to run the model (default: cpu)")
    add("--threads", default="auto", help="threads: auto (usable cores, or OMP_NUM_THREADS) or N")
    args = parser.parse_args(argv)
    threads = int(args.threads) if args.threads.isdigit() else args.threads
    check_threads(threads, "--threads")
    set_threads(threads)
    device = str(pick_device(args.device, UserError))
    report, run, ckpt_path = analyse_checkpoint(args.run, device)
    text = report.markdown()
    print(text)
    json_path, md_path = run.analysis(ckpt_path, ".json"), run.analysis(ckpt_path, ".md")
    for path, content in (
        (json_path, json.dumps(report.to_dict(), indent=1) + "\n"),
        (md_path, f"# Heads of {ckpt_path}\n\n{text}\n"),
    ):
        try:  # its own file in the run folder, replaced; never through a link out of the folder
            write_text(check_new_file(path, "the analysis", own=True), content)
        except OSError as e:  # a read-only run: the analysis above stands, its file is not written
            raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    print(f"wrote {json_path} and {md_path} ({report.seconds:.1f} s)")
