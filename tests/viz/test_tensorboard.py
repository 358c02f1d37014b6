import io
import re
from contextlib import closing

import numpy as np
import pytest
import torch
from PIL import Image

from microgpt.heads.report import ROLES
from microgpt.runs import RunFolder
from microgpt.viz.tensorboard import TensorBoardLogger, sanitize_hparams
from tests.conftest import read_events

# ----------------------------------------------------------------------------- the logger


def test_sanitize_hparams():
    hp = {"lr": 1e-3, "n_head": 4, "bias": False, "top_k": None, "betas": [0.9, 0.95]}
    assert sanitize_hparams({**hp, "model": {"norm": "rmsnorm"}}) == {
        **{"lr": 1e-3, "n_head": 4, "bias": "false", "top_k": "none", "betas": "[0.9, 0.95]"},
        "model.norm": "rmsnorm",
    }


def test_logger_writes_everything_into_the_run_folder(tmp_path):
    L, H, T = 2, 3, 5
    labels = list(".emma")
    attention = [torch.softmax(torch.randn(H, T, T), dim=-1) for _ in range(L)]
    with closing(TensorBoardLogger(tmp_path)) as tb:
        for step in (0, 10):
            tb.scalars(step, {"Loss/train": 2.1 - step / 100, "lr": torch.tensor(1e-3)})
        tb.scalars(10, {"heads/induction_ablation_all": float("nan")})  # undefined: no chart
        tb.attention_maps(10, attention, labels)
        tb.samples(10, ["emma", "olivia (in train)", "zoe *new*"])
        tb.hparams({"n_head": H, "lr": 1e-3, "dropout": None}, {"best_val_loss": 1.9}, 10)

    files = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert len(files) == len(list(tmp_path.iterdir())) == 2  # no subfolder
    assert files[0].startswith("events.out.tfevents.") and files[1] == "metrics.jsonl"
    acc = read_events(tmp_path)
    tags = acc.Tags()
    assert set(tags["scalars"]) == {"Loss/train", "lr", "result/best_val_loss"}
    assert [e.step for e in acc.Scalars("Loss/train")] == [0, 10]
    assert acc.Scalars("result/best_val_loss")[0].value == pytest.approx(1.9)
    assert "heads/induction_ablation_all" not in RunFolder(tmp_path).metrics()[2]
    # the final figures also as a table in the Text tab, in nats and bits
    result = acc.Tensors("result")[0].tensor_proto.string_val[0].decode()
    assert "| best val loss | 1.9000 | 2.7411 |" in result
    expected_images = {f"attention/layer{n}/head{h}" for n in range(L) for h in range(H)}
    expected_images |= {f"attention/layer{n}" for n in range(L)}
    assert set(tags["images"]) == expected_images
    head, layer = acc.Images("attention/layer0/head0")[0], acc.Images("attention/layer0")[0]
    assert head.step == 10 and 2 * head.width < layer.width < 3 * head.width  # two heads a row
    text = acc.Tensors("samples")[0].tensor_proto.string_val[0].decode()
    assert "emma" in text and "olivia (in train)" in text and len(text.splitlines()) == 3
    hp = acc.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hp)


def test_images_are_written_losslessly_as_pngs_tensorboard_reads(tmp_path):
    """_image encodes its own PNG (zlib level 1, for speed): the pixels come back unchanged."""
    img = np.random.default_rng(0).integers(0, 256, (7, 11, 3), dtype=np.uint8)
    with closing(TensorBoardLogger(tmp_path)) as tb:
        tb._image("attention/layer0", img, 3)
    event = read_events(tmp_path).Images("attention/layer0")[0]
    assert (event.step, event.height, event.width) == (3, 7, 11)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(event.encoded_image_string))), img)


def test_logger_purge_step_on_an_existing_folder(tmp_path):
    with closing(TensorBoardLogger(tmp_path)) as tb:
        for step in range(10):
            tb.scalars(step, {"Loss/train": 1.0})
    # the first run's events a second older, as a resume in a later process finds them (within
    # one second TensorBoard orders the files by a process-wide counter, not by their age)
    (first,) = tmp_path.glob("events.out.tfevents.*")
    parts = first.name.split(".")
    parts[3] = str(int(parts[3]) - 1)
    first.rename(first.with_name(".".join(parts)))
    with closing(TensorBoardLogger(tmp_path, purge_step=5)) as tb:  # resumed from step 5
        for step in range(5, 8):
            tb.scalars(step, {"Loss/train": 2.0})
    points = [(e.step, e.value) for e in read_events(tmp_path).Scalars("Loss/train")]
    assert points == [(s, 1.0) for s in range(5)] + [(s, 2.0) for s in range(5, 8)]


# ----------------------------------------------------------------------------- head analysis


@pytest.fixture(scope="module")
def head_runs(tmp_path_factory):
    """Tiny 1-head and 8-head runs (two layers), as a heads=1,8 sweep writes them: {heads: (the
    run's folder, its events)}."""
    from microgpt.train.trainer import train
    from tests.conftest import TINY, compose_config, make_names

    tmp = tmp_path_factory.mktemp("heads")
    (tmp / "names.txt").write_text("\n".join(make_names()) + "\n")
    runs = {}
    for heads in (1, 8):
        cfg = compose_config(
            [*TINY, f"heads={heads}", "model.n_layer=2", "train.num_samples=0",
             f"data.path={tmp / 'names.txt'}"]
        )  # fmt: skip
        cfg.out_dir = str(tmp / f"heads={heads}")
        train(cfg)
        runs[heads] = tmp / f"heads={heads}", read_events(tmp / f"heads={heads}")
    return runs


def test_head_summaries_have_the_same_tags_for_1_and_8_heads(head_runs):
    # but the undefined: the rise with every induction head zeroed, where there is none
    undefined = {"heads/induction_ablation_all"}
    tags = {
        heads: {t for t in acc.Tags()["scalars"] if t.startswith("heads/")} - undefined
        for heads, (_, acc) in head_runs.items()
    }
    names = ("entropy_min", "entropy_mean", "entropy_max", "importance_max", "importance_sum")
    expected = {f"heads/layer{layer}/{name}" for layer in range(2) for name in names}
    names = ("prunable", "prunable_fraction", "named")
    expected |= {f"heads/{name}" for name in names} | {f"heads/role/{role}" for role in ROLES}
    names = ("induction", "duplicate", "copying", "induction_ablation")
    expected |= {f"heads/{name}_max" for name in names}
    expected |= {f"heads/repeat_loss{end}" for end in ("", "_first", "_gain")}
    assert tags[1] == tags[8] == expected
    acc = head_runs[8][1]
    assert [e.step for e in acc.Scalars("heads/prunable")] == [0, 6, 12]
    roles = sum(acc.Scalars(f"heads/role/{role}")[-1].value for role in ROLES)
    assert roles == 16  # every head of both layers has one role
    per_head_tags = {t for t in acc.Tags()["scalars"] if t.startswith("per_head/")}
    names = ("entropy", "importance", "position_mean_importance", "score")
    names += ("induction", "duplicate")
    expected_per_head = {f"per_head/layer{n}/head{h}/{name}" for n in range(2) for h in range(8)
                         for name in names}  # fmt: skip
    expected_per_head |= {f"per_head/layer0/head{h}/copying" for h in range(8)}
    assert per_head_tags == expected_per_head  # under their own prefix, apart from summaries
    for heads, (_, acc) in head_runs.items():
        images = set(acc.Tags()["images"])
        assert {"heads/offsets/layer0", "heads/offsets/layer1"} <= images
        table = acc.Tensors("heads/table")[-1].tensor_proto.string_val[0].decode()
        assert table.startswith("| layer | head | role |") and f"| 1 | {heads - 1} |" in table


def test_head_summaries_are_hparams_metrics_and_charted_by_a_layout_of_the_runs_tags(head_runs):
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2

    for heads, (_, acc) in head_runs.items():
        scalars = acc.Tags()["scalars"]
        content = acc.PluginTagToContent("hparams")["_hparams_/experiment"]
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        metrics = {m.name.tag for m in data.experiment.metric_infos}
        # few columns, the losses first: on screen beside the two hparams
        hparams = {h.name for h in data.experiment.hparam_infos}
        assert hparams == {"heads", "seed", "params"}  # the seed: runs of a group side by side
        start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        row = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
        assert (row["heads"].number_value, row["seed"].number_value) == (heads, 1337)
        main = {"heads/prunable", "heads/named", "heads/induction_max"}  # the main measures
        assert metrics == {"result/best_val_loss", "result/test_loss", *main}
        assert metrics <= set(scalars)  # the HParams tab reads each metric's value from a scalar
        events = acc.Tensors("custom_scalars__config__")
        assert len(events) == 1  # written once per run
        layout = layout_pb2.Layout.FromString(events[0].tensor_proto.string_val[0])
        charts = {c.title: c for cat in layout.category for c in cat.chart}
        assert len(charts) == 3 * 2 + 6  # three per layer, and six summary charts
        for title, chart in charts.items():
            assert chart.WhichOneof("content") == "multiline", title
            for regex in chart.multiline.tag:
                matched = [t for t in scalars if re.fullmatch(regex, t)]
                assert matched, f"{title}: {regex} matches no tag of the {heads}-head run"
        layer1 = charts["layer 1: entropy and importance of each head"].multiline.tag
        matched = {t for t in scalars for regex in layer1 if re.fullmatch(regex, t)}
        assert len(matched) == 2 * heads  # entropy and importance of every head in layer 1


def test_every_scalar_also_goes_to_metrics_jsonl(head_runs, tmp_path):
    """metrics.jsonl holds, line by line, every scalar the event files hold (same steps, same
    values), so a script can read a run without TensorBoard; a line cut by a crash is skipped."""
    folder, acc = head_runs[1]
    metrics = tmp_path / "metrics.jsonl"  # a copy, cut short below
    metrics.write_bytes((folder / "metrics.jsonl").read_bytes())
    events = {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    lines = RunFolder(tmp_path).metrics()
    jsonl = {(t, d["step"]): v for d in lines for t, v in d.items() if t not in ("step", "time")}
    assert set(jsonl) == set(events) and len(events) > 50
    assert all(jsonl[k] == pytest.approx(events[k], rel=1e-6) for k in events)
    with open(metrics, "a") as f:
        f.write('{"step": 99, "loss/tra')  # killed mid-line
    assert RunFolder(tmp_path).metrics() == lines
