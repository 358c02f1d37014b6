"""What a run logs, kept cheap: a large split estimated on fixed rows while the run trains and
read whole at its end (the figures a run reports stay exact), light head analyses while it trains
and a whole one at its end."""

import logging
import re

import pytest
import torch

from microgpt.checkpoint import Checkpoint
from microgpt.data.dataset import load_data
from microgpt.data.text import TextWindows
from microgpt.heads.analyse import LIGHT_SHARE
from microgpt.model import GPT, GPTConfig
from microgpt.train import loss, trainer
from microgpt.train.loss import eval_rows, evaluate
from microgpt.train.trainer import train
from tests.conftest import read_events


def test_eval_rows_are_the_whole_split_or_evenly_spaced_rows_of_about_the_estimate(monkeypatch):
    windows = TextWindows(torch.arange(1001) % 7, block_size=10)  # 100 windows, 1,000 positions
    assert eval_rows(windows).tolist() == list(range(100))
    assert eval_rows(windows, estimate=True).tolist() == list(range(100))  # no larger than 2**14
    monkeypatch.setattr(loss, "ESTIMATE_POSITIONS", 250)
    assert eval_rows(windows, estimate=True).tolist() == list(range(0, 100, 4))
    assert eval_rows(windows).tolist() == list(range(100))


def test_evaluate_estimates_on_its_rows_and_sums_the_whole_split_as_before(monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, block_size=10, n_layer=1, n_head=2, n_embd=8)).eval()
    windows = TextWindows(torch.randint(1, 7, (1001,)), block_size=10)
    monkeypatch.setattr(loss, "ESTIMATE_POSITIONS", 250)
    with torch.no_grad():
        x, y = windows.batch(torch.arange(0, 100, 4))
        estimate = evaluate(model, windows, 25, estimate=True)  # its 25 rows in one batch
        assert estimate == pytest.approx(float(model(x, y)[1]), rel=1e-12)
        # the whole split: each batch's mean times its targets, summed in float64 in order
        total = torch.zeros((), dtype=torch.float64)
        for start in range(0, len(windows), 8):
            x, y = windows.batch(torch.arange(start, min(start + 8, len(windows))))
            total += model(x, y)[1].double() * int((y >= 0).sum())
    assert evaluate(model, windows, 8) == float(total / 1000)


def whole_val_loss(path, data) -> float:
    model, _ = Checkpoint.load(path).build_model("cpu")
    return evaluate(model, data.datasets["val"], 1000)


def test_a_text_run_estimates_while_it_trains_and_reports_whole_split_figures(
    tiny_cfg, tmp_path, monkeypatch, caplog
):
    text = ("data.format=text", "model.block_size=8", "train.num_samples=1")
    cfg, estimated = tiny_cfg(*text), tiny_cfg(*text, out=tmp_path / "est")
    whole = train(cfg)
    data = load_data(cfg.data, 8)
    assert whole["best_val_loss"] == whole_val_loss(tmp_path / "run/checkpoints/best.pt", data)
    monkeypatch.setattr(loss, "ESTIMATE_POSITIONS", 64)  # 8 windows of the val split
    real, calls = trainer.evaluate, []

    def first_estimate_best(model, dataset, batch_size, autocast=None, estimate=False):
        # the estimate at step 6 made to look the best: best.pt keeps step 6's weights
        calls.append(estimate)
        out = real(model, dataset, batch_size, autocast, estimate)
        return out - 10 if calls == [True] else out

    monkeypatch.setattr(trainer, "evaluate", first_estimate_best)
    caplog.clear()  # the first run's lines, where an earlier test left the logger at INFO
    with caplog.at_level(logging.INFO, logger="microgpt"):
        metrics = train(estimated)
    rows, val = len(eval_rows(data.datasets["val"], True)), len(data.datasets["val"])
    assert rows < val
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    estimate = f"; val loss estimated on {rows} of the {val} validation rows, evenly spaced (the "
    assert [estimate in line for line in said] == [True, False]  # step 6; step 12 read them all
    # the training draws are the run's own: the same weights, whatever the evaluation read
    a = Checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt").model
    b = Checkpoint.load(tmp_path / "est" / "checkpoints" / "last.pt").model
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the last evaluation reads the whole split, as the run without estimates did
    assert metrics["val_loss"] == whole["val_loss"]
    # best.pt, chosen on an estimate, gets its whole-split loss
    best = tmp_path / "est" / "checkpoints" / "best.pt"
    assert Checkpoint.load(best).step == 6
    assert metrics["best_val_loss"] == whole_val_loss(best, data)
    kept = Checkpoint.load(best).metrics
    assert kept["best_val_loss"] == kept["val_loss"] == metrics["best_val_loss"]
    acc = read_events(tmp_path / "est")
    assert [e.step for e in acc.Scalars("Loss/val")] == [6, 12]


def test_the_head_analyses_are_light_while_the_run_trains_and_whole_at_its_end(tiny_cfg, tmp_path):
    train(tiny_cfg("train.num_samples=0", "log.head_items=16"))
    acc = read_events(tmp_path / "run")
    assert [e.step for e in acc.Images("heads/offsets/layer0")] == [0, 6, 12]
    tables = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("heads/table")}
    items = {step: int(re.search(r"over ([\d,]+) items", t)[1]) for step, t in tables.items()}
    assert items == {0: 16 // LIGHT_SHARE, 6: 16 // LIGHT_SHARE, 12: 16}
