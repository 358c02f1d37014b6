"""python -m microgpt.compare: one row per run of a sweep; it writes nothing."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

from microgpt.checkpoint import Checkpoint
from microgpt.commands.compare import RunSummary, main, read_sweep, table, to_json
from microgpt.commands.heads import main as heads_main
from microgpt.heads.report import ROLES
from microgpt.train.trainer import train
from microgpt.viz.tensorboard import read_metrics
from tests.conftest import TINY, compose_config, make_names
from tests.e2e.harness import changes, fingerprint


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A 2-job sweep as `train.py -m heads=1,2` lays it out: sweep/heads=1, sweep/heads=2 (built
    once for this module; the tests only read it)."""
    tmp = tmp_path_factory.mktemp("compare")
    (tmp / "names.txt").write_text("\n".join(make_names()) + "\n")
    root = tmp / "sweep"
    metrics = {}
    for heads in (1, 2):
        # train.ema=0: the analyses read last.pt's weights, the ones trained
        names = [f"data.path={tmp / 'names.txt'}", "train.num_samples=0", "train.ema=0"]
        cfg = compose_config([*TINY, f"heads={heads}", *names])
        cfg.out_dir = str(root / f"heads={heads}")  # '=' in a path cannot go through an override
        metrics[heads] = train(cfg)
    (root / ".submitit").mkdir()  # launcher clutter is not a run
    return root, metrics


def columns(runs, wide_run: str) -> dict[str, str]:
    """The cells of one run's row, by column (every column, as --wide and --csv show them)."""
    header, rows = table(runs)
    return dict(zip(header, next(row for row in rows if row[0] == wide_run)))


def test_compare_prints_a_row_per_run_in_100_columns_with_a_legend_and_writes_nothing(
    sweep, capsys
):
    root, metrics = sweep
    before = fingerprint(root)
    assert main([str(root)]) == 0
    assert changes(before, fingerprint(root)) == ([], [], [])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    header = lines[0].split()
    assert header[:6] == ["run", "heads", "params", "best", "val", "test"]
    assert "entropy" not in header and header[-1] == "analysis"  # each layer's: --wide
    row = {line.split()[0]: line.split() for line in lines[1:3]}
    assert set(row) == {"heads=1", "heads=2"}
    for heads in (1, 2):
        cells = row[f"heads={heads}"]
        assert cells[1] == str(heads)
        assert cells[2] == f"{metrics[heads]['params']:,}"  # counted from the checkpoint
        assert float(cells[3]) == pytest.approx(metrics[heads]["best_val_loss"], abs=1e-4)
        assert float(cells[4]) == pytest.approx(metrics[heads]["test_loss"], abs=1e-4)
    # a legend for every column a newcomer could not guess
    for name in ("best val:", "tok/s:", "prunable:", "named:", "induction:", "analysis:"):
        assert name in out, name
    assert out.count("lowest validation loss: heads=") == 1 and "different data" not in out
    assert [r.label for r in read_sweep(root)[0]] == ["1 head", "2 heads"]
    assert main([str(root), "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert "entropy" in wide[0] and "importance" in wide[0] and "entropy:" in "\n".join(wide)


def test_csv_and_json_hold_every_column_for_scripts(sweep, capsys):
    root, metrics = sweep
    runs = read_sweep(root)[0]
    assert main([str(root), "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == table(runs)[0] and [r[0] for r in rows[1:]] == ["heads=1", "heads=2"]
    assert rows[1][rows[0].index("params")] == str(metrics[1]["params"])  # a plain number
    assert main([str(root), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == ["heads=1", "heads=2"]
    assert records[1]["test_loss"] == pytest.approx(metrics[2]["test_loss"])
    assert records[0]["heads_from"] == "log" and records[0]["heads_step"] == 12
    # a figure a run lacks is null, not NaN (which is not JSON)
    assert json.loads(to_json([RunSummary("new", root, 4)]))[0]["best_val_loss"] is None


def test_head_columns_from_the_logged_summaries(sweep):
    root, _ = sweep
    runs = read_sweep(root)[0]
    for r in runs:  # no heads-best.json: each summary's last logged value
        last = {}
        for line in read_metrics(r.path / "metrics.jsonl"):
            last |= {tag: value for tag, value in line.items() if tag.startswith("heads/")}
        assert r.heads_summary == pytest.approx(last)
        assert r.importance_max == [last["heads/layer0/importance_max"]]
        assert r.role_counts == {role: last[f"heads/role/{role}"] for role in ROLES}
    col = columns(runs, "heads=1")
    assert float(col["induction"]) == pytest.approx(runs[0].summary("induction_max"), abs=0.01)
    assert float(col["repeat gain"]) == pytest.approx(runs[0].summary("repeat_loss_gain"), abs=1e-3)
    assert int(col["prunable"]) == runs[0].summary("prunable")
    assert float(col["importance L0"]) == pytest.approx(runs[0].importance_max[0], abs=1e-4)
    assert int(col["named"]) + int(col["mixed"]) == 1  # its one head: named, or mixed
    assert col["analysis"] == "log 12"  # the analysis the run logged at its last step


def test_the_analysis_of_best_pt_wins_with_its_step_and_a_stale_one_is_flagged(sweep, capsys):
    """heads-best.json (the whole validation split) wins over the logged summaries, and the
    analysis column says so. The resumed-sweep case: an analysis of best.pt made before the run
    went on (its step is not the checkpoint's) gets a `*` and a line saying so."""
    root, _ = sweep
    analysis = root / "heads=2" / "heads-best.json"
    assert heads_main([str(root / "heads=2")]) == 0
    best_step = Checkpoint.load(root / "heads=2" / "checkpoints" / "best.pt").step
    last_logged = max(json.loads(line)["step"] for line in open(root / "heads=1" / "metrics.jsonl"))
    data = json.loads(analysis.read_text())
    data["summaries"] |= {"heads/prunable": 2.0, "heads/layer0/importance_max": 0.125}
    analysis.write_text(json.dumps(data))
    try:
        runs = read_sweep(root)[0]
        assert runs[1].summary("prunable") == 2 and runs[1].importance_max == [0.125]
        assert columns(runs, "heads=2")["analysis"] == f"best.pt {best_step}"
        assert columns(runs, "heads=1")["analysis"] == f"log {last_logged}"
        capsys.readouterr()
        assert main([str(root)]) == 0
        out = capsys.readouterr().out
        assert f"best.pt {best_step}\n" in out and not any(
            line.startswith("* ") for line in out.splitlines()
        )
        data["step"] = best_step - 1
        analysis.write_text(json.dumps(data))
        assert columns(read_sweep(root)[0], "heads=2")["analysis"] == f"best.pt {best_step - 1}*"
        assert main([str(root)]) == 0
        out = capsys.readouterr().out
        assert f"* heads=2: its head columns are of step {best_step - 1}, not {best_step} " in out
    finally:
        analysis.unlink()


def test_runs_on_different_data_are_not_ranked_against_each_other(sweep, tmp_path, capsys):
    """A run trained on other names (same path, other items) is grouped apart: each group gets
    its own "lowest validation loss" line, and the table says the data differ."""
    root, _ = sweep
    mixed = tmp_path / "mixed"
    shutil.copytree(root / "heads=1", mixed / "heads=1")
    other = tmp_path / "other.txt"
    other.write_text("\n".join(make_names(seed=1)) + "\n")
    cfg = compose_config([*TINY, "heads=2", "train.num_samples=0", f"data.path={other}"])
    cfg.out_dir = str(mixed / "heads=2")
    train(cfg)
    assert main([str(mixed)]) == 0
    out = capsys.readouterr().out
    assert "trained on 2 different data sets" in out
    assert out.count("lowest validation loss on ") == 2
