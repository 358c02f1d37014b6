"""bench/run.py as a user meets it: a bad value is one line and exit 2, --out never replaces a
file the user did not hand over, and a tiny run prints the table and writes the JSON. The
figures themselves are not checked: they depend on the machine and what else runs on it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from bench import run, time_to_loss
from bench.run import main
from microgpt import entry, files
from microgpt.files import sha256_file
from tests.conftest import make_names


@pytest.fixture(autouse=True)
def project(tmp_path_factory, monkeypatch):
    """The bench's runs read data/names.txt from the working folder: generated names there,
    whatever the checkout's data/ holds."""
    root = tmp_path_factory.mktemp("project")
    (root / "data").mkdir()
    (root / "data" / "names.txt").write_text("\n".join(make_names(2000)) + "\n")
    monkeypatch.chdir(root)


def bench(*argv: str) -> int:
    try:
        return entry.run(lambda: main(list(argv)))
    except SystemExit as e:  # a usage error ends in the parser
        return e.code


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--batches", "abc"], "--batches"),
        (["--seeds", "x"], "--seeds"),
        (["--threads", "-1"], "--threads"),
        (["--device", "cuda"], "cuda"),
        (["--run", "no-such-run"], "no-such-run"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(argv, named, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    assert bench("--quick", "--only", "memory", *argv, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("microgpt: error: ") and err.count("\n") == 1 and named in err
    assert not out.exists()


def test_out_refuses_what_it_would_replace_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(files, "PROJECT_DATA", Path("data").resolve())  # the project fixture's
    run = tmp_path / "run"  # a run folder: its claim, its checkpoints, its metrics
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    mine = tmp_path / "results.json"
    mine.write_text("earlier results")
    (tmp_path / "link.json").symlink_to(mine)
    kept = [*tmp_path.rglob("*"), Path("data/names.txt").resolve()]
    before = {p: sha256_file(p) for p in kept if p.is_file()}
    refused = [
        (mine, [], "already exists"),  # no --overwrite
        (run / "metrics.jsonl", ["--overwrite"], "inside the run folder"),
        (run / "new.json", [], "inside the run folder"),
        (tmp_path / "link.json", ["--overwrite"], "symbolic link"),
        ("/dev/full", ["--overwrite"], "device"),
        (tmp_path / "no-folder" / "r.json", [], "no folder"),
        # issue 43: bench --out data/names.txt --overwrite replaced the training data
        ("data/names.txt", ["--overwrite"], "is the project's data/names.txt"),
    ]
    for out, extra, why in refused:
        assert bench("--quick", "--only", "memory", "--out", str(out), *extra) == 2, out
        err = capsys.readouterr().err
        assert err.startswith(f"microgpt: error: --out={out}") and err.count("\n") == 1, err
        assert why in err, err
    assert {p: sha256_file(p) for p in kept if p.is_file()} == before


def test_a_failed_section_is_an_exit_2_after_the_figures_are_written(tmp_path, capsys, monkeypatch):
    def broken(*args):
        raise RuntimeError("no such thing")

    monkeypatch.setitem(run.SECTIONS, "memory", broken)
    out = tmp_path / "r.json"
    assert bench("--quick", "--only", "memory", "--device", "cpu", "--out", str(out)) == 2
    assert "error" in json.loads(out.read_text())["sections"]["memory"]["figures"]["section"]
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "microgpt: error: section memory failed (see the table); the rest stand"
    # a section every row of which failed (issue 52: an unknown --row-override was exit 0)
    bad = ("--only", "throughput", "--row-override", "nosuch=1", "--out", str(tmp_path / "t"))
    assert bench("--quick", "--device", "cpu", *bad) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("microgpt: error: section through")


def test_a_tiny_run_prints_the_table_and_replaces_the_named_file(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("earlier results")
    argv = ["--quick", "--only", "throughput,heads", "--threads", "1", "--device", "cpu"]
    assert bench(*argv, "--out", str(out), "--overwrite") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == "section case median min max unit target pass/miss".split()
    results = json.loads(out.read_text())
    assert results["quick"] is True and results["device"] == "cpu"
    assert list(results["sections"]) == ["throughput", "heads"]
    for section, body in results["sections"].items():
        for case, fig in body["figures"].items():
            assert "error" not in fig, (case, fig)
            assert 0 < fig["min"] <= fig["median"] <= fig["max"], (case, fig)
            assert any(line.startswith(section) and case in line for line in table), case


def test_the_step_section_times_the_optimizer_and_the_average_apart(tmp_path):
    out = tmp_path / "r.json"
    assert bench("--quick", "--only", "step", "--threads", "1", "--out", str(out)) == 0
    figures = json.loads(out.read_text())["sections"]["step"]["figures"]
    names = {k.removeprefix("names: "): f for k, f in figures.items() if k.startswith("names: ")}
    for part in ("recipe: optimizer", "recipe: weight average", "AdamW: optimizer"):
        assert names[part]["median"] > 0, part
    assert "AdamW: weight average" not in names  # AdamW's variant averages nothing
    assert names["orthogonalisation FLOPs / model's"]["median"] > 0


def test_time_to_loss_interpolates_each_sides_crossing_of_the_references_final_loss(
    tmp_path, monkeypatch
):
    """The crossing, timed alike on both sides: linear between the last validation above the
    reference's last one and the first at or below it (equal counts), from train()'s call; and
    the same from the steps to it and the two steps' times alternated, round by round."""
    # (seconds, step, val loss): the reference ends at 2.0 going up, having crossed it between
    # 10 s (3.0, step 250) and 20 s (1.99, step 500): at 10 + 10 / 1.01 s, 250 + 250 / 1.01 steps
    reference = [(10.0, 250, 3.0), (20.0, 500, 1.99), (30.0, 750, 2.0)]
    ours = [(5.0, 100, 2.6), (8.0, 200, 2.0), (12.0, 300, 1.9), (15.0, 400, 2.1)]  # at 8 s, 200
    curves = iter([reference, ours] * len(time_to_loss.CASES))
    monkeypatch.setattr(time_to_loss, "val_curve", lambda *args: next(curves))
    monkeypatch.setattr(time_to_loss, "make_trainer", lambda *args: None)
    # two rounds of (seconds a step, characters a second): the reference's, then ours
    rounds = [[(0.04, 0), (0.06, 0)], [(0.02, 0), (0.02, 0)]]
    monkeypatch.setattr(time_to_loss, "alternate", lambda *args: rounds)
    args = argparse.Namespace(quick=False, row_override=[], rounds=2, block_s=1.0)
    figures = time_to_loss.run_time_to_loss(args, "cpu", tmp_path)["figures"]
    median = lambda name: figures[f"names: {name}"]["median"]  # noqa: E731
    assert median("microgpt's wall time to the reference's") == 8.0
    assert median("reference's wall time to it") == pytest.approx(19.90099)
    assert median("reference's time / microgpt's") == pytest.approx(2.487624)
    assert median("the same at the first evaluations at or below it") == 20.0 / 8.0
    assert median("steps to it, reference's / microgpt's") == pytest.approx(2.487624)
    assert median("step time, reference's / microgpt's") == 2.5  # rounds of 2x and 3x
    assert median("steps ratio x step time ratio") == pytest.approx(2.487624 * 2.5)
    # a crossing at the fourth evaluation: from the one before it (2.5 at 12 s) to 1.5 at 16 s
    later = [(5.0, 100, 3.0), (8.0, 200, 2.8), (12.0, 300, 2.5), (16.0, 400, 1.5)]
    assert time_to_loss.crossing(later, 2.0) == (14.0, 16.0)
    assert time_to_loss.crossing(later, 2.0, at=1) == (350.0, 400)
