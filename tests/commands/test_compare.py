"""python -m microgpt.compare: one row per run of a sweep; it writes nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from microgpt.checkpoint import Checkpoint
from microgpt.commands.compare import main, read_sweep
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


def test_compare_prints_a_row_per_run_and_writes_nothing(sweep, capsys):
    root, metrics = sweep
    before = fingerprint(root)
    assert main([str(root)]) == 0
    assert changes(before, fingerprint(root)) == ([], [], [])
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:6] == ["run", "heads", "params", "best", "val", "test"]
    assert "entropy" in header and "tok/s" in header
    row = {line.split()[0]: line.split() for line in lines[1:3]}
    assert set(row) == {"heads=1", "heads=2"}
    for heads in (1, 2):
        cells = row[f"heads={heads}"]
        assert cells[1] == str(heads)
        assert cells[2] == f"{metrics[heads]['params']:,}"  # counted from the checkpoint
        assert float(cells[3]) == pytest.approx(metrics[heads]["best_val_loss"], abs=1e-4)
        assert float(cells[4]) == pytest.approx(metrics[heads]["test_loss"], abs=1e-4)
        assert float(cells[6]) > 0  # layer 0's mean attention entropy
    assert out.count("lowest validation loss: heads=") == 1 and "different data" not in out
    assert [r.label for r in read_sweep(root)[0]] == ["1 head", "2 heads"]


def test_head_columns_from_the_logged_summaries(sweep, capsys):
    root, _ = sweep
    runs = read_sweep(root)[0]
    for r in runs:  # no heads-best.json: each summary's last logged value
        last = {}
        for line in read_metrics(r.path / "metrics.jsonl"):
            last |= {tag: value for tag, value in line.items() if tag.startswith("heads/")}
        assert r.heads_summary == pytest.approx(last, nan_ok=True)
        assert r.importance_max == [last["heads/layer0/importance_max"]]
        assert r.role_counts == {role: last[f"heads/role/{role}"] for role in ROLES}
    assert main([str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].replace(" max", "_max").replace(" gain", "_gain").replace(" L0", "_L0")
    tail = header.split()[header.split().index("prunable") :]  # one word per column from here
    col = dict(zip(tail, lines[1].split()[-len(tail) :]))  # heads=1
    assert set(tail) - set(ROLES) == {"prunable", "importance_L0", "induction_max",
                                      "repeat_gain", "copying_max", "named"}  # fmt: skip
    assert float(col["induction_max"]) == pytest.approx(runs[0].summary("induction_max"), abs=0.01)
    assert float(col["repeat_gain"]) == pytest.approx(runs[0].summary("repeat_loss_gain"), abs=1e-3)
    assert int(col["prunable"]) == runs[0].summary("prunable")
    assert float(col["importance_L0"]) == pytest.approx(runs[0].importance_max[0], abs=1e-4)
    assert int(col["named"]) + int(col["mixed"]) == 1  # its one head: named, or mixed


def test_the_analysis_of_best_pt_wins_with_its_step_and_a_stale_one_is_flagged(sweep, capsys):
    """heads-best.json (the whole validation split) wins over the logged summaries. The
    resumed-sweep case: an analysis of best.pt made before the run went on (its step is not the
    checkpoint's) gets a `*` and a line saying so; logged summaries are of the last step."""
    root, _ = sweep
    analysis = root / "heads=2" / "heads-best.json"
    assert heads_main([str(root / "heads=2")]) == 0
    best_step = Checkpoint.load(root / "heads=2" / "checkpoints" / "best.pt").step
    last_logged = max(json.loads(line)["step"] for line in open(root / "heads=1" / "metrics.jsonl"))
    data = json.loads(analysis.read_text())
    data["summaries"] |= {"heads/prunable": 2.0, "heads/layer0/importance_max": 0.125}
    analysis.write_text(json.dumps(data))
    try:
        two = read_sweep(root)[0][1]
        assert two.summary("prunable") == 2 and two.importance_max == [0.125]
        capsys.readouterr()
        assert main([str(root)]) == 0
        lines = capsys.readouterr().out.splitlines()
        # the column's cell: "best val", "entropy L0" and "heads step" are two words each
        at = lines[0].split().index("step") - 3
        rows = {line.split()[0]: line.split() for line in lines[1:3]}
        assert rows["heads=2"][at] == str(best_step)
        assert rows["heads=1"][at] == str(last_logged)
        assert not any(line.startswith("* ") for line in lines)
        data["step"] = best_step - 1
        analysis.write_text(json.dumps(data))
        assert main([str(root)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[2].split()[at] == f"{best_step - 1}*"
        assert f"* heads=2: its head columns are of step {best_step - 1}, not {best_step} " in (
            "\n".join(lines)
        )
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
