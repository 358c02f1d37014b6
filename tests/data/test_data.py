"""The data formats: the one data-file check, the lines format (reading, splits, rows, batches,
packing), generated repeats, and each format's round trip through what a checkpoint records."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from microgpt.config import DataConfig, RepeatsConfig
from microgpt.data.dataset import (
    FORMATS,
    DataError,
    data_format,
    data_of_checkpoint,
    load_data,
    resolve_data_path,
)
from microgpt.data.lines import (
    CharDataset,
    ItemBatches,
    Split,
    encode_items,
    read_items,
    split_items,
)
from microgpt.tokenizer import CharTokenizer
from tests.conftest import REPO, make_names


def write(tmp_path, content, name="items.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ----------------------------------------------------------------------------- the data file


def test_items_are_stripped_deduplicated_nfc_lines_whatever_the_line_ends(tmp_path):
    path = write(tmp_path, "\ufeff  emma\r\n\nolivia\rava \nemma\nzoe\u0308\nzo\u00eb\nmia")
    assert read_items(path) == ["emma", "olivia", "ava", "zo\u00eb", "mia"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("", r"is empty \(or only blank lines\)"),
        ("\n\n  \t\n", r"is empty \(or only blank lines\)"),
        (b"emma\x00ava\n", r"holds NUL bytes: it looks binary"),
        ("emma\nzoë\n".encode() + "renée\n".encode("latin-1"), r"not UTF-8 \(.* on line 3\)"),
        ("emma\nava\nemma\n", r"only 2 distinct item\(s\); it needs at least 3"),
    ],
)
def test_a_bad_data_file_is_one_line_naming_it(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(DataError, match=message) as e:
        read_items(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_file_names_the_command_that_builds_it_and_only_that_file(tmp_path):
    book, prepare = tmp_path / "book.txt", f"python data/prepare.py --out {tmp_path / 'book.txt'}"
    with pytest.raises(DataError, match=f"no data file at {book} .*build it first: {prepare}$"):
        load_data(DataConfig(str(book), prepare=prepare))
    other = tmp_path / "my_book.txt"  # data.path=my_book.txt: the names' command builds another
    with pytest.raises(DataError, match="point data.path=... at a UTF-8 text file$") as e:
        load_data(DataConfig(str(other), "text", prepare))
    assert "prepare.py" not in str(e.value)
    with pytest.raises(DataError, match="is a folder"):
        load_data(DataConfig(str(tmp_path)))


def test_a_relative_data_path_is_found_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_data_path("data/prepare.py") == REPO / "data" / "prepare.py"
    assert resolve_data_path("data/no-such-file.txt") == Path("data/no-such-file.txt")


def test_an_unknown_format_names_the_known_ones():
    assert list(FORMATS) == ["lines", "text", "repeats"]
    with pytest.raises(DataError, match=r"data.format='prose' is unknown; choose one of \['lines'"):
        data_format("prose")


# ----------------------------------------------------------------------------- splits and rows


@pytest.mark.parametrize("n, n_eval", [(3, 1), (25, 2), (100, 10), (30000, 1000)])
def test_splits_are_disjoint_complete_and_seeded(n, n_eval):
    items = [f"item{i}" for i in range(n)]
    split = split_items(items, seed=0)
    assert (len(split.train), len(split.val), len(split.test)) == (n - 2 * n_eval, n_eval, n_eval)
    assert sorted(split.train + split.val + split.test) == sorted(items)
    assert split_items(items, seed=0) == split and (n < 25 or split_items(items, 1) != split)
    assert split.where(split.val[-1]) == "val" and split.where("never seen") is None
    assert Split(**split.to_dict()) == split


def test_items_are_encoded_as_makemore_rows_and_a_long_one_is_named():
    tok = CharTokenizer("abemo")  # a=1 b=2 e=3 m=4 o=5
    X, Y = encode_items(["emma", "bo", "a"], tok, block_size=6)
    assert X.tolist() == [[0, 3, 4, 4, 1, 0], [0, 2, 5, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    assert Y.tolist() == [[3, 4, 4, 1, 0, -1], [2, 5, 0, -1, -1, -1], [1, 0, -1, -1, -1, -1]]
    with pytest.raises(DataError) as e:
        encode_items(["emma", "christopher"], CharTokenizer("cehimoprst"), block_size=8)
    for part in ["item 2 ('christopher')", "11 characters", "model.block_size=8", "least 12"]:
        assert part in str(e.value)


def test_a_batch_keeps_the_columns_its_longest_item_needs():
    items = ["a", "bb", "ccccccc", "dd"]
    tok = CharTokenizer.from_items(items)
    data = CharDataset(*encode_items(items, tok, 10))
    x, y = data.batch(torch.tensor([1, 0, 3]))  # lengths 2, 1, 2 -> 3 columns
    assert x.shape == (3, 3) and tok.decode(x[0, 1:]) == "bb" and y[1].tolist() == [1, 0, -1]
    assert data.batch(torch.tensor([2]))[1][0, -1] == 0  # the end token is never cut
    whole = CharDataset(*encode_items(items, tok, 10), trim=False)
    assert whole.batch(torch.tensor([0, 1]))[0].shape == (2, 10)
    assert torch.equal(data.batch(torch.tensor([3]))[1], data.Y[3:, :3])


# ----------------------------------------------------------------------------- batches


def batches(n: int, batch_size: int, seed: int) -> ItemBatches:
    """Batches of n one-character items."""
    items = [chr(0x4E00 + i) for i in range(n)]
    return ItemBatches(CharDataset(*encode_items(items, CharTokenizer(items), 2)), batch_size, seed)


def test_every_epoch_is_a_fresh_permutation_and_batches_run_on():
    sampler = batches(10, 4, seed=0)
    epochs = torch.cat([sampler.next_batch() for _ in range(15)]).view(6, 10)  # 60 = 6 epochs
    assert all(sorted(epoch.tolist()) == list(range(10)) for epoch in epochs)
    assert len({tuple(e.tolist()) for e in epochs}) > 1
    assert len(batches(3, 7, seed=0).next_batch()) == 7  # a batch larger than the data
    a, b = (batches(100, 8, seed=s).next_batch() for s in (5, 6))
    assert torch.equal(a, batches(100, 8, seed=5).next_batch()) and not torch.equal(a, b)


@pytest.mark.parametrize("steps_before", [0, 3, 12])
def test_a_sampler_state_resumes_the_same_batches(steps_before, tmp_path):
    sampler = batches(10, 4, seed=7)
    for _ in range(steps_before):
        sampler.next_batch()
    torch.save(sampler.state_dict(), tmp_path / "state.pt")
    expected = [sampler.next_batch() for _ in range(10)]
    resumed = batches(10, 4, seed=123)  # another seed: the state wins
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert all(torch.equal(resumed.next_batch(), want) for want in expected)


NAMES = ["emma", "olivia", "ava", "x", "isabella", "mia", "charlotte", "abigail"]
TOK = CharTokenizer.from_items(NAMES)


def test_packed_rows_hold_each_name_whole_with_its_targets():
    x, y = CharDataset(*encode_items(NAMES, TOK, 10)).packed(torch.arange(len(NAMES)), 12)
    # greedy in order: emma(5) olivia(7) | ava(4) x(2) | isabella(9) | mia(4) | charlotte(10) |...
    expected = [".emma.olivia", ".ava.x", ".isabella", ".mia", ".charlotte", ".abigail"]
    assert x.shape == (6, 12)

    def show(ids):  # ids -> text, "." the boundary token
        return "".join("." if i == 0 else TOK.chars[i - 1] for i in ids.tolist())

    for row, want in enumerate(expected):
        n = len(want)
        assert show(x[row, :n]) == want and show(y[row, :n]) == want[1:] + "."
        assert (y[row, n:] == -1).all() and (x[row, n:] == 0).all()


def test_packing_draws_the_same_names_and_rows_grow_to_the_longest():
    ds = CharDataset(*encode_items(NAMES, TOK, 10))
    padded, packed = ItemBatches(ds, 4, seed=3), ItemBatches(ds, 4, seed=3, pack=16)
    for _ in range(5):
        _, yp, n, n_all = padded.next(0, 4)
        _, yq, m, m_all = packed.next(0, 4)
        assert (n, n_all) == (m, m_all) == (int((yp >= 0).sum()),) * 2
        assert sorted(yp[yp >= 0].tolist()) == sorted(yq[yq >= 0].tolist())
    x, y, n, _ = ItemBatches(ds, 8, seed=0, pack=8).next(0, 8)  # charlotte needs 10
    assert x.shape[1] == 10 and int((y >= 0).sum()) == n == sum(len(s) + 1 for s in NAMES)
    # two ranks take the two halves of one global batch
    whole = ItemBatches(ds, 8, seed=1).next(0, 8)
    halves = [ItemBatches(ds, 8, seed=1).next(rank, 4) for rank in (0, 1)]
    assert halves[0][3] == halves[1][3] == whole[3] == halves[0][2] + halves[1][2]


# ----------------------------------------------------------------------------- every format


def checkpoint_of(data, format: str, path) -> SimpleNamespace:
    """What the trainer's checkpoint records of the data (Checkpoint's fields)."""
    return SimpleNamespace(
        split=data.record(),
        tokenizer=data.tokenizer.to_dict(),
        model_config={"block_size": data.block_size},
        data={"path": str(path), "format": format},
        path=Path("best.pt"),
    )


@pytest.fixture
def files(tmp_path) -> dict:
    play = "ROMEO:\nThou art my lord, and the king shall not be so fair.\n\n" * 40
    return {"lines": write(tmp_path, "\n".join(make_names(60)) + "\n"), "text": write(
        tmp_path, play, "play.txt"), "repeats": "generated:repeats"}  # fmt: skip


@pytest.mark.parametrize("format", ["lines", "text", "repeats"])
def test_each_format_comes_back_from_what_its_checkpoint_records(format, files):
    repeats = RepeatsConfig(items=60, length=12, span=[2, 4])
    settings = DataConfig(str(files[format]), format, repeats=repeats, split_seed=5)
    data = load_data(settings, 24 if format == "text" else None)
    assert type(data) is FORMATS[format] and data.boundary == (format != "text")
    back = data_of_checkpoint(checkpoint_of(data, format, data.path))
    assert type(back) is type(data) and back.record() == data.record()
    for name in ("val", "test"):
        rows, again = (d.datasets[name].batch(torch.arange(len(d.datasets[name]))) for d in
                       (data, back))  # fmt: skip
        assert torch.equal(rows[0], again[0]) and torch.equal(rows[1], again[1])
    probe = data.probe_ids(None)
    assert (probe[0] == 0) == data.boundary and len(probe) <= data.block_size


def test_a_checkpoint_whose_data_moved_says_what_to_do(files, tmp_path):
    data = load_data(DataConfig(str(files["text"]), "text"), 24)
    ckpt = checkpoint_of(data, "text", files["text"])
    files["text"].write_text(files["text"].read_text().replace("king", "queen"))
    with pytest.raises(DataError, match="no longer holds the text this run was trained on"):
        data_of_checkpoint(ckpt)
    files["text"].unlink()
    with pytest.raises(DataError, match="is missing .*put the file the run was trained on back"):
        data_of_checkpoint(ckpt)
    old = checkpoint_of(load_data(DataConfig(str(files["lines"]))), "lines", "")
    old.data, old.split["val"] = {}, []  # no format recorded: lines; no validation items
    with pytest.raises(DataError, match="best.pt stores no validation split"):
        data_of_checkpoint(old)


def test_generated_repeats_are_seeded_hashed_and_checked_by_the_schema():
    settings = DataConfig(format="repeats", repeats=RepeatsConfig(items=30, length=12, span=[2, 4]))
    a, b = (load_data(settings) for _ in "ab")
    assert a.sha256() == b.sha256() and a.source == "generated repeats (seed 0)"
    # another data.split_seed: the same items, split otherwise
    split, moved = (load_data(replace(settings, split_seed=s)).split.to_dict() for s in (1, 2))
    assert sorted(sum(moved.values(), [])) == sorted(sum(split.values(), [])) and moved != split
    assert not FORMATS["repeats"].reads_file
    with pytest.raises(DataError, match=r"data.repeats.span=\[2, 9\] must be \[lo, hi\]"):
        FORMATS["repeats"].check_settings(SimpleNamespace(repeats=RepeatsConfig(span=[2, 9],
                                                          length=12)), None)  # fmt: skip
