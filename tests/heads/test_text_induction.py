"""The induction test of a text run: passages of its own validation text, each twice; a names
run keeps its random spans."""

from __future__ import annotations

import math

import torch

from microgpt.checkpoint import Checkpoint
from microgpt.commands import heads as command
from microgpt.data.dataset import load_data
from microgpt.data.repeats import repeated_passages, span_for
from microgpt.data.text import TextData, TextWindows
from microgpt.heads.analyse import (
    INDUCTION_ROWS,
    LIGHT_SHARE,
    TEXT_INDUCTION_ROWS,
    analyse,
    induction_test,
)
from microgpt.model import GPT, GPTConfig
from tests.heads.test_head_roles import induction_circuit
from tests.heads.test_heads import random_model


def cycle_model(V: int = 12) -> GPT:
    """A bigram that knows a text cycling through ids 1..V-1: each id raises the next one's logit
    (one-hot embeddings, attention writing nothing, no MLP, RMSNorm without a gain)."""
    sizes = {"block_size": 16, "n_layer": 1, "n_embd": V, "n_head": 1}
    model = GPT(GPTConfig(vocab_size=V, **sizes, mlp=False, norm="rmsnorm"))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.wte.weight.copy_(torch.eye(V))
        model.lm_head.weight[torch.arange(V) % (V - 1) + 1, torch.arange(V)] = 30.0
    return model.eval()


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


def test_a_text_runs_induction_test_repeats_passages_of_its_own_text(rows):
    # validation windows (no boundary token) of a text cycling through 11 characters
    ids = torch.arange(400) % 11 + 1
    x, y = TextWindows(ids, 16).batch(torch.arange(25))
    # a model that knows the text predicts both copies of a passage of it ...
    test = analyse(cycle_model(), x, y, boundary=False).induction
    assert test.text and (test.rows, test.span) == (TEXT_INDUCTION_ROWS, 8)
    assert test.loss_first < 0.01 and test.loss_repeat < 0.01
    # ... and not random spans' first copy
    assert induction_test(cycle_model()).loss_first > 5
    # the hand-wired induction circuit predicts the repeat from the first copy: zeroing its
    # induction head undoes it
    model = induction_circuit(V=12, T=16)
    with torch.no_grad():
        # sharper logits: the copied character (and the current one) far above the rest
        model.lm_head.weight.mul_(10.0)
    test = analyse(model, x, y, boundary=False).induction
    assert test.prefix[1, 0] > 0.9 and test.prefix[0, 0] < 0.05, test.prefix
    assert test.loss_repeat < test.loss_first - 0.5
    assert test.ablated[1, 0] > test.loss_repeat + 0.5
    # a names run (the boundary token at its rows' start): random spans
    x, y, tok = rows
    test = analyse(random_model(tok, n_layer=1, n_head=2), x, y).induction
    assert not test.text and (test.rows, test.span) == (INDUCTION_ROWS, span_for(8))


def test_the_command_analyses_every_name_and_the_first_windows_of_a_text_light_or_whole(
    tmp_path, tiny_cfg, monkeypatch
):
    from microgpt.train.trainer import train

    # 45 targets of a text (5 windows of 9), every name: the limits made small
    monkeypatch.setattr(TextData, "analysis_targets", 45)
    for fmt in ("lines", "text"):
        cfg = tiny_cfg(f"data.format={fmt}", "model.block_size=9", out=tmp_path / fmt)
        train(cfg)
        report, _, _ = command.analyse_checkpoint(cfg.out_dir)
        val = load_data(cfg.data, 9).datasets["val"]
        _, y = val.batch(torch.arange(len(val)))
        assert report.tokens == (45 if fmt == "text" else int((y >= 0).sum()))
        test = report.induction
        assert test.rows == (TEXT_INDUCTION_ROWS if fmt == "text" else INDUCTION_ROWS)
        assert math.isfinite(test.loss_first) and math.isfinite(test.loss_repeat)
        assert ("passage of the text twice" in report.markdown()) == (fmt == "text")
    # analyse(light=True), a run's analyses while it trains (here the text run's): 1/LIGHT_SHARE
    # of the rows and of the induction test's, the same report otherwise (a run's last analysis
    # is whole: tests/train)
    model, _ = Checkpoint.load(tmp_path / "text" / "checkpoints" / "last.pt").build_model()
    x, y = val.batch(torch.arange(min(len(val), 16)))
    light = analyse(model, x, y, light=True, boundary=False)
    whole = analyse(model, x, y, boundary=False)
    assert (whole.items, light.items) == (len(x), len(x) // LIGHT_SHARE)
    assert light.induction.rows == TEXT_INDUCTION_ROWS // LIGHT_SHARE and light.induction.text
    assert whole.induction.rows == TEXT_INDUCTION_ROWS
    assert light.summaries().keys() == whole.summaries().keys()
    assert light.zero_importance.shape == whole.zero_importance.shape
    assert torch.equal(light.copying, whole.copying)  # of the weights alone
