"""The microgpt tab of TensorBoard (microgpt/commands/tab): its routes called directly on a tiny
sweep trained here (the `lab` fixture, tests/commands/conftest.py); the page in a browser:
test_tab_page.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from microgpt.checkpoint import checksum
from microgpt.commands.tab import MicrogptPlugin
from microgpt.commands.tab.attention import cached_model
from tests.conftest import REPO, make_names
from tests.e2e.harness import changes, fingerprint


def routes(logdir: Path | str, spec: str | None = None) -> dict[str, Client]:
    """{route: a client of it} of the plugin on --logdir `logdir`, or --logdir_spec `spec`."""
    flags = Namespace(logdir_spec=spec)
    plugin = MicrogptPlugin(base_plugin.TBContext(logdir=str(logdir), flags=flags))
    return {path: Client(app) for path, app in plugin.get_plugin_apps().items()}


def attention(client: Client, **args) -> tuple[int, dict]:
    response = client.get("/attention", query_string=args)
    return response.status_code, json.loads(response.get_data(as_text=True))


# ----------------------------------------------------------------------------- the routes


def test_the_plugin_is_registered_shipped_and_active_only_where_runs_are(lab, tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    entry = re.search(r'\[project.entry-points."tensorboard_plugins"\]\s*microgpt = "(.+)"', text)
    module, name = entry.group(1).split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is MicrogptPlugin
    assert '"microgpt.commands.tab" = ["static/*.js", "static/*.css"]' in text
    assert MicrogptPlugin(base_plugin.TBContext(logdir=str(lab / "sweep"))).is_active()
    for logdir in (str(tmp_path), ""):
        assert not MicrogptPlugin(base_plugin.TBContext(logdir=logdir)).is_active()
    apps = routes(lab / "sweep")
    page = apps["/index.js"].get("/index.js")
    assert page.status_code == 200 and "javascript" in page.content_type
    assert "export async function render()" in page.get_data(as_text=True)
    assert apps["/style.css"].get("/style.css").content_type.startswith("text/css")


def test_runs_lists_each_job_by_its_folder_with_its_checkpoints(lab):
    body = json.loads(routes(lab / "sweep")["/runs"].get("/runs").get_data(as_text=True))
    runs = {r["name"]: r for r in body["runs"]}
    assert list(runs) == ["heads=1", "heads=2"]
    assert runs["heads=1"]["checkpoints"] == ["best.pt", "last.pt"]
    steps = ["step-000006.pt", "step-000012.pt"]
    assert runs["heads=2"]["checkpoints"] == ["best.pt", "last.pt", *steps]
    assert runs["heads=1"]["analysed"] == []
    assert runs["heads=2"]["analysed"] == ["best.pt", "step-000006.pt"]
    assert body["example"] in make_names()  # the first validation name: an input to start with


def test_attention_gives_every_head_on_the_input_with_its_analysis(lab):
    client = routes(lab / "sweep")["/attention"]
    status, one = attention(client, run="heads=1", input="kalo")
    assert status == 200 and one["tokens"] == ["<s>", "k", "a", "l", "o"]
    assert (one["n_layer"], one["n_head"], one["checkpoint"], one["step"]) == (1, 1, "best.pt", 12)
    assert one["heads"] == [[None]] and one["analysis"] is None  # "not analysed" on the page
    status, two = attention(client, run="heads=2", input="kalo")
    assert status == 200 and len(two["layers"]) == 1 and len(two["layers"][0]) == 2
    report = json.loads((lab / "sweep" / "heads=2" / "heads-best.json").read_text())
    for head, label in enumerate(two["heads"][0]):
        assert label["role"] == report["heads"][head]["role"]
        assert label["importance"] == report["heads"][head]["zero_importance"]
    assert two["analysis"] == "heads-best.json"
    for row, weights in enumerate(two["layers"][0][1]):  # causal rows that sum to 1
        assert all(w == 0 for w in weights[row + 1 :]) and abs(sum(weights) - 1) < 0.01
    status, late = attention(client, run="heads=2", checkpoint="step-000012.pt", input="kalo")
    assert status == 200 and late["step"] == 12 and late["heads"] == [[None, None]]
    status, early = attention(client, run="heads=2", checkpoint="step-000006.pt", input="kalo")
    assert status == 200 and early["step"] == 6 and early["analysis"] == "heads-step-000006.json"
    assert early["layers"] != late["layers"]


def test_names_and_text_runs_side_by_side_each_get_their_own_boundary(lab):
    client = routes(lab)["/attention"]
    status, names = attention(client, run="sweep/heads=1", input="ka")
    assert status == 200 and names["tokens"] == ["<s>", "k", "a"] and names["format"] == "lines"
    status, text = attention(client, run="text/run", input="Thou art")
    assert status == 200 and text["format"] == "text"
    assert text["tokens"] == ["T", "h", "o", "u", "·", "a", "r", "t"]  # no boundary token
    status, long = attention(client, run="text/run", input="a" * 16)
    assert status == 200 and len(long["tokens"]) == 16  # a text run fills its whole context
    status, error = attention(client, run="text/run", input="a" * 17)
    assert status == 400 and error["error"] == (
        f"text/run: input={'a' * 17!r} has 17 characters but the model reads at most 16; shorten it"
    )


UNKNOWN = "input='Kalo!' has characters the vocabulary does not know: 'K', '!'"
LONG = f"input={'ka' * 20!r} has 40 characters but the model reads at most 8 after the boundary"


@pytest.mark.parametrize(
    "args, message",
    [({"run": "heads=1", "input": "Kalo!"}, f"heads=1: {UNKNOWN}; use characters of the training"),
     ({"run": "heads=1", "input": ""}, "type a name"),
     ({"run": "heads=9", "input": "ka"}, "no run 'heads=9'"),
     ({"run": "heads=1", "checkpoint": "../x.pt", "input": "ka"}, "no checkpoint '../x.pt'"),
     ({"run": "heads=1", "input": "ka" * 20}, f"heads=1: {LONG} token; shorten it")],
)  # fmt: skip
def test_bad_requests_get_a_message_the_page_shows(lab, args, message):
    status, body = attention(routes(lab / "sweep")["/attention"], **args)
    assert status == 400 and message in body["error"]


def test_a_model_is_loaded_once_and_again_once_its_checkpoint_is_rewritten(lab, tmp_path):
    best = tmp_path / "best.pt"
    shutil.copyfile(lab / "sweep" / "heads=2" / "checkpoints" / "best.pt", best)
    first = cached_model(best)
    assert cached_model(best) is first
    os.utime(best, ns=(0, best.stat().st_mtime_ns + 10**9))  # rewritten: another time
    assert cached_model(best) is not first


# ----------------------------------------------------------------------------- one bad run


def _edit(path: Path, field: str, value) -> None:
    """Give a checkpoint an odd field that still passes its checksum, or damage its bytes."""
    if field == "damaged":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        return path.write_bytes(bytes(data))
    ckpt = torch.load(path, weights_only=True)
    ckpt[field] = value
    torch.save({**ckpt, "checksum": checksum(ckpt)}, path)


@pytest.mark.parametrize(
    "field, value, message",
    [("step", "abc", "heads=1: "), ("train_config", [1, 2], "heads=1: "),
     ("damaged", None, "heads=1: .*corrupt"), ("none", None, "heads=1 has no checkpoint yet")],
)  # fmt: skip
def test_a_run_that_cannot_be_read_is_listed_and_the_rest_served(lab, tmp_path, field, value,
                                                                  message):  # fmt: skip
    shutil.copytree(lab / "sweep", tmp_path / "sweep")
    for path in (tmp_path / "sweep" / "heads=1" / "checkpoints").glob("*.pt"):
        path.unlink() if field == "none" else _edit(path, field, value)
    before = fingerprint(tmp_path)
    apps = routes(tmp_path / "sweep")
    response = apps["/runs"].get("/runs")
    assert response.status_code == 200
    body = json.loads(response.get_data(as_text=True))
    assert [r["name"] for r in body["runs"]] == ["heads=1", "heads=2"]
    assert body["example"] in make_names()  # from the run that can be read
    status, body = attention(apps["/attention"], run="heads=1", input="ka")
    assert status == 400 and re.match(message, body["error"]), body
    assert attention(apps["/attention"], run="heads=2", input="ka")[0] == 200
    assert changes(before, fingerprint(tmp_path)) == ([], [], [])


@pytest.mark.parametrize(
    "bad",
    ["[1]", "1", '{"n_layer": 1, "n_head": 2, "heads": ["a", "b"]}', "{not json", "fifo",
     '{"n_layer": 1, "n_head": 2, "heads": {"0": 1}}', "score"],
)  # fmt: skip
def test_a_malformed_analysis_gives_the_panel_a_message_never_a_500_or_a_hang(lab, tmp_path, bad):
    run, answers = tmp_path / "heads=2", []
    shutil.copytree(lab / "sweep" / "heads=2", run)
    analysis = json.loads((run / "heads-best.json").read_text())
    (run / "heads-best.json").unlink()
    if bad == "fifo":
        os.mkfifo(run / "heads-best.json")
    else:  # "score": a string where the page formats a number
        analysis["heads"][0]["score"] = "high"
        (run / "heads-best.json").write_text(json.dumps(analysis) if bad == "score" else bad)
    apps = routes(tmp_path)

    def ask():
        answers.append(apps["/runs"].get("/runs").status_code)
        answers.append(attention(apps["/attention"], run="heads=2", input="ka"))

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(timeout=60)
    assert not asking.is_alive(), "a request blocked"
    runs_status, (status, body) = answers
    assert runs_status == 200 and status == 200
    if bad == "score":  # a field of another type is left out
        assert body["heads"][0][0]["score"] is None and body["analysis"] == "heads-best.json"
    else:  # unreadable: no labels, and the panel's line says why
        assert body["heads"] == [[None, None]] and "heads-best.json " in body["analysis"]


def test_logdir_spec_serves_each_log_dir_under_its_name(lab):
    spec = f"sweep:{lab / 'sweep'},{lab / 'text'}"  # one named, one not (TensorBoard's form)
    plugin = MicrogptPlugin(base_plugin.TBContext(logdir="", flags=Namespace(logdir_spec=spec)))
    assert plugin.is_active()
    apps = routes("", spec)
    body = json.loads(apps["/runs"].get("/runs").get_data(as_text=True))
    assert [r["name"] for r in body["runs"]] == ["sweep/heads=1", "sweep/heads=2", "run"]
    assert attention(apps["/attention"], run="sweep/heads=2", input="ka")[0] == 200
    assert attention(apps["/attention"], run="run", input="Thou")[0] == 200
