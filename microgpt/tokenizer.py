"""Characters <-> ids, as in makemore: id 0 is the boundary token (drawn as "<s>"), which starts
and ends an item, ids 1..N the characters in sorted order: "emma" is fed to the model as
[<s>, e, m, m, a] and trained to predict [e, m, m, a, <s>].
"""

from __future__ import annotations

from collections.abc import Iterable

from microgpt.errors import DataError

BOUNDARY_ID = 0
BOUNDARY_LABEL = "<s>"  # how maps and tables draw the boundary token
SHOWN = {" ": "·", "\n": "\\n", "\t": "\\t"}  # whitespace, made visible


def char_label(c: str) -> str:
    """How every map and table draws a token's character (or BOUNDARY_LABEL): whitespace made
    visible, a character that cannot be printed as "?"."""
    return SHOWN.get(c, c if c.isprintable() else "?")


def quoted(text: str, most: int = 40) -> str:
    """`text` as a message shows it: repr, cut after `most` characters."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}..."


class CharTokenizer:
    """Maps each known character (`chars`: single characters, a string say) to an id in
    1..len(chars); id 0 is the boundary token."""

    def __init__(self, chars: Iterable[str]):
        self.chars: list[str] = sorted(set(chars))
        self.stoi: dict[str, int] = {c: i + 1 for i, c in enumerate(self.chars)}
        self.itos: dict[int, str] = {i: c for c, i in self.stoi.items()}

    @classmethod
    def from_items(cls, items: Iterable[str]) -> CharTokenizer:
        return cls(set().union(*map(set, items)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1  # + the boundary token

    def check(self, text: str, what: str = "text") -> None:
        """The one unknown-characters error: a DataError naming every character of `text` the
        vocabulary lacks (in order of first appearance), and the ones it has. `what` names the
        text (prefix, log.probe)."""
        if unknown := list(dict.fromkeys(c for c in text if c not in self.stoi)):
            raise DataError(
                f"{what}={quoted(text)} has characters the vocabulary does not know: "
                f"{', '.join(map(repr, unknown))}; use characters of the training data: "
                f"{''.join(self.chars)!r}"
            )

    def labels(self, ids: Iterable[int]) -> list[str]:
        """The labels of token ids in a map: BOUNDARY_LABEL, or the character's label."""
        return [
            BOUNDARY_LABEL if int(i) == BOUNDARY_ID else char_label(self.itos.get(int(i), "?"))
            for i in ids
        ]

    def encode(self, text: str) -> list[int]:
        self.check(text)
        return [self.stoi[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, up to the first boundary token (which ends an item)."""
        out = []
        for i in map(int, ids):
            if i == BOUNDARY_ID:
                break
            out.append(self.itos[i])
        return "".join(out)

    def to_dict(self) -> dict:
        """Plain types: safe for torch.load(weights_only=True) and JSON."""
        return {"chars": "".join(self.chars), "boundary_id": BOUNDARY_ID}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        """From a checkpoint's tokenizer (its schema checked chars, a string, and boundary_id 0)."""
        return cls(d["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.chars == other.chars
