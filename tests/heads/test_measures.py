"""A head measure is defined once (microgpt/heads/measures.py) and every view shows it: the
analysis' JSON, TensorBoard, compare and the microgpt tab, none of them edited for it."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest
import torch
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from microgpt.commands.compare import main as compare_main
from microgpt.commands.heads import main as heads_main
from microgpt.commands.tab import MicrogptPlugin
from microgpt.heads.measures import MEASURES, Measure
from microgpt.train.trainer import train
from tests.conftest import TINY, compose_config, make_names, read_events


@pytest.fixture
def probe():
    """Two measures registered for the test: `probe`, per head, 10 * layer + head (on the tab's
    captions); `probe_max`, its largest, a compare column and a line of the tab's timeline."""
    added = [
        Measure("probe", lambda r: 10.0 * torch.arange(r.n_layer)[:, None] + torch.arange(
            r.n_head), "a test's number", ".1f", per_head=True, caption="p"),
        Measure("probe_max", lambda r: 10 * (r.n_layer - 1) + r.n_head - 1, "the largest",
                ".1f", column="probe", line="probe max"),
    ]  # fmt: skip
    MEASURES.extend(added)
    yield
    for measure in added:
        MEASURES.remove(measure)


def test_a_registered_measure_shows_in_tensorboard_compare_and_the_tab(probe, tmp_path, capsys):
    (tmp_path / "names.txt").write_text("\n".join(make_names()) + "\n")
    run = tmp_path / "sweep" / "heads=2"
    data = [f"data.path={tmp_path / 'names.txt'}", "train.num_samples=0", "model.n_layer=2"]
    train(compose_config([*TINY, *data, f"out_dir='{run}'"]))
    # TensorBoard: each head's value, and the summary, at each analysis
    events = read_events(run)
    assert events.Scalars("per_head/layer1/head0/probe")[-1].value == 10.0
    assert events.Scalars("heads/probe_max")[-1].value == 11.0
    assert heads_main([str(run), "--threads", "1"]) == 0
    analysis = json.loads((run / "heads-best.json").read_text())
    assert [row["probe"] for row in analysis["heads"]] == [0.0, 1.0, 10.0, 11.0]
    # compare: a column of the wide table, and in the JSON
    capsys.readouterr()
    assert compare_main([str(tmp_path / "sweep"), "--wide"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    right = header.index("  probe") + len("  probe")  # the column's cells end where its name does
    assert row[:right].split()[-1] == "11.0"
    assert compare_main([str(tmp_path / "sweep"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["heads_summary"]["heads/probe_max"] == 11
    # the tab: on each head's caption, with its format and help
    context = base_plugin.TBContext(logdir=str(tmp_path / "sweep"), flags=Namespace())
    app = Client(MicrogptPlugin(context).get_plugin_apps()["/attention"])
    body = json.loads(app.get("/attention", query_string={"run": "heads=2", "input": "ka"}).data)
    assert [label["probe"] for row in body["heads"] for label in row] == [0.0, 1.0, 10.0, 11.0]
    listed = {"name": "probe", "caption": "p", "fmt": ".1f", "help": "a test's number"}
    assert listed in body["measures"]
    app = Client(MicrogptPlugin(context).get_plugin_apps()["/timeline"])
    lines = json.loads(app.get("/timeline", query_string={"run": "heads=2"}).data)["lines"]
    assert {"name": "probe_max", "line": "probe max", "fmt": ".1f", "help": "the largest"} in lines
