"""python -m microgpt.compare: one row per group of seeds, verdicts between neighbours; it writes
nothing."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from microgpt.checkpoint import Checkpoint
from microgpt.commands import compare
from microgpt.commands.compare import RunSummary, format_groups, main, read_sweep, table, to_json
from microgpt.commands.heads import main as heads_main
from microgpt.heads.report import ROLES
from microgpt.runs import RunFolder
from microgpt.train.trainer import train
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


def test_a_single_seed_sweep_prints_a_row_per_group_and_says_it_cannot_tell(sweep, capsys):
    root, metrics = sweep
    before = fingerprint(root)
    assert main([str(root)]) == 0
    assert changes(before, fingerprint(root)) == ([], [], [])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    assert lines[0].split()[:6] == ["group", "heads", "seeds", "best", "val", "test"]
    row = {line.split()[0]: line.split() for line in lines[1:3]}
    assert set(row) == {"heads=1", "heads=2"}
    for heads in (1, 2):
        cells = row[f"heads={heads}"]
        assert cells[1:3] == [str(heads), "1"]  # one seed: the value alone, no interval
        assert float(cells[3]) == pytest.approx(metrics[heads]["best_val_loss"], abs=1e-4)
        assert float(cells[4]) == pytest.approx(metrics[heads]["test_loss"], abs=1e-4)
    # a legend for every column a newcomer could not guess
    for name in ("group:", "best val:", "tok/s:", "prunable:", "named:", "induction:", "95% CI"):
        assert name in out, name
    # no ranking of one seed against another: it says it cannot tell, and how to tell
    assert "cannot tell a difference" in " ".join(lines) and "seed=1,2,3" in out
    assert not any(s in out for s in ("lowest validation loss:", "significant", "different data"))
    assert main([str(root), "--runs"]) == 0  # a row per run too, above the groups
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    runs = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert runs["heads=1"][2] == f"{metrics[1]['params']:,}"
    assert out.index("run  ") < out.index("group  ")
    assert main([str(root), "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert "entropy" in wide[0] and "importance" in wide[0] and "entropy:" in "\n".join(wide)


def test_csv_and_json_hold_runs_groups_and_comparisons_for_scripts(sweep, capsys):
    root, metrics = sweep
    assert main([str(root), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["record"], r["name"]) for r in rows] == [
        ("run", "heads=1"), ("run", "heads=2"), ("group", "heads=1"), ("group", "heads=2"),
        ("comparison", "heads=2 - heads=1"), ("comparison", "heads=2 - heads=1"),
    ]  # fmt: skip
    assert rows[0]["params"] == str(metrics[1]["params"]) and rows[0]["group"] == "heads=1"
    assert float(rows[3]["test_loss.mean"]) == pytest.approx(metrics[2]["test_loss"])
    assert rows[3]["test_loss.interval"] == "none" and rows[4]["verdict"] == "cannot tell"
    assert main([str(root), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records["runs"]] == ["heads=1", "heads=2"]
    assert records["runs"][1]["test_loss"] == pytest.approx(metrics[2]["test_loss"])
    assert records["runs"][0]["heads_step"] == 12  # the analysis the run logged at its last step
    assert [(g["name"], g["n"]) for g in records["groups"]] == [("heads=1", 1), ("heads=2", 1)]
    assert {c["verdict"] for c in records["comparisons"]} == {"cannot tell"}
    # a figure a run lacks is null, not NaN (which is not JSON)
    lacking = json.loads(to_json([RunSummary("new", root, 4)]))
    assert lacking["runs"][0]["best_val_loss"] is lacking["groups"][0]["test_loss"] is None


def test_head_columns_from_the_logged_summaries(sweep):
    root, _ = sweep
    runs = read_sweep(root)[0]
    for r in runs:  # no heads-best.json: each summary's last logged value
        last = {}
        for line in RunFolder(r.path).metrics():
            last |= {tag: value for tag, value in line.items() if tag.startswith("heads/")}
        assert r.heads_summary == pytest.approx(last)
    col = columns(runs, "heads=1")
    for column, name, shown_to in [
        ("induction", "induction_max", 0.01), ("repeat gain", "repeat_loss_gain", 1e-3),
        ("prunable", "prunable", 0), ("importance L0", "layer0/importance_max", 1e-4),
        ("entropy L0", "layer0/entropy_mean", 1e-3)]:  # fmt: skip
        assert float(col[column]) == pytest.approx(runs[0].summary(name), abs=shown_to)
    # a role's column where some run has a head with it: mixed, unless none has
    assert int(col["named"]) + int(col.get("mixed", 0)) == 1  # its one head: named, or mixed


def test_the_analysis_of_best_pt_wins_with_its_step_and_a_stale_one_is_flagged(sweep, capsys):
    """heads-best.json (the whole validation split) wins over the logged summaries, with its step.
    The resumed-sweep case: an analysis of best.pt made before the run went on (its step is not
    the checkpoint's) gets a line saying so."""
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
        assert (runs[1].summary("prunable"), runs[1].summary("layer0/importance_max")) == (2, 0.125)
        assert (runs[1].heads_step, runs[0].heads_step) == (best_step, last_logged)
        capsys.readouterr()
        assert main([str(root), "--runs"]) == 0
        assert "\n* " not in capsys.readouterr().out
        data["step"] = best_step - 1
        analysis.write_text(json.dumps(data))
        assert read_sweep(root)[0][1].heads_step == best_step - 1
        assert main([str(root)]) == 0
        out = capsys.readouterr().out
        assert f"* heads=2: its head columns are of step {best_step - 1}, not {best_step} " in out
    finally:
        analysis.unlink()


def test_runs_on_different_data_are_not_ranked_against_each_other(sweep, tmp_path, capsys):
    """A run trained on other names (same path, other items): the table says the data differ,
    and no verdict compares them."""
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
    assert "trained on 2 different data sets" in out and "significant" not in out


# test losses by head count and seed: heads=2 is heads=1 less 0.05 (jitter 0.001), seed by seed;
# heads=4 is heads=2 plus +0.010, -0.012, +0.003; heads=8 (seeds 4-6: unpaired) far below heads=4
TEST_LOSS = {
    (1, 1): 2.000, (1, 2): 2.030, (1, 3): 1.980,
    (2, 1): 1.951, (2, 2): 1.979, (2, 3): 1.931,
    (4, 1): 1.961, (4, 2): 1.967, (4, 3): 1.934,
    (8, 4): 1.800, (8, 5): 1.820, (8, 6): 1.810,
}  # fmt: skip


@pytest.fixture(scope="module")
def seeded(sweep, tmp_path_factory) -> Path:
    """A `heads=1,2,4 seed=1,2,3` sweep plus heads=8 on seeds 4-6, with the test losses above
    (best val: test + 0.01): copies of the sweep's heads=2 run, their config.yaml and best.pt
    metrics rewritten, each given an analysis (heads-best.json) that names its roles: heads=1
    has `previous` in seeds 1 and 2 only, every run `self`; prunable 0, 1, 2 by seed."""
    root = tmp_path_factory.mktemp("seeded") / "sweep"
    for (heads, seed), loss in TEST_LOSS.items():
        run = root / f"heads={heads},seed={seed}"
        shutil.copytree(sweep[0] / "heads=2", run)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["seed"], config["heads"] = seed, heads  # its model.n_head stays 2: compare's
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        best = run / "checkpoints" / "best.pt"
        ckpt = Checkpoint.load(best)
        ckpt.metrics |= {"test_loss": loss, "best_val_loss": loss + 0.01}
        ckpt.model_config["n_head"] = heads  # head count is the checkpoint's (issue 52)
        ckpt.save(best)
        roles = {"heads/role/self": 1.0, "heads/role/previous": float(heads > 1 or seed < 3)}
        summaries = {**roles, "heads/prunable": float(seed - 1) if heads == 1 else 0.0}
        analysis = {"summaries": summaries, "step": ckpt.step, "heads": []}
        (run / "heads-best.json").write_text(json.dumps(analysis))
    return root


def test_verdicts_say_which_difference_is_beyond_the_seed_noise(seeded, capsys):
    before = fingerprint(seeded)
    assert main([str(seeded)]) == 0
    assert changes(before, fingerprint(seeded)) == ([], [], [])
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    rows = {line.split()[0]: line for line in out.splitlines()}
    # heads=1: mean 2.00333, sd 0.025166, 95% CI 4.303 * 0.025166 / sqrt(3) = +-0.0625
    assert rows["heads=1"].split()[:3] == ["heads=1", "1", "3"]
    assert "2.0133 ± 0.0625  2.0033 ± 0.0625" in rows["heads=1"]
    assert rows["heads=1"].split()[-3] == "1.0"  # prunable: the mean of 0, 1, 2
    # paired: differences -0.049 -0.051 -0.049 (t -74.5 on 2 df): significant
    assert rows["heads=2"].split()[1:] == ["-", "heads=1", "test", "-0.0497", "±", "0.0029",
        "<0.001", "<0.001", "significant", "paired", "t"]  # fmt: skip
    # paired: +0.010 -0.012 +0.003, mean +0.00033, sd 0.011240, se 0.0064893, t 0.05137 on 2 df:
    # p = 1 - t / sqrt(t^2 + 2) = 0.964, the largest of the 3: Holm keeps it; within noise
    line = rows["heads=4"].split()
    assert line[4:6] == ["+0.0003", "±"] and line[-4:] == ["within", "noise", "paired", "t"]
    assert line[-6:-4] == ["0.964", "0.964"]
    # other seeds: Welch, -0.1440 (1.8100 - 1.9540)
    assert rows["heads=8"].split()[4] == "-0.1440"
    assert rows["heads=8"].split()[-3:] == ["significant", "Welch", "t"]
    assert "differences in test loss beyond the noise: 2 of 3" in out
    assert "  heads=1: self 3 of 3 seeds, previous 2 of 3 seeds" in out
    assert "  heads=2: self 3 of 3 seeds, previous 3 of 3 seeds" in out
    assert main([str(seeded), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    test = [c for c in data["comparisons"] if c["loss"] == "test_loss"]
    assert [(c["t_test"], c["verdict"]) for c in test] == [
        ("paired t", "significant"), ("paired t", "within noise"), ("Welch t", "significant")
    ]  # fmt: skip
    # Holm over the 3: the smallest p times 3 (t -74.5 on 2 df: p = 1 - 74.5 / sqrt(74.5^2 + 2)
    # = 1.801e-4), the next (Welch's) times 2, the largest as it is
    assert test[0]["p"] == pytest.approx(1.801e-4, rel=1e-3)
    assert test[0]["p_holm"] == pytest.approx(3 * 1.801e-4, rel=1e-3)
    assert test[2]["p_holm"] == pytest.approx(2 * test[2]["p"])
    assert test[0]["seeds"] == [1, 2, 3] and test[1]["p_holm"] == pytest.approx(0.9637, abs=1e-4)
    group = data["groups"][0]
    assert (group["n"], group["seeds"]) == (3, [1, 2, 3])
    assert group["test_loss"]["interval"] == "t 95% CI"
    assert group["roles"]["previous"] == {"seeds": 2, "of": 3}


def summaries(test_loss: dict, roles: dict | None = None) -> list[RunSummary]:
    """Runs as read_sweep gives them, without files: {(heads, seed): test loss}; `roles`:
    {(heads, seed): {role: heads with it}} (a run not in it has no analysis)."""
    out = []
    for (heads, seed), loss in test_loss.items():
        run = RunSummary(f"heads={heads},seed={seed}", Path(), heads, test_loss=loss, seed=seed)
        run.config = {"seed": seed, "model": {"n_head": heads}}
        if (counts := (roles or {}).get((heads, seed))) is not None:
            run.heads_summary = {f"heads/role/{r}": float(counts.get(r, 0)) for r in ROLES}
        out.append(run)
    return out


def test_a_raw_p_under_alpha_is_within_noise_when_holms_p_is_not():
    """heads=2 is heads=1 plus 0.02, 0.03, 0.04 by seed (paired: mean 0.03, sd 0.01, t = sqrt(27)
    on 2 df: p = 1 - t / sqrt(t^2 + 2) = 0.03510); heads=4 is heads=2 plus 0.01, -0.01, 0 (p 1).
    Holm over the 2: 2 x 0.03510 = 0.07020, not under 0.05."""
    losses = {(1, 1): 2.00, (1, 2): 2.10, (1, 3): 1.95, (2, 1): 2.02, (2, 2): 2.13,
              (2, 3): 1.99, (4, 1): 2.03, (4, 2): 2.12, (4, 3): 1.99}  # fmt: skip
    runs = summaries(losses)
    test = [c for c in compare.records(runs)["comparisons"] if c["loss"] == "test_loss"]
    assert (test[0]["p"], test[0]["p_holm"]) == pytest.approx((0.03510, 0.07020), abs=1e-5)
    assert [c["verdict"] for c in test] == ["within noise", "within noise"]
    assert "differences in test loss beyond the noise: 0 of 2" in compare.format_groups(runs)


def test_roles_across_seeds_count_the_seeds_with_an_analysis_only():
    roles = {(2, 1): {"previous": 1, "self": 1}, (2, 2): {"self": 2}}  # seed 3: no analysis
    runs = summaries({(2, 1): 2.0, (2, 2): 2.1, (2, 3): 2.2}, roles)
    of_2 = {"self": {"seeds": 2, "of": 2}, "previous": {"seeds": 1, "of": 2}}
    assert compare.records(runs)["groups"][0]["roles"] == of_2
    line = "  heads=2: self 2 of 2 analysed, previous 1 of 2 analysed"
    assert line in compare.format_groups(runs).splitlines()


def test_a_loss_that_is_not_finite_is_left_out_and_the_seeds_column_says_so(seeded, tmp_path):
    """issue 52: an infinite test loss crashed the verdicts; a NaN one was counted as a seed; a
    run with no checkpoint (its data unknown) kept its group from being compared."""
    shutil.copytree(seeded, tmp_path / "sweep")
    for seed, loss in ((1, math.inf), (2, math.nan)):
        best = tmp_path / "sweep" / f"heads=1,seed={seed}" / "checkpoints" / "best.pt"
        ckpt = Checkpoint.load(best)
        ckpt.metrics |= {"test_loss": loss}
        ckpt.save(best)
    shutil.rmtree(tmp_path / "sweep" / "heads=2,seed=3" / "checkpoints")  # its data unknown
    runs = read_sweep(tmp_path / "sweep")[0]
    out = format_groups(runs)
    assert "different data" not in out
    assert next(line for line in out.splitlines() if "heads=4 - heads=2" in line).endswith("t")
    assert next(line for line in out.splitlines() if line.startswith("heads=1 ")).split()[:5] == [
        "heads=1", "1", "1", "of", "3"]  # fmt: skip
    assert "heads=2 - heads=1  test" in out  # one seed left: cannot tell, no traceback
