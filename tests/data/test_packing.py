"""train.pack: a batch's names end to end in rows, each whole, with the same targets."""

from __future__ import annotations

import torch

from microgpt.config import load_config
from microgpt.data.lines import CharDataset, ItemBatches
from microgpt.tokenizer import CharTokenizer

NAMES = ["emma", "olivia", "ava", "x", "isabella", "mia", "charlotte", "abigail"]


def dataset():
    return CharDataset.from_items(NAMES, CharTokenizer(sorted(set("".join(NAMES)))), 10)


def test_packed_rows_hold_each_name_whole_with_its_targets():
    ds = dataset()
    x, y = ds.packed(torch.arange(len(NAMES)), 12)
    # greedy in order: rows of at most 12 tokens, each name (its length + 1) whole
    # emma(5) olivia(7) | ava(4) x(2) | isabella(9) | mia(4) | charlotte(10) | abigail(8)
    assert x.shape == (6, 12)
    expected = [".emma.olivia", ".ava.x", ".isabella", ".mia", ".charlotte", ".abigail"]
    tok = CharTokenizer(sorted(set("".join(NAMES))))

    def show(ids):
        return "".join("." if i == 0 else tok.chars[i - 1] for i in ids)

    for row, want in zip(range(6), expected):
        n = len(want)
        assert show(x[row, :n].tolist()) == want
        # the targets: each character's next, the end token closing every name, then -1
        assert show(y[row, :n].tolist()) == want[1:] + "."
        assert (y[row, n:] == -1).all() and (x[row, n:] == 0).all()
    assert int((y >= 0).sum()) == sum(len(n) + 1 for n in NAMES)


def test_packing_draws_the_same_names_as_padded_batches():
    ds = dataset()
    padded = ItemBatches(ds, 4, seed=3)
    packed = ItemBatches(ds, 4, seed=3, pack=16)
    for _ in range(5):
        xp, yp, n, n_all = padded.next(0, 4)
        xq, yq, m, m_all = packed.next(0, 4)
        assert (n, n_all) == (m, m_all) == (int((yp >= 0).sum()),) * 2
        assert sorted(yp[yp >= 0].tolist()) == sorted(yq[yq >= 0].tolist())


def test_rows_shorter_than_the_longest_name_grow_to_hold_it():
    # the block is 10 tokens (charlotte and its boundary): rows of 8 would cut it
    batches = ItemBatches(dataset(), len(NAMES), seed=0, pack=8)
    x, y, n, _ = batches.next(0, len(NAMES))
    assert x.shape[1] == 10 and int((y >= 0).sum()) == n == sum(len(s) + 1 for s in NAMES)


def test_text_windows_have_no_padding_so_pack_leaves_them_as_they_are(tiny_cfg):
    from microgpt.data.text import WindowBatches
    from microgpt.train.trainer import Trainer

    trainer = Trainer(
        load_config(tiny_cfg("data.format=text", "model.block_size=8", "train.pack=64"))
    )
    assert isinstance(trainer.batches, WindowBatches)
    x, y, n, _ = trainer.batches.next(0, trainer.config.train.batch_size)
    assert x.shape[1] == trainer.config.model.block_size and n == y.numel()
