"""`python -m microgpt.heads`: a run's checkpoint, each of its checkpoints (a line each), or each
job of a sweep; every analysis named after its checkpoint."""

from __future__ import annotations

import json
import re
import shutil

from microgpt.commands.compare import read_sweep
from microgpt.commands.heads import main


def test_a_run_is_analysed_into_a_file_named_after_its_checkpoint(lab, tmp_path, capsys):
    """Analysing another checkpoint never replaces the run's analysis (of best.pt), and compare
    reads best.pt's."""
    run = tmp_path / "heads=2"
    shutil.copytree(lab / "sweep" / "heads=2", run)
    assert main([str(run), "--threads", "1"]) == 0
    out, md = capsys.readouterr().out, (run / "heads-best.md").read_text()
    assert "| layer | head | role |" in out and "Prunable:" in out and "| 0 | 1 |" in md
    assert out.split("\nwrote ")[0].strip() in md  # the table and notes printed, as in the file
    best = json.loads((run / "heads-best.json").read_text())
    assert best["n_head"] == 2 and len(best["heads"]) == 2
    assert best["checkpoint"].endswith("best.pt")
    kept = (run / "heads-best.json").read_bytes()
    assert main([str(run / "checkpoints" / "last.pt"), "--threads", "1"]) == 0  # into the run
    assert json.loads((run / "heads-last.json").read_text())["checkpoint"].endswith("last.pt")
    assert (run / "heads-last.md").is_file() and (run / "heads-best.json").read_bytes() == kept
    assert main([str(run / "checkpoints"), "--threads", "1"]) == 0  # the same run
    assert json.loads((run / "heads-best.json").read_text())["checkpoint"] == best["checkpoint"]
    # compare reports best.pt's analysis, whatever else was analysed last
    step = json.loads((run / "heads-step-000006.json").read_text())
    step["summaries"]["heads/prunable"] = 99.0
    (run / "heads-step-000006.json").write_text(json.dumps(step))
    (row,) = read_sweep(run)[0]
    assert row.heads_summary == best["summaries"]


def test_all_checkpoints_analyses_each_one_not_analysed_since_it_was_written(lab, tmp_path, capsys):
    run = tmp_path / "heads=2"
    shutil.copytree(lab / "sweep" / "heads=2", run)  # best.pt and step-000006.pt analysed
    assert main([str(run), "--all-checkpoints", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "best.pt: heads-best.json is up to date"
    assert lines[2] == "step-000006.pt: heads-step-000006.json is up to date"
    assert lines[1].startswith("last.pt: step 12, loss ") and len(lines) == 4
    assert lines[3].startswith("step-000012.pt: step 12, loss ")
    assert re.search(r", \d \w+(, \d \w+)? -> heads-step-000012.json$", lines[3])  # 2 heads' roles
    for name in ("last", "step-000012"):
        analysis = json.loads((run / f"heads-{name}.json").read_text())
        assert analysis["step"] == 12 and analysis["checkpoint"].endswith(f"{name}.pt")
        assert (run / f"heads-{name}.md").is_file()
    (run / "checkpoints" / "step-000006.pt").touch()  # written again since its analysis
    assert main([str(run / "checkpoints"), "--all-checkpoints", "--threads", "1"]) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[2].startswith("step-000006.pt: step 6, loss ")
    assert [line.endswith(" is up to date") for line in again] == [True, True, False, True]


def test_a_sweep_folder_analyses_each_job_not_analysed_since_its_checkpoint(lab, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    shutil.copytree(lab / "sweep", sweep)  # heads=2's best.pt is analysed, heads=1's is not
    assert main([str(sweep), "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("heads=1: best.pt: step 12, loss ") and len(lines) == 2
    assert lines[0].endswith(" -> heads-best.json")
    assert lines[1] == "heads=2: best.pt: heads-best.json is up to date"
    assert json.loads((sweep / "heads=1" / "heads-best.json").read_text())["step"] == 12
