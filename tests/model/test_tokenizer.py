"""CharTokenizer: ids 1..N for the characters, id 0 for the boundary token, one error for unknown
characters, one label per special character."""

import json

import pytest
import torch

from microgpt.errors import DataError
from microgpt.tokenizer import BOUNDARY_ID, CharTokenizer, char_label


@pytest.fixture
def tok():
    return CharTokenizer.from_items(["emma", "olivia", "ava"])


def test_ids_are_the_sorted_characters_after_the_boundary_token(tok):
    assert tok.chars == ["a", "e", "i", "l", "m", "o", "v"] and tok.vocab_size == 8
    assert BOUNDARY_ID == 0 and tok.stoi == {c: i + 1 for i, c in enumerate("aeilmov")}
    assert tok.encode("mia") == [5, 3, 1] and tok.encode("") == []
    assert tok.decode(torch.tensor([5, 3, 1])) == "mia"  # tensors decode too


def test_decode_stops_at_the_boundary(tok):
    assert tok.decode([*tok.encode("emma"), BOUNDARY_ID, *tok.encode("ava")]) == "emma"


def test_unknown_characters_are_one_data_error_naming_them_and_the_known_ones(tok):
    with pytest.raises(DataError) as e:
        tok.encode("zoe!z")
    assert str(e.value) == (
        "text='zoe!z' has characters the vocabulary does not know: 'z', '!'; use characters of "
        "the training data: 'aeilmov'"
    )
    with pytest.raises(DataError, match=r"^prefix='x{40}'\.\.\. has"):  # a long text is cut
        tok.check("x" * 100, "prefix")


def test_a_dict_of_plain_types_round_trips_through_torch_save(tok, tmp_path):
    d = tok.to_dict()
    assert d == {"chars": "aeilmov", "boundary_id": 0}
    torch.save({"tokenizer": d}, tmp_path / "t.pt")
    back = CharTokenizer.from_dict(torch.load(tmp_path / "t.pt", weights_only=True)["tokenizer"])
    assert back == tok and back.stoi == tok.stoi
    assert CharTokenizer.from_dict(json.loads(json.dumps(d))) == tok


def test_every_special_character_has_one_label():
    tok = CharTokenizer(" \n\tab\x07")
    ids = [BOUNDARY_ID, *tok.encode("a \n\tb\x07")]
    assert tok.labels(ids) == ["<s>", "a", "·", "\\n", "\\t", "b", "?"]
    assert [char_label(c) for c in " a\x00"] == ["·", "a", "?"] and char_label("<s>") == "<s>"
