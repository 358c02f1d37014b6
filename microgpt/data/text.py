"""Continuous text (`data.format=text`): one stream of characters in contiguous slices (90% train,
5% val, 5% test). Training draws windows of block_size + 1 characters at seeded random starts (x
the first block_size, y the last); evaluation cuts a split into non-overlapping windows, so every
character of it but the first is predicted exactly once.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import numpy as np
import torch
from torch import Tensor

from microgpt.data.format import Data, read_data_file, resolve_data_path
from microgpt.data.lines import IGNORE_ID, Rows
from microgpt.errors import DataError
from microgpt.tokenizer import BOUNDARY_ID, CharTokenizer

SPLIT_FRACTIONS = (0.9, 0.05, 0.05)  # train, val, test: contiguous, in this order
DEFAULT_BLOCK_SIZE = 128  # model.block_size=null in text mode
PROBE_LENGTH = 64  # characters of the validation passage drawn in the attention maps
ENCODE_CHUNK = 1 << 22  # characters converted at once: bounds the memory of encoding a big file


def encode_text(text: str, tokenizer: CharTokenizer) -> Tensor:
    """(N,) ids of `text` in the smallest dtype that holds them, a few million at a time; every
    character of `text` is in the vocabulary (TextData.load builds it from the text)."""
    table = np.zeros(0x110000, dtype=np.int32)  # code point -> id
    for c, i in tokenizer.stoi.items():
        table[ord(c)] = i
    V = tokenizer.vocab_size
    dtype = torch.uint8 if V <= 256 else torch.int16 if V <= 2**15 else torch.int32
    out = torch.empty(len(text), dtype=dtype)
    for start in range(0, len(text), ENCODE_CHUNK):
        piece = text[start : start + ENCODE_CHUNK]
        ids = table[np.frombuffer(piece.encode("utf-32-le"), np.uint32)]
        out[start : start + len(ids)] = torch.from_numpy(ids).to(out.dtype)
    return out


@dataclass(frozen=True)
class TextSplit:
    """Where train, val and test lie in the text: [0, bounds[0]), [bounds[0], bounds[1]),
    [bounds[1], bounds[2]), in characters; `digest` identifies the text they cut."""

    bounds: tuple[int, int, int]
    digest: str
    seeded = False  # contiguous: no seed moves it

    @classmethod
    def of(cls, n: int, digest: str, block_size: int, source: str = "the text") -> TextSplit:
        """The split of n characters; a slice shorter than one window is a DataError."""
        a = int(n * SPLIT_FRACTIONS[0])
        split = cls((a, a + int(n * SPLIT_FRACTIONS[1]), n), digest)
        sizes, need = split.sizes(), block_size + 1
        if min(sizes) < need:
            raise DataError(
                f"{source} has {n:,} characters: its train/val/test slices "
                f"({sizes[0]:,} / {sizes[1]:,} / {sizes[2]:,}) must each hold at least "
                f"block_size + 1 = {need} characters, so it needs at least "
                f"{math.ceil(need / min(SPLIT_FRACTIONS)):,}; use a longer text or a smaller "
                f"model.block_size"
            )
        return split

    def sizes(self) -> tuple[int, int, int]:
        a, b, n = self.bounds
        return a, b - a, n - b

    def describe(self) -> str:
        return "{:,} train / {:,} val / {:,} test characters".format(*self.sizes())

    def to_dict(self) -> dict:
        """What a checkpoint records: a run's data come back when the re-read text matches it."""
        return {"format": "text", "bounds": list(self.bounds), "digest": self.digest}


class WindowBatches:
    """Training batches of random windows of the train ids, like lines.ItemBatches; the starts
    come from a seeded generator and `state_dict` resumes the exact sequence."""

    def __init__(self, ids: Tensor, block_size: int, global_batch: int, seed: int, device="cpu"):
        # TextSplit.of made the training slice at least one window long
        self.ids, self.block_size, self.device = ids, block_size, torch.device(device)
        # window starts are drawn in [0, n)
        self.n, self.batch_size, self.seed = len(ids) - block_size, global_batch, seed
        self.generator = torch.Generator().manual_seed(seed)

    def next(self, rank: int, batch_size: int) -> tuple[Tensor, Tensor, int, int]:
        # (global batch,) starts, the same on every rank
        starts = torch.randint(self.n, (self.batch_size,), generator=self.generator)
        mine = starts[rank * batch_size : (rank + 1) * batch_size]
        windows = self.ids[mine[:, None] + torch.arange(self.block_size + 1)].long()  # (B, T + 1)
        windows = windows.to(self.device, non_blocking=True)
        x, y = windows[:, :-1], windows[:, 1:]  # (B, T) each
        return x, y, len(mine) * self.block_size, len(starts) * self.block_size

    def state_dict(self) -> dict:
        state = {"n": self.n, "batch_size": self.batch_size, "seed": self.seed}
        return {**state, "generator_state": self.generator.get_state().clone()}

    def load_state_dict(self, state: dict) -> None:
        """A state of this text's windows (Checkpoint.check_resumable refuses other data)."""
        self.batch_size, self.seed = state["batch_size"], state["seed"]
        self.generator.set_state(state["generator_state"])


class TextWindows(Rows):
    """One split in non-overlapping windows for evaluation: row i predicts characters
    i*T + 1 .. (i+1)*T; the last row is padded with IGNORE_ID targets."""

    def __init__(self, ids: Tensor, block_size: int, device="cpu"):
        self.ids, self.block_size, self.device = ids, block_size, torch.device(device)

    def __len__(self) -> int:
        return math.ceil((len(self.ids) - 1) / self.block_size)

    def batch(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """(x, y) (B, T) for the windows `idx`; the last window's tail is padding."""
        T, n = self.block_size, len(self.ids)
        pos = idx.cpu()[:, None] * T + torch.arange(T + 1)  # (B, T + 1) positions in the split
        real = pos < n
        windows = self.ids[pos.clamp(max=n - 1)].long()  # (B, T + 1)
        x = windows[:, :-1].masked_fill(~real[:, :-1], BOUNDARY_ID)
        y = windows[:, 1:].masked_fill(~real[:, 1:], IGNORE_ID)
        return x.to(self.device), y.to(self.device)


class VerbatimIndex:
    """Which stretches of a sample appear verbatim in the text, exactly, over an index of the
    text's 4-grams (sorted codes and positions: about 16 bytes per character). Plain substring
    search (`in` on the text as a str) finds the same lengths 20 times slower on the plays (90% of
    data/shakespeare.txt, 2026-12-06, 2-core EPYC): 451 ms a 256-character unseen passage against
    21 ms here, 180 ms against 58 ms for a memorised one; this index takes 0.56 s to build, once."""

    def __init__(self, ids: Tensor, vocab_size: int):
        self.ids = ids = ids.numpy()  # compact: uint8 for most texts
        n = len(ids)
        self.base = vocab_size + 1  # the ids, and an end-of-text symbol (vocab_size)
        self.Q = 4 if self.base <= 2**15 else 2  # codes stay below 2**60
        codes = np.zeros(n, dtype=np.int64)  # the q-gram at each position, as one number
        for k in range(self.Q):  # the last positions' q-grams end in end-of-text symbols
            codes *= self.base
            inside = max(n - k, 0)
            codes[:inside] += ids[k:]
            codes[inside:] += vocab_size
        order = np.argsort(codes, kind="stable")  # positions, by q-gram
        self.codes = codes[order]
        self.order = order.astype(np.int32) if n < 2**31 else order

    def _range(self, gram: np.ndarray) -> tuple[int, int]:
        """The index range of positions whose q-gram starts with `gram` (1..Q ids)."""
        lo = 0
        for k in range(self.Q):
            lo = lo * self.base + (int(gram[k]) if k < len(gram) else 0)
        hi = lo + self.base ** (self.Q - len(gram))
        return int(np.searchsorted(self.codes, lo)), int(np.searchsorted(self.codes, hi))

    def contains(self, stretch) -> bool:
        s = np.asarray(stretch, dtype=np.int64)
        if len(s) <= self.Q:
            lo, hi = self._range(s)
            return hi > lo
        # the rarest q-gram of the stretch gives the fewest places to check
        ranges = [self._range(s[k : k + self.Q]) for k in range(len(s) - self.Q + 1)]
        k, (lo, hi) = min(enumerate(ranges), key=lambda kr: kr[1][1] - kr[1][0])
        starts = self.order[lo:hi] - k
        starts = starts[(starts >= 0) & (starts + len(s) <= len(self.ids))]
        return bool((self.ids[starts[:, None] + np.arange(len(s))] == s).all(axis=1).any())

    def longest(self, sample) -> tuple[int, int]:
        """(length, start) of the longest stretch of `sample` (ids) found verbatim in the text."""
        s = np.asarray(sample, dtype=np.int64)
        best, where, i = 0, 0, 0
        while i + best < len(s):  # a stretch at i must beat `best` to matter
            if self.contains(s[i : i + best + 1]):
                best, where = best + 1, i
            else:
                i += 1
        return best, where


class TextData(Data):
    """data.format=text: one stream of characters (a play, a book), no boundary token; windows
    drawn at random for training, cut in order for evaluation."""

    name, boundary, analysis_targets = "text", False, 4096  # 32 windows of 128
    user_input, packs = "a line of text", False

    @classmethod
    def known_block(cls, data) -> int:
        return DEFAULT_BLOCK_SIZE

    @classmethod
    def check_settings(cls, data, block_size: int | None) -> None:
        if block_size is not None and block_size < 2:
            raise DataError(
                f"model.block_size={block_size} with data.format=text: a window of one character "
                f"gives attention nothing to look at but itself (a bigram model, no heads to "
                f"analyse); use at least 2 (null = {DEFAULT_BLOCK_SIZE})"
            )

    @classmethod
    def load(cls, settings, block_size=None, device="cpu", trim=True) -> TextData:
        """The text of settings.path (settings.prepare: the command that builds it); block_size
        None: DEFAULT_BLOCK_SIZE. No seed moves it, no batch is trimmed (no padding)."""
        text, found = read_data_file(settings.path, settings.prepare)
        block_size = block_size or DEFAULT_BLOCK_SIZE
        # a short hash of the normalised text: a resume or a later analysis checks it
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        split = TextSplit.of(len(text), digest, block_size, str(found))
        tokenizer = CharTokenizer.from_items([text])
        ids, (a, b, n) = encode_text(text, tokenizer), split.bounds
        val, test = (TextWindows(part, block_size, device) for part in (ids[a:b], ids[b:n]))
        datasets = {"val": val, "test": test}
        return cls(found, tokenizer, split, block_size, datasets, train_ids=ids[:a])

    @classmethod
    def from_checkpoint(cls, ckpt, device="cpu") -> TextData:
        """The run's text file read again (a checkpoint keeps only its digest): a DataError says
        it is missing or changed, and what to do."""
        where = resolve_data_path(str(ckpt.data.get("path")))
        if not where.is_file():
            raise DataError(
                f"the run's text file {where.resolve()} is missing (a checkpoint keeps only its "
                f"digest); put the file the run was trained on back at that path"
            )
        try:
            the_file = SimpleNamespace(path=where, prepare=None)  # the run's, read again
            data = cls.load(the_file, int(ckpt.model_config["block_size"]), device)
        except DataError:
            data = None
        # the digest covers the text, and so the vocabulary built from it
        if data is None or data.record() != ckpt.split:
            raise DataError(
                f"{where} no longer holds the text this run was trained on (its content differs); "
                f"restore the file the run used"
            )
        return data

    def train_batches(self, global_batch, seed, pack=0) -> WindowBatches:
        """Windows: nothing to group or pack (no padding)."""
        device = self.datasets["val"].device
        return WindowBatches(self.train_ids, self.block_size, global_batch, seed, device)

    def default_probe(self) -> list[int]:
        """A validation passage from the start of a line, where one fits."""
        ids, length = self.datasets["val"].ids, min(PROBE_LENGTH, self.block_size)
        newline = self.tokenizer.stoi.get("\n")
        hits = (ids[: max(len(ids) - length, 0)] == newline).nonzero() if newline else []
        start = int(hits[0]) + 1 if len(hits) else 0
        return ids[start : start + length].tolist()

    def prompt(self, prefix: str) -> tuple[list[int], str]:
        """A passage continues `prefix` (default: a new line); of a prefix longer than the
        context, the last block_size - 1 characters, and a note that says so."""
        self.tokenizer.check(prefix, "prefix")
        text = prefix or ("\n" if "\n" in self.tokenizer.stoi else self.tokenizer.chars[0])
        keep, note = self.block_size - 1, ""
        if len(text) > keep:
            note = (
                f"the prefix has {len(text)} characters; the model reads {keep} at most "
                f"(block_size - 1), so it continues the last {keep}"
            )
        return self.tokenizer.encode(text[-keep:]), note

    def training_counts(self) -> Tensor:
        """(V,) how often each token occurs in the training text."""
        return torch.bincount(self.train_ids, minlength=self.tokenizer.vocab_size)

    @cached_property
    def verbatim_index(self) -> VerbatimIndex | None:
        """An index of the training text, for memorisation (built on first use); None without."""
        ids = self.train_ids
        return VerbatimIndex(ids, self.tokenizer.vocab_size) if ids is not None else None
