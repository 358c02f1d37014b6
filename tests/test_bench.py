"""Smoke test of bench/run.py: the quick run finishes, prints one table and writes well-formed JSON.

No timing is asserted: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SECTIONS = ["throughput", "sampling", "memory"]
FIGURE_KEYS = {"median", "min", "max", "unit", "n"}


def test_quick_bench_writes_json_and_prints_table(tmp_path):
    out = tmp_path / "r.json"
    # one thread: on a busy 2-core machine, two intra-op threads can make small steps 10-30x slower
    cmd = [
        sys.executable,
        str(REPO / "bench" / "run.py"),
        "--quick",
        "--only",
        ",".join(SECTIONS),
        "--threads",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    # a generous limit: the quick run takes about a minute alone, several on a busy machine
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-2000:]

    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "section",
        "case",
        "median",
        "min",
        "max",
        "unit",
        "target",
        "pass/miss",
    ]
    assert set(lines[1]) <= {"-", " "}  # the rule under the header
    assert any(line.startswith("throughput") for line in lines)

    r = json.loads(out.read_text())
    assert r["quick"] is True and r["threads"] == 1 and r["device"] == "cpu"
    assert {"platform", "cpu", "cores"} <= set(r["machine"])
    assert isinstance(r["torch"], str)
    assert list(r["sections"]) == SECTIONS
    for section, body in r["sections"].items():
        assert body["figures"], section
        for case, fig in body["figures"].items():
            assert "error" not in fig, f"{section} / {case}: {fig.get('error')}"
            assert FIGURE_KEYS <= set(fig), (section, case)
            assert fig["min"] <= fig["median"] <= fig["max"], (section, case)
            if "target" in fig:
                assert isinstance(fig["pass"], bool)
            assert any(case in line for line in lines), f"{case} missing from the table"

    tp = r["sections"]["throughput"]["figures"]
    for preset in ("micro", "small"):
        for unit in ("tokens/s", "chars/s", "steps/s"):
            assert tp[f"{preset} b32 sdpa eager {unit}"]["median"] > 0
    sampling = r["sections"]["sampling"]
    assert "base 32 tokens, cache speedup" in sampling["figures"]
    assert "trained here" in sampling["info"]["model"]
    memory = r["sections"]["memory"]["figures"]
    mha, gqa, mqa = (
        memory[f"base KV cache {k} b64"]["bytes"]
        for k in ("MHA (n_kv_head=6)", "GQA (n_kv_head=2)", "MQA (n_kv_head=1)")
    )
    assert mha == 3 * gqa == 6 * mqa


def test_bench_heads_writes_the_committed_figures_only_when_asked(tiny_cfg, tmp_path, monkeypatch):
    """issue 22, item 7: bench/heads.py wrote docs/heads_bench.json by default, over the
    committed figures; like bench/run.py, it does so only with --write-docs."""
    import importlib.util

    from microgpt.train.trainer import train

    train(tiny_cfg("train.num_samples=0"))
    spec = importlib.util.spec_from_file_location("bench_heads", REPO / "bench" / "heads.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    root = tmp_path / "repo"  # where the script's defaults point, instead of this repository
    monkeypatch.setattr(bench, "REPO", root)
    monkeypatch.setattr(bench, "DOCS_JSON", root / "docs" / "heads_bench.json", raising=False)
    run = str(tmp_path / "run")
    assert bench.main([run, "--repeat", "1"]) == 0
    assert not (root / "docs" / "heads_bench.json").exists()
    assert json.loads((root / "bench" / "heads.json").read_text())["items"] > 0
    assert bench.main([run, "--repeat", "1", "--write-docs"]) == 0
    assert (root / "docs" / "heads_bench.json").is_file()


@pytest.mark.slow  # about 30 s: two quick trainings, a cost ratio and the pair case
def test_quick_targets_and_threads_sections_write_json(tmp_path):
    """The issue-20 sections (bench/targets.py, cost.py, pair.py) on tiny settings: each names row
    is trained on both names files, its cost is measured as a ratio, the pair case runs two step
    processes at once, and the targets table is printed. Timings are not checked."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--only", "targets,threads"]
    cmd += ["--rows", "names", "--threads", "1", "--device", "cpu", "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(out.read_text())
    assert list(r["sections"]) == ["targets", "threads"]
    targets = r["sections"]["targets"]
    figs = targets["figures"]
    for case in ("names: test loss", "names [names-1980s]: test loss"):
        assert figs[case]["n"] == 1 and 0 < figs[case]["median"] < 10, case  # one seed: 1337
    cost = targets["info"]["rows"]["names"]
    assert len(cost["ratios"]) == 2 and cost["run_cost"] > 0  # --quick: 2 rounds
    assert all(len(x["loadavg"]) == 3 for x in cost["loads"]) and isinstance(cost["busy"], bool)
    pair = r["sections"]["threads"]["figures"]
    assert pair["auto: steps/s each, two at once"]["n"] == 2  # both processes of the pair
    assert pair["auto: two at once / alone, each"]["median"] > 0
    assert "The targets of issue 20" in done.stdout
    table = done.stdout.split("The targets of issue 20")[1]
    assert "python train.py heads=4" in table and "the same on names-1980s" in table


def test_the_overhead_row_times_a_whole_run_against_its_step_loop(names_file, tmp_path):
    """bench/targets.py's "overhead" row (issue 27): train() run whole against the same recipe's
    steps alone, as a ratio with its parts, and the line format_targets prints for it."""
    from types import SimpleNamespace

    from bench import targets
    from tests.conftest import TINY

    tiny = (*TINY, f"data.path={names_file}")
    row = next(r for r in targets.ROWS if r.key == "overhead")
    args = SimpleNamespace(device="cpu", threads=1)
    found = targets.overhead(targets.Row(**{**row.__dict__, "overrides": tiny}), args, tmp_path)
    assert found["ratio"] == pytest.approx(found["run_s"] / found["steps_s"])
    assert 0 < found["steps_s"] < found["run_s"] and found["in_run_s"] < found["run_s"]
    figures = {"overhead: run / step loop": {"median": 1.23, "n": 1}}
    table = targets.format_targets({"sections": {"targets": {"figures": figures}}})
    assert row.recipe in table and "| 1.23 |" in table and "<= 1.1" in table


@pytest.mark.slow  # about 20 s: two tiny trainings in spawned processes, then the same in this one
def test_targets_jobs_train_the_seeds_at_once_to_the_same_losses(names_file, tmp_path):
    """--jobs 2 trains two seeds in their own processes at once: the losses are those of the
    seeds trained one after the other here (exact), in seed order."""
    from types import SimpleNamespace

    from bench import targets
    from tests.conftest import TINY

    row = targets.Row("t", "tiny", (*TINY, f"data.path={names_file}"), "test_loss", None, None, "")
    args = SimpleNamespace(device="cpu", threads=1, seeds=[1, 2], jobs=2)
    together = targets.losses(row, [], args, tmp_path)
    alone = targets.losses(row, [], SimpleNamespace(**{**vars(args), "jobs": 1}), tmp_path)
    assert together == alone and together[0] != together[1]
