"""The lines format (`data.format=lines`, names): one item per line, read and checked, shuffled
into train/val/test, encoded into rows and batched. Rows follow makemore: "emma" in a block of 8 is

    x = [0, e, m, m, a, 0,  0,  0]    # the boundary token, the characters, padding
    y = [e, m, m, a, 0, -1, -1, -1]   # the characters, the end boundary, ignored padding

The loss (nats per character, the end token included) ignores the targets -1.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from torch import Tensor

from microgpt.data.format import Data, read_data_file, resolve_data_path
from microgpt.errors import DataError
from microgpt.tokenizer import BOUNDARY_ID, CharTokenizer, quoted

IGNORE_ID = -1  # the target of padded positions (the loss ignores it)
MAX_EVAL_ITEMS = 1000  # the most items each of val and test get
SPLIT_NAMES = ("train", "val", "test")


def read_items(path: str | Path, prepare: str | None = None) -> list[str]:
    """The items of a data file, one per line: stripped, no blanks, no duplicates, in order."""
    text, where = read_data_file(path, prepare)
    items = list(dict.fromkeys(s for s in (line.strip() for line in text.split("\n")) if s))
    if len(items) < len(SPLIT_NAMES):
        raise DataError(
            f"data file {where.absolute()} has only {len(items)} distinct item(s); it needs at "
            f"least 3, one for each of train/val/test; add more lines"
        )
    return items


@dataclass(frozen=True)
class Split:
    """Disjoint train/val/test lists of items. Treat the lists as read-only: `where` caches them."""

    train: list[str]
    val: list[str]
    test: list[str]
    seeded = True  # shuffled by data.split_seed

    @cached_property
    def _split_of(self) -> dict[str, str]:
        return {item: name for name in SPLIT_NAMES for item in getattr(self, name)}

    def where(self, item: str) -> str | None:
        """ "train", "val" or "test": the split that holds `item`; None for an item in none."""
        return self._split_of.get(item)

    def describe(self) -> str:
        return f"{len(self.train):,} train / {len(self.val):,} val / {len(self.test):,} test items"

    def to_dict(self) -> dict[str, list[str]]:
        return {name: list(getattr(self, name)) for name in SPLIT_NAMES}


def split_items(items: Sequence[str], seed: int) -> Split:
    """Shuffled by `random.Random(seed)`: test and val get min(1000, 10%) items each (at least
    one), train the rest (read_items and RepeatsData.check_settings make them at least 3)."""
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    n = max(1, min(MAX_EVAL_ITEMS, len(shuffled) // 10))
    return Split(train=shuffled[2 * n :], val=shuffled[n : 2 * n], test=shuffled[:n])


def check_fits(items: Sequence[str], block_size: int, source: str = "") -> None:
    """A DataError naming the first item longer than block_size - 1 (by number and start)."""
    too_long = [i for i, item in enumerate(items) if len(item) > block_size - 1]
    if too_long:
        item = items[too_long[0]]
        raise DataError(
            f"{source + ': ' if source else ''}item {too_long[0] + 1} ({quoted(item)}) has "
            f"{len(item)} characters but model.block_size={block_size} fits at most "
            f"{block_size - 1}; raise model.block_size to at least {max(map(len, items)) + 1} (the "
            f"longest item + 1 boundary token) or set it to null to take it from the data"
        )


def encode_items(items, tokenizer: CharTokenizer, block_size: int) -> tuple[Tensor, Tensor]:
    """X, Y LongTensors of shape (N, block_size): X = [0, c1..cn, 0...], Y = [c1..cn, 0, -1...]."""
    check_fits(items, block_size)
    n = len(items)
    lengths = torch.tensor([len(item) for item in items], dtype=torch.long)  # (N,)
    flat = torch.tensor(tokenizer.encode("".join(items)), dtype=torch.long)  # (sum of lengths,)
    # filled[i, j] is True where row i has a character at position j; row-major boolean
    # assignment puts the flat ids back item by item, in order
    filled = torch.arange(block_size - 1)[None, :] < lengths[:, None]  # (N, block_size - 1)
    X = torch.full((n, block_size), BOUNDARY_ID, dtype=torch.long)
    X[:, 1:][filled] = flat
    Y = torch.full((n, block_size), IGNORE_ID, dtype=torch.long)
    Y[:, :-1][filled] = flat
    Y[torch.arange(n), lengths] = BOUNDARY_ID  # the end of each item
    return X, Y


class Rows:
    """Evaluation rows (what train.loss.evaluate reads): a subclass gives `__len__` and
    `batch(idx)`."""


class CharDataset(Rows):
    """One split's rows X, Y (N, block_size) on a device; with `trim`, a batch keeps only the
    columns its longest item needs (most padding never reaches the model)."""

    def __init__(self, X: Tensor, Y: Tensor, device: str | torch.device = "cpu", trim: bool = True):
        self.X, self.Y, self.trim = X.to(device), Y.to(device), trim
        # item lengths stay on the CPU so trimming needs no device sync
        self.lengths = (Y >= 0).sum(dim=1).cpu() - 1  # (N,) characters per item

    @property
    def block_size(self) -> int:
        return self.X.shape[1]

    def __len__(self) -> int:
        return self.X.shape[0]

    def batch(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """(x, y) for the rows `idx`, each (B, T) with T <= block_size."""
        idx = idx.cpu()
        width = int(self.lengths[idx].max()) + 1 if self.trim else self.block_size
        # a pinned source lets the copy run without waiting for the GPU
        if self.X.is_cuda:
            idx = idx.pin_memory()
        rows = idx.to(self.X.device, non_blocking=True)
        return self.X[rows, :width], self.Y[rows, :width]

    def packed(self, idx: Tensor, row_len: int) -> tuple[Tensor, Tensor]:
        """The items `idx` end to end in rows of row_len tokens, (rows, row_len) each: item i
        brings X[i, :n+1] (its boundary token and n characters) and Y[i, :n+1] (the characters
        and the end token); an item never straddles two rows; the rest of a row is padding."""
        sizes = (self.lengths[idx.cpu()] + 1).tolist()
        starts, row, used = [], 0, 0  # starts: where each item begins in the rows, flattened
        for size in sizes:
            if used + size > row_len:
                row, used = row + 1, 0
            starts.append(row * row_len + used)
            used += size
        idx, sizes_t = idx.cpu(), torch.tensor(sizes)
        # one entry per token: its item, its column in the item, where it goes in the rows
        item = torch.repeat_interleave(torch.arange(len(sizes)), sizes_t)
        column = torch.arange(len(item)) - (torch.cumsum(sizes_t, 0) - sizes_t)[item]
        dest = torch.tensor(starts)[item] + column
        src = idx[item] * self.block_size + column
        # the gather runs where the data lives: only the indices travel
        dest, src = dest.to(self.X.device), src.to(self.X.device)
        x = torch.full(((row + 1) * row_len,), BOUNDARY_ID, device=self.X.device)
        y = torch.full_like(x, IGNORE_ID)
        x[dest], y[dest] = self.X.view(-1)[src], self.Y.view(-1)[src]
        # (rows * row_len,) -> (rows, row_len)
        return x.view(-1, row_len), y.view(-1, row_len)


class ItemBatches:
    """Training batches of items: a fresh permutation each epoch, cut into consecutive batches
    that run on into the next epoch (`next_batch`: the global batch's indices);
    `next(rank, batch_size)` gives this rank's (x, y) (B, T), its number of targets and the
    global batch's, like text.WindowBatches; `state_dict` resumes the exact sequence."""

    def __init__(self, dataset: CharDataset, global_batch: int, seed: int, pack: int = 0):
        self.n, self.batch_size, self.seed = len(dataset), global_batch, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0  # permutations drawn so far; the current one is number `epoch`
        self.position = 0  # indices of the current permutation already handed out
        self._perm: Tensor | None = None  # the current permutation
        self._state_before_perm = self.generator.get_state()  # the state that draws it
        # > 0: the batch's items end to end in rows of `pack` tokens, or of the longest item's
        # (with its boundary token) where that is longer: no padding between items
        self.dataset, self.pack = dataset, pack and max(pack, dataset.block_size)

    def next_batch(self) -> Tensor:
        """The next `batch_size` indices, a LongTensor on the CPU."""
        parts, need = [], self.batch_size
        while need:
            if self._perm is None or self.position == self.n:
                self._state_before_perm = self.generator.get_state()
                perm = torch.randperm(self.n, generator=self.generator)
                self._perm, self.epoch, self.position = perm, self.epoch + 1, 0
            take = min(need, self.n - self.position)
            parts.append(self._perm[self.position : self.position + take])
            self.position += take
            need -= take
        return torch.cat(parts)

    def state_dict(self) -> dict:
        """Plain containers: ints and the generator state (a uint8 tensor)."""
        keys = ("n", "batch_size", "seed", "epoch", "position")
        state = self._state_before_perm.clone()
        return {**{k: getattr(self, k) for k in keys}, "generator_state": state}

    def load_state_dict(self, state: dict) -> None:
        """A state of this data's sampler (Checkpoint.check_resumable refuses other data)."""
        for k in ("batch_size", "seed", "epoch", "position"):
            setattr(self, k, state[k])
        self._state_before_perm = state["generator_state"].clone()
        self.generator.set_state(self._state_before_perm)
        # the current permutation, redrawn from the state just before it
        self._perm = torch.randperm(self.n, generator=self.generator) if self.epoch > 0 else None

    def next(self, rank: int, batch_size: int) -> tuple[Tensor, Tensor, int, int]:
        # (global batch,) indices, the same on every rank
        idx = self.next_batch()
        mine = idx[rank * batch_size : (rank + 1) * batch_size]
        x, y = self.dataset.packed(mine, self.pack) if self.pack else self.dataset.batch(mine)
        # targets: each item's characters and its end token
        lengths = self.dataset.lengths
        return x, y, int((lengths[mine] + 1).sum()), int((lengths[idx] + 1).sum())


def rows_of(split: Split, names, tokenizer, block_size, device, trim=True) -> dict:
    """{name: CharDataset} of the splits `names`."""
    return {
        n: CharDataset(*encode_items(getattr(split, n), tokenizer, block_size), device, trim)
        for n in names
    }


class LinesData(Data):
    """data.format=lines: one item per line (names), shuffled into train/val/test by the seed,
    each item a row of its own (or packed end to end, train.pack)."""

    name, analysis_targets = "lines", 16384  # every validation name

    @classmethod
    def load(cls, settings, block_size=None, device="cpu", trim=True) -> LinesData:
        """The items of settings.path (settings.prepare: the command that builds it, named if it
        is missing), split by settings.split_seed."""
        items, found = read_items(settings.path, settings.prepare), resolve_data_path(settings.path)
        return cls.of_items(items, found, settings.split_seed, block_size, device, trim)

    @classmethod
    def of_items(cls, items, path, seed, block_size, device, trim, label="") -> LinesData:
        block_size = block_size or max(map(len, items)) + 1  # the longest item + 1 boundary token
        check_fits(items, block_size, label or str(path))
        tokenizer, split = CharTokenizer.from_items(items), split_items(items, seed)
        datasets = rows_of(split, SPLIT_NAMES, tokenizer, block_size, device, trim)
        return cls(path, tokenizer, split, block_size, datasets, label)

    @classmethod
    def from_checkpoint(cls, ckpt, device="cpu") -> LinesData:
        """The evaluation sets of the split the checkpoint stores."""
        lists = [(ckpt.split or {}).get(name) for name in SPLIT_NAMES]  # its schema: a dict or None
        if not all(isinstance(items, list) for items in lists) or not lists[1]:
            raise DataError(f"{ckpt.path} stores no validation split (lists of items)")
        split, tokenizer = Split(*lists), CharTokenizer.from_dict(ckpt.tokenizer)
        block_size = int(ckpt.model_config["block_size"])
        datasets = rows_of(split, ("val", "test"), tokenizer, block_size, device)
        return cls(ckpt.data.get("path") or "", tokenizer, split, block_size, datasets)

    def train_batches(self, global_batch, seed, pack=0) -> ItemBatches:
        return ItemBatches(self.datasets["train"], global_batch, seed, pack)

    def default_probe(self) -> list[int]:
        return self.input_ids(self.tokenizer, self.split.val[0], self.block_size, "val[0]")

    def training_counts(self) -> Tensor:
        """(V,) how often each token occurs in the training items (the boundary token: 0)."""
        seen = Counter("".join(self.split.train))
        return torch.tensor([0] + [seen.get(c, 0) for c in self.tokenizer.chars])
