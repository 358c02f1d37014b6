import re
from pathlib import Path

import pytest
import torch

from microgpt.data.lines import (
    BatchSampler,
    CharDataset,
    DataError,
    Split,
    block_size_for,
    encode_items,
    read_items,
    split_items,
)
from microgpt.tokenizer import CharTokenizer

NAMES_TXT = Path(__file__).resolve().parents[2] / "data" / "names.txt"


def write(tmp_path, content, name="items.txt"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ----------------------------------------------------------------------------- read_items


def test_read_items_strips_skips_blanks_and_drops_duplicates_in_order(tmp_path):
    path = write(tmp_path, "  emma\r\n\nolivia\n   \nava \nemma\nolivia\nmia")
    assert read_items(path) == ["emma", "olivia", "ava", "mia"]


def test_read_items_ignores_a_byte_order_mark(tmp_path):
    path = write(tmp_path, "\ufeffemma\nava\nmia\n")
    assert read_items(path) == ["emma", "ava", "mia"]


def test_missing_file_names_the_absolute_path_and_the_setting(tmp_path):
    missing = tmp_path / "nope" / "names.txt"
    with pytest.raises(DataError) as e:
        read_items(missing)
    msg = str(e.value)
    assert str(missing.resolve()) in msg
    assert "data.path=" in msg
    assert "\n" not in msg


def test_directory_is_refused(tmp_path):
    with pytest.raises(DataError, match="is a directory.*data.path="):
        read_items(tmp_path)


@pytest.mark.parametrize("content", ["", "\n\n   \n\t\n"])
def test_empty_file_is_refused(tmp_path, content):
    with pytest.raises(DataError, match="empty"):
        read_items(write(tmp_path, content))


def test_not_utf8_gives_the_line_number(tmp_path):
    # line 3 is valid UTF-8 with a two-byte character; line 4 is Latin-1
    content = "emma\nolivia\nzoë\n".encode() + "renée\nava\n".encode("latin-1")
    with pytest.raises(DataError, match=r"not UTF-8 .*line 4\b"):
        read_items(write(tmp_path, content))


@pytest.mark.parametrize("content", ["emma\n", "emma\nava\nemma\n"])
def test_fewer_than_three_distinct_items_is_refused(tmp_path, content):
    with pytest.raises(DataError, match="at least 3.*one for each of train/val/test"):
        read_items(write(tmp_path, content))


# ----------------------------------------------------------------------------- split_items


@pytest.mark.parametrize("n, n_eval", [(3, 1), (25, 2), (100, 10), (5000, 500), (30000, 1000)])
def test_split_sizes_disjoint_and_complete(n, n_eval):
    items = [f"item{i}" for i in range(n)]
    split = split_items(items, seed=0)
    assert (len(split.train), len(split.val), len(split.test)) == (n - 2 * n_eval, n_eval, n_eval)
    assert sorted(split.train + split.val + split.test) == sorted(items)
    assert not set(split.train) & set(split.val)
    assert not set(split.train) & set(split.test)
    assert not set(split.val) & set(split.test)


def test_split_is_deterministic_by_seed():
    items = [f"item{i}" for i in range(200)]
    assert split_items(items, seed=1) == split_items(list(items), seed=1)
    assert split_items(items, seed=1) != split_items(items, seed=2)


def test_split_where_and_dict_round_trip():
    items = [f"item{i}" for i in range(50)]
    split = split_items(items, seed=3)
    assert split.where(split.train[0]) == "train"
    assert split.where(split.val[-1]) == "val"
    assert split.where(split.test[0]) == "test"
    assert split.where("never seen") is None
    d = split.to_dict()
    assert all(type(v) is list for v in d.values())
    assert Split.from_dict(d) == split
    with pytest.raises(DataError):
        Split.from_dict({"train": []})


def test_split_refuses_too_few_items():
    with pytest.raises(DataError, match="at least 3"):
        split_items(["a", "b"], seed=0)


# ----------------------------------------------------------------------------- encode_items


def test_encode_items_exact_rows():
    tok = CharTokenizer("abemo")  # a=1 b=2 e=3 m=4 o=5
    X, Y = encode_items(["emma", "bo", "a"], tok, block_size=6)
    assert X.dtype == Y.dtype == torch.long
    assert X.tolist() == [
        [0, 3, 4, 4, 1, 0],
        [0, 2, 5, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
    ]
    assert Y.tolist() == [
        [3, 4, 4, 1, 0, -1],
        [2, 5, 0, -1, -1, -1],
        [1, 0, -1, -1, -1, -1],
    ]


def test_encode_items_fits_the_longest_item_exactly():
    items = ["emma", "bo"]
    block_size = block_size_for(items)
    assert block_size == 5
    X, Y = encode_items(items, CharTokenizer.from_items(items), block_size)
    assert X[0].tolist() == [0, 3, 4, 4, 1]
    assert Y[0].tolist() == [3, 4, 4, 1, 0]


def test_encode_items_too_long_names_item_length_block_and_fix():
    items = ["emma", "christopher"]
    with pytest.raises(DataError) as e:
        encode_items(items, CharTokenizer.from_items(items), block_size=8)
    msg = str(e.value)
    for part in ["'christopher'", "11 characters", "block_size=8", "model.block_size", "12"]:
        assert part in msg


def test_encode_items_unknown_character_is_a_data_error():
    with pytest.raises(DataError, match="'z'"):
        encode_items(["ab", "az"], CharTokenizer("ab"), block_size=4)


# ----------------------------------------------------------------------------- BatchSampler


def test_every_epoch_covers_every_index_once_and_batches_straddle_epochs():
    n, batch_size = 10, 4
    sampler = BatchSampler(n, batch_size, seed=0)
    stream = torch.cat([sampler.next_batch() for _ in range(15)])  # 60 indices = 6 epochs
    assert all(len(b) == batch_size for b in stream.split(batch_size))
    epochs = stream.view(6, n)  # (epochs * n,) -> (epochs, n)
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(n))
    assert len({tuple(e.tolist()) for e in epochs}) > 1  # a fresh permutation each epoch
    assert (sampler.epoch, sampler.position) == (6, n)  # six whole epochs handed out


def test_batch_larger_than_the_data_samples_across_epochs():
    sampler = BatchSampler(3, 7, seed=0)
    batch = sampler.next_batch()
    assert len(batch) == 7
    for epoch in batch[:6].view(2, 3):  # (6,) -> (2 epochs, 3)
        assert sorted(epoch.tolist()) == [0, 1, 2]


def test_sampler_is_deterministic_by_seed():
    a, b, c = (BatchSampler(100, 8, seed=s) for s in (5, 5, 6))
    first = [[x.next_batch() for _ in range(3)] for x in (a, b, c)]  # the same position in each
    assert all(torch.equal(x, y) for x, y in zip(first[0], first[1]))  # same seed, same batches
    assert not any(torch.equal(x, z) for x, z in zip(first[0], first[2]))  # another seed


@pytest.mark.parametrize("steps_before", [0, 1, 3, 5, 12])
def test_sampler_state_dict_round_trip_continues_identically(steps_before, tmp_path):
    sampler = BatchSampler(10, 4, seed=7)
    for _ in range(steps_before):
        sampler.next_batch()
    torch.save(sampler.state_dict(), tmp_path / "state.pt")
    expected = [sampler.next_batch() for _ in range(10)]

    resumed = BatchSampler(10, 4, seed=123)  # a different seed: the state must win
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    for want in expected:
        assert torch.equal(resumed.next_batch(), want)


def test_sampler_refuses_state_for_other_data():
    state = BatchSampler(10, 4, seed=0).state_dict()
    with pytest.raises(ValueError, match="10 items"):
        BatchSampler(11, 4, seed=0).load_state_dict(state)


# ----------------------------------------------------------------------------- CharDataset


def make_dataset(trim=True):
    items = ["a", "bb", "ccccccc", "dd"]
    tok = CharTokenizer.from_items(items)
    return CharDataset.from_items(items, tok, block_size=10, trim=trim), tok


def test_batch_trims_to_the_longest_item_in_it():
    data, tok = make_dataset()
    assert len(data) == 4
    x, y = data.batch(torch.tensor([1, 0, 3]))  # lengths 2, 1, 2 -> 3 columns
    assert x.shape == y.shape == (3, 3)
    assert tok.decode(x[0, 1:]) == "bb"
    assert y[0].tolist() == [tok.stoi["b"], tok.stoi["b"], 0]
    assert y[1].tolist() == [tok.stoi["a"], 0, -1]
    x, y = data.batch(torch.tensor([2]))
    assert x.shape == (1, 8)
    assert y[0, -1].item() == 0  # the end token is never trimmed away


def test_trim_off_keeps_the_whole_block():
    data, _ = make_dataset(trim=False)
    x, y = data.batch(torch.tensor([0, 1]))
    assert x.shape == y.shape == (2, 10)


def test_iter_batches_covers_the_split_in_order():
    data, _ = make_dataset()
    batches = list(data.iter_batches(3))
    assert [x.shape for x, _ in batches] == [(3, 8), (1, 3)]
    assert torch.equal(batches[0][0], data.X[:3, :8])
    assert torch.equal(batches[1][1], data.Y[3:, :3])


# ----------------------------------------------------------------------------- data/names.txt


def test_committed_names_txt_is_clean():
    names = read_items(NAMES_TXT)
    lines = NAMES_TXT.read_text(encoding="utf-8").splitlines()
    assert lines == names  # already stripped, no blanks, no duplicates
    assert len(names) > 25_000
    assert all(re.fullmatch(r"[a-z]+", name) for name in names)
    assert names[:3] == ["emma", "liam", "olivia"]  # most common first
    assert block_size_for(names) == 16


def test_group_by_length_keeps_epochs_complete_and_batches_of_similar_length():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 16, (1000,), generator=g)
    grouped = BatchSampler(1000, 50, seed=3, lengths=lengths, group_by_length=5)
    plain = BatchSampler(1000, 50, seed=3)
    epoch = [grouped.next_batch() for _ in range(20)]  # exactly one epoch
    assert sorted(torch.cat(epoch).tolist()) == list(range(1000))

    def spread(batches):
        return sum(int(lengths[b].max() - lengths[b].min()) for b in batches) / len(batches)

    assert spread(epoch) < spread([plain.next_batch() for _ in range(20)]) / 2


def test_group_by_length_state_round_trip_continues_identically():
    lengths = torch.randint(1, 16, (300,), generator=torch.Generator().manual_seed(1))
    a = BatchSampler(300, 32, seed=7, lengths=lengths, group_by_length=4)
    for _ in range(13):
        a.next_batch()
    b = BatchSampler(300, 32, seed=0, lengths=lengths, group_by_length=4)
    b.load_state_dict(a.state_dict())
    for _ in range(25):
        assert torch.equal(a.next_batch(), b.next_batch())


def test_a_relative_data_path_is_found_from_the_repository_root_wherever_the_command_runs(
    tmp_path, monkeypatch
):
    from microgpt.data.dataset import resolve_data_path
    from tests.conftest import REPO

    monkeypatch.chdir(tmp_path)
    assert resolve_data_path("data/names.txt") == REPO / "data" / "names.txt"
    assert resolve_data_path("data/no-such-file.txt") == Path("data/no-such-file.txt")
