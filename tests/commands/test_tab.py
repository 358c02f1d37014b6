"""The microgpt tab of TensorBoard (microgpt/commands/tab): its routes called directly on a tiny
sweep trained here (the `lab` fixture, tests/commands/conftest.py); the page in a browser:
test_tab_page.py."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import threading
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from microgpt.checkpoint import Checkpoint, checksum
from microgpt.commands.heads import analysis_rows
from microgpt.commands.tab import MicrogptPlugin
from microgpt.commands.tab import attention as tab_models
from microgpt.commands.tab.attention import ModelCache
from microgpt.data.dataset import data_of_checkpoint
from microgpt.heads.analyse import _first_pass, length_batches
from microgpt.heads.circuits import ablated_losses, single_heads
from microgpt.heads.roles import class_members
from microgpt.train.trainer import train
from tests.commands.conftest import seeded
from tests.conftest import REPO, TINY, compose_config, make_names
from tests.e2e.harness import LAUGHS, changes, fingerprint


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
    apps = routes(lab / "sweep")
    body = json.loads(apps["/runs"].get("/runs").get_data(as_text=True))
    runs = {r["name"]: r for r in body["runs"]}
    assert list(runs) == ["heads=1", "heads=2"]
    assert runs["heads=1"]["checkpoints"] == ["best.pt", "last.pt"]
    steps = ["step-000006.pt", "step-000012.pt"]
    assert runs["heads=2"]["checkpoints"] == ["best.pt", "last.pt", *steps]
    assert runs["heads=1"]["analysed"] == runs["heads=1"]["snapshots"] == []
    assert runs["heads=2"]["analysed"] == ["best.pt", "step-000006.pt"]
    assert body["example"] in make_names()  # the first validation name: an input to start with
    assert runs["heads=2"]["snapshots"] == [["step-000006.pt", 6], ["step-000012.pt", 12]]


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
        assert label["zero_importance"] == report["heads"][head]["zero_importance"]
    assert [m["name"] for m in two["measures"]] == ["score", "zero_importance"]  # captioned
    assert two["analysis"] == "heads-best.json"
    shades = base64.b64decode(two["layers"][0][1])  # query q's keys 0..q, a byte each
    assert len(shades) == 5 * 6 // 2
    model, tokenizer, _ = model_of(lab)
    ids = torch.tensor([[0, *tokenizer.encode("kalo")]])
    weights = model.eval().forward_with_attention(ids)[2][0][0, 1]  # (T, T): layer 0, head 1
    q, k = torch.tril_indices(5, 5)
    assert [s / 255 for s in shades] == pytest.approx(weights[q, k].tolist(), abs=0.5 / 255)
    status, late = attention(client, run="heads=2", checkpoint="step-000012.pt", input="kalo")
    assert status == 200 and late["step"] == 12 and late["heads"] == [[None, None]]
    status, early = attention(client, run="heads=2", checkpoint="step-000006.pt", input="kalo")
    assert status == 200 and early["step"] == 6 and early["analysis"] == "heads-step-000006.json"
    assert early["layers"] != late["layers"]


UNKNOWN = "input='Kalo!' has characters the vocabulary does not know: 'K', '!'"
NO_HEAD = "%r is not a head of this run; give layer.head, comma-separated (as 0.1,0.0), layer 0 "
NO_HEAD += "and head 0 to 1"
LONG = f"input={'ka' * 20!r} has 40 characters but the model reads at most 8 after the boundary"
TEXT_LONG = f"input={'a' * 17!r} has 17 characters but the model reads at most 16; shorten it"


def test_runs_that_differ_only_by_seed_form_a_group_whose_roles_are_counted(lab, tmp_path):
    roles = {3: ["previous", "self"], 1: ["previous", "previous"], 2: None, 10: ["start", "self"]}
    seeded(lab, tmp_path, roles)
    shutil.copytree(lab / "sweep" / "heads=1", tmp_path / "heads=1")  # another experiment
    apps = routes(tmp_path)
    groups = json.loads(apps["/runs"].get("/runs").get_data())["groups"]
    runs = [f"heads=2,seed={seed}" for seed in (1, 2, 3, 10)]  # in seed order
    assert groups == [{"name": "heads=1", "runs": ["heads=1"], "seeds": [1337]},
                      {"name": "heads=2", "runs": runs, "seeds": [1, 2, 3, 10]}]  # fmt: skip
    status, body = attention(apps["/attention"], run="heads=2,seed=3", input="ka")
    # 3 of the 4 runs analysed (seed 2 not): previous in seeds 1 and 3, self in 3 and 10
    counts = {"previous": 2, "self": 2, "start": 1}
    assert status == 200 and body["group"] == {"name": "heads=2", "runs": runs,
        "seeds": [1, 2, 3, 10], "analysed": 3, "roles": counts}  # fmt: skip
    assert [label["role"] for label in body["heads"][0]] == ["previous", "self"]  # its own
    status, body = attention(apps["/attention"], run="heads=2,seed=1", input="ka",
                             checkpoint="step-000006.pt")  # fmt: skip
    assert status == 200 and (body["group"]["analysed"], body["group"]["roles"]) == (0, {})
    status, body = attention(apps["/attention"], run="heads=1", input="ka")
    assert body["group"] == {"name": "heads=1", "runs": ["heads=1"], "seeds": [1337],
                             "analysed": 0, "roles": {}}  # fmt: skip


def test_an_attention_only_model_has_no_mlp_parts(lab, tmp_path):
    names = [f"data.path={lab / 'names.txt'}", "train.num_samples=0", "model.mlp=false"]
    train(compose_config([*TINY, *names, f"out_dir='{tmp_path / 'run'}'"]))
    status, body = attention(routes(tmp_path)["/attention"], run="run", input="kalo", pin="2")
    assert status == 200 and body["attribution"]["mlps"] == []
    parts = body["attribution"]
    total = parts["embed"] + sum(map(sum, parts["heads"])) + parts["rest"]
    assert total == pytest.approx(parts["logit"], abs=1e-4)


@pytest.mark.parametrize(
    "args, message",
    [({"run": "heads=1", "input": "Kalo!"}, f"heads=1: {UNKNOWN}; use characters of the training"),
     ({"run": "heads=1", "input": ""}, "type a name"),
     ({"run": "heads=9", "input": "ka"}, "no run 'sweep/heads=9'"),
     ({"run": "text/run", "input": "a" * 17}, f"text/run: {TEXT_LONG}"),
     ({"run": "heads=1", "checkpoint": "../x.pt", "input": "ka"}, "no checkpoint '../x.pt'"),
     ({"run": "heads=1", "input": "ka" * 20}, f"heads=1: {LONG} token; shorten it"),
     ({"run": "heads=2", "input": "ka", "off": "9.9"}, f"heads=2: off='9.9': {NO_HEAD % '9.9'}"),
     ({"run": "heads=2", "input": "ka", "off": "0.1,x"}, f"heads=2: off='0.1,x': {NO_HEAD % 'x'}"),
     ({"run": "heads=2", "input": "ka", "ablation": "max"},
      "heads=2: ablation='max' is unknown; give zero or mean"),
     ({"run": "heads=2", "input": "ka", "pin": "3"},
      "heads=2: pin='3' is not a position of the input; give 0 to 2"),
     ({"run": "heads=2", "input": "ka", "pin": "-1"}, "pin='-1' is not a position"),
     ({"run": "heads=2", "input": "ka", "pin": "9" * 5000}, "is not a position"),
     ({"run": "heads=2", "input": "ka", "off": "\u00b2.0"}, "'\u00b2.0' is not a head")],
)  # fmt: skip
def test_bad_requests_get_a_message_the_page_shows(lab, args, message):
    run = args.pop("run")
    run = run if run == "text/run" else f"sweep/{run}"
    status, body = attention(routes(lab)["/attention"], run=run, **args)
    assert status == 400 and message in body["error"]


# ----------------------------------------------------------------------------- the head lab


def model_of(lab: Path, run: str = "heads=2", checkpoint: str = "best.pt"):
    """The checkpoint's model, its tokenizer and its run's data, loaded here."""
    ckpt = Checkpoint.load(lab / "sweep" / run / "checkpoints" / checkpoint)
    model, tokenizer = ckpt.build_model()
    return model.requires_grad_(False), tokenizer, data_of_checkpoint(ckpt)


def test_the_lab_gives_what_the_model_predicts_at_each_position_of_a_name_or_text(lab):
    client = routes(lab)["/attention"]
    status, body = attention(client, run="sweep/heads=2", input="kalo")
    assert status == 200 and (body["off"], body["ablation"], body["pin"]) == ([], "zero", None)
    assert body["tokens"] == ["<s>", "k", "a", "l", "o"] and body["format"] == "lines"
    assert body["attribution"] is body["reading"] is None  # nothing pinned until asked
    model, tokenizer, _ = model_of(lab)
    probs = model(torch.tensor([[0, *tokenizer.encode("kalo")]]))[0][0].softmax(-1)  # (T, V)
    shown = body["predictions"]
    assert [p["next"] for p in shown] == ["k", "a", "l", "o", "<s>"]  # a name's end is predicted
    for t, (p, target) in enumerate(zip(shown, tokenizer.encode("kalo") + [0])):
        assert p["p"] == pytest.approx(float(probs[t, target]), abs=1e-4)
        assert p["loss"] == pytest.approx(-math.log(probs[t, target]), abs=1e-3)
        best = probs[t].topk(5)
        assert p["top"] == [[tokenizer.labels([i])[0], pytest.approx(float(v), abs=1e-4)]
                            for i, v in zip(best.indices, best.values)]  # fmt: skip
    loss = -sum(math.log(probs[t, c]) for t, c in enumerate(tokenizer.encode("kalo") + [0])) / 5
    assert body["loss"] == body["base_loss"] == pytest.approx(loss, abs=1e-4)
    assert body["off_loss"] == []
    thrice = attention(client, run="sweep/heads=2", input="kalo", off="0.1,0.1,0.1")  # issue 52
    assert thrice[1]["off"] == [[0, 1]]
    status, text = attention(client, run="text/run", input="Thou art")  # no boundary token
    assert status == 200 and text["format"] == "text" and text["tokens"] == list("Thou·art")
    assert attention(client, run="text/run", input="a" * 16)[0] == 200  # its whole context
    status, text = attention(client, run="text/run", input="Thou")  # its next is not known
    assert status == 200 and [p["next"] for p in text["predictions"]] == ["h", "o", "u", None]
    assert text["predictions"][-1]["p"] is None and text["attribution"] is None
    mean = sum(p["loss"] for p in text["predictions"][:3]) / 3
    assert text["loss"] == pytest.approx(mean, abs=1e-3)
    status, text = attention(client, run="text/run", input="Thou", off="0.1", ablation="mean")
    assert status == 200 and text["loss"] != text["base_loss"]  # the means of its text's windows


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_switching_heads_off_changes_the_loss_by_what_the_head_analysis_computes(lab, ablation):
    """On a validation name: the route's losses are microgpt.heads' ablation losses (circuits),
    a head replaced by its mean output as the analysis computes it."""
    model, tokenizer, data = model_of(lab)
    name, (x, y) = data.split.val[3], data.datasets["val"].batch(torch.tensor([3]))
    means = None
    if ablation == "mean":  # the analysis' own mean outputs, over the rows it reads
        chars, counts = "".join(tokenizer.chars), data.training_counts()
        rows = analysis_rows(data)
        members = class_members(chars, model.config.vocab_size, counts)
        means = _first_pass(model, length_batches(*rows), members, chars, rows[0].shape[1])[0]
    drops = single_heads(model)  # (0, 0), (0, 1)
    both = drops.any(dim=0)
    expected = ablated_losses(model, [(x, y)], [(both, means), *((d, means) for d in drops)])
    client = routes(lab / "sweep")["/attention"]
    status, body = attention(client, run="heads=2", input=name, off="0.1,0.0", ablation=ablation)
    assert status == 200 and body["off"] == [[0, 1], [0, 0]] and body["ablation"] == ablation
    assert body["base_loss"] == pytest.approx(float(expected[0]), abs=1e-4)
    assert body["loss"] == pytest.approx(float(expected[1]), abs=1e-4)
    (h1, h1_rise), (h0, h0_rise) = ((r[:2], r[2]) for r in body["off_loss"])
    assert h1 == [0, 1] and h1_rise == pytest.approx(float(expected[3] - expected[0]), abs=1e-4)
    assert h0 == [0, 0] and h0_rise == pytest.approx(float(expected[2] - expected[0]), abs=1e-4)
    assert body["loss"] != body["base_loss"]


def test_the_attribution_adds_up_to_the_logit_and_each_head_gets_a_reading(lab):
    client = routes(lab / "sweep")["/attention"]
    model, tokenizer, _ = model_of(lab)
    logits = model(torch.tensor([[0, *tokenizer.encode("kalo")]]))[0][0]  # (T, V)
    for pin, off in [("4", ""), ("2", "0.1")]:
        status, body = attention(client, run="heads=2", input="kalo", pin=pin, off=off)
        parts, where = body["attribution"], body["pin"]
        assert status == 200 and parts["position"] == where == int(pin)
        assert parts["target"] == body["predictions"][where]["next"]
        total = parts["embed"] + sum(map(sum, parts["heads"])) + sum(parts["mlps"]) + parts["rest"]
        assert total == pytest.approx(parts["logit"], abs=1e-4)
        if not off:  # the logit of the model's own pass
            target = tokenizer.encode(parts["target"])[0] if parts["target"] != "<s>" else 0
            assert parts["logit"] == pytest.approx(float(logits[where, target]), abs=1e-4)
    assert parts["heads"][0][1] == 0  # switched off
    looks = r"L0H0 looks (at its own|\d back at) '(<s>|[a-z])'"
    line = re.compile(looks + r" and adds [+-]\d+\.\d\d to 'l'")
    assert line.fullmatch(body["reading"][0][0]) and body["reading"][0][1] == "L0H1 is off"
    assert body["layers"] == attention(client, run="heads=2", input="kalo")[1]["layers"]


def test_timeline_gives_the_val_loss_and_each_step_checkpoints_scores(lab):
    plugin = MicrogptPlugin(base_plugin.TBContext(logdir=str(lab / "sweep")))
    client = Client(plugin.get_plugin_apps()["/timeline"])
    body = json.loads(client.get("/timeline", query_string={"run": "heads=2"}).get_data())
    metrics = [json.loads(line) for line in (lab / "sweep" / "heads=2" / "metrics.jsonl").open()]
    assert body["val"] == [[m["step"], m["Loss/val"]] for m in metrics if "Loss/val" in m]
    assert [step for step, _ in body["val"]] == [6, 12]
    early, late = body["checkpoints"]
    assert (early["checkpoint"], early["step"], late["step"]) == ("step-000006.pt", 6, 12)
    report = json.loads((lab / "sweep" / "heads=2" / "heads-step-000006.json").read_text())
    for key in ("role", "score"):
        assert [label[key] for label in early["heads"][0]] == [row[key] for row in report["heads"]]
    induction = max(row["induction"] for row in report["heads"])  # the best prefix matching
    assert early["summaries"] == {"induction_max": induction}  # the lines the page draws:
    assert [(m["name"], m["line"]) for m in body["lines"]] == [("induction_max", "induction max")]
    assert late["heads"] is late["summaries"] is None  # not analysed
    response = client.get("/timeline", query_string={"run": "heads=7"})
    assert response.status_code == 400 and "no run 'heads=7'" in response.get_data(as_text=True)


def test_timeline_skips_bad_metrics_lines_and_reads_analyses_only_of_the_runs_shape(lab, tmp_path):
    """issue 43: a line that is an int, lacks its step or is not UTF-8 was a 500; an analysis
    claiming 4096x4096 heads made /timeline answer 201 MB. Issue 52: a line nested 100,000 deep
    was a 500, a NaN loss answered NaN, which is not JSON."""
    run = tmp_path / "heads=2"
    shutil.copytree(lab / "sweep" / "heads=2", run)
    good = (run / "metrics.jsonl").read_bytes()
    bad = (
        b'7\n{"Loss/val": 1.0}\n\xff\xfe{}\n' + b"[" * 100_000 + b'\n{"step": 1, "Loss/val": NaN}\n'
    )
    (run / "metrics.jsonl").write_bytes(bad + good)
    huge = json.dumps({"n_layer": 4096, "n_head": 4096, "heads": []})
    for name in ("heads-step-000006.json", "heads-best.json"):
        (run / name).write_text(huge)
    apps = routes(tmp_path)
    response = apps["/timeline"].get("/timeline", query_string={"run": "heads=2"})
    assert response.status_code == 200 and len(response.get_data()) < 10_000
    body = json.loads(response.get_data(), parse_constant=pytest.fail)  # JSON: no NaN
    assert body["val"][0] == [1, None] and [step for step, _ in body["val"][1:]] == [6, 12]
    assert [re.search(r"metrics\.jsonl line (\d+): ", s)[1] for s in body["skipped"]] == list(
        "1234"
    )
    early, _ = body["checkpoints"]
    assert early["step"] == 6 and early["heads"] is early["summaries"] is None
    status, body = attention(apps["/attention"], run="heads=2", input="ka")
    assert status == 200 and body["heads"] == [[None, None]]
    other = "heads-best.json is of another model (4096x4096 heads; the run has 1x2)"
    assert body["analysis"] == other


def test_a_run_or_checkpoint_reached_through_a_link_leading_out_is_refused(lab, tmp_path):
    logdir, outside = tmp_path / "logdir", tmp_path / "outside"
    shutil.copytree(lab / "sweep" / "heads=1", outside / "heads=1")
    shutil.copytree(lab / "sweep" / "heads=2", logdir / "heads=2")
    (logdir / "linked").symlink_to(outside / "heads=1")  # a whole run out of the log dir
    best = logdir / "heads=2" / "checkpoints" / "best.pt"
    best.unlink()
    best.symlink_to(outside / "heads=1" / "checkpoints" / "best.pt")
    (logdir / "heads=2" / "heads-step-000006.json").unlink()
    (logdir / "heads=2" / "heads-step-000006.json").symlink_to(outside / "x.json")
    apps = routes(logdir)
    body = json.loads(apps["/runs"].get("/runs").get_data())
    assert [r["name"] for r in body["runs"]] == ["heads=2"]
    assert "no run 'linked'" in attention(apps["/attention"], run="linked", input="ka")[1]["error"]
    status, body = attention(apps["/attention"], run="heads=2", input="ka")
    assert status == 400, body
    assert body["error"] == "heads=2: best.pt leads out of the run's folder; not read"
    args = {"run": "heads=2", "checkpoint": "step-000006.pt", "input": "ka"}
    status, body = attention(apps["/attention"], **args)
    assert status == 200 and "leads out of the run's folder" in body["analysis"]


def test_the_model_cache_is_bounded_in_bytes(lab, tmp_path, monkeypatch):
    """The models used longest ago go first, while their parameters' bytes pass MAX_BYTES; a
    checkpoint file over it is refused before it is read."""
    best = lab / "sweep" / "heads=2" / "checkpoints" / "best.pt"
    size = sum(t.numel() * t.element_size() for t in Checkpoint.load(best).model.values())
    file = best.stat().st_size
    kept_at_most = max(2, -(-file // size))  # a bound the file fits under
    paths = [tmp_path / f"{n}.pt" for n in range(kept_at_most + 2)]
    for path in paths:
        shutil.copyfile(best, path)
    cache = ModelCache()
    first = cache.get(paths[0])  # loaded once, and again once its checkpoint is rewritten
    assert cache.get(paths[0]) is first
    os.utime(paths[0], ns=(0, paths[0].stat().st_mtime_ns + 10**9))  # another time
    assert cache.get(paths[0]) is not first
    cache = ModelCache()
    kept = lambda: sorted(paths.index(Path(key[0])) for key in cache.models)  # noqa: E731
    monkeypatch.setattr(tab_models, "MAX_BYTES", kept_at_most * size + size // 2)
    for path in paths:
        cache.get(path)
    assert kept() == list(range(2, len(paths)))  # the two used longest ago went
    monkeypatch.setattr(tab_models, "MAX_BYTES", file - 1)  # a file over the bound
    with pytest.raises(tab_models.InputError, match=r"0\.pt is 0 MiB, more than the tab loads"):
        cache.get(paths[0])
    assert kept() == list(range(2, len(paths)))  # refused before loading: nothing pushed out


@pytest.mark.parametrize("damaged", [False, True])
def test_requests_for_one_cold_checkpoint_at_once_wait_for_its_one_load(
    lab, tmp_path, monkeypatch, damaged
):
    """issue 43: two threads could load one checkpoint at once (each its own copy); the requests
    that waited for a load that failed each loaded it again."""
    best, requests = tmp_path / "best.pt", 4
    shutil.copyfile(lab / "sweep" / "heads=2" / "checkpoints" / "best.pt", best)
    if damaged:
        _edit(best, "damaged", None)
    cache, loads, together = ModelCache(), [], threading.Barrier(requests)

    def load(path):  # slow enough for the other requests to come meanwhile
        loads.append(path)
        time.sleep(0.3)
        return real_load(path)

    real_load = tab_models.load_model
    monkeypatch.setattr(tab_models, "load_model", load)

    def get(n):
        if n is not None:  # one of the requests at once
            together.wait(timeout=60)
        try:
            return cache.get(best)
        except tab_models.InputError as e:
            return str(e)

    with ThreadPoolExecutor(requests) as pool:  # the requests at once
        got = list(pool.map(get, range(requests), timeout=120))
    got.append(get(None))  # a request after them: the model, or the error, kept
    assert loads == [best]
    if damaged:
        assert len(set(got)) == 1 and "corrupt" in got[0], got
    else:
        assert got[0] is not None and all(g is got[0] for g in got)


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
     ("damaged", None, "heads=1: .*corrupt"), ("none", None, "heads=1: no checkpoint yet")],
)  # fmt: skip
def test_a_run_that_cannot_be_read_is_listed_the_rest_served(lab, tmp_path, field, value, message):
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


@pytest.mark.parametrize("config", [LAUGHS, "seed: abc\n", "seed: null\n", "seed: [1, 2]\n"])
def test_a_hostile_config_makes_its_run_a_group_of_its_own_never_a_500_or_a_hang(
    lab, tmp_path, config
):
    """issue 52: a billion laughs hung /runs, a seed that is no integer made it a 500."""
    shutil.copytree(lab / "sweep", tmp_path / "sweep")
    (tmp_path / "sweep" / "heads=1" / "config.yaml").write_text(config)
    response = routes(tmp_path / "sweep")["/runs"].get("/runs")
    assert response.status_code == 200
    groups = json.loads(response.get_data())["groups"]
    assert [group["runs"] for group in groups] == [["heads=1"], ["heads=2"]]


@pytest.mark.parametrize(
    "bad",
    ["[1]", "1", '{"n_layer": 1, "n_head": 2, "heads": ["a", "b"]}', "{not json", "fifo",
     '{"n_layer": 1, "n_head": 2, "heads": {"0": 1}}', "score",
     pytest.param("[" * 100_000 + "]" * 100_000, id="nested-100000-deep")],
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


def test_a_logdir_spec_is_read_as_tensorboard_documents_it(lab, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # name:path, commas between; a path from / keeps its colons
    assert tab_models.log_dirs(None, "a:x,b:/y:z") == {"a": tmp_path / "x", "b": Path("/y:z")}
    assert tab_models.log_dirs(None, "/p:q") == {"": Path("/p:q")}
    assert tab_models.log_dirs(None, "") == {}
    assert tab_models.log_dirs("d", "a:x") == {"": Path("d")}
    spec = f"sweep:{lab / 'sweep'},{lab / 'text'}"  # one named, one not (TensorBoard's form)
    plugin = MicrogptPlugin(base_plugin.TBContext(logdir="", flags=Namespace(logdir_spec=spec)))
    assert plugin.is_active()
    apps = routes("", spec)
    body = json.loads(apps["/runs"].get("/runs").get_data(as_text=True))
    assert [r["name"] for r in body["runs"]] == ["sweep/heads=1", "sweep/heads=2", "run"]
    assert attention(apps["/attention"], run="sweep/heads=2", input="ka")[0] == 200
    assert attention(apps["/attention"], run="run", input="Thou")[0] == 200
