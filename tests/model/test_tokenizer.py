"""CharTokenizer: ids 1..N for the characters, id 0 for the boundary token, helpful errors."""

import json
import re

import pytest
import torch

from microgpt.tokenizer import BOUNDARY_ID, CharTokenizer


@pytest.fixture
def tok():
    return CharTokenizer.from_items(["emma", "olivia", "ava"])


def test_vocab_is_sorted_chars_plus_boundary(tok):
    assert tok.chars == sorted(set("emmaoliviaava"))
    assert tok.vocab_size == len(set("emmaoliviaava")) + 1
    assert BOUNDARY_ID == 0 and tok.boundary_id == 0
    assert sorted(tok.stoi.values()) == list(range(1, tok.vocab_size))  # 0 is never a character
    assert tok.stoi["a"] == 1  # the first character in sorted order


def test_encode_decode_round_trip(tok):
    for text in ["emma", "olivia", "ava", "", "mia"]:
        ids = tok.encode(text)
        assert len(ids) == len(text)
        assert all(1 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(tok.encode("olivia"))) == "olivia"  # tensors decode too


def test_decode_stops_at_boundary(tok):
    ids = [*tok.encode("emma"), BOUNDARY_ID, *tok.encode("ava")]
    assert tok.decode(ids) == "emma"
    assert tok.decode([BOUNDARY_ID, *tok.encode("ava")]) == ""


def test_decode_rejects_ids_outside_vocab(tok):
    with pytest.raises(ValueError, match=rf"id {tok.vocab_size} is outside the vocabulary"):
        tok.decode([1, tok.vocab_size])


def test_unknown_chars_error_lists_them_and_the_known_ones(tok):
    with pytest.raises(ValueError) as e:
        tok.encode("zoe!z")
    msg = str(e.value)
    assert "'zoe!z'" in msg
    assert "'z!'" in msg  # the offending characters, each once, in order of appearance
    assert "'z', '!'" in msg
    assert f"Known characters: {''.join(tok.chars)!r}" in msg
    assert tok.unknown_chars("zoe!z") == ["z", "!"]


def test_to_dict_from_dict_round_trip_plain_containers(tok, tmp_path):
    d = tok.to_dict()
    assert d == {"chars": "aeilmov", "boundary_id": 0}
    assert type(d["chars"]) is str and type(d["boundary_id"]) is int
    assert CharTokenizer.from_dict(json.loads(json.dumps(d))) == tok
    torch.save({"tokenizer": d}, tmp_path / "t.pt")
    loaded = torch.load(tmp_path / "t.pt", weights_only=True)  # plain containers only
    back = CharTokenizer.from_dict(loaded["tokenizer"])
    assert back == tok and back.stoi == tok.stoi and back.itos == tok.itos


def test_from_dict_rejects_bad_dicts():
    with pytest.raises(ValueError, match="not a CharTokenizer dict"):
        CharTokenizer.from_dict({"chars": ["a", "b"]})
    with pytest.raises(ValueError, match=re.escape("unsupported boundary_id 3")):
        CharTokenizer.from_dict({"chars": "ab", "boundary_id": 3})


def test_rejects_multi_character_tokens():
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab", "c"])
