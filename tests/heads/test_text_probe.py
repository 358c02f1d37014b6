"""The induction probe of a text run: passages of its own validation text, each twice; a names
run keeps its random spans."""

from __future__ import annotations

import math

import torch

from microgpt.data.dataset import load_data
from microgpt.data.repeats import repeated_passages, repeated_spans
from microgpt.data.text import TextWindows
from microgpt.heads import command
from microgpt.heads.analyse import (
    LIGHT_SHARE,
    PROBE_ROWS,
    PROBE_SEED,
    TEXT_PROBE_ROWS,
    analyse,
    run_probe,
)
from microgpt.train.checkpoint import Checkpoint
from tests.heads.test_head_roles import induction_circuit
from tests.heads.test_heads import random_model


def probe_rows(model, x, y, n: int) -> list[list[int]]:
    """The rows analyse(model, x, y) runs its probe on: its one pass of n rows."""
    seen, forward = [], model.forward_with_attention

    def spy(rows):
        seen.append(rows)
        return forward(rows)

    model.forward_with_attention = spy
    analyse(model, x, y)
    del model.forward_with_attention
    return next(rows for rows in seen if rows.shape[0] == n).tolist()


def test_repeated_passages_are_a_passage_of_the_text_twice():
    ids = torch.randint(1, 10, (100,), generator=torch.Generator().manual_seed(0))
    r = repeated_passages(ids, 30, 5, torch.Generator().manual_seed(1))
    text = ids.tolist()
    for row, target in zip(r.x.tolist(), r.y.tolist()):
        passage = row[:5]
        assert row == passage + passage
        assert any(text[s : s + 5] == passage for s in range(96))
        assert target == row[1:] + [-1]
    # the targets s2..s5 of each copy: the first copy's at 0..3, the repeat's at 5..8
    assert r.first.tolist() == [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0]] * 30
    assert r.repeat.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1, 0]] * 30
    assert torch.equal(r.x, repeated_passages(ids, 30, 5, torch.Generator().manual_seed(1)).x)


def test_a_text_runs_probe_is_its_validation_text_twice_and_a_names_runs_is_unchanged(rows):
    # a text run's rows: consecutive windows of its validation text, no boundary token
    ids = torch.randint(1, 12, (300,), generator=torch.Generator().manual_seed(2))
    val = TextWindows(ids, 16)
    x, y = val.batch(torch.arange(len(val)))
    model = induction_circuit(V=12, T=16)
    text = ids.tolist()
    for row in probe_rows(model, x, y, TEXT_PROBE_ROWS):
        passage = row[:8]
        assert row == passage + passage
        assert any(text[s : s + 8] == passage for s in range(300 - 8))
    probe = analyse(model, x, y).probe
    assert probe.rows == TEXT_PROBE_ROWS and probe.span == 8 and math.isfinite(probe.loss_first)
    # a names run: the boundary token and random spans, as before
    x, y, tok = rows
    model = random_model(tok, n_layer=1, n_head=2)
    g = torch.Generator().manual_seed(PROBE_SEED)
    assert (
        probe_rows(model, x, y, PROBE_ROWS)
        == repeated_spans(PROBE_ROWS, tok.vocab_size, 3, g).x.tolist()
    )
    assert analyse(model, x, y).probe.to_dict() == run_probe(model, "cpu").to_dict()


def test_a_hand_wired_induction_circuit_copies_the_repeated_passage():
    # a text of 11 characters in a cycle: any passage of 8 holds 8 different characters
    ids = torch.arange(400) % 11 + 1
    model = induction_circuit(V=12, T=16)
    with torch.no_grad():
        # sharper logits: the copied character (and the current one) far above the rest
        model.lm_head.weight.mul_(10.0)
    probe = run_probe(model, "cpu", ids)
    assert probe.span == 8
    assert probe.prefix[1, 0] > 0.9 and probe.prefix[0, 0] < 0.05, probe.prefix
    # the repeat is predicted from the first copy: zeroing the induction head undoes it
    assert probe.loss_repeat < probe.loss_first - 0.5
    assert probe.ablated[1, 0] > probe.loss_repeat + 0.5


def test_the_command_analyses_every_name_and_the_first_windows_of_a_text(
    tmp_path, tiny_cfg, monkeypatch
):
    from microgpt.train.trainer import train

    # 45 targets of a text (5 windows of 9), every name: the limits made small
    monkeypatch.setattr(command, "ANALYSIS_TARGETS", {"lines": 16384, "text": 45})
    for fmt in ("lines", "text"):
        cfg = tiny_cfg(f"data.format={fmt}", "model.block_size=9", out=tmp_path / fmt)
        train(cfg)
        report, _, _ = command.analyse_checkpoint(cfg.out_dir)
        val = load_data(cfg.data.path, cfg.seed, 9, format=fmt).datasets["val"]
        _, y = val.batch(torch.arange(len(val)))
        assert report.tokens == (45 if fmt == "text" else int((y >= 0).sum()))
        assert report.probe.rows == (TEXT_PROBE_ROWS if fmt == "text" else PROBE_ROWS)
        assert math.isfinite(report.probe.loss_first) and math.isfinite(report.probe.loss_repeat)
        assert ("passage of the text twice" in report.markdown()) == (fmt == "text")


def test_a_light_analysis_reads_an_eighth_of_the_rows_and_of_the_probe(tmp_path, tiny_cfg):
    """analyse(light=True), a run's analyses while it trains: 1/LIGHT_SHARE of the rows and of the
    probe's rows, the same report otherwise (a run's last analysis is whole: tests/train)."""
    from microgpt.train.trainer import train

    cfg = tiny_cfg("data.format=text", "model.block_size=9", "train.num_samples=0")
    train(cfg)
    model, _ = Checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt").build_model("cpu")
    val = load_data(cfg.data.path, cfg.seed, 9, format="text").datasets["val"]
    x, y = val.batch(torch.arange(min(len(val), 16)))
    light, whole = analyse(model, x, y, light=True), analyse(model, x, y)
    assert (whole.items, light.items) == (len(x), len(x) // LIGHT_SHARE)
    assert light.probe.rows == TEXT_PROBE_ROWS // LIGHT_SHARE and light.probe.text
    assert whole.probe.rows == TEXT_PROBE_ROWS
    assert light.summaries().keys() == whole.summaries().keys()
    assert light.zero_importance.shape == whole.zero_importance.shape
    # the layer-0 copying scores stay; their QK and OV tables are the whole analysis's alone
    assert torch.equal(light.copying, whole.copying) and light.qk is light.ov is None
    assert whole.qk is not None and "Layer-0 circuits" not in light.markdown()
