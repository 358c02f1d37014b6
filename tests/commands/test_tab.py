"""The microgpt tab of TensorBoard (microgpt/commands/tab): its routes called directly on a tiny
sweep trained here, and the real page in headless Chromium against a real TensorBoard."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from microgpt.checkpoint import checksum
from microgpt.commands.heads import main as heads_main
from microgpt.commands.tab import MicrogptPlugin
from microgpt.commands.tab.attention import cached_model
from microgpt.train.trainer import train
from tests.conftest import REPO, TINY, compose_config, make_names
from tests.e2e.harness import changes, fingerprint

PLAY = "ROMEO:\nThou art my lord and the king.\n\nJULIET:\nSo fair a night of love.\n" * 40


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """lab/sweep/heads=1 and heads=2 (names; heads=2 keeps step-N.pt and is analysed) and
    lab/text/run (a text run): tiny runs, a few seconds in all."""
    root = tmp_path_factory.mktemp("lab")
    (root / "names.txt").write_text("\n".join(make_names()) + "\n")
    (root / "play.txt").write_text(PLAY)
    names = [*TINY, f"data.path={root / 'names.txt'}", "train.num_samples=0"]
    train(compose_config([*names, "heads=1", f"out_dir='{root / 'sweep' / 'heads=1'}'"]))
    heads2 = root / "sweep" / "heads=2"
    train(compose_config([*names, "heads=2", "train.save_every=6", f"out_dir='{heads2}'"]))
    assert heads_main([str(heads2), "--threads", "1"]) == 0
    text = ["data.format=text", "model.block_size=16", f"data.path={root / 'play.txt'}"]
    train(compose_config([*TINY, *text, "train.num_samples=0", f"out_dir={root / 'text' / 'run'}"]))
    return root


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
    assert runs["heads=1"]["analysed"] == [] and runs["heads=2"]["analysed"] == ["best.pt"]
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
    status, early = attention(client, run="heads=2", checkpoint="step-000006.pt", input="kalo")
    assert status == 200 and early["step"] == 6 and early["heads"] == [[None, None]]
    assert early["layers"] != two["layers"]


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


# ----------------------------------------------------------------------------- in a browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def tensorboard(lab):
    """A real TensorBoard on the sweep (--logdir_spec: the tab reads it too), its URL."""
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "tensorboard.main", "--logdir_spec", str(lab / "sweep")]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=2) as r:
                    listing = json.load(r)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"TensorBoard did not start: {server.stderr.read()}")
                time.sleep(0.3)
        if "microgpt" not in listing:
            pytest.skip("the microgpt tab is not registered with TensorBoard: pip install -e .")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def chromium(url: str, *args: str) -> str:
    """Load `url` in headless Chromium; its stdout (the DOM with --dump-dom)."""
    command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += ["--virtual-time-budget=15000", "--window-size=1400,900", *args, url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def panels(dom: str) -> dict[str, str]:
    """{run: the HTML of its panel} from a dumped page."""
    parts = re.split(r'<section class="mg-panel" data-run="', dom)[1:]
    return {part.split('"', 1)[0]: part for part in parts}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_tab_in_a_browser_shows_one_panel_per_run_with_every_head(tensorboard):
    page = f"{tensorboard}/data/plugin_entry.html?name=microgpt"
    dom = chromium(f"{page}#input=kalo&q=1", "--dump-dom")
    shown = panels(dom)
    assert list(shown) == ["heads=1", "heads=2"], dom[-3000:]
    for run, html in shown.items():
        heads = int(run.split("=")[1])
        assert f'data-heads="{heads}"' in html
        assert html.count('<figure class="mg-head"') == heads  # 1 layer
        queries = re.findall(
            r'class="mg-label mg-query[^"]*" data-char="-?\d+"[^>]*>([^<]+)<', html
        )
        assert queries == ["&lt;s&gt;", "k", "a", "l", "o"] * heads
        # q=1 pins the query "a": its row is highlighted and each head says where it looks
        assert html.count('class="mg-label mg-query mg-on" data-char="1"') == heads
        assert len(re.findall(r'<div class="mg-looks">a→', html)) == heads
    unanalysed = '<div class="mg-role mg-unanalysed">not analysed</div>'
    assert shown["heads=1"].count(unanalysed) == 1 and unanalysed not in shown["heads=2"]
    errors = panels(chromium(f"{page}#input=Kalo!", "--dump-dom"))
    assert all(f"{run}: {UNKNOWN}" in html for run, html in errors.items())


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
